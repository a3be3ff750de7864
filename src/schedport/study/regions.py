"""Operating regions (offered load rho) and the persistent per-window capacity cache.

A window is run in a region by scaling its time axis so that its offered load
rho = (offered request rate) / (the engine's anchor rate for the window's request mix) hits the
region's value. What the anchor is -- the sustainable capacity (the default), the drain rate or
the rate that meets an SLO -- and the time-scale arithmetic belong to the engine
(`schedport.engine.capacity`: `RegionDefinition`, `parse_region_def`, `slo_capacity`,
`offered_rate`, `time_scale`; re-exported here). This module holds the study's side: the six
named regions (`REGIONS`, `parse_regions` for ``--regions``) and the cache of measured anchors.

An anchor costs one simulation of the window (of a few copies of a short one), or a bisection
of them for the SLO definition, and the sweep, the corpus listing and the analysis all need it:
`CapacityCache` is a small JSON file keyed by (window content sha256, engine config hash,
definition), written atomically.

The region scale factor is exactly `schedport.engine.capacity.load_scale`'s formula,
``offered / (capacity * rho)`` with ``offered = (n - 1) / span``, so a sweep cell and a
``schedport simulate --load RHO`` run of the same window agree to the last bit.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from schedport.engine.capacity import (  # noqa: F401  (re-exported: the region definitions' home is the engine)
    DRAIN, LEGACY_DRAIN, REFERENCE_SCHEDULER, SLO_BRACKET, SLO_DEFAULT_PROFILE, SLO_DEFAULT_TARGET, SLO_ITERATIONS,
    SLO_RTOL, SUSTAINABLE, THROUGHPUT_KINDS, RegionDefinition, offered_rate, parse_region_def, slo_capacity,
    time_scale,
)
from schedport.common.atomic import atomic_write_bytes
from schedport.errors import SchedportError

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


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
