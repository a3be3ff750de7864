"""The public Python API: every stage of the study as a function that returns a typed result.

    >>> import schedport
    >>> from schedport.workload.examples import make_example_trace
    >>> res = schedport.simulate(make_example_trace(200), "vllm-fcfs", load=0.8)
    >>> res.summary["ttft_p99_s"], len(res.requests)

The command line (`schedport.cli`) parses its options, calls these functions and prints what
they return; every check, every piece of wiring between the stages and every choice (build a
missing corpus, run the engine variants' sweeps or the plain one) is made here, so a Python
user gets what the command gets. Each function raises the one-line errors of `schedport.errors`
on bad input and returns a frozen dataclass:

    =====================  =========================================================
    `run`                  `RunResult`: the sweep (and its variants'), the analysis
    `analyze`              `AnalysisResult`: portability.json's dict and its paths
    `report`               `ReportResult`: the pages written again
    `explain`              `ExplainResult`: an explanation, or the reversals listed
    `simulate`             `SimulationResult` (`schedport.engine.runner`)
    `replay`               `ReplayResult` (`schedport.realengine.replay`): one trace on a server
    `validate`             `ValidationResult`: validation.json's dict and its paths
    `calibrate`            `CalibrationResult`: the fitted engine config's limits and fit
    `check_policy`         `PolicyCheckResult`: a policy of your own, checked fast == exact
    `convert_trace`        `TraceConversion`: a public trace turned into the canonical one
    `trace_stats`          `TraceStats`: a canonical trace's size and token statistics
    `conformance`          `ConformanceResult`: the engine against vLLM's scheduler
    =====================  =========================================================

Where a function checks an option its error names the command's flag (``--q must be in
(0, 1)``), the keyword of the same name here. The engine's names (`capacity`, `scaled`,
`check_clock`, ...) live in `schedport.engine.runner` and are documented there: `load=RHO`
scales the trace's time axis to offered load RHO against the engine's `capacity` for that
request mix, and every number that reaches the engine is checked where it enters.

`analyze` is the study's last stage as the command line runs it: the analysis writes
``portability.json``, then the report renders it (`render_report`), so neither the sweep nor
the analysis has to call the stage after it.
"""

from __future__ import annotations

import dataclasses
import math
import time
import contextlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from schedport.common.atomic import atomic_write_text
from schedport.common.guard import (check_analysis_current, check_not_inside_store, check_same_corpus, claim_dir,
                                    claim_file, claim_names, dir_kind, dir_lock, json_with_keys, starts_with)
from schedport.common.outputs import io_error, output_dir, output_file
from schedport.engine.runner import (CAPACITY_DEFINITIONS, CAPACITY_REFERENCE, DRAIN, MAX_ARRIVAL_S,
                                     SATURATED_BATCHES, SATURATED_MAX, SIM_BYTES_PER_REQUEST,
                                     SUSTAINABLE, SimulationResult, capacity, check_clock, check_horizon,
                                     check_metrics_horizon, check_seed, check_simulation_memory,
                                     check_time_scale, load_scale, rescale, scaled, served_trace)
from schedport.engine.runner import simulate as _simulate
from schedport.errors import SchedportError

__all__ = ["CAPACITY_DEFINITIONS", "CAPACITY_REFERENCE", "DRAIN", "MAX_ARRIVAL_S", "SATURATED_BATCHES",
           "SATURATED_MAX", "SIM_BYTES_PER_REQUEST", "SUSTAINABLE",
           "SimulationResult", "capacity", "check_clock", "check_horizon", "check_metrics_horizon",
           "check_seed", "check_simulation_memory", "check_time_scale", "load_scale", "rescale", "scaled",
           "served_trace", "simulate", "unserved",
           "run", "RunResult", "check_analysable", "analyze", "AnalysisResult", "render_report", "report",
           "ReportResult", "explain", "ExplainResult", "validate", "ValidationResult", "read_predicted",
           "calibrate", "CalibrationResult", "check_policy", "PolicyCheckResult", "convert_trace",
           "TraceConversion", "trace_stats", "TraceStats", "conformance", "ConformanceResult", "replay",
           "replay_failure",
           "analysis_outputs_cleaned"]


# --------------------------------------------------------------------------- the study


@dataclass(frozen=True)
class RunResult:
    """What `run` did: the store (`out`) and its corpus (`corpus_built` when `run` built it from the
    public data first), the study's sweep (`schedport.study.sweep.SweepResult`), every engine
    variant's sweep with the default's first (empty without variants) and the variant set run
    (`schedport.study.variants.VariantSet`; `variants_from_spec` when the corpus spec named it),
    the analysis (None with ``analysis=False``) and the sweeps' wall time in seconds."""

    out: Path
    corpus: Path
    corpus_built: bool
    sweep: Any
    variant_sweeps: tuple
    variant_set: Any
    variants_from_spec: bool
    analysis: Optional["AnalysisResult"]
    wall_s: float = 0.0


def _say(console) -> Callable[[str], None]:
    """A plain-text line printer over `console` (rich's Console or anything with its `print`), or
    one that prints nothing."""
    if console is None:
        return lambda msg: None
    return lambda msg: console.print(str(msg), markup=False, soft_wrap=True)


