"""What enters the engine: the engine configuration resolved, the trace rescaled and served as
the engine sees it, and every number checked where it enters.

The time scale must be positive and finite, and the scaled arrivals finite, below `MAX_ARRIVAL_S`
(2^32 s, where float64 seconds still resolve a microsecond) and as distinct from one another as in
the trace itself (`check_clock`); the metrics horizon must let at least one request complete
(`check_metrics_horizon`); a trace must fit the memory a simulation of it needs
(`check_simulation_memory`); seeds and horizons are checked as they are given.
"""

from __future__ import annotations

import dataclasses

import math
from pathlib import Path

import numpy as np

from schedport.engine.core.config import EngineConfig, load_engine_config
from schedport.engine.core.latency import make_latency_model
from schedport.errors import SchedportError
from schedport.workload.trace import MAX_ARRIVAL_S, Trace, available_memory


def resolve_engine(engine: EngineConfig | str | Path | None) -> EngineConfig:
    """The engine configuration `engine` stands for: an `EngineConfig` as it is, a TOML path
    loaded (`load_engine_config`), None the documented defaults. Every entry point that takes an
    ``engine=`` argument (simulate, capacity, replay, calibrate, validate) resolves it so."""
    if engine is None:
        return load_engine_config(None)
    if isinstance(engine, EngineConfig):
        return engine
    return load_engine_config(engine)


