"""Operating regions (offered load rho) and the persistent per-window capacity cache.

A window is run in a region by scaling its time axis so that its offered load
rho = (offered request rate) / (engine capacity for the window's request mix) hits the
region's value. Capacity is measured by the simulator (`schedport.engine.runner.capacity`), so it
depends only on the window's content and the engine configuration -- never on the scheduler
under test. By default it is the *sustainable* capacity: the steady-state completion rate of
the engine saturated with the window's mix under the reference scheduler, so rho > 1 means a
queue that grows, in every source (docs/corpus.md, "Capacity"). It is worth caching: measuring
it costs one simulation of the window (of a few copies of a short one), and the sweep, the
corpus listing and the analysis all need it. The cache is a small JSON file keyed by (window
content sha256, engine config hash, definition), written atomically.

Two other definitions are selectable (`RegionDefinition`, ``--region-def``): ``drain``, the
earlier requests / makespan of an all-at-once replay, and ``slo:PROFILE:TARGET``, where rho is
measured against the rate at which the reference scheduler meets TARGET of the SLO
(`slo_capacity`), so a region is the same latency regime in every source.

The region scale factor is exactly `schedport.engine.runner.load_scale`'s formula,
``offered / (capacity * rho)`` with ``offered = (n - 1) / span``, so a sweep cell and a
``schedport simulate --load RHO`` run of the same window agree to the last bit.
"""

from __future__ import annotations

import json
import math
import re
import os
import tempfile
from pathlib import Path

from schedport.errors import SchedportError, TraceError

#: The six operating regions of the study, by offered load rho, in increasing order.
REGIONS: dict[str, float] = {
    "light": 0.3,
    "moderate": 0.6,
    "high": 0.8,
    "near-saturation": 0.95,
    "overload": 1.2,
    "severe": 1.6,
}

CACHE_KIND = "schedport-capacity-cache"
CACHE_SCHEMA = 1

#: The default region definition: rho = offered rate / sustainable capacity (steady state of a
#: saturated engine, `schedport.engine.runner.capacity`).
SUSTAINABLE = "sustainable"
#: The earlier definition: rho = offered rate / (requests / makespan of an all-at-once replay),
#: which includes the drain. Stores made before `sustainable` recorded it as ``throughput``.
DRAIN = "drain"
LEGACY_DRAIN = "throughput"
#: Definitions anchored on a throughput (every other is ``slo:...``).
THROUGHPUT_KINDS = (SUSTAINABLE, DRAIN)
#: Latency-anchored regions (``slo``, ``slo:PROFILE`` or ``slo:PROFILE:TARGET``): rho = offered rate /
#: the rate at which the reference scheduler meets TARGET of PROFILE's SLO (DistServe's goodput capacity).
SLO_DEFAULT_PROFILE = "standard"
SLO_DEFAULT_TARGET = 0.9
REFERENCE_SCHEDULER = "vllm-fcfs"
#: Bisection on log(rate / throughput capacity) between these multiples, to this relative precision.
SLO_BRACKET = (1e-3, 4.0)
SLO_ITERATIONS = 30
SLO_RTOL = 1e-3


class RegionDefinition:
    """How a region's rho is anchored: on a throughput capacity, or on the rate that meets an SLO.

    ``sustainable`` (the default): rho = offered rate / the engine's sustainable capacity for the
    window's request mix, the steady-state completion rate of a saturated engine under the
    reference scheduler (`schedport.engine.runner.capacity`): rho > 1 is a queue that grows, in every
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
        from schedport.engine.runner import capacity

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
    from schedport.engine.runner import capacity, simulate

    key = f"slo_attainment_{profile}"
    offered = offered_rate(trace)
    cap = capacity(trace, cfg, DRAIN)     # the bracket only (as before the sustainable definition)

    def attainment(rate: float) -> float:
        res = simulate(trace, REFERENCE_SCHEDULER, engine=cfg, time_scale=offered / rate)
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


_REGION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def parse_regions(spec: str | None) -> dict[str, float]:
    """Turn a ``--regions`` value into an ordered {name: rho} dict.

    ``None`` or "" means all of `REGIONS`. Otherwise a comma-separated list whose items
    are either a region name (``light``) or a custom region ``name=rho``
    (``mid=0.7``), so the study's names and values stay configurable from the command
    line. Unknown names, duplicates and non-positive rho are one-line errors.
    """
    if spec is None or not spec.strip():
        return dict(REGIONS)
    out: dict[str, float] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if "=" in item:
            name, _, value = (p.strip() for p in item.partition("="))
            try:
                rho = float(value)
            except ValueError:
                raise SchedportError(f"--regions: {item!r}: rho must be a number, got {value!r}") from None
            if not name:
                raise SchedportError(f"--regions: {item!r}: a custom region needs a name (name=rho)")
        else:
            name = item
            if name not in REGIONS:
                raise SchedportError(f"--regions: unknown region {name!r} (known: {', '.join(REGIONS)}; "
                                     f"or give a custom one as name=rho)")
            rho = REGIONS[name]
        if not (math.isfinite(rho) and rho > 0):
            raise SchedportError(f"--regions: {name}: rho must be a positive number, got {rho}")
        if not _REGION_NAME.fullmatch(name):
            raise SchedportError(f"--regions: {name!r}: a region name is letters, digits, '-' and '_' "
                                 f"(it names files and report rows)")
        if name in out:
            raise SchedportError(f"--regions: region {name!r} given twice")
        same = [k for k, v in out.items() if v == rho]
        if same:
            raise SchedportError(f"--regions: {name} and {same[0]} are both rho {rho:g}: one load under two names "
                                 f"would be analysed as two regions that always agree")
        out[name] = rho
    if not out:
        raise SchedportError("--regions: no region given")
    return out


def offered_rate(trace) -> float:
    """The window's offered request rate, (n - 1) / span in req/s (as `api.load_scale`)."""
    if len(trace) < 2 or trace.span_s <= 0:
        raise TraceError(f"{trace.name}: a region needs at least two requests with distinct arrival "
                         f"times (the offered rate is undefined otherwise)")
    return (len(trace) - 1) / trace.span_s