def run(corpus="corpus", out="results", *, schedulers: str | None = None, sources: str | None = None,
        regions: str | None = None, windows: int | None = None, seeds: int = 1, engine=None, data_dir=None,
        quick: bool = False, force: bool = False, workers: int | None = None, executor: str = "local",
        ray_address: str | None = None, keep_requests: bool = False, region_def: str = "sustainable",
        variants: str | None = None, analysis: bool = True, console=None,
        on_swept: Callable[["RunResult"], None] | None = None) -> RunResult:
    """Run the study's matrix (schedulers x windows x regions x seeds) into the store `out`,
    resumable, then analyse it (`analyze`) unless `analysis` is False: `schedport run`.

    The selectors are `schedport.study.sweep.select`'s (comma-separated strings, as on the
    command line). Before any work: `out` is claimed (a store, resumed, or a new folder), the
    engine config's ``[scheduler.*]`` tables are checked against the schedulers, every variant's
    engine config is built, and, with the analysis to follow, the selection must be one it can
    use (`check_analysable`). A `corpus` that does not exist is built from the public data in
    `data_dir` first. The sweep is the plain one, or, with `variants` (a set's name or TOML) or a
    corpus spec that names a set, one sweep per engine variant (`run_variant_sweeps`).
    `console` (rich's Console, optional) gets the progress lines; `on_swept`, when given, is
    called with the result so far (no analysis yet) as soon as the sweep ends. Ctrl-C keeps every
    finished cell and raises `SweepInterrupted`.
    """
    from schedport.engine.core.config import load_engine_config
    from schedport.engine.policies.plugins import check_scheduler_tables, resolve_schedulers
    from schedport.study.sweep import load_corpus, run_sweep, select
    from schedport.study.variants import load_variant_set, run_variant_sweeps, variant_configs
    from schedport.workload import corpus as corpus_lib

    corpus, out = Path(corpus), Path(out)
    say = _say(console)
    # a store (resumed) or a new folder; never a corpus, an analysis, a cache or a run output
    claim_dir(out, {"results"}, inputs=[corpus, engine, data_dir])
    output_dir(out, create=False)  # before a corpus build or any simulation
    # the store's lock from here to the analysis, the variants' sweeps included: no other command
    # writes the store (or moves it aside with --force) between them
    with dir_lock(out, "another schedport command (a run, or an analysis) is writing this results store right "
                       "now; wait for it to finish or use another --out"):
        # every [scheduler.*] table against the policies it names, before a corpus build or any worker
        named = [n.strip() for n in (schedulers or "").split(",") if n.strip()]
        check_scheduler_tables(load_engine_config(engine), resolve_schedulers(named) if len(set(named)) == len(named)
                               else [])
        vset, from_spec = None, False
        if variants is not None:   # every variant's engine config, before a corpus build or any cell
            vset = load_variant_set(variants)
            variant_configs(vset, load_engine_config(engine))
        built = not corpus.exists()
        if built:
            output_dir(corpus, "--corpus", create=False)
            say(f"no corpus at {corpus}/: building it from the public data first")
            corpus_lib.build_corpus(spec=None, data_dir=data_dir, out=corpus, progress=say)
        if vset is None:      # a corpus spec may name the engine variants of its study (`variants = "..."`)
            spec_variants = (load_corpus(corpus).manifest.get("study") or {}).get("variants")
            if spec_variants is not None:
                vset, from_spec = load_variant_set(spec_variants), True
                variant_configs(vset, load_engine_config(engine))
                say(f"variants: {vset.name} (named by the corpus spec; --variants overrides it)")
        if analysis:
            check_analysable(select(load_corpus(corpus), schedulers=schedulers, sources=sources, regions=regions,
                                    windows=windows, seeds=seeds, quick=quick))
        opts = dict(schedulers=schedulers, sources=sources, regions=regions, windows=windows, seeds=seeds,
                    quick=quick, executor=executor, workers=workers, ray_address=ray_address,
                    keep_requests=keep_requests, force=force, region_def=region_def)
        t0 = time.perf_counter()
        if vset is not None:
            sweeps = tuple(run_variant_sweeps(corpus, out, vset, engine=engine, console=console, **opts))
        else:
            sweeps = (run_sweep(corpus, out, engine=engine, **opts),)
        res = RunResult(out, corpus, built, sweeps[0], sweeps if vset is not None else (), vset, from_spec, None,
                        time.perf_counter() - t0)
        if on_swept is not None:
            on_swept(res)
        if not analysis:
            return res
        return dataclasses.replace(res, analysis=analyze(out, out, corpus_dir=corpus))


def check_analysable(sel) -> None:
    """Refuse up front a selection the analysis that ends `schedport run` cannot use, instead of
    running every cell first: it ranks at least two schedulers, and its statistics are over
    windows, so some source needs `schedport.analysis.defaults.MIN_WINDOWS` windows (`sel`: a
    `schedport.study.sweep.Selection`)."""
    from schedport.analysis.defaults import MIN_WINDOWS

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


@dataclass(frozen=True)
class AnalysisResult:
    """An analysis written (`analyze`): ``portability.json``'s dict (`portability`; schema in
    `schedport.analysis.schema`), the folder it is in and the paths of the JSON and of the report
    rendered from it."""

    portability: dict
    out_dir: Path
    portability_json: Path
    report_html: Path