def check_time_scale(factor, what: str = "time_scale") -> float:
    """`factor` as a float if it is a positive, finite number; a one-line error otherwise."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float, np.floating, np.integer)):
        raise SchedportError(f"{what} must be a positive, finite number, got {factor!r}")
    f = float(factor)
    if not (math.isfinite(f) and f > 0):
        raise SchedportError(f"{what} must be a positive, finite number, got {f!r} (a negative scale would "
                             f"reverse the arrivals, zero or NaN would collapse them)")
    return f


def check_clock(scaled_trace: Trace, original: Trace | None = None, why: str = "") -> None:
    """Refuse arrivals the engine's float64 clock cannot simulate faithfully.

    Every arrival must be finite and at most `MAX_ARRIVAL_S` (beyond it a second is
    resolved more coarsely than a microsecond, and short latencies vanish into rounding),
    and scaling must not merge arrivals that were distinct in `original` (the scaled trace
    would have lost the resolution of its own timestamps). `why` names the cause (the load
    or time scale) in the message.
    """
    a = scaled_trace.arrival_s
    if not len(a):
        return
    tail = f" {why}" if why else ""
    bad = ~np.isfinite(a)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SchedportError(f"{scaled_trace.name}: request {i} would arrive at {a[i]!r} s{tail}; arrivals "
                             f"must be finite")
    hi = float(np.max(np.abs(a)))
    if hi > MAX_ARRIVAL_S:
        raise SchedportError(f"{scaled_trace.name}: arrivals would reach {hi:.4g} s{tail}; beyond "
                             f"{MAX_ARRIVAL_S:.4g} s (2^32) the clock cannot resolve a microsecond and "
                             f"latencies would be lost to rounding")
    if original is not None and len(original) > 1:
        # arrivals at least a microsecond apart (a trace's own resolution) must stay apart; two
        # that were already closer (generated timestamps can differ in the last bits) may merge
        # without anything of the trace being lost
        apart = np.diff(original.arrival_s) >= 1e-6
        merged = int(np.count_nonzero(apart & ~(np.diff(a) > 0)))
        if merged:
            raise SchedportError(f"{scaled_trace.name}: {merged} distinct arrival times would merge"
                                 f"{tail}: the scaled trace loses the resolution of its own timestamps")


def rescale(trace: Trace, factor: float) -> Trace:
    """`trace` with its time axis stretched by `factor` around its first arrival (a warm-up's
    first, when it has one: the warm-up is brought to the same load as the window it precedes).
    Every other column (prefix identity, warm-up) is kept."""
    a0 = float(trace.arrival_s[0]) if len(trace) else 0.0
    arr = a0 + (trace.arrival_s - a0) * float(factor)
    return dataclasses.replace(trace, arrival_s=arr)


def check_metrics_horizon(trace: Trace, cfg: EngineConfig, alone_s=None, advice: str = "") -> None:
    """Refuse a (scaled) trace whose metrics horizon, `[metrics] horizon_factor` x its arrival
    span, is shorter than its fastest request's service time alone on the engine: no request
    could complete within it, so every attainment would be 0 by construction (``--load 1e9``).
    Only the measured requests count (the span and service times of a trace's warm-up do not);
    `alone_s`, when given, is per request of the whole trace."""
    if alone_s is not None and trace.warmup:
        alone_s = np.asarray(alone_s)[trace.warmup:]
    trace = trace.measured()
    if trace.span_s <= 0 or not len(trace):
        return
    if alone_s is None:
        alone_s = make_latency_model(cfg).alone_time(trace.input_tokens, trace.output_tokens)
    # only requests the engine can serve at all count: one rejected at arrival for its length
    # completes at no horizon, and if none can be served the horizon decides nothing
    limit = trace.input_tokens + (trace.output_tokens if cfg.over_length != "clamp" else 1)
    servable = limit <= cfg.max_model_len
    if not servable.any():
        return
    horizon, fastest = cfg.horizon_factor * trace.span_s, float(np.min(np.asarray(alone_s)[servable]))
    if horizon < fastest:
        raise SchedportError(
            f"{trace.name}: the metrics horizon ({cfg.horizon_factor:g} x the arrival span = {horizon:.3g} s) "
            f"is shorter than the fastest request's service time alone ({fastest:.3g} s), so no request could "
            f"count as completed{advice}")


#: Peak memory of a simulation per request, with its result table (measured: about 730 bytes a
#: request on 300,000 requests under vllm-fcfs); the bound `check_simulation_memory` applies.
SIM_BYTES_PER_REQUEST = 1024


def check_simulation_memory(trace) -> None:
    """Refuse, before the engine starts, a trace whose simulation would not fit the memory
    available (a one-line error instead of a machine that swaps for minutes, then a MemoryError)."""
    if not isinstance(trace, Trace):
        return
    avail, need = available_memory(), len(trace) * SIM_BYTES_PER_REQUEST
    if avail is not None and need > avail:
        raise SchedportError(f"{trace.name}: simulating {len(trace):,} requests needs about {need / 2**30:.1f} GiB of "
                             f"memory and {avail / 2**30:.1f} GiB are available; simulate a window of it")


def check_seed(seed) -> int:
    """`seed` as an int if it is a non-negative integer (numpy's generators refuse others)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise SchedportError(f"--seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def check_horizon(horizon_s) -> float | None:
    """`horizon_s` (the simulation cut) as a float if positive and finite; None stays None."""
    if horizon_s is None:
        return None
    if isinstance(horizon_s, bool) or not isinstance(horizon_s, (int, float, np.floating, np.integer)) \
            or not (horizon_s > 0 and math.isfinite(horizon_s)):
        raise SchedportError(f"--horizon must be a positive, finite number of seconds, got {horizon_s!r}")
    return float(horizon_s)


def served_trace(trace: Trace, cfg: EngineConfig) -> Trace:
    """The requests as the engine serves them: with ``[engine] over_length = "clamp"`` an output
    that would run past max_model_len is cut to the context left (what vLLM's API server does
    with max_tokens, `get_max_tokens` in vllm/entrypoints/serve/utils/api_utils.py); a prompt
    that fills the context is still rejected. With the default "reject" the trace is unchanged
    and such requests are rejected at arrival."""
    if cfg.over_length != "clamp" or not len(trace):
        return trace
    room = cfg.max_model_len - trace.input_tokens
    cut = (trace.output_tokens > room) & (room >= 1)
    if not cut.any():
        return trace
    outs = np.where(cut, room, trace.output_tokens)
    return dataclasses.replace(trace, output_tokens=outs)
