"""The public Python API: simulate one trace under one scheduler, get the per-request table and summary.

    >>> import schedport
    >>> from schedport.workload.examples import make_example_trace
    >>> res = schedport.simulate(make_example_trace(200), "vllm-fcfs", load=0.8)
    >>> res.summary["ttft_p99_s"], len(res.requests)

`load=RHO` brings the trace to offered load RHO against the engine's capacity for that
request mix (`capacity`): the time axis is scaled, so the trace keeps its burst shape.

`[latency] request_overhead_s` (default 0) is a fixed time per request spent outside the
engine loop (HTTP parsing, input processing, output streaming): `simulate` lets each
request enter the engine's waiting queue that long after its arrival and measures its
latencies from the arrival, so TTFT and E2E include it.  It is not a cost of the engine,
so it does not change `capacity`.

Every number that reaches the engine is checked where it enters (`check_clock`): the time
scale must be positive and finite, and the scaled arrivals finite, below `MAX_ARRIVAL_S`
(2^32 s, where float64 seconds still resolve a microsecond) and as distinct from one another
as in the trace itself, so a load or scale that would lose the resolution of the trace's own
timestamps is refused with the reason instead of simulating a clock that cannot tick. The
metrics horizon (`[metrics] horizon_factor` x the arrival span) must be long enough for at
least one request to complete alone on the engine, or every attainment would be zero by
construction.

`simulate` is assembled from the engine's parts: the checks at its entry
(`schedport.engine.inputs`), the load and its anchor (`schedport.engine.capacity`) and one run of
the scaled trace (`schedport.engine.execution`); their public names are re-exported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from schedport.engine.capacity import (  # noqa: F401  (re-exported: the API of a simulation's load)
    CAPACITY_DEFINITIONS, CAPACITY_REFERENCE, DRAIN, SATURATED_BATCHES, SATURATED_MAX, SUSTAINABLE, capacity,
    load_scale, scaled,
)
from schedport.engine.core.config import EngineConfig
from schedport.engine.execution import SimulationResult, atomic_write, simulate_scaled  # noqa: F401
from schedport.engine.inputs import (  # noqa: F401  (re-exported: the checks at the engine's entry)
    SIM_BYTES_PER_REQUEST, check_clock, check_horizon, check_metrics_horizon, check_seed, check_simulation_memory,
    check_time_scale, rescale, resolve_engine, served_trace,
)
from schedport.engine.policies.plugins import check_scheduler_tables, get_scheduler
from schedport.engine.policies.schedulers import Policy
from schedport.workload.trace import MAX_ARRIVAL_S, Trace, load_trace  # noqa: F401


def simulate(trace: Trace | str | Path, scheduler: "str | Policy", engine: EngineConfig | str | Path | None = None,
             load: float | None = None, seed: int = 0, *, exact: bool = False,
             horizon_s: float | None = None, time_scale: float | None = None,
             progress: Callable[[float, int, int], None] | None = None,
             region_def: str | None = None, check_tables: bool = True) -> SimulationResult:
    """Simulate `trace` under `scheduler` on `engine`; return the per-request table and summary.

    The table has the columns of `schedport.engine.core.metrics.request_table` plus ``reject_reason``:
    for a request rejected at arrival, why (e.g. it can never fit the KV cache); else None.

    `scheduler` is a built-in name, ``PATH.py:NAME`` or ``module:NAME`` (a policy of your own,
    `schedport.engine.policies.plugins`), an installed policy's name, or a `Policy` declaration.
    `trace` is a `Trace` or a path to a canonical CSV/Parquet file; `engine` an `EngineConfig`,
    a TOML path, or None for the documented defaults. `load` rescales time to offered load rho
    against the sustainable capacity, or against the anchor of `region_def` (``drain``,
    ``slo[:PROFILE[:TARGET]]``; `load_scale`).
    `horizon_s` cuts the simulation (requests still in flight end `unfinished`); metrics count
    completions within 1.5 x the arrival span (`[metrics] horizon_factor`) either way.
    `exact=True` steps every iteration (the oracle the default fast mode must match).
    `time_scale` applies a precomputed `load_scale` factor instead of `load` (sweeps compute
    each window's capacity once and pass the factor to every cell).
    `check_tables=False` skips the check of the config's ``[scheduler.*]`` tables against the
    policies they name (a sweep's workers: the driver checked them against the whole selection).
    `progress`, when given, is called every 1,024 engine steps with (simulated time, requests
    arrived, requests in the trace): to show a long run advancing; it cannot change the result.

    With ``[latency] request_overhead_s = o > 0`` the engine is simulated on the (rescaled)
    trace with every arrival shifted by o -- each request reaches the engine's waiting queue
    o seconds after it reaches the server -- while the table keeps the original arrivals:
    ``first_token_s`` and ``finish_s`` are absolute times on the shifted run, so ``ttft_s``
    and ``e2e_s`` include o, and `horizon_s` stays an absolute time.  The alone time used
    for slowdown is the latency model's alone time plus o (a request alone on the server
    also pays it), so a lone request's slowdown stays 1.
    """
    if not isinstance(trace, Trace):
        trace = load_trace(trace)
    seed = check_seed(seed)
    horizon_s = check_horizon(horizon_s)
    check_simulation_memory(trace)
    cfg = resolve_engine(engine)
    policy = get_scheduler(scheduler)
    if check_tables:     # every [scheduler.*] table names a policy it can meet (a sweep checked them all)
        check_scheduler_tables(cfg, [policy])
    trace, scale = scaled(trace, cfg, load=load, time_scale=time_scale, region_def=region_def)
    advice = (f" at load {load!r}; give a lower load" if load is not None
              else ("; spread the arrivals over a longer span, or give --load RHO" if time_scale is None
                    else "; give a larger time scale"))
    return simulate_scaled(trace, scale, policy, cfg, seed=seed, exact=exact, horizon_s=horizon_s,
                           progress=progress, advice=advice)