def analyze(results_dir, out_dir=None, *, validation=None, explain=None, **options) -> AnalysisResult:
    """Analyse a results store into ``portability.json`` and render it as ``report.html``.

    The study's last stage, as `schedport analyze` and `schedport run` do it: the analysis
    (`schedport.analysis.portability.analyze`, which takes the same keyword `options`:
    practical_threshold, abs_threshold, q, n_boot, seed, n_splits, metrics, corpus_dir,
    expect_corpus, compare, robustness, robustness_boot) writes the JSON into `out_dir`
    (default: `results_dir`), then `render_report` writes the report beside it.

    Checked before any work: `results_dir` is a results store; `out_dir` is new, empty, an
    earlier analysis or a folder without schedport's files (never a corpus, another store or a
    folder inside one); every option is in its range. `validation` (a ``validation.json`` path
    from ``schedport validate``, or its dict) adds the simulator-vs-real-engine section; it is
    read first, so a bad one fails before anything is written. `explain` (K, or reversal
    numbers "N1,N2,...") explains those study-form reversals first
    (`schedport.analysis.explain.add_explanations`, which adds them to ``portability.json``) so
    that the report has its "Why it flips" section. The output folder's lock
    (`schedport.common.guard.dir_lock`, the file a running `run` holds on its store) is held
    throughout; a folder locked by another process, or a write that fails, is a one-line
    `SchedportError`.
    """
    _check_analysis_target(results_dir, out_dir, [options.get("corpus_dir"), validation])
    with analysis_outputs_cleaned(out_dir if out_dir is not None else results_dir):
        check_analyze_options(results_dir, explain=explain, **options)
        res = _analyze(results_dir, out_dir, validation=validation, explain=explain, **options)
    odir = Path(out_dir if out_dir is not None else results_dir)
    return AnalysisResult(res, odir, odir / "portability.json", odir / "report.html")


def _check_analysis_target(results, out_dir, inputs) -> None:
    """The folder an analysis writes into, checked before the analysis: a folder of its own (new,
    empty, an earlier analysis, or one without schedport's files, whose report.html it will not
    overwrite), or the results store itself."""
    if out_dir is not None:
        same = results is not None and Path(results).exists() and Path(out_dir).exists() \
            and Path(out_dir).resolve() == Path(results).resolve()
        if not same:
            kind = claim_dir(out_dir, {"analysis"}, inputs=inputs)
            if kind == "other":
                claim_names(out_dir, ["report.html"])
            check_not_inside_store(out_dir, results)
        output_dir(out_dir, create=False)
    elif results is not None and Path(results).is_dir():
        if dir_kind(results) not in ("results", "empty", "other"):
            # analysis writes beside the store's parts: refuse a corpus or another kind here
            claim_dir(results, {"results"}, option="--results")
        output_dir(results)


def check_analyze_options(results, *, q: float | None = None, n_boot: int | None = None, seed: int = 0,
                          n_splits: int | None = None, practical_threshold: float | None = None,
                          abs_threshold: float | None = None, metrics: Sequence[str] | None = None,
                          explain: str | None = None, robustness_boot: int | None = None, **_) -> None:
    """Every `analyze` option checked before any work, each error naming its flag (None: the
    analysis's default, which is in range)."""
    from schedport.analysis.explain import check_results_dir, parse_selection   # numpy, pandas: on use

    check_results_dir(results)
    if q is not None and not (0 < q < 1):
        raise SchedportError(f"--q must be in (0, 1), got {q}")
    if n_boot is not None and n_boot < 1:
        raise SchedportError(f"--boot must be at least 1, got {n_boot}")
    if seed < 0:
        raise SchedportError(f"--seed must be >= 0, got {seed}")
    if n_splits is not None and n_splits < 1:
        raise SchedportError(f"--splits must be at least 1, got {n_splits}")
    if practical_threshold is not None and not (practical_threshold >= 0):
        raise SchedportError(f"--threshold must be >= 0, got {practical_threshold}")
    if abs_threshold is not None and not (0 <= abs_threshold < 1):
        raise SchedportError(f"--abs-threshold must be in [0, 1), got {abs_threshold}")
    if metrics is not None and not [m for m in metrics if str(m).strip()]:
        raise SchedportError("--metrics: empty; give metric names, or leave the option out for all")
    if explain is not None:
        if not str(explain).strip():
            raise SchedportError("--explain: empty; give K or reversal numbers N1,N2,...")
        parse_selection(explain, 10 ** 9)  # the form now; the numbers against the reversals found, later
    if robustness_boot is not None and robustness_boot < 1:
        raise SchedportError(f"--robustness-boot must be at least 1, got {robustness_boot}")


def _analyze(results_dir, out_dir=None, *, validation=None, explain=None, **options) -> dict:
    """The analysis, its explanations and the report, under the output folder's lock; the
    portability dict."""
    # the analysis and the report load scipy and matplotlib: imported on use, so that
    # `import schedport.api` for `simulate` stays ~1.1 s faster
    from schedport.analysis import portability
    from schedport.analysis.validation_stats import load_validation

    vdict = load_validation(validation) if validation is not None else None
    odir = out_dir if out_dir is not None else results_dir
    # one analysis at a time in a folder, and none while `run` writes the store there: the
    # JSON and the report must come from one store
    with dir_lock(odir, "another schedport command (an analysis, or a run writing its store) is writing "
                        "here right now; wait for it to finish or use another --out"):
        res = portability.analyze(results_dir, out_dir, **options)
        if explain:
            from schedport.analysis.explain import add_explanations

            res = add_explanations(res, results_dir, odir, explain, corpus_dir=options.get("corpus_dir"))
        render_report(res, odir, vdict)
    return res


def render_report(res: dict, out_dir, validation=None) -> Path:
    """Render a portability dict as ``report.html`` in `out_dir` (through a temporary file);
    returns its path.

    `validation` (a ``validation.json`` path or its dict, optional) adds its section. A dict of a
    schema major version this code does not read is a one-line `SchedportError`. `analyze`
    calls it last (after ``--explain`` has added its block to the dict); it also re-renders a
    saved analysis (``portability.json`` read back) byte for byte as it was rendered first.
    """
    from schedport.analysis.schema import check_version
    from schedport.analysis.validation_stats import load_validation
    from schedport.report.html import write_report   # matplotlib: imported on use, as in `analyze`

    check_version(res, Path(out_dir) / "portability.json")
    vdict = load_validation(validation) if validation is not None else None
    return write_report(res, Path(out_dir) / "report.html", vdict)


