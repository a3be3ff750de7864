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
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from schedport.engine.config import EngineConfig, load_engine_config
from schedport.engine.simulator import Simulator
from schedport.errors import SchedportError, TraceError
from schedport.engine.latency import make_latency_model
from schedport.engine.metrics import request_table, summarize
from schedport.engine.schedulers import get_policy, run_counters
from schedport.common.outputs import file_mode, io_error
from schedport.workload.trace import MAX_ARRIVAL_S, Trace

CAPACITY_REFERENCE = "vllm-fcfs"


@dataclass
class SimulationResult:
    """The outcome of one simulation: `requests` (one row per request) and `summary` (run metrics)."""

    requests: pd.DataFrame
    summary: dict
    scale: float

    def save(self, out_dir: str | Path) -> None:
        """Write `requests.parquet` and `summary.json` into `out_dir`, each atomically.

        An I/O failure (a full disk, a read-only file system, `out_dir` an existing file)
        is a one-line `SchedportError` naming the path; no temporary file is left behind.
        """
        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise SchedportError(f"{out}: exists and is not a directory; choose another output directory")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise io_error(out, e, "create the directory") from None
        _atomic_write(out / "requests.parquet", lambda p: self.requests.to_parquet(p, index=False))
        _atomic_write(out / "summary.json",
                      lambda p: Path(p).write_text(json.dumps(self.summary, indent=2, allow_nan=False) + "\n"))


def _atomic_write(path: Path, write) -> None:
    """Write `path` through a temporary file beside it, with the permissions a plain open()
    would give (mkstemp's 0600 would hide results from the rest of the group); an OSError
    becomes a one-line `SchedportError` naming `path`, and the temporary file is removed."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise io_error(path, e) from None
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise io_error(path, e) from None
        raise


def _resolve_engine(engine) -> EngineConfig:
    if engine is None:
        return load_engine_config(None)
    if isinstance(engine, EngineConfig):
        return engine
    return load_engine_config(engine)


#: The capacity definitions `capacity` knows: the steady-state rate of a saturated engine (the
#: default), and the older all-at-once rate that includes the drain.
SUSTAINABLE = "sustainable"
DRAIN = "drain"
CAPACITY_DEFINITIONS = (SUSTAINABLE, DRAIN)
#: The sustainable rate is read from a saturated replay of at least this many batches' worth of
#: the window's mix (the mix is repeated when the window is shorter), up to `SATURATED_MAX`
#: requests (an engine configured with a huge max_num_seqs is bounded by its KV cache instead).
SATURATED_BATCHES = 4
SATURATED_MAX = 16384


def capacity(trace: Trace, engine: EngineConfig | str | Path | None = None,
             definition: str = SUSTAINABLE) -> float:
    """The engine's capacity for this request mix, in requests per second.

    Measured by the simulator itself, independently of the scheduler under test, on the
    reference scheduler (vllm-fcfs), from a replay in which every request is released at time
    zero. Two definitions:

    ``sustainable`` (the default): the highest arrival rate the engine serves without a growing
    queue, i.e. its completion rate in steady state with a non-empty queue. It is read from the
    saturated part of the replay only: after the first `max_num_seqs` completions (the batch
    admitted at time zero has turned over, and the running batch has its steady, length-biased
    mix) and before the last request is admitted (after which the queue is empty and the batch
    drains). A window with fewer than `SATURATED_BATCHES` x `max_num_seqs` requests is replayed
    as enough copies of its mix to reach that many (at most `SATURATED_MAX` requests), so the
    saturated part is at least two batches long. This is the service rate mu of queueing theory: at offered load rho = lambda / mu > 1
    the queue of a fluid model grows at lambda - mu (docs/corpus.md, "Capacity").

    ``drain``: requests completed / makespan of the same replay. The makespan includes the
    drain at the end, when the batch thins out while the longest requests finish, so windows
    with long-tailed lengths get a lower capacity (and their "overload" is not overloaded);
    kept for comparison with stores made before the sustainable definition.

    ``[latency] request_overhead_s`` is ignored: capacity is a throughput, and a fixed delay
    before each request's entry into the engine adds latency, not engine work.
    """
    if definition not in CAPACITY_DEFINITIONS:
        raise SchedportError(f"capacity definition must be one of {', '.join(CAPACITY_DEFINITIONS)}, "
                             f"got {definition!r}")
    return _capacity_cached(_TraceKey(trace), _without_overhead(_resolve_engine(engine)), definition)


def _without_overhead(cfg: EngineConfig) -> EngineConfig:
    """`cfg` with no per-request overhead: a delay outside the engine is not engine work."""
    return dataclasses.replace(cfg, request_overhead_s=0.0) if cfg.request_overhead_s else cfg


class _TraceKey:
    """Hashable wrapper keying a trace by its content (for the capacity cache)."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.digest = trace.content_sha256()

    def __hash__(self):
        return hash(self.digest)

    def __eq__(self, other):
        return isinstance(other, _TraceKey) and other.digest == self.digest


