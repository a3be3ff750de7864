"""`schedport run`: the sweep (`schedport.study.sweep.run_sweep`), then, unless ``--no-analyze``,
the analysis and the report of the store it wrote (`schedport.api.analyze`).

Before any work the command claims its output directory, checks the engine config's scheduler
tables and, when the analysis is to follow, that the selection is one the analysis can use
(`check_analysable`); a missing corpus is built from the public data first.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Optional

import typer

from schedport.analysis.defaults import MIN_WINDOWS
from schedport.cli.params import out_path_parser
from schedport.common.guard import claim_dir, dir_lock
from schedport.common.outputs import output_dir
from schedport.errors import SchedportError

# The sweep, the engine, the analysis (`schedport.api`) and rich are imported on use, so that
# `schedport --help` starts at once; these defaults are `schedport.study.sweep`'s DEFAULT_CORPUS
# and DEFAULT_OUT (a test checks them).
DEFAULT_CORPUS = Path("corpus")
DEFAULT_OUT = Path("results")


def __getattr__(name: str):
    # `schedport.cli.study.api`, loaded on first use (numpy, pandas, scipy), as before this module
    # deferred it
    if name == "api":
        from schedport import api

        return api
    raise AttributeError(name)


def run_command(
    schedulers: Optional[str] = typer.Option(
        None, "--schedulers", metavar="LIST",
        help="Comma-separated scheduler names (default: all 13; see `schedport schedulers`); your own "
             "as FILE.py:NAME or module:NAME (docs/own-scheduler.md)."),
    sources: Optional[str] = typer.Option(
        None, "--sources", metavar="LIST",
        help="Comma-separated corpus sources (default: all, e.g. azure,bailian,burstgpt-modeled)."),
    regions: Optional[str] = typer.Option(
        None, "--regions", metavar="LIST",
        help="Comma-separated regions: light,moderate,high,near-saturation,overload,severe "
             "(rho 0.3..1.6), or custom name=rho. Default: all six."),
    windows: Optional[int] = typer.Option(
        None, "--windows", metavar="N", help="Run only N windows of each source, taken in turn from its parts (Azure's "
                                               "conv and code) (default: all)."),
    seeds: int = typer.Option(1, "--seeds", metavar="N", help="Run seeds 0..N-1 of every cell."),
    corpus: Path = typer.Option(
        DEFAULT_CORPUS, "--corpus", metavar="DIR", parser=out_path_parser,
        help="Corpus directory (built from the public data if missing; your own traces: `schedport corpus build "
             "--spec`, docs/corpus.md)."),
    engine: Optional[Path] = typer.Option(None, "--engine", metavar="FILE",
                                          help="Engine config TOML (defaults: docs/engine.md)."),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", metavar="DIR", help="Public data directory, used only to build a missing corpus."),
    quick: bool = typer.Option(
        False, "--quick", help="Small first-contact subset (180 runs, about half a minute on 2 cores plus a first "
                               "corpus build): schedulers "
                               "vllm-fcfs,sarathi,sjf,vtc,slo-admission; 4 windows per source; regions "
                               "moderate,near-saturation,overload. Explicit selectors override it."),
    out: Path = typer.Option(
        DEFAULT_OUT, "--out", metavar="DIR", parser=out_path_parser,
        help="Results directory: Parquet dataset OUT/runs/ + OUT/manifest.json. "
             "Rerunning resumes, skipping finished cells."),
    force: bool = typer.Option(
        False, "--force", help="If OUT holds results of another corpus/engine config, or is corrupt or foreign, "
                               "move it aside to OUT.old-TIMESTAMP and start afresh (nothing is deleted)."),
    workers: Optional[int] = typer.Option(
        None, "--workers", metavar="N",
        help="Worker processes (local) or CPUs of a local Ray instance (default: all cores)."),
    executor: str = typer.Option("local", "--executor", metavar="TEXT", help="local (process pool) or ray."),
    ray_address: Optional[str] = typer.Option(
        None, "--ray-address", metavar="TEXT",
        help="Existing Ray cluster (e.g. ray://host:10001 or auto); default: start a "
             "local instance."),
    keep_requests: bool = typer.Option(
        False, "--keep-requests", help="Also keep every run's per-request table in OUT/requests/ (large)."),
    region_def: str = typer.Option(
        "sustainable", "--region-def", metavar="TEXT",
        help="How rho is anchored: 'sustainable' (offered / the rate the engine "
        "sustains with a queue, the default), 'drain' (offered / requests per makespan of an all-at-once replay, "
        "the earlier definition) or 'slo[:PROFILE[:TARGET]]' (offered / the rate at which vllm-fcfs meets TARGET "
        "of PROFILE's SLO; default slo:standard:0.9)."),
    variants: Optional[str] = typer.Option(
        None, "--variants", metavar="TEXT",
        help="Run the matrix once per engine variant of a set: 'uncertainty' (the engine "
        "perturbed within its fit errors and published simulator errors, docs/engine.md §3.6), 'deployments' or "
        "'deployments-scaled' (other models and GPUs with absolute or scaled SLO thresholds, §3.7) or your own set's "
        "TOML; the default variant's cells are the study's, reused. The analysis then gives each reversal its "
        "survival across the variants."),
    do_analyze: bool = typer.Option(
        True, "--analyze/--no-analyze", help="After the sweep, analyse the store and write the report (default); "
                                             "--no-analyze runs any selection (one window or scheduler too) and "
                                             "leaves `schedport analyze` for later."),
) -> None:
    """Run the experiment matrix (schedulers x windows x regions x seeds), resumable, then the analysis."""
    from rich.console import Console

    from schedport.study.sweep import SweepInterrupted

    try:
        _run_command(schedulers, sources, regions, windows, seeds, corpus, engine, data_dir, quick, out, force,
                     workers, executor, ray_address, keep_requests, region_def, do_analyze, variants)
    except (KeyboardInterrupt, SweepInterrupted) as e:
        msg = str(e) if isinstance(e, SweepInterrupted) else "interrupted"
        Console(stderr=True).print(msg, markup=False)
        raise typer.Exit(130) from None


def _run_command(schedulers, sources, regions, windows, seeds, corpus, engine, data_dir, quick, out, force,
                 workers, executor, ray_address, keep_requests, region_def="sustainable", do_analyze=True,
                 variants=None) -> None:
    # a store (resumed) or a new folder; never a corpus, an analysis, a cache or a run output
    claim_dir(out, {"results"}, inputs=[corpus, engine, data_dir])
    output_dir(out, create=False)  # before a corpus build or any simulation
    # the store's lock from here to the report, the variants' sweeps and the analysis included: no
    # other command writes the store (or moves it aside with --force) between them
    with dir_lock(out, "another schedport command (a run, or an analysis) is writing this results store right "
                       "now; wait for it to finish or use another --out"):
        _run_locked(schedulers, sources, regions, windows, seeds, corpus, engine, data_dir, quick, out, force,
                    workers, executor, ray_address, keep_requests, region_def, do_analyze, variants)


def _run_locked(schedulers, sources, regions, windows, seeds, corpus, engine, data_dir, quick, out, force,
                workers, executor, ray_address, keep_requests, region_def, do_analyze, variants) -> None:
    from rich.console import Console

    from schedport import api
    from schedport.engine.core.config import load_engine_config
    from schedport.engine.policies.plugins import check_scheduler_tables, resolve_schedulers
    from schedport.study.progress import fmt_wall
    from schedport.study.sweep import load_corpus, run_sweep, select
    from schedport.study.variants import load_variant_set, run_variant_sweeps, variant_configs, variants_dir
    from schedport.workload import corpus as corpus_lib

    con = Console()
    # every [scheduler.*] table against the policies it names, before a corpus build or any worker
    named = [n.strip() for n in (schedulers or "").split(",") if n.strip()]
    check_scheduler_tables(load_engine_config(engine), resolve_schedulers(named) if len(set(named)) == len(named)
                           else [])
    vset = None
    if variants is not None:   # every variant's engine config, before a corpus build or any cell
        vset = load_variant_set(variants)
        variant_configs(vset, load_engine_config(engine))
    if not corpus.exists():
        output_dir(corpus, "--corpus", create=False)
        con.print(f"no corpus at {corpus}/: building it from the public data first", markup=False,
                  soft_wrap=True)
        corpus_lib.build_corpus(spec=None, data_dir=data_dir, out=corpus,
                                progress=lambda msg: con.print(str(msg), markup=False, soft_wrap=True))
    if vset is None:      # a corpus spec may name the engine variants of its study (`variants = "..."`)
        spec_variants = (load_corpus(corpus).manifest.get("study") or {}).get("variants")
        if spec_variants is not None:
            vset = load_variant_set(spec_variants)
            variant_configs(vset, load_engine_config(engine))
            con.print(f"variants: {vset.name} (named by the corpus spec; --variants overrides it)", markup=False,
                      soft_wrap=True)
    if do_analyze:
        check_analysable(select(load_corpus(corpus), schedulers=schedulers, sources=sources, regions=regions,
                                windows=windows, seeds=seeds, quick=quick))
    opts = dict(schedulers=schedulers, sources=sources, regions=regions, windows=windows, seeds=seeds, quick=quick,
                executor=executor, workers=workers, ray_address=ray_address, keep_requests=keep_requests, force=force,
                region_def=region_def)
    if vset is not None:
        t0 = time.perf_counter()
        results = run_variant_sweeps(corpus, out, vset, engine=engine, console=con, **opts)
        ran = sum(r.cells_run for r in results)
        con.print(f"variants: {len(results)} engines ({vset.name} v{vset.version} and the default), {ran} runs "
                  f"({sum(r.cells_skipped for r in results)} already done) in {fmt_wall(time.perf_counter() - t0)}; "
                  f"the variants' stores are in {variants_dir(out)}", markup=False, soft_wrap=True)
        res = results[0]
    else:
        res = run_sweep(corpus, out, engine=engine, **opts)
    for note in dict.fromkeys(r.workers_note for r in (results if vset is not None else [res]) if r.workers_note):
        con.print(note, markup=False, soft_wrap=True)
    if res.moved_aside is not None:
        con.print(f"moved the previous contents of {out} aside to {res.moved_aside}", markup=False,
                  soft_wrap=True)
    if res.cells_run == 0:
        con.print(f"nothing to run: all {res.cells_total} cells are already in {out / 'runs'} "
                  f"(0 simulations, {res.wall_s:.1f} s)", markup=False,
                  soft_wrap=True)
    else:
        rate = res.cells_run / res.wall_s if res.wall_s > 0 else math.nan
        con.print(f"{res.cells_run} runs ({res.cells_skipped} already done, {res.cells_total} in the selection) "
                  f"in {fmt_wall(res.wall_s)} wall ({rate:.1f} runs/s, {res.workers} {res.executor} workers); "
                  f"results in {out / 'runs'}", markup=False, soft_wrap=True)
    if not do_analyze:
        con.print(f"analysis skipped (--no-analyze); run `schedport analyze --results {out}` when ready",
                  markup=False, soft_wrap=True)
        return
    with api.analysis_outputs_cleaned(out):
        ares = api.analyze(out, out, corpus_dir=corpus)
    sel = (ares or {}).get("selection") or {}
    if sel:
        con.print(f"analysis over {len(sel['schedulers'])} schedulers x {sum(sel['windows_per_source'].values())} "
                  f"windows x {len(sel['regions'])} regions of the store (sources: {', '.join(sel['sources'])})",
                  markup=False, soft_wrap=True)
    missing = (ares or {}).get("missing_cells") or []
    if missing:
        con.print(f"analysis: {len(missing)} cell(s) of incomplete blocks (a scheduler, window or region run for "
                  f"only part of the selection) were left out; the report's notes list them, and a rerun of the "
                  f"whole selection fills them in", markup=False, soft_wrap=True)
    for name in ("portability.json", "report.html"):
        if (out / name).exists():
            con.print(f"{'analysis' if name.endswith('json') else 'report'}: {out / name}", markup=False,
                      soft_wrap=True)


def check_analysable(sel) -> None:
    """Refuse up front a selection the analysis that ends `schedport run` cannot use, instead of
    running every cell first: it ranks at least two schedulers, and its statistics are over
    windows, so some source needs `schedport.analysis.defaults.MIN_WINDOWS` windows (`sel`: a
    `schedport.study.sweep.Selection`)."""
    if len(sel.schedulers) < 2:
        raise SchedportError(f"--schedulers: the analysis that ends `run` ranks schedulers, so it needs at "
                             f"least 2 (got {', '.join(sel.schedulers)})")
    per_source: dict[str, int] = {}
    for w in sel.windows:
        per_source[w.source] = per_source.get(w.source, 0) + 1
    if not per_source or max(per_source.values()) < MIN_WINDOWS:
        raise SchedportError(f"--windows: the analysis that ends `run` needs at least {MIN_WINDOWS} windows of one "
                             f"source (its statistics are over windows); this selection has "
                             f"{max(per_source.values(), default=0)} per source")
