"""One simulation of a trace already brought to its load: the engine run, the per-request table
and the run summary (`simulate_scaled`, which `schedport.engine.runner.simulate` and the
latency-anchored capacity both call), and `SimulationResult`, what a simulation returns.
"""

from __future__ import annotations

import dataclasses

import json
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable

import numpy as np

from schedport.common.atomic import atomic_write as common_atomic_write
from schedport.common.outputs import io_error
from schedport.engine.core.config import EngineConfig
from schedport.engine.inputs import check_metrics_horizon, served_trace
from schedport.engine.core.latency import make_latency_model
from schedport.engine.core.metrics import arrow_table_of, request_columns, summarize, table_of
from schedport.engine.policies.schedulers import Policy, run_counters
from schedport.engine.core.simulator import collector_paused
from schedport.engine.modes import make_simulator
from schedport.errors import SchedportError
from schedport.workload.trace import Trace

if TYPE_CHECKING:  # pandas is imported where the table is built: `save` writes it without
    import pandas as pd


class SimulationResult:
    """The outcome of one simulation: `requests` (one row per request), `summary` (run metrics) and
    the time `scale` the trace was brought to its load by.

    `requests` may be given as a function that builds the table: it is called on first access
    only, so a sweep that keeps only summaries never builds a DataFrame per run. `columns`, when
    given, are the table's columns (`table_of`'s input): `save` writes them without building the
    DataFrame, so writing a simulation's files needs no pandas.
    """

    def __init__(self, requests: pd.DataFrame | Callable[[], pd.DataFrame], summary: dict, scale: float,
                 columns: Mapping[str, np.ndarray] | None = None):
        self._requests = requests
        self._built = not callable(requests)
        self._columns = columns
        self.summary = summary
        self.scale = scale

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request (`schedport.engine.core.metrics.REQUEST_COLUMNS`, then `reject_reason`)."""
        if not self._built:
            self._requests = self._requests()
            self._built = True
        return self._requests

    def save(self, out_dir: str | Path) -> None:
        """Write `requests.parquet` and `summary.json` into `out_dir`, each atomically.

        An I/O failure (a full disk, a read-only file system, `out_dir` an existing file)
        is a one-line `SchedportError` naming the path; no temporary file is left behind.
        Until the `requests` DataFrame is built, the table is written from its columns
        (`arrow_table_of`): the same bytes, without pandas.
        """
        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise SchedportError(f"{out}: exists and is not a directory; choose another output directory")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise io_error(out, e, "create the directory") from None
        table = None if self._built or self._columns is None else arrow_table_of(self._columns)
        if table is not None:
            import pyarrow.parquet as pq

            atomic_write(out / "requests.parquet", lambda p: pq.write_table(table, p, compression="snappy"))
        else:
            atomic_write(out / "requests.parquet", lambda p: self.requests.to_parquet(p, index=False))
        atomic_write(out / "summary.json",
                      lambda p: Path(p).write_text(json.dumps(self.summary, indent=2, allow_nan=False) + "\n"))


def atomic_write(path: Path, write) -> None:
    """Write `path` through a temporary file beside it: `write(tmp)` fills the temporary file,
    which then gets the permissions a plain open() would give (mkstemp's 0600 would hide results
    from the rest of the group) and is renamed over `path`, so a reader never sees half a file.
    An OSError becomes a one-line `SchedportError` naming `path`, and the temporary file is
    removed. Every result file of a simulation, a replay or a calibration is written so."""
    try:
        common_atomic_write(path, write, durable=False)
    except OSError as e:
        raise io_error(path, e) from None


def simulate_scaled(trace: Trace, scale: float, policy: Policy, cfg: EngineConfig, *, seed: int = 0,
                    exact: bool = False, horizon_s: float | None = None,
                    progress: Callable[[float, int, int], None] | None = None,
                    advice: str = "") -> SimulationResult:
    """Simulate `trace`, already rescaled by `scale` (`schedport.engine.capacity.scaled`), under
    the declared `policy` on the resolved engine `cfg`: the rest of `schedport.engine.runner.simulate`
    (see there for the table, the summary and ``[latency] request_overhead_s``), with its
    arguments already checked. `advice` ends the error of a metrics horizon too short for any
    request (`check_metrics_horizon`): what to change, in the caller's terms.

    A trace with a warm-up (`Trace.warmup`, docs/corpus.md "Warm caches") is simulated whole, its
    warm-up first, and measured on the rest only (`measured_summary`): the table keeps every
    request and flags the warm-up in a ``warmup`` column (absent for a trace without one).
    """
    if trace.warmup >= len(trace):
        raise SchedportError(f"{trace.name}: every request is a warm-up request; a run needs at least one "
                             f"measured request")
    trace = served_trace(trace, cfg)
    lat = make_latency_model(cfg)
    alone = lat.alone_time(trace.input_tokens, trace.output_tokens) if len(trace) else np.zeros(0)
    span = trace.span_s
    check_metrics_horizon(trace, cfg, alone, advice)
    overhead = cfg.request_overhead_s
    engine_trace = trace
    if overhead:
        engine_trace = dataclasses.replace(trace, arrival_s=trace.arrival_s + overhead)
    # The run's objects are freed (`release`) before the cyclic collector is back, so they never
    # add to what its next pass walks.
    # A user's policy runs its own code in the binding and the run: what it raises there, a
    # `sys.exit` or an `os._exit` included, becomes one line naming its file (`policy.failure`).
    with collector_paused(), policy.guarded():
        sim = None
        try:
            sim = make_simulator(engine_trace, policy, cfg, lat, seed=seed, exact=exact, horizon_s=horizon_s,
                            progress=progress)
            out = sim.run()
            policy.after_run(sim)
        except (Exception, SystemExit) as e:
            err = policy.failure(e, sim)
            if err is None:
                raise
            raise err from None
        counters = {"preemptions": out.preemptions_total, "iterations": out.iterations,
                    "recomputed_tokens": out.recomputed_tokens,
                    "swapped_bytes": out.swapped_blocks * cfg.block_bytes,
                    "load_scale": scale, **run_counters(sim),
                    "host_swap_full_events": out.host_full_events,
                    "stall_recomputes": out.stall_recomputes}
        if cfg.enable_prefix_caching:
            counters.update(prefix_cache_counters(trace, out, trace.warmup))
        sim.release()
    columns = request_columns(
        arrival_s=trace.arrival_s, input_tokens=trace.input_tokens, output_tokens=trace.output_tokens,
        client_id=trace.client_id, status=out.status, first_token_s=out.first_token_s, finish_s=out.finish_s,
        preemptions=out.preemptions)
    if overhead:
        alone = alone + overhead
    if trace.warmup:
        summary = measured_summary(columns, trace.warmup, cfg, alone, counters)
        columns["warmup"] = np.arange(len(trace)) < trace.warmup
    else:
        if span > 0:
            horizon = cfg.horizon_factor * span
        else:
            fin = out.finish_s[np.isfinite(out.finish_s)]
            horizon = cfg.horizon_factor * max(float(fin.max() - trace.arrival_s[0]) if fin.size else 1.0, 1e-9)
        summary = summarize(columns, horizon_s=horizon, slo_profiles=cfg.slo_profiles, alone_s=alone,
                            counters=counters)
    reasons = out.reject_reason
    # prompt tokens found cached at a request's first admission, and tokens preemptions made it
    # compute again (after what a return found still cached), as further columns
    extra = {"cached_tokens": out.cached_tokens, "recomputed_tokens": out.recomputed}

    def table() -> pd.DataFrame:
        import pandas as pd

        t = table_of({**columns, **extra})
        # why a request was rejected at arrival (None for every other request)
        t["reject_reason"] = pd.Series([r or None for r in reasons], dtype=object, index=t.index)
        return t

    # the same columns, `reject_reason` last, for `save` to write without the DataFrame
    saved = {**columns, **extra, "reject_reason": np.array([r or None for r in reasons], dtype=object)}
    return SimulationResult(table, summary, scale, columns=saved)


def prefix_cache_counters(trace: Trace, out, warmup: int = 0) -> dict:
    """A prefix-caching run's summary figures: its hit rate (prompt tokens found cached at first
    admission over the prompt tokens of the requests admitted) and the cached tokens behind it,
    over the measured requests (those after the first `warmup`)."""
    admitted = out.status != "rejected"
    admitted[:warmup] = False
    prompt = int(trace.input_tokens[admitted].sum())
    cached = int(out.cached_tokens[admitted].sum())
    return {"prefix_cached_tokens": cached, "prefix_prompt_tokens": prompt,
            "prefix_hit_rate": cached / prompt if prompt else 0.0}


def measured_summary(columns: Mapping[str, np.ndarray], warmup: int, cfg: EngineConfig, alone: np.ndarray,
                     counters: dict) -> dict:
    """The run summary of a trace whose first `warmup` requests are a warm-up: `summarize` over the
    measured requests alone, as if they were the whole trace. Their first arrival is the time
    origin, the metrics horizon is `[metrics] horizon_factor` x their arrival span, and every
    count, latency, attainment and goodput is theirs; ``preemptions`` is the sum of their own.
    The engine's other counters (iterations, recomputed tokens, swapped bytes, ...) are the
    run's totals, warm-up included: the engine keeps them per run, not per request."""
    measured = {k: np.asarray(v)[warmup:] for k, v in columns.items()}
    arrival = measured["arrival_s"]
    span = float(arrival[-1] - arrival[0])
    if span > 0:
        horizon = cfg.horizon_factor * span
    else:
        fin = measured["finish_s"][np.isfinite(measured["finish_s"])]
        horizon = cfg.horizon_factor * max(float(fin.max() - arrival[0]) if fin.size else 1.0, 1e-9)
    counters = {**counters, "preemptions": int(measured["preemptions"].sum())}
    return summarize(measured, horizon_s=horizon, slo_profiles=cfg.slo_profiles, alone_s=alone[warmup:],
                     counters=counters)