@dataclass(frozen=True)
class ReportResult:
    """The pages `report` wrote: ``report.html`` and the study's Markdown page (None where not
    asked for)."""

    html: Path | None
    study_md: Path | None


#: How a study page that `schedport report --study-md` wrote begins (report/studymd.py).
STUDY_PAGE_START = ("# The study's figures\n", "<!-- Written by `schedport report")


def report(results_dir, *, html: bool = True, study_md=None, command: str = "schedport report") -> ReportResult:
    """Write a store's pages again from its saved ``portability.json``, recomputing nothing:
    ``report.html`` beside it (with `html`) and, with `study_md` (a path), the study's figures as
    Markdown (`schedport.report.studymd`), stamped with the digest of the store's cells and of the
    portability.json read and with `command`, so a page in the docs always names the store it
    shows. `study_md` is checked first: a writable path, never inside a store or a corpus, and
    never a file other than a study page this function wrote; an analysis older than the store's
    cells is refused (`schedport.common.guard.check_analysis_current`). The store's lock is held
    from the first read to the last write. A missing or unreadable portability.json, one of an
    unknown schema major version or one that breaks the shipped schema
    (`schedport.analysis.schema`), or a store without results, is a one-line `SchedportError`."""
    import hashlib

    from schedport.analysis.reader import read_portability_bytes

    results_dir = Path(results_dir)
    if study_md is not None:   # a page this command wrote, or a new one; never inside a store or a corpus
        study_md = Path(study_md)
        claim_file(study_md, made_by=starts_with(*STUDY_PAGE_START), command="schedport report --study-md",
                   inputs=[results_dir], option="--study-md")
        output_file(study_md, option="--study-md")
    path = results_dir / "portability.json"
    out: dict[str, Path | None] = {"html": None, "study_md": None}
    with dir_lock(results_dir, "another schedport command (an analysis, or a run writing its store) is writing "
                               "here right now; wait for it to finish"):
        # the one checked reader: its major version, its structure against the shipped schema
        res, raw = read_portability_bytes(path, hint=" first", store=None)
        if study_md is not None:
            from schedport.report.studymd import study_markdown
            from schedport.study.digest import cells_digest

            check_analysis_current(res, results_dir, path)   # the stamp names the cells the page shows
            digest, n = cells_digest(results_dir / "runs")
            stamp = {"cells_sha256": digest, "n_cells": n, "portability_sha256": hashlib.sha256(raw).hexdigest(),
                     "command": command}
            try:
                text = study_markdown(res, stamp)
            except (KeyError, TypeError, IndexError) as e:
                raise SchedportError(f"{path}: lacks a field the study page needs ({type(e).__name__}: {e}); "
                                     "analyse the store again with this version") from None
            try:
                atomic_write_text(study_md, text)
            except OSError as e:
                raise io_error(study_md, e) from None
            out["study_md"] = study_md
        if html:
            try:
                out["html"] = render_report(res, results_dir)
            except (KeyError, TypeError, IndexError) as e:
                raise SchedportError(f"{path}: lacks a field the report needs ({type(e).__name__}: {e}); "
                                     "analyse the store again with this version") from None
    return ReportResult(out["html"], out["study_md"])


@contextmanager
def analysis_outputs_cleaned(out_dir):
    """Run the analysis writing into `out_dir`; if a write fails (a full disk, say), report the
    I/O error as one line naming the path. Nothing half-written is left behind: every file the
    analysis and the report write goes through `schedport.common.atomic`, which removes its
    temporary file on failure."""
    d = Path(out_dir) if out_dir is not None else None
    try:
        yield
    except OSError as e:
        raise io_error(getattr(e, "filename", None) or d, e, "write the analysis") from None


# --------------------------------------------------------------------------- why a ranking flips


@dataclass(frozen=True)
class ExplainResult:
    """What `explain` found: the explanation (`schedport.analysis.explain.explain`'s dict: the
    comparison, each feature's transplant, the verdict and `run_info`) and the file it was written
    to (None: not written); or, with ``list_only``, the study form's reversals, numbered,
    strongest first, and no explanation."""

    explanation: dict | None
    out: Path | None
    reversals: tuple = ()