def time_scale(trace, capacity_rps: float, rho: float) -> float:
    """The time-axis factor bringing `trace` to offered load `rho` given its capacity.

    Identical arithmetic to `schedport.engine.runner.load_scale`, with the capacity supplied by
    the caller (from the cache) instead of measured again.
    """
    return offered_rate(trace) / (capacity_rps * rho)


class CapacityCache:
    """Capacities in req/s keyed by (window sha256, engine config hash), persisted as JSON.

    `get` / `put` work in memory; `save` writes the file atomically (temp file, fsync,
    rename), merging entries another process may have saved meanwhile, so concurrent
    users lose nothing. Floats are stored with Python's round-trip repr, so a cached
    capacity is bit-identical to a freshly measured one.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.entries: dict[str, float] = self._read()
        self._dirty = False

    @staticmethod
    def key(window_sha256: str, config_hash: str) -> str:
        """The cache key of a window and an engine configuration."""
        return f"{window_sha256}:{config_hash}"

    def _read(self) -> dict[str, float]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SchedportError(f"{self.path}: not a readable capacity cache ({_one_line(e)}); "
                                 f"delete it to measure capacities again") from None
        if not (isinstance(data, dict) and data.get("kind") == CACHE_KIND
                and data.get("schema") == CACHE_SCHEMA and isinstance(data.get("entries"), dict)):
            raise SchedportError(f"{self.path}: not a schedport capacity cache (schema {CACHE_SCHEMA}); "
                                 f"delete or move it to measure capacities again")
        entries = data["entries"]
        for k, v in entries.items():
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
                raise SchedportError(f"{self.path}: entry {k!r} is not a positive capacity ({v!r}); "
                                     f"delete the file to measure capacities again")
        return {str(k): float(v) for k, v in entries.items()}

    def get(self, window_sha256: str, config_hash: str) -> float | None:
        """The cached capacity, or None when it has not been measured yet."""
        return self.entries.get(self.key(window_sha256, config_hash))

    def put(self, window_sha256: str, config_hash: str, capacity_rps: float) -> None:
        """Record a measured capacity (in memory; call `save` to persist)."""
        self.entries[self.key(window_sha256, config_hash)] = float(capacity_rps)
        self._dirty = True

    def save(self) -> None:
        """Write the cache atomically if anything changed, keeping entries saved by others."""
        if not self._dirty:
            return
        merged = self._read() if self.path.exists() else {}
        merged.update(self.entries)
        self.entries = merged
        payload = json.dumps({"kind": CACHE_KIND, "schema": CACHE_SCHEMA,
                              "entries": dict(sorted(merged.items()))}, indent=1) + "\n"
        atomic_write_bytes(self.path, payload.encode("utf-8"))
        self._dirty = False

    def capacity(self, trace, cfg, window_sha256: str | None = None,
                 definition: "RegionDefinition | None" = None) -> float:
        """The anchor of `trace` on engine `cfg` (sustainable capacity unless `definition` says
        otherwise): from the cache, else measured and recorded."""
        rdef = definition or RegionDefinition(SUSTAINABLE)
        sha = window_sha256 or trace.content_sha256()
        h = rdef.cache_hash(cfg.config_hash())
        cap = self.get(sha, h)
        if cap is None:
            cap = rdef.anchor(trace, cfg)
            self.put(sha, h, cap)
        return cap


def capacity_cache(path: str | os.PathLike[str]) -> CapacityCache:
    """Open (or start) the persistent capacity cache at `path` (a JSON file)."""
    return CapacityCache(path)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically and durably: temp file in the same dir, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp makes 0600; results are meant to be shared
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives a power loss (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
