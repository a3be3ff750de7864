"""Capacity and load: what offered load rho = 1 means for a window on an engine, and the time
scale that brings a window to a given rho.

A window is run at offered load rho by scaling its time axis so that rho = (offered request rate)
/ (the window's anchor rate on the engine) hits the wanted value (`load_scale`, `scaled`). The
anchor is measured by the simulator, so it depends only on the window's content and the engine
configuration -- never on the scheduler under test. Three definitions (`RegionDefinition`,
``--region-def``):

* ``sustainable`` (the default): the engine's sustainable capacity for the window's request mix,
  the steady-state completion rate of a saturated engine under the reference scheduler
  (`capacity`), so rho > 1 means a queue that grows, in every source (docs/corpus.md, "Capacity");
* ``drain``: the earlier requests / makespan of an all-at-once replay, which includes the drain;
* ``slo:PROFILE:TARGET``: the rate at which the reference scheduler meets TARGET of the SLO
  (`slo_capacity`), so a region is the same latency regime in every source.

A time scale is ``offered / (anchor * rho)`` with ``offered = (n - 1) / span`` (`offered_rate`,
`time_scale`), so a study cell (`schedport.study`) and a ``schedport simulate --load RHO`` run of
the same window agree to the last bit.
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from schedport.engine.core.config import EngineConfig
from schedport.engine.execution import simulate_scaled
from schedport.engine.inputs import check_clock, check_simulation_memory, check_time_scale, rescale, resolve_engine
from schedport.engine.core.latency import make_latency_model
from schedport.engine.policies.schedulers import get_policy
from schedport.engine.modes import make_simulator
from schedport.errors import SchedportError, TraceError
from schedport.workload.trace import Trace

# ============================================================================ throughput capacity

#: The scheduler every anchor is measured under (the study's baseline, vLLM's default).
CAPACITY_REFERENCE = "vllm-fcfs"

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
    saturated part is at least two batches long. This is the service rate mu of queueing theory: at
    offered load rho = lambda / mu > 1 the queue of a fluid model grows at lambda - mu (docs/corpus.md,
    "Capacity").

    ``drain``: requests completed / makespan of the same replay. The makespan includes the
    drain at the end, when the batch thins out while the longest requests finish, so windows
    with long-tailed lengths get a lower capacity (and their "overload" is not overloaded);
    kept for comparison with stores made before the sustainable definition.

    ``[latency] request_overhead_s`` is ignored: capacity is a throughput, and a fixed delay
    before each request's entry into the engine adds latency, not engine work. A trace's warm-up
    is left out: the capacity is that of the measured requests' mix (`Trace.measured`).
    """
    if definition not in CAPACITY_DEFINITIONS:
        raise SchedportError(f"capacity definition must be one of {', '.join(CAPACITY_DEFINITIONS)}, "
                             f"got {definition!r}")
    return _capacity_cached(_TraceKey(trace.measured()), _without_overhead(resolve_engine(engine)), definition)


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
    out = make_simulator(burst, get_policy(CAPACITY_REFERENCE), cfg, make_latency_model(cfg)).run()
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


# ============================================================================ region definitions

#: The earlier definition's name in stores made before `sustainable` (read as ``drain``).
LEGACY_DRAIN = "throughput"
#: Definitions anchored on a throughput (every other is ``slo:...``).
THROUGHPUT_KINDS = (SUSTAINABLE, DRAIN)
#: Latency-anchored regions (``slo``, ``slo:PROFILE`` or ``slo:PROFILE:TARGET``): rho = offered rate /
#: the rate at which the reference scheduler meets TARGET of PROFILE's SLO (DistServe's goodput capacity).
SLO_DEFAULT_PROFILE = "standard"
SLO_DEFAULT_TARGET = 0.9
REFERENCE_SCHEDULER = CAPACITY_REFERENCE
#: Bisection on log(rate / throughput capacity) between these multiples, to this relative precision.
SLO_BRACKET = (1e-3, 4.0)
SLO_ITERATIONS = 30
SLO_RTOL = 1e-3