def explain(results, *, reversal: int | None = None, pair: str | None = None, metric: str | None = None,
            region: str | None = None, sources: str | None = None, out=None, list_only: bool = False,
            corpus_dir=None, cache_dir=None, features: Sequence[str] | None = None, workers: int | None = None,
            executor: str = "local", ray_address: str | None = None, n_boot: int | None = None,
            seed: int = 0) -> ExplainResult:
    """Explain why a ranking flips (`schedport explain`): run the scheduler pair on hybrid windows
    that each take one traffic feature from the other source, and name the feature whose
    transplant reproduces the flip (`schedport.analysis.explain.explain`, whose arguments these
    are). The reversal is a number of the study form's (`reversal`, see ``list_only``) or given
    as `pair`, `metric`, `region` and `sources`.

    Checked before any work: `results` is a results store, `out` a file that is none of the
    inputs, `cache_dir` a folder of explain runs (default: RESULTS/explain), `seed` >= 0, `n_boot`
    >= 1 and `features` not empty. With `out` the explanation is written there as JSON
    (atomically). With `list_only` nothing is run: the result lists the reversals. Ctrl-C keeps
    every finished run in the cache.
    """
    import json

    from schedport.analysis.explain import (DEFAULT_BOOT, check_results_dir, ranked_reversals,
                                            read_portability)
    from schedport.analysis.explain import explain as _explain

    n_boot = DEFAULT_BOOT if n_boot is None else n_boot
    check_results_dir(results)
    out = Path(out) if out is not None else None
    if out is not None and out.exists() and out.is_dir():
        raise SchedportError(f"--out: {out} is a directory; give a file name (FILE.json)")
    if seed < 0:
        raise SchedportError(f"--seed must be >= 0, got {seed}")
    if n_boot < 1:
        raise SchedportError(f"--boot must be at least 1, got {n_boot}")
    if features is not None and not [f for f in features if str(f).strip()]:
        raise SchedportError("--features: empty; give feature names, or leave the option out for all")
    if out is not None:   # a file this command wrote, or a new one; never inside a corpus or a store
        claim_file(out, made_by=json_with_keys("verdict", "run_info"), command="schedport explain --out",
                   inputs=[results, corpus_dir])
        output_file(out)
    if cache_dir is not None:
        claim_dir(cache_dir, {"explain"}, option="--cache", allow_other=False, inputs=[corpus_dir], own=results)
    if list_only:
        return ExplainResult(None, None, tuple(ranked_reversals(read_portability(results, hint=" first",
                                                                                 store=results))))
    # the default cache is the store's own folder (RESULTS/explain): the store's lock while it is written
    hold = (dir_lock(results, "another schedport command (a run, or an analysis) is writing this results store "
                              "right now; wait for it to finish") if cache_dir is None else contextlib.nullcontext())
    with hold:
        d = _explain(results, reversal=reversal, pair=pair, metric=metric, region=region, sources=sources,
                     corpus_dir=corpus_dir, cache_dir=cache_dir, features=list(features) if features else None,
                     executor=executor, workers=workers, ray_address=ray_address, n_boot=n_boot, seed=seed)
    if out is not None:
        try:
            atomic_write_text(out, json.dumps(d, indent=1, allow_nan=False) + "\n")
        except OSError as e:
            raise io_error(out, e) from None
    return ExplainResult(d, out)


# --------------------------------------------------------------------------- one trace


def simulate(trace, scheduler, engine=None, load: float | None = None, seed: int = 0, *, exact: bool = False,
             horizon_s: float | None = None, time_scale: float | None = None,
             progress: Callable[[float, int, int], None] | None = None, region_def: str | None = None,
             check_tables: bool = True, out_dir=None) -> SimulationResult:
    """Simulate `trace` under `scheduler` on `engine`; return the per-request table and summary
    (`schedport.engine.runner.simulate`, whose arguments these are).

    With `out_dir`, the run's ``requests.parquet`` and ``summary.json`` are written there, as
    `schedport simulate --out` writes them: the folder is claimed before the trace is read (new,
    empty, or an earlier run's output; never one of the inputs), and a write that fails is a
    one-line error. `horizon_s` must be positive and finite, and `region_def` says what `load`
    is relative to, so it needs `load`. A run whose every request was rejected is returned as it
    is; `unserved` says so in one line.
    """
    if horizon_s is not None and not (horizon_s > 0 and math.isfinite(horizon_s)):
        raise SchedportError(f"--horizon must be a positive, finite number of seconds, got {horizon_s}")
    if out_dir is not None:
        claim_dir(out_dir, {"run"}, inputs=[trace if isinstance(trace, (str, Path)) else None,
                                            engine if isinstance(engine, (str, Path)) else None])
        output_dir(out_dir, create=False)
    if region_def is not None and load is None:
        raise SchedportError("--region-def says what --load is relative to; give --load too")
    res = _simulate(trace, scheduler, engine=engine, load=load, seed=seed, exact=exact, horizon_s=horizon_s,
                    time_scale=time_scale, progress=progress, region_def=region_def, check_tables=check_tables)
    if out_dir is not None:
        res.save(out_dir)
    return res


def unserved(result: SimulationResult, trace="the trace") -> str | None:
    """One line when `result` served nothing (every request rejected at arrival: the lengths do not
    fit the engine), naming `trace` and the first reason; None when some request was admitted.
    `schedport simulate` ends with this as its error, after writing the files."""
    s = result.summary
    if not (s["n_requests"] and s["n_rejected"] == s["n_requests"]):
        return None
    reasons = result.requests.reject_reason.dropna()
    why = f" (first: {reasons.iloc[0]})" if len(reasons) else ""
    return (f"{trace}: all {s['n_requests']} requests were rejected at arrival{why}; the files are written, but "
            f"nothing was served (check the lengths against [engine] max_model_len)")


@dataclass(frozen=True)
class TraceStats:
    """A canonical trace's size and token statistics (`trace_stats`); `rate_rps` is NaN for a trace
    of one instant."""

    path: Path
    n_requests: int
    span_s: float
    rate_rps: float
    input_mean: float
    input_p99: float
    output_mean: float
    output_p99: float


def trace_stats(path) -> TraceStats:
    """Read and validate the canonical trace at `path` (`schedport.workload.trace.load_trace`: a bad
    row is a one-line `TraceError`) and return its statistics, as `schedport trace check` prints
    them."""
    import numpy as np

    from schedport.workload.trace import load_trace

    t = load_trace(path)
    rate = (len(t) - 1) / t.span_s if t.span_s > 0 else float("nan")
    return TraceStats(Path(path), len(t), float(t.span_s), float(rate), float(t.input_tokens.mean()),
                      float(np.percentile(t.input_tokens, 99)), float(t.output_tokens.mean()),
                      float(np.percentile(t.output_tokens, 99)))


def is_trace_file(path) -> bool:
    """A canonical trace that `example` or `convert_trace` may replace (`claim_file`'s test)."""
    from schedport.workload.trace import is_canonical_trace_file

    return is_canonical_trace_file(path)


@dataclass(frozen=True)
class TraceConversion:
    """What `convert_trace` wrote: the canonical file, its requests, the rows dropped per reason
    (every reason the adapter checks, 0 included) and the things skipped as a whole (one line
    each, "name: why"); `prefix`, for a prefix identity derived from sessions, the record of that
    assumption (`schedport.workload.prefix.session_prefix_record`), else None."""

    out: Path
    n_requests: int
    dropped: dict
    skipped: tuple
    prefix: dict | None = None


