"""Per window, the prefix-cache hit rate its warm-up gives vs the one the full trace gives.

A window of a prefix-bearing source is run with its warm-up (docs/corpus.md, "Warm caches"); the
warm-up is good enough when the window's measured requests get, within 5 points, the hit rate
those same requests get when the whole source trace is run through the same engine at the same
time scale. This tool measures that difference, window by window:

    hit rate = sum of the measured requests' cached prompt tokens / sum of their prompt tokens

once from the window's own run (warm-up included, measured requests only) and once from the run
of the full trace (the same requests, found in it by their lengths and block ids).

Where the cached tokens come from is a function of a trace (`CachedTokens`): the engine's prefix
cache (`engine_cached_tokens`: a run whose ``requests.parquet`` has a ``cached_tokens`` column,
with ``[engine] enable_prefix_caching = true``), or, with ``--reference``, a cache that never
evicts and ignores time (`schedport.workload.prefix.seen_prefix_tokens`), which needs no engine
and bounds what any cache could keep from before the window.

    python tools/warmup_hit_rate.py --corpus DIR --source FILE.jsonl [--reference]
        [--engine ENGINE.toml] [--scheduler vllm-fcfs] [--rho 0.8] [--windows ID,ID]

``--source`` is the file the corpus source was cut from (Mooncake JSONL, read with the
``mooncake`` adapter, or a canonical trace). Prints one line per window and exits 1 when a
window's difference reaches `LIMIT_POINTS`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from schedport.errors import SchedportError
from schedport.workload.trace import Trace

#: The largest difference, in points of hit rate, a warm-up may leave (issue 62, "Warm caches").
LIMIT_POINTS = 5.0

#: Per request of a trace, the prompt tokens its run served from the prefix cache.
CachedTokens = Callable[[Trace], np.ndarray]


def locate(window: Trace, full: Trace) -> int:
    """Where the window's measured requests start in `full`: the index i0 such that full[i0:i0+n]
    has the same input and output lengths and block ids, in order. A `ValueError` when the window
    is not a run of the full trace's requests."""
    m = window.measured()
    n = len(m)
    cands = np.flatnonzero(full.input_tokens[: len(full) - n + 1] == m.input_tokens[0])
    off = full.hash_offsets() if full.hash_ids is not None and m.hash_ids is not None else None
    for i0 in cands.tolist():
        if not (np.array_equal(full.input_tokens[i0:i0 + n], m.input_tokens)
                and np.array_equal(full.output_tokens[i0:i0 + n], m.output_tokens)):
            continue
        if off is None or np.array_equal(full.hash_ids[off[i0]:off[i0 + n]], m.hash_ids):
            return int(i0)
    raise ValueError(f"{window.name}: its measured requests are not a run of the full trace's requests")


def hit_rate_gap(window: Trace, full: Trace, cached_tokens: CachedTokens) -> dict:
    """The hit rate of the window's measured requests in the window's run (with its warm-up) and
    in the full trace's run, and their difference in points (full - window, so positive = the
    warm-up left the cache colder than the service had it).

    `window` and `full` must be on the same time scale (the window's time scale applied to both)
    so both runs see the same load; `cached_tokens` runs a trace and returns each request's
    cached prompt tokens.
    """
    i0 = locate(window, full)
    m = window.measured()
    n = len(m)
    prompt = float(m.input_tokens.sum())
    in_window = np.asarray(cached_tokens(window), dtype=np.float64)[window.warmup:]
    in_full = np.asarray(cached_tokens(full), dtype=np.float64)[i0:i0 + n]
    w, f = float(in_window.sum()) / prompt, float(in_full.sum()) / prompt
    return {"window": window.name, "n_measured": n, "n_warmup": int(window.warmup),
            "hit_window": w, "hit_full": f, "gap_points": 100.0 * (f - w)}


_REFERENCE: dict[str, np.ndarray] = {}


def reference_cached_tokens(trace: Trace) -> np.ndarray:
    """Cached tokens under a cache that never evicts and ignores time (`seen_prefix_tokens`); it
    does not depend on the time scale, so each trace's is computed once (by content)."""
    from schedport.workload.prefix import seen_prefix_tokens

    key = trace.content_sha256()
    if key not in _REFERENCE:
        _REFERENCE[key] = seen_prefix_tokens(trace)
    return _REFERENCE[key]


def engine_cached_tokens(engine, scheduler: str = "vllm-fcfs") -> CachedTokens:
    """A `CachedTokens` that runs a trace as it is (already on its time scale) under `scheduler` on
    `engine` and reads the ``cached_tokens`` column of its request table. A `SchedportError` when
    the engine reports no cached tokens (an engine without a prefix cache)."""
    from schedport.engine.runner import simulate

    def run(trace: Trace) -> np.ndarray:
        res = simulate(trace, scheduler, engine=engine, time_scale=1.0)
        if "cached_tokens" not in res.requests.columns:
            raise SchedportError("the engine's request table has no cached_tokens column: this engine has no "
                                 "prefix cache to measure (use --reference for the engine-independent bound)")
        return res.requests["cached_tokens"].to_numpy()
    return run


def _read_source(path: Path) -> Trace:
    """The whole source trace: Mooncake JSONL by the mooncake adapter, else a canonical trace file."""
    if path.suffix == ".jsonl":
        from schedport.workload.sources import mooncake

        return mooncake.read([path]).trace
    from schedport.workload.trace import load_trace

    return load_trace(path)


def main(argv=None) -> int:
    """Command line: one line per window (hit rates, difference), exit 1 if any reaches the limit."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--source", type=Path, required=True, help="the file the source's windows were cut from")
    ap.add_argument("--windows", default="", help="comma-separated window ids (default: every window with a warm-up)")
    ap.add_argument("--reference", action="store_true", help="a cache that never evicts, without the engine")
    ap.add_argument("--engine", default=None, help="engine TOML (with [engine] enable_prefix_caching = true)")
    ap.add_argument("--scheduler", default="vllm-fcfs")
    ap.add_argument("--rho", type=float, default=0.8, help="the load both runs are brought to (the window's scale)")
    args = ap.parse_args(argv)
    try:
        from schedport.engine.capacity import load_scale
        from schedport.engine.inputs import rescale, resolve_engine
        from schedport.workload.corpus_manifest import load_corpus

        corpus = load_corpus(args.corpus)
        full = _read_source(args.source)
        wanted = [w for w in args.windows.split(",") if w]
        cfg = resolve_engine(args.engine)
        worst = 0.0
        for w in corpus.windows:
            if (wanted and w.window_id not in wanted) or (not wanted and not w.meta.get("n_warmup")):
                continue
            t = corpus.trace(w.window_id)
            if args.reference:
                cached, scale = reference_cached_tokens, 1.0
            else:
                cached, scale = engine_cached_tokens(cfg, args.scheduler), load_scale(t, args.rho, cfg)
            r = hit_rate_gap(rescale(t, scale), rescale(full, scale), cached)
            worst = max(worst, abs(r["gap_points"]))
            print(f"{r['window']}: {r['n_measured']} measured, {r['n_warmup']} warm-up; hit rate "
                  f"{100 * r['hit_window']:.2f}% with the warm-up, {100 * r['hit_full']:.2f}% in the full trace "
                  f"({r['gap_points']:+.2f} points)")
    except (SchedportError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"largest difference {worst:.2f} points (limit {LIMIT_POINTS:g})")
    return 1 if worst >= LIMIT_POINTS else 0


if __name__ == "__main__":
    sys.exit(main())
