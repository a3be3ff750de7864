"""The public Python API: simulate one trace under one scheduler, get the per-request table and summary.

    >>> import schedport
    >>> from schedport.workload.examples import make_example_trace
    >>> res = schedport.simulate(make_example_trace(200), "vllm-fcfs", load=0.8)
    >>> res.summary["ttft_p99_s"], len(res.requests)

The names here are the stable surface; they live in `schedport.engine.runner` (one trace
through one engine) and are documented there: `load=RHO` scales the trace's time axis to offered
load RHO against the engine's `capacity` for that request mix, and every number that reaches
the engine is checked where it enters (`check_clock`, `check_metrics_horizon`).
"""

from __future__ import annotations

from contextlib import contextmanager, suppress
from pathlib import Path

from schedport.engine.runner import (CAPACITY_DEFINITIONS, CAPACITY_REFERENCE, DRAIN, MAX_ARRIVAL_S,
                                     SUSTAINABLE, SimulationResult, capacity, check_clock, check_horizon,
                                     check_metrics_horizon, check_seed, check_simulation_memory,
                                     check_time_scale, load_scale, rescale, scaled, served_trace, simulate)

__all__ = ["CAPACITY_DEFINITIONS", "CAPACITY_REFERENCE", "DRAIN", "MAX_ARRIVAL_S", "SUSTAINABLE",
           "SimulationResult", "capacity", "check_clock", "check_horizon", "check_metrics_horizon",
           "check_seed", "check_simulation_memory", "check_time_scale", "load_scale", "rescale", "scaled",
           "served_trace", "simulate"]


def analyze(results_dir, out_dir=None, **options) -> dict:
    """Analyse a results store into ``portability.json`` and render it as ``report.html``.

    The study's last stage, as `schedport analyze` and `schedport run` do it: the analysis
    (`schedport.analysis.portability.analyze`, which takes the same keyword options) writes the
    JSON; the report renders it. Returns the portability dict.
    """
    from schedport.analysis.portability import analyze as compute

    return compute(results_dir, out_dir, **options)


#: The files `schedport.analysis.portability.analyze` writes through a temporary name in its output directory.
ANALYSIS_TEMP_FILES = ("portability.json.tmp", "report.html.tmp")


@contextmanager
def analysis_outputs_cleaned(out_dir):
    """Run the analysis writing into `out_dir`; if it fails (a full disk, say), remove the
    temporary files it leaves there, so a failed write leaves nothing half-written behind
    and the I/O error is reported as one line naming the path."""
    from schedport.common.outputs import io_error

    d = Path(out_dir) if out_dir is not None else None
    try:
        yield
    except BaseException as e:
        if d is not None:
            for name in ANALYSIS_TEMP_FILES:
                with suppress(OSError):
                    (d / name).unlink()
        if isinstance(e, OSError):
            raise io_error(getattr(e, "filename", None) or d, e, "write the analysis") from None
        raise


