"""`schedport run`: the study (`schedport.api.run`: the sweep, then, unless ``--no-analyze``, the
analysis and the report of the store it wrote), its options parsed and what it did printed.

`schedport.api.run` makes every check before any work (the output directory, the engine
config's scheduler tables, a selection the analysis can use: `schedport.api.check_analysable`),
builds a missing corpus from the public data and chooses the sweep (the plain one, or one per
engine variant).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from schedport.cli.params import out_path_parser

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
    from rich.console import Console

    from schedport import api

    con = Console()
    say = lambda msg: con.print(msg, markup=False, soft_wrap=True)  # noqa: E731
    res = api.run(corpus, out, schedulers=schedulers, sources=sources, regions=regions, windows=windows, seeds=seeds,
                  engine=engine, data_dir=data_dir, quick=quick, force=force, workers=workers, executor=executor,
                  ray_address=ray_address, keep_requests=keep_requests, region_def=region_def, variants=variants,
                  analysis=do_analyze, console=con, on_swept=lambda r: _print_sweep(r, say))
    if not do_analyze:
        say(f"analysis skipped (--no-analyze); run `schedport analyze --results {out}` when ready")
        return
    ares = res.analysis.portability if res.analysis is not None else {}
    sel = ares.get("selection") or {}
    if sel:
        say(f"analysis over {len(sel['schedulers'])} schedulers x {sum(sel['windows_per_source'].values())} "
            f"windows x {len(sel['regions'])} regions of the store (sources: {', '.join(sel['sources'])})")
    missing = ares.get("missing_cells") or []
    if missing:
        say(f"analysis: {len(missing)} cell(s) of incomplete blocks (a scheduler, window or region run for "
            f"only part of the selection) were left out; the report's notes list them, and a rerun of the "
            f"whole selection fills them in")
    for name in ("portability.json", "report.html"):
        if (out / name).exists():
            say(f"{'analysis' if name.endswith('json') else 'report'}: {out / name}")


def _print_sweep(res, say) -> None:
    """The lines `run` prints when its sweep ends (a `schedport.api.RunResult` without its analysis)."""
    from schedport.study.progress import fmt_wall
    from schedport.study.variants import variants_dir

    if res.variant_set is not None:
        vs, sweeps = res.variant_set, res.variant_sweeps
        ran = sum(r.cells_run for r in sweeps)
        say(f"variants: {len(sweeps)} engines ({vs.name} v{vs.version} and the default), {ran} runs "
            f"({sum(r.cells_skipped for r in sweeps)} already done) in "
            f"{fmt_wall(res.wall_s)}; the variants' stores are in {variants_dir(res.out)}")
    sw, out = res.sweep, res.out
    for note in dict.fromkeys(r.workers_note for r in (res.variant_sweeps or (sw,)) if r.workers_note):
        say(note)
    if sw.moved_aside is not None:
        say(f"moved the previous contents of {out} aside to {sw.moved_aside}")
    if sw.cells_run == 0:
        say(f"nothing to run: all {sw.cells_total} cells are already in {out / 'runs'} "
            f"(0 simulations, {sw.wall_s:.1f} s)")
    else:
        rate = sw.cells_run / sw.wall_s if sw.wall_s > 0 else math.nan
        say(f"{sw.cells_run} runs ({sw.cells_skipped} already done, {sw.cells_total} in the selection) "
            f"in {fmt_wall(sw.wall_s)} wall ({rate:.1f} runs/s, {sw.workers} {sw.executor} workers); "
            f"results in {out / 'runs'}")