@lru_cache(maxsize=512)
def _capacity_cached(key: _TraceKey, cfg: EngineConfig, definition: str) -> float:
    t = key.trace
    n = max(len(t), 1)
    copies = 1 if definition == DRAIN else max(1, min(math.ceil(SATURATED_BATCHES * cfg.max_num_seqs / n),
                                                      SATURATED_MAX // n))
    tile = (lambda a: np.tile(a, copies))
    clients = None if t.client_id is None else tile(np.asarray(t.client_id, dtype=object))
    burst = Trace(np.zeros(len(t) * copies), tile(t.input_tokens), tile(t.output_tokens), clients, t.name)
    out = Simulator(burst, get_policy(CAPACITY_REFERENCE), cfg, make_latency_model(cfg)).run()
    done = out.status == "completed"
    if not done.any():
        raise TraceError(f"{t.name}: no request of this trace can ever be served by this engine, "
                         f"so its capacity (and any --load) is undefined")
    if definition == DRAIN:
        return float(done.sum()) / float(np.nanmax(out.finish_s))
    fin = np.sort(out.finish_s[done])
    queue_empty = float(np.nanmax(out.first_token_s))       # the last request is admitted
    turned_over = fin[min(cfg.max_num_seqs, len(fin)) - 1]  # the batch admitted at zero has turned over
    steady = fin[(fin > turned_over) & (fin <= queue_empty)]
    if len(steady) < cfg.max_num_seqs or not queue_empty > turned_over:
        # most of the mix rejected, or a max_num_seqs the replay cannot fill
        raise TraceError(f"{t.name}: a replay of {len(burst)} requests ({int(done.sum())} served) never kept a queue "
                         f"for {cfg.max_num_seqs} completions after the first {cfg.max_num_seqs} (max_num_seqs), so "
                         f"its sustainable capacity is undefined; lower max_num_seqs or use --region-def drain")
    return float(len(steady)) / (queue_empty - float(turned_over))


def load_scale(trace: Trace, load: float, engine: EngineConfig | str | Path | None = None,
               region_def: str | None = None) -> float:
    """The time-axis factor that brings `trace` to offered load `load` (rho) on this engine.

    rho is relative to the anchor of `region_def` (`schedport.study.regions.parse_region_def`: the
    sustainable capacity when None, or ``drain``, or ``slo[:PROFILE[:TARGET]]``), exactly as a
    study region is."""
    if isinstance(load, bool) or not isinstance(load, (int, float, np.floating, np.integer)) \
            or not (load > 0 and np.isfinite(load)):
        raise SchedportError(f"--load must be a positive, finite number, got {load!r}")
    if len(trace) < 2 or trace.span_s <= 0:
        raise TraceError(f"{trace.name}: --load needs at least two requests with distinct arrival "
                         f"times (the offered rate is undefined otherwise)")
    from schedport.study.regions import parse_region_def

    cfg = _resolve_engine(engine)
    rdef = parse_region_def(region_def, list(cfg.slo_profiles))
    offered = (len(trace) - 1) / trace.span_s
    scale = offered / (rdef.anchor(trace, cfg) * load)
    if not (np.isfinite(scale) and scale > 0):
        raise SchedportError(f"{trace.name}: --load {load!r} gives a time scale of {scale!r}, which is not a "
                             f"positive finite number; give a load nearer 1 (the study's regions are 0.3-1.6)")
    return scale


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
    """`trace` with its time axis stretched by `factor` around its first arrival."""
    a0 = float(trace.arrival_s[0]) if len(trace) else 0.0
    arr = a0 + (trace.arrival_s - a0) * float(factor)
    return Trace(arr, trace.input_tokens, trace.output_tokens, trace.client_id, trace.name)


def scaled(trace: Trace, cfg: EngineConfig, *, load: float | None = None,
           time_scale: float | None = None, region_def: str | None = None) -> tuple[Trace, float]:
    """`trace` brought to offered load `load` on `cfg` (or stretched by a precomputed
    `time_scale`), and the factor used; unchanged with factor 1 when neither is given.
    Simulations and replays of one run share it, so both see the same arrivals."""
    if load is not None and time_scale is not None:
        raise SchedportError("give either load or time_scale, not both")
    if time_scale is not None:
        scale = check_time_scale(time_scale)
        why = f"(time scale {scale!r})"
    elif load is not None:
        scale = load_scale(trace, load, cfg, region_def)
        why = f"(load {load!r}, time scale {scale:.4g})"
    else:
        check_clock(trace)
        return trace, 1.0
    out = rescale(trace, scale)
    check_clock(out, trace, why)
    return out, scale


def check_metrics_horizon(trace: Trace, cfg: EngineConfig, alone_s=None, advice: str = "") -> None:
    """Refuse a (scaled) trace whose metrics horizon, `[metrics] horizon_factor` x its arrival
    span, is shorter than its fastest request's service time alone on the engine: no request
    could complete within it, so every attainment would be 0 by construction (``--load 1e9``)."""
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
    from schedport.workload.trace import _available_memory

    if not isinstance(trace, Trace):
        return
    avail, need = _available_memory(), len(trace) * SIM_BYTES_PER_REQUEST
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
    return Trace(trace.arrival_s, trace.input_tokens, outs, trace.client_id, trace.name)


def simulate(trace: Trace | str | Path, scheduler: str, engine: EngineConfig | str | Path | None = None,
             load: float | None = None, seed: int = 0, *, exact: bool = False,
             horizon_s: float | None = None, time_scale: float | None = None,
             progress: Callable[[float, int, int], None] | None = None,
             region_def: str | None = None) -> SimulationResult:
    """Simulate `trace` under `scheduler` on `engine`; return the per-request table and summary.

    The table has the columns of `schedport.engine.metrics.request_table` plus ``reject_reason``:
    for a request rejected at arrival, why (e.g. it can never fit the KV cache); else None.

    `trace` is a `Trace` or a path to a canonical CSV/Parquet file; `engine` an `EngineConfig`,
    a TOML path, or None for the documented defaults. `load` rescales time to offered load rho
    against the sustainable capacity, or against the anchor of `region_def` (``drain``,
    ``slo[:PROFILE[:TARGET]]``; `load_scale`).
    `horizon_s` cuts the simulation (requests still in flight end `unfinished`); metrics count
    completions within 1.5 x the arrival span (`[metrics] horizon_factor`) either way.
    `exact=True` steps every iteration (the oracle the default fast mode must match).
    `time_scale` applies a precomputed `load_scale` factor instead of `load` (sweeps compute
    each window's capacity once and pass the factor to every cell).
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
    from schedport.workload.trace import load_trace

    if not isinstance(trace, Trace):
        trace = load_trace(trace)
    seed = check_seed(seed)
    horizon_s = check_horizon(horizon_s)
    check_simulation_memory(trace)
    cfg = _resolve_engine(engine)
    policy = get_policy(scheduler)
    trace, scale = scaled(trace, cfg, load=load, time_scale=time_scale, region_def=region_def)
    trace = served_trace(trace, cfg)
    lat = make_latency_model(cfg)
    alone = lat.alone_time(trace.input_tokens, trace.output_tokens) if len(trace) else np.zeros(0)
    span = trace.span_s
    check_metrics_horizon(trace, cfg, alone, f" at load {load!r}; give a lower load" if load is not None
                          else (f"; spread the arrivals over a longer span, or give --load RHO" if time_scale is None
                                else "; give a larger time scale"))
    overhead = cfg.request_overhead_s
    engine_trace = trace
    if overhead:
        engine_trace = Trace(trace.arrival_s + overhead, trace.input_tokens, trace.output_tokens,
                             trace.client_id, trace.name)
    sim = Simulator(engine_trace, policy, cfg, lat, seed=seed, exact=exact, horizon_s=horizon_s, progress=progress)
    out = sim.run()
    cid = trace.client_id if trace.client_id is not None else np.full(len(trace), None, dtype=object)
    table = request_table(
        arrival_s=trace.arrival_s, input_tokens=trace.input_tokens, output_tokens=trace.output_tokens,
        client_id=cid, status=out.status, first_token_s=out.first_token_s, finish_s=out.finish_s,
        preemptions=out.preemptions)
    # why a request was rejected at arrival (None for every other request)
    table["reject_reason"] = pd.Series([r or None for r in out.reject_reason], dtype=object, index=table.index)
    if span > 0:
        horizon = cfg.horizon_factor * span
    else:
        fin = out.finish_s[np.isfinite(out.finish_s)]
        horizon = cfg.horizon_factor * max(float(fin.max() - trace.arrival_s[0]) if fin.size else 1.0, 1e-9)
    if overhead:
        alone = alone + overhead
    summary = summarize(table, horizon_s=horizon, slo_profiles=cfg.slo_profiles, alone_s=alone,
                        counters={"preemptions": out.preemptions_total, "iterations": out.iterations,
                                  "recomputed_tokens": out.recomputed_tokens,
                                  "swapped_bytes": out.swapped_blocks * cfg.block_bytes,
                                  "load_scale": scale, **run_counters(sim),
                                  "host_swap_full_events": out.host_full_events,
                                  "stall_recomputes": out.stall_recomputes})
    return SimulationResult(table, summary, scale)
