"""The public Python API: simulate one trace under one scheduler, get the per-request table and summary.

    >>> import schedport
    >>> from schedport.workload.examples import make_example_trace
    >>> res = schedport.simulate(make_example_trace(200), "vllm-fcfs", load=0.8)
    >>> res.summary["ttft_p99_s"], len(res.requests)

The names here are the stable surface; they live in `schedport.engine.runner` (one trace
through one engine) and are documented there: `load=RHO` scales the trace's time axis to offered
load RHO against the engine's `capacity` for that request mix, and every number that reaches
the engine is checked where it enters (`check_clock`, `check_metrics_horizon`).

`analyze` is the study's last stage as the command line runs it: the analysis writes
``portability.json``, then the report renders it (`render_report`), so neither the sweep nor
the analysis has to call the stage after it.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from schedport.common.atomic import atomic_write_text
from schedport.common.guard import check_analysis_current, dir_lock
from schedport.common.outputs import io_error
from schedport.engine.runner import (CAPACITY_DEFINITIONS, CAPACITY_REFERENCE, DRAIN, MAX_ARRIVAL_S,
                                     SATURATED_BATCHES, SATURATED_MAX, SIM_BYTES_PER_REQUEST,
                                     SUSTAINABLE, SimulationResult, capacity, check_clock, check_horizon,
                                     check_metrics_horizon, check_seed, check_simulation_memory,
                                     check_time_scale, load_scale, rescale, scaled, served_trace, simulate)

__all__ = ["CAPACITY_DEFINITIONS", "CAPACITY_REFERENCE", "DRAIN", "MAX_ARRIVAL_S", "SATURATED_BATCHES",
           "SATURATED_MAX", "SIM_BYTES_PER_REQUEST", "SUSTAINABLE",
           "SimulationResult", "capacity", "check_clock", "check_horizon", "check_metrics_horizon",
           "check_seed", "check_simulation_memory", "check_time_scale", "load_scale", "rescale", "scaled",
           "served_trace", "simulate"]


def analyze(results_dir, out_dir=None, *, validation=None, explain=None, **options) -> dict:
    """Analyse a results store into ``portability.json`` and render it as ``report.html``.

    The study's last stage, as `schedport analyze` and `schedport run` do it: the analysis
    (`schedport.analysis.portability.analyze`, which takes the same keyword `options`)
    writes the JSON into `out_dir` (default: `results_dir`), then `render_report` writes the
    report beside it. `validation` (a ``validation.json`` path from ``schedport validate``, or
    its dict) adds the simulator-vs-real-engine section; it is read first, so a bad one fails
    before anything is written. `explain` (K, or reversal numbers "N1,N2,...") explains those
    study-form reversals first (`schedport.analysis.explain.add_explanations`, which adds them
    to ``portability.json``) so that the report has its "Why it flips" section. Returns the
    portability dict. The output folder's lock (`schedport.common.guard.dir_lock`, the file a
    running `run` holds on its store) is held throughout; a folder locked by another process
    is a one-line `SchedportError`.
    """
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


def report(results_dir, *, html: bool = True, study_md=None, command: str = "schedport report") -> dict:
    """Write a store's pages again from its saved ``portability.json``, recomputing nothing:
    ``report.html`` beside it (with `html`) and, with `study_md` (a path), the study's figures as
    Markdown (`schedport.report.studymd`), stamped with the digest of the store's cells and of the
    portability.json read, so a page in the docs always names the store it shows (an analysis
    older than the store's cells is refused: `schedport.common.guard.check_analysis_current`). The
    store's lock is held from the first read to the last write. Returns
    {"html": path or None, "study_md": path or None}. A missing or unreadable portability.json,
    one of an unknown schema major version or one that breaks the shipped schema
    (`schedport.analysis.schema`), or a store without results, is a one-line `SchedportError`."""
    import hashlib

    from schedport.analysis.reader import read_portability_bytes
    from schedport.errors import SchedportError

    results_dir = Path(results_dir)
    path = results_dir / "portability.json"
    out = {"html": None, "study_md": None}
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
            out["study_md"] = Path(study_md)
        if html:
            try:
                out["html"] = render_report(res, results_dir)
            except (KeyError, TypeError, IndexError) as e:
                raise SchedportError(f"{path}: lacks a field the report needs ({type(e).__name__}: {e}); "
                                     "analyse the store again with this version") from None
    return out


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