class RegionDefinition:
    """How a region's rho is anchored: on a throughput capacity, or on the rate that meets an SLO.

    ``sustainable`` (the default): rho = offered rate / the engine's sustainable capacity for the
    window's request mix, the steady-state completion rate of a saturated engine under the
    reference scheduler (`capacity`): rho > 1 is a queue that grows, in every
    source. ``drain``: rho = offered rate / (requests / makespan) of the same all-at-once replay,
    the definition of stores made before (recorded there as ``throughput``): its makespan
    includes the drain, so long-tailed windows get a low capacity and a mild "overload".
    ``slo:P:X``: rho = offered rate / r*, where r* is the highest rate at which the reference
    scheduler (vllm-fcfs) still meets fraction X of SLO profile P's requests (found by
    bisection, `slo_capacity`), so one rho is the same latency regime in every window and
    source: at rho = 1 the reference just meets X of the SLO. Either way a region's time scale
    is offered / (anchor x rho).
    """

    def __init__(self, kind: str, profile: str | None = None, target: float | None = None):
        self.kind, self.profile, self.target = kind, profile, target

    @property
    def spec(self) -> str:
        """The canonical text form (``sustainable``, ``drain`` or ``slo:standard:0.9``), as recorded in stores."""
        return self.kind if self.kind in THROUGHPUT_KINDS else f"slo:{self.profile}:{self.target:g}"

    def describe(self) -> str:
        """One sentence for reports: what rho = 1 means under this definition."""
        if self.kind == SUSTAINABLE:
            return ("sustainable-capacity-anchored: rho = offered rate / the rate the engine sustains on the window's "
                    "request mix with a queue (vllm-fcfs, saturated, steady state): above 1 the queue grows")
        if self.kind == DRAIN:
            return ("drain-anchored: rho = offered rate / (requests / makespan) when all the window's requests are "
                    "released at once under vllm-fcfs (the makespan includes the drain)")
        return (f"latency-anchored: rho = offered rate / the rate at which {REFERENCE_SCHEDULER} meets "
                f"{100 * self.target:g}% of the {self.profile} SLO on that window (bisection)")

    def cache_hash(self, config_hash: str) -> str:
        """The capacity-cache key part for an engine config under this definition (the drain
        definition keeps the bare config hash it had in caches made before the others)."""
        return config_hash if self.kind == DRAIN else f"{config_hash}|{self.spec}"

    def anchor(self, trace, cfg) -> float:
        """The anchor rate in req/s of `trace` on engine `cfg` (its capacity, or its SLO rate)."""
        if self.kind in THROUGHPUT_KINDS:
            return capacity(trace, cfg, self.kind)
        return slo_capacity(trace, cfg, self.profile, self.target)


def parse_region_def(spec: str | None, slo_profiles=None) -> RegionDefinition:
    """Turn ``--region-def`` (``sustainable``, ``drain``, ``slo``, ``slo:PROFILE`` or ``slo:PROFILE:TARGET``)
    into a definition; None or empty is the default, ``sustainable``.

    ``throughput`` (what stores made before the sustainable definition recorded) reads as
    ``drain``. An unknown kind, an SLO profile the engine config does not define (when
    `slo_profiles` is given) or a target outside (0, 1) is a one-line error.
    """
    if spec is None or spec.strip() in ("", SUSTAINABLE):
        return RegionDefinition(SUSTAINABLE)
    if spec.strip() in (DRAIN, LEGACY_DRAIN):
        return RegionDefinition(DRAIN)
    parts = [p.strip() for p in spec.strip().split(":")]
    if parts[0] != "slo" or len(parts) > 3:
        raise SchedportError(f"--region-def: {spec!r}: expected 'sustainable', 'drain' or 'slo[:PROFILE[:TARGET]]'")
    profile = parts[1] if len(parts) > 1 and parts[1] else SLO_DEFAULT_PROFILE
    if slo_profiles is not None and profile not in slo_profiles:
        raise SchedportError(f"--region-def: SLO profile {profile!r} is not in the engine config (known: "
                             f"{', '.join(slo_profiles)})")
    target = SLO_DEFAULT_TARGET
    if len(parts) > 2:
        try:
            target = float(parts[2])
        except ValueError:
            raise SchedportError(f"--region-def: target must be a number in (0, 1), got {parts[2]!r}") from None
    if not (math.isfinite(target) and 0 < target < 1):
        raise SchedportError(f"--region-def: target must be in (0, 1), got {target}")
    return RegionDefinition("slo", profile, target)


