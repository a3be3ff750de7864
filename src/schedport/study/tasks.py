"""The work a sweep hands its workers: one window's capacity (`measure_capacity`) and one chunk of
cells (`run_chunk`: one window under one scheduler at several regions and seeds), plus the
fingerprint of the code a result depends on (`code_fingerprint`), which workers and caches compare.

Both tasks are module-level functions, so a process pool pickles them by name and Ray ships them
as remote functions; `schedport explain` runs its variants through the same two.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import schedport
from schedport.engine.policies.plugins import PolicyError, PolicySource
from schedport.engine.runner import simulate
from schedport.study.regions import parse_region_def, time_scale


def measure_capacity(trace, cfg, region_def: str = "sustainable") -> tuple[float, float]:
    """Worker task: (anchor in req/s, seconds spent) of one window on engine `cfg`: its capacity
    under `region_def` (sustainable or drain), or under a latency-anchored one the rate meeting
    its SLO target."""
    t0 = time.perf_counter()
    cap = parse_region_def(region_def).anchor(trace, cfg)
    return cap, time.perf_counter() - t0


def run_chunk(trace, cfg, scheduler: str | PolicySource, window: tuple[str, str, str, float],
              cells: list[tuple[str, float, int]],
              keep_requests: bool = False) -> tuple[list[dict], list | None, float]:
    """Worker task: simulate one window under one scheduler at several (region, rho, seed).

    `scheduler` is a built-in or installed policy's name, or a user policy's `PolicySource` (its
    code travels with the task: a worker loads exactly the version the driver hashed).
    `window` is (source, window_id, sha256, capacity_rps); a user policy's failure (`PolicyError`)
    is raised again with the window, region and seed it happened in. Returns the stored rows, the
    per-request tables when `keep_requests` (measured requests only, else None), and the seconds spent inside
    `api.simulate` (to measure the sweep machinery's overhead).
    """
    source, window_id, sha, cap = window
    name = scheduler.name if isinstance(scheduler, PolicySource) else scheduler
    rows: list[dict] = []
    reqs: list | None = [] if keep_requests else None
    sim_s = 0.0
    for region, rho, seed in cells:
        scale = time_scale(trace, cap, rho)
        t0 = time.perf_counter()
        try:
            res = simulate(trace, scheduler, engine=cfg, seed=seed, time_scale=scale, check_tables=False)
        except PolicyError as e:     # a user policy's failure: say which cell it happened in
            seed_part = f", seed {seed}" if seed else ""
            raise PolicyError(f"{e} (in window {window_id}, region {region} at rho {rho:g}{seed_part})") from None
        sim_s += time.perf_counter() - t0
        row = {"source": source, "window_id": window_id, "region": region, "scheduler": name,
               "seed": int(seed), "rho": float(rho), "time_scale": float(scale), "capacity_rps": float(cap),
               "window_sha256": sha}
        row.update(res.summary)
        rows.append(row)
        if reqs is not None:   # the store keeps the measured requests: a window's warm-up is never stored
            t = res.requests
            reqs.append(t[~t["warmup"].to_numpy(dtype=bool)] if "warmup" in t.columns else t)
    return rows, reqs, sim_s


def describe_task(fn, args) -> str:
    """What a worker task computes, in a user's terms, for a line about a worker that died running it:
    ``window W under scheduler S (regions R)`` for `run_chunk`, ``the capacity of window W`` for
    `measure_capacity`."""
    if fn is run_chunk and len(args) >= 5:
        scheduler, window, cells = args[2], args[3], args[4]
        name = scheduler.name if isinstance(scheduler, PolicySource) else scheduler
        regions = list(dict.fromkeys(str(c[0]) for c in cells))
        regions = ("region " if len(regions) == 1 else "regions ") + ", ".join(regions)
        seeds = sorted({int(c[2]) for c in cells})
        seed = f", seed {seeds[0]}" if len(seeds) == 1 and seeds[0] else (f", seeds {seeds}" if len(seeds) > 1 else "")
        return f"window {window[1]} under scheduler {name!r} ({regions}{seed})"
    if fn is measure_capacity and args:
        return f"the capacity of window {getattr(args[0], 'name', '?')}"
    return getattr(fn, "__name__", "a task")


def code_fingerprint() -> str:
    """sha256 over the source of the modules a simulation's result depends on.

    The whole engine package (config, latency model, simulator, policies, metrics, capacity and
    region definitions, runner), the trace format and its checks, and the study's regions: any edit
    there can change a run's numbers, so caches keyed on this fingerprint (explain's runs, a Ray
    cluster's code check) are refreshed.
    """
    h = hashlib.sha256(schedport.__version__.encode())
    pkg = Path(schedport.__file__).parent
    files = sorted((pkg / "engine").rglob("*.py")) + [pkg / "workload" / "trace.py", pkg / "workload" / "tracecheck.py",
                                                     pkg / "study" / "regions.py"]
    for p in files:
        h.update(p.relative_to(pkg).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()