def convert_trace(inputs, fmt: str, out, *, start_s: float | None = None, duration_s: float | None = None,
                  rows: int | None = None, slot_s: int | None = None, seed: int = 0,
                  rate_scale: float = 1.0, prefix: str | None = None) -> TraceConversion:
    """Turn public trace file(s) `inputs` of format `fmt` (azure, burstgpt, servegen, jsonl,
    canonical: `schedport.workload.sources`) into the canonical trace at `out` (CSV or Parquet).

    The selection is a window (`start_s`, `duration_s`, seconds from the file's start) or the
    first `rows` requests; servegen generates the 600 s slot starting at `slot_s` with `seed`,
    every client's rate times `rate_scale`. ``prefix="sessions"`` (burstgpt only) derives the
    prefix identity from the files' sessions, an assumption the result's `prefix` records
    (docs/corpus.md, "Prefix identity from sessions"). `out` is checked first: never one of the
    inputs, never inside a corpus or a results store. A selection with no usable request writes
    nothing and is a one-line error.
    """
    from schedport.workload import sources
    from schedport.workload.trace import save_trace

    paths = [Path(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    if prefix is not None and prefix != "none" and fmt != "burstgpt":
        raise SchedportError(f"--prefix {prefix} needs --from burstgpt (a source with session ids), not {fmt}")
    claim_file(out, made_by=is_trace_file, command="schedport trace convert", inputs=paths)
    output_file(out)
    sel = {k: v for k, v in dict(start_s=start_s, duration_s=duration_s, rows=rows).items() if v is not None}
    if fmt == "servegen":
        if slot_s is None:
            raise SchedportError("--from servegen needs --slot SECONDS (the 600 s window to generate)")
        sel = {"slot_start_s": slot_s, "seed": seed, "rate_scale": rate_scale}
    if prefix is not None:
        sel["prefix"] = prefix
    res = sources.read(fmt, paths, **sel)
    if len(res.trace) == 0:
        raise SchedportError(f"{paths[0]}: the selection holds no usable request")
    save_trace(res.trace, out)
    return TraceConversion(Path(out), len(res.trace), dict(res.dropped), tuple(res.skipped), res.prefix)


# --------------------------------------------------------------------------- a policy of your own


@dataclass(frozen=True)
class PolicyCheckResult:
    """A policy loaded and checked (`check_policy`): its name and one-line summary, where it came
    from ("built-in", or its kind, spec and the first 12 hex digits of its source's sha256) and
    what the check ran (`schedport.engine.policycheck.PolicyCheck`; `.summary()` in one line)."""

    name: str
    summary: str
    origin: str
    check: Any


def check_policy(spec, engine=None) -> PolicyCheckResult:
    """Load the policy `spec` names (FILE.py:NAME, module:NAME or a name) and check it: the example
    trace simulated at rho 0.5, 1 and 1.6 and on a tight KV pool, fast and stepping every
    iteration, must agree bit for bit (`schedport.engine.policycheck.check_policy`); any
    difference, or a key or hook that breaks the policy contract, is a one-line `PolicyError`."""
    from schedport.engine.policies.plugins import get_scheduler, source_of
    from schedport.engine.policycheck import check_policy as _check

    pol = get_scheduler(spec)
    src = source_of(pol)
    origin = "built-in" if src is None else f"{src.kind} {src.spec}, sha256 {src.sha256[:12]}"
    return PolicyCheckResult(pol.name, pol.summary, origin, _check(pol, engine=engine))


# --------------------------------------------------------------------------- a real server


def replay(endpoint: str, trace, out_dir=None, *, engine=None, scheduler: str = "vllm-fcfs", load: float | None = None,
           seed: int = 0, model: str | None = None, request_timeout_s: float = 600.0, max_lag_s: float = 0.05,
           retries: int = 2, log: Callable[[str], None] = lambda s: None,
           on_progress: Callable[[int, int], None] | None = None):
    """Replay the canonical trace `trace` against the streaming server at `endpoint`, open loop,
    under `scheduler` (as vLLM priorities), scaled to offered load `load` against `engine` (the
    server's calibrated config): `schedport replay`; `schedport.realengine.replay.replay`. With
    `out_dir` (claimed before the trace is read) the same files as `simulate` are written there.
    Returns the `ReplayResult` (`requests`, `summary`, `lag_ok`, `server`); `replay_failure`
    says in one line when its measurements are of failures rather than of the server."""
    from schedport.realengine.replay import replay as _replay
    from schedport.workload.trace import load_trace

    if out_dir is not None:
        claim_dir(out_dir, {"run"}, inputs=[trace, engine if isinstance(engine, (str, Path)) else None])
        output_dir(out_dir, create=False)
    res = _replay(load_trace(trace), endpoint, engine=engine, scheduler=scheduler, load=load, seed=seed, model=model,
                  request_timeout_s=request_timeout_s, max_lag_s=max_lag_s, retries=retries, log=log,
                  on_progress=on_progress)
    if out_dir is not None:
        res.save(out_dir)
    return res


def replay_failure(result, endpoint: str) -> str | None:
    """One line when a replay's `result` measures failures, not the server (no request completed,
    or more than half failed: errors and timeouts), naming the first failed request; else None.
    `schedport replay` ends with this as its error, after writing the files."""
    s = result.summary
    failed = s["n_requests"] - s["n_completed"] - s["n_rejected"]
    if not (s["n_completed"] == 0 or failed > s["n_requests"] / 2):
        return None
    t = result.requests
    bad = t[~t.status.isin(["completed", "rejected"])]
    first = f" (first: request {int(bad.index[0])}, {bad.status.iloc[0]}: {bad.detail.iloc[0]})" if len(bad) else ""
    return (f"{endpoint}: {s['n_completed']} of {s['n_requests']} requests completed and {failed} "
            f"failed{first}; the files are written, but they measure failures, not the server")


@dataclass(frozen=True)
class ValidationResult:
    """A validation run (`validate`): ``validation.json``'s dict (`validation`), the folder and the
    paths of its JSON and HTML, the predicted check it tested (`read_predicted`; None without
    one), and whether every replay kept to its schedule (`lag_ok`; when not, those runs do not
    replay the trace faithfully)."""

    validation: dict
    out_dir: Path
    validation_json: Path
    validation_html: Path
    predicted: dict | None
    lag_ok: bool


def read_predicted(path, corpus=None) -> dict:
    """The predicted check in an analysis (``portability.json`` of a store run with variants) at
    `path`: its strongest reversal and most stable ranking, with the schedulers, regions and
    sources that test them (`schedport.realengine.validate.predicted_check`); one line when it
    holds none, or when it analyses a store of another corpus than `corpus` (when given)."""
    from schedport.analysis.reader import read_portability
    from schedport.realengine.validate import predicted_check

    res = read_portability(path)
    if corpus is not None:   # what it predicts was measured on that corpus's windows
        check_same_corpus(res, corpus, path)
    return predicted_check(res, str(path))


def validate(endpoint: str, engine, out_dir, *, traces: Sequence | None = None, corpus=None, windows: int = 3,
             max_requests: int | None = None, schedulers: str | Sequence[str] = "vllm-fcfs,sjf,spf,edf",
             regions: str = "light,moderate,high", seed: int = 0, model: str | None = None,
             threshold: float = 0.05, request_timeout_s: float = 600.0, max_lag_s: float = 0.05,
             retries: int = 2, repeats: int = 1, speed_probe: bool = True, predicted=None,
             min_completed: float = 0.5, log: Callable[[str], None] = lambda s: None) -> ValidationResult:
    """Simulate and replay the same runs on the real server at `endpoint` and compare what they
    rank (`schedport validate`; `schedport.realengine.validate.validate`, docs/validation.md).

    The runs are over `traces` (canonical trace files) or `windows` windows of `corpus`, one of
    the two; each cut to its first `max_requests` requests when given; under `schedulers` (names,
    or one comma-separated string) at `regions` ("name" or "name=rho", comma-separated).
    `engine` is the server's calibrated engine config (`calibrate`). `predicted` (an analysis's
    portability.json path, or the dict `read_predicted` gives) replaces the schedulers and
    regions with exactly those its strongest reversal and most stable ranking name, and the
    corpus sources with theirs. With `speed_probe` a lone prompt is timed before each replay.
    `out_dir` (runs/, validation.json, validation.html) is claimed first. A validation whose
    replays did not complete (fewer than `min_completed` of a replay's requests) is a one-line
    `SchedportError`: the rankings of timeouts are not the server's. `log` gets progress lines.
    """
    from schedport.realengine.validate import NamedTrace, completion_error, corpus_traces, head
    from schedport.realengine.validate import validate as _validate
    from schedport.study.regions import parse_regions
    from schedport.workload.trace import load_trace

    if (traces is None) == (corpus is None):
        raise SchedportError("give either --trace FILE (repeatable) or --corpus DIR, not both or neither")
    trace_paths = [Path(p) for p in traces] if traces is not None else []
    claim_dir(out_dir, {"validation"}, inputs=[engine, corpus, *trace_paths])
    output_dir(out_dir, create=False)
    check = None
    if predicted is not None:
        check = predicted if isinstance(predicted, dict) else read_predicted(predicted, corpus)
        schedulers, regions = list(check["schedulers"]), ",".join(f"{k}={v}" for k, v in check["regions"].items())
    if corpus is not None:
        named = corpus_traces(corpus, windows, check["sources"] if check else None)
    else:
        named = [NamedTrace(p.stem, load_trace(p)) for p in trace_paths]
    named = [NamedTrace(t.name, head(t.trace, max_requests)) for t in named]
    names = schedulers.split(",") if isinstance(schedulers, str) else list(schedulers)
    scheds = [s.strip() for s in names if s.strip()]
    probe = None
    if speed_probe:
        from functools import partial

        from schedport.engine.core.config import load_engine_config
        from schedport.realengine.calibrate import speed_index

        probe = partial(speed_index, endpoint, load_engine_config(engine), model=model)
    res = _validate(endpoint, named, out_dir, engine=engine, schedulers=scheds, regions=parse_regions(regions),
                    seed=seed, model=model, threshold=threshold, request_timeout_s=request_timeout_s,
                    max_lag_s=max_lag_s, retries=retries, repeats=repeats, speed_probe=probe,
                    min_completed=min_completed, log=log, predicted=check)
    failed = completion_error(res, endpoint)
    if failed:   # the rankings of timeouts are not the server's
        raise SchedportError(failed)
    d = Path(out_dir)
    return ValidationResult(res, d, d / "validation.json", d / "validation.html", check, bool(res["lag_ok"]))


@dataclass(frozen=True)
class CalibrationResult:
    """A calibration (`calibrate`): the engine config written (`out`), the server's model, its
    limits and where each came from, the latency fit (coefficients, R^2, errors:
    `schedport.realengine.calibrate.Fit`) and the whole `Calibration` (probes included)."""

    out: Path
    model: str
    limits: dict
    sources: dict
    fit: Any
    calibration: Any


#: The engine limits `calibrate` takes as known instead of probing them.
CALIBRATE_LIMITS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "num_gpu_blocks")


def calibrate(endpoint: str, out, *, model: str | None = None, repeats: int = 5, seed: int = 0,
              request_timeout_s: float = 300.0, log: Callable[[str], None] = lambda s: None,
              **known: int | None) -> CalibrationResult:
    """Probe the running server at `endpoint`, fit the simulator's linear latency model and engine
    limits to it, and write them as the engine config TOML `out` (`schedport calibrate`;
    `schedport.realengine.calibrate.calibrate`). `known` limits (max_num_seqs,
    max_num_batched_tokens, max_model_len, block_size, num_gpu_blocks: positive integers) are
    taken as given instead of probed. `out` is checked first (never inside a corpus or a store).
    Each probe runs `repeats` times in an order shuffled with `seed`; no probe may take longer
    than `request_timeout_s`. `log` gets progress lines.
    """
    from schedport.realengine.calibrate import calibrate as _calibrate

    unknown = sorted(set(known) - set(CALIBRATE_LIMITS))
    if unknown:
        raise SchedportError(f"calibrate: unknown limit {unknown[0]!r}; known: {', '.join(CALIBRATE_LIMITS)}")
    given = {k: known.get(k) for k in CALIBRATE_LIMITS}
    for key, v in given.items():
        if v is not None and v < 1:
            raise SchedportError(f"--{key.replace('_', '-')} must be a positive integer, got {v}")
    claim_file(out, made_by=starts_with("# Engine config calibrated by `schedport calibrate`"),
               command="schedport calibrate")
    output_file(out)
    cal = _calibrate(endpoint, out, model=model, repeats=repeats, seed=seed, overrides=given,
                     request_timeout_s=request_timeout_s, log=log)
    return CalibrationResult(Path(out), cal.server.model, dict(cal.limits), dict(cal.sources), cal.fit, cal)


@dataclass(frozen=True)
class ConformanceResult:
    """What `conformance` compared: vLLM's version, one `schedport.realengine.conformance.CaseResult`
    per (case, mode), and whether every one was identical step for step (`agrees`)."""

    vllm_version: str
    results: tuple
    agrees: bool
    corpus_built: bool = False


def conformance(corpus="corpus", *, trace=None, schedulers: str = "vllm-fcfs", load: float | None = None,
                engine=None, cases: str | None = None, modes: str | Sequence[str] = ("exact", "fast"),
                vllm_python=None, data_dir=None, out=None, console=None) -> ConformanceResult:
    """Check the engine against vLLM's real v1 scheduler, step for step (`schedport conformance`;
    `schedport.realengine.conformance`, docs/validation.md).

    The standard cases on `corpus` (built from the public data in `data_dir` first when it does
    not exist), only those whose name contains one of `cases` (comma-separated) when given; or,
    with `trace`, that trace under each of `schedulers` (comma-separated: ones vLLM's policies
    run) at offered load `load` (default: its own time axis). `modes` are the simulator's
    (exact, fast). With `out` the per-case results are also written there as JSON. `console`
    (rich's Console, optional) gets the progress lines. A difference is a result
    (``agrees=False``), not an error.
    """
    import json

    from schedport.engine.core.config import load_engine_config
    from schedport.realengine.conformance import Case, run_conformance, standard_cases, vllm_policy
    from schedport.workload import corpus as corpus_lib
    from schedport.workload.trace import load_trace

    say = _say(console)
    names = modes.split(",") if isinstance(modes, str) else list(modes)
    mode_list = tuple(m.strip() for m in names if m.strip())
    if not mode_list or any(m not in ("exact", "fast") for m in mode_list):
        raise SchedportError(f"--mode: must be exact, fast or exact,fast, got {','.join(names)!r}")
    cfg = load_engine_config(engine)
    out = Path(out) if out is not None else None
    if out is not None and out.is_dir():
        raise SchedportError(f"--out {out}: is a directory, not a file")
    if out is not None:   # a file this command wrote, or a new one; never inside a corpus or a store
        claim_file(out, made_by=json_with_keys("vllm_version", "results"), command="schedport conformance --out",
                   inputs=[corpus, trace])
        output_file(out)
    built = False
    if trace is not None:
        if load is not None and not (load > 0 and math.isfinite(load)):
            raise SchedportError(f"--load must be a positive finite number, got {load}")
        tr = scaled(load_trace(trace), cfg, load=load)[0]
        scheds = [s.strip() for s in schedulers.split(",") if s.strip()]
        for s in scheds:
            vllm_policy(s)     # a one-line error for a scheduler vLLM's policies cannot run
        todo = [Case(f"{s}/{Path(trace).name}" + (f"/rho{load}" if load else ""), tr, s, cfg) for s in scheds]
    else:
        corpus = Path(corpus)
        if not corpus.exists():
            say(f"corpus {corpus} not found: building it from the public data first")
            corpus_lib.build_corpus(spec=None, data_dir=data_dir, out=corpus)
            built = True
        todo = standard_cases(corpus_lib.load_corpus(corpus), cfg)
        if cases:
            keys = [c.strip() for c in cases.split(",") if c.strip()]
            todo = [c for c in todo if any(k in c.name for k in keys)]
            if not todo:
                raise SchedportError(f"--cases {cases!r}: no standard case matches")
    results = run_conformance(todo, vllm_python, mode_list, progress=say)
    version = results[0].vllm_version if results else "?"
    if out is not None:
        try:
            atomic_write_text(out, json.dumps({"vllm_version": version, "results": [r.to_dict() for r in results]},
                                              indent=1))
        except OSError as e:
            raise SchedportError(f"--out {out}: cannot write: {e.strerror or e}") from None
    return ConformanceResult(version, tuple(results), all(r.agrees for r in results), built)