def slo_capacity(trace, cfg, profile: str = SLO_DEFAULT_PROFILE, target: float = SLO_DEFAULT_TARGET) -> float:
    """The highest offered rate (req/s) at which the reference scheduler meets `target` of `profile`'s SLO.

    The window keeps its burst shape; its time axis is scaled to each candidate rate and run
    under vllm-fcfs (scheduler-independent, like the throughput capacity). Attainment falls as
    the rate rises, so the crossing is found by bisection on log rate between 1e-3 and 4 times
    the throughput capacity, to 0.1%; where attainment is not monotone, bisection returns one
    crossing, deterministically. A window whose attainment is below `target` even at the
    lowest rate (requests too long for the SLO on an idle engine) is a one-line error.
    """
    cfg = resolve_engine(cfg)
    key = f"slo_attainment_{profile}"
    offered = offered_rate(trace)
    cap = capacity(trace, cfg, DRAIN)     # the bracket only (as before the sustainable definition)

    def attainment(rate: float) -> float:
        res = _reference_run(trace, cfg, offered / rate)
        v = res.summary.get(key)
        if v is None:
            raise SchedportError(f"{trace.name}: the engine config has no SLO profile for {key}")
        return float(v)

    lo, hi = math.log(SLO_BRACKET[0] * cap), math.log(SLO_BRACKET[1] * cap)
    a_lo = attainment(math.exp(lo))
    if a_lo < target:
        raise SchedportError(f"{trace.name}: {REFERENCE_SCHEDULER} meets only {100 * a_lo:.1f}% of the {profile} SLO "
                             f"even at {SLO_BRACKET[0]:g} x capacity; a latency-anchored region needs a target "
                             f"below that (--region-def slo:{profile}:X)")
    if attainment(math.exp(hi)) >= target:
        return math.exp(hi)
    for _ in range(SLO_ITERATIONS):
        if hi - lo <= math.log1p(SLO_RTOL):
            break
        mid = (lo + hi) / 2
        if attainment(math.exp(mid)) >= target:
            lo = mid
        else:
            hi = mid
    return math.exp(lo)


def offered_rate(trace) -> float:
    """The window's offered request rate, (n - 1) / span in req/s (as `api.load_scale`), over its
    measured requests (a warm-up is brought to the same time scale but does not define it)."""
    trace = trace.measured()
    if len(trace) < 2 or trace.span_s <= 0:
        raise TraceError(f"{trace.name}: a region needs at least two requests with distinct arrival "
                         f"times (the offered rate is undefined otherwise)")
    return (len(trace) - 1) / trace.span_s


def time_scale(trace, capacity_rps: float, rho: float) -> float:
    """The time-axis factor bringing `trace` to offered load `rho` given its capacity.

    Identical arithmetic to `load_scale`, with the capacity supplied by
    the caller (from the cache) instead of measured again.
    """
    return offered_rate(trace) / (capacity_rps * rho)


# ============================================================================ rho -> time scale


def clear_capacity_cache() -> None:
    """Forget the capacities measured in this process (`capacity` memoises them by trace content,
    engine config and definition): for a benchmark that times the measurement itself."""
    _capacity_cached.cache_clear()


def load_scale(trace: Trace, load: float, engine: EngineConfig | str | Path | None = None,
               region_def: str | None = None) -> float:
    """The time-axis factor that brings `trace` to offered load `load` (rho) on this engine.

    rho is relative to the anchor of `region_def` (`parse_region_def`: the
    sustainable capacity when None, or ``drain``, or ``slo[:PROFILE[:TARGET]]``), exactly as a
    study region is. The rate is the measured requests' (a warm-up is scaled with them)."""
    if isinstance(load, bool) or not isinstance(load, (int, float, np.floating, np.integer)) \
            or not (load > 0 and np.isfinite(load)):
        raise SchedportError(f"--load must be a positive, finite number, got {load!r}")
    measured = trace.measured()
    if len(measured) < 2 or measured.span_s <= 0:
        what = "measured requests" if trace.warmup else "requests"
        raise TraceError(f"{trace.name}: --load needs at least two {what} with distinct arrival "
                         f"times (the offered rate is undefined otherwise)")
    cfg = resolve_engine(engine)
    rdef = parse_region_def(region_def, list(cfg.slo_profiles))
    offered = (len(measured) - 1) / measured.span_s
    scale = offered / (rdef.anchor(trace, cfg) * load)
    if not (np.isfinite(scale) and scale > 0):
        raise SchedportError(f"{trace.name}: --load {load!r} gives a time scale of {scale!r}, which is not a "
                             f"positive finite number; give a load nearer 1 (the study's regions are 0.3-1.6)")
    return scale


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


def _reference_run(trace: Trace, cfg: EngineConfig, time_scale: float):
    """`trace` stretched by `time_scale` under the reference scheduler: what
    ``simulate(trace, REFERENCE_SCHEDULER, engine=cfg, time_scale=time_scale)`` runs."""
    check_simulation_memory(trace)
    policy = get_policy(REFERENCE_SCHEDULER)
    trace, scale = scaled(trace, cfg, time_scale=time_scale)
    return simulate_scaled(trace, scale, policy, cfg, advice="; give a larger time scale")
