"""Input speed: loading a trace CSV, and a ServeGen slot read cold and warm.

    python benchmarks/bench_io.py [--data-dir DIR] [--rows 20000] [--repeats 3]

Prints the best of `--repeats` for: `load_trace` on a CSV of `--rows` synthetic requests (per
1,000 rows), and, when the data directory holds the ServeGen mirror, one slot of the Bailian
pool read with no file parsed yet (cold) and again with the parsed files the process keeps
(warm). These were timed in the test suite once; they live here so that no test depends on
how fast the machine is.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from schedport.workload.trace import Trace, load_trace, save_trace


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()

    rng = np.random.default_rng(1)
    n = a.rows
    t = Trace.from_arrays(np.cumsum(rng.exponential(0.2, n)), rng.integers(1, 5000, n),
                          rng.integers(1, 500, n), rng.choice(["chat", "code"], n))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.csv"
        save_trace(t, path)
        load_trace(path)  # imports paid once
        s = _best(lambda: load_trace(path), a.repeats)
    print(f"load_trace, {n:,} rows: {s * 1e3:.1f} ms ({s / n * 1e6:.2f} ms per 1,000 rows)")

    from schedport.workload import sources
    from schedport.workload.datadir import resolve_data_dir
    from schedport.errors import SchedportError
    from schedport.workload.sources import servegen as sg

    try:
        pool = resolve_data_dir(a.data_dir) / "servegen-language-m-large"
    except SchedportError:
        pool = None
    if pool is None or not pool.is_dir():
        print("servegen slot: no ServeGen mirror in the data directory (give --data-dir)")
        return
    sg.clear_cache()
    t0 = time.perf_counter()
    sources.read("servegen", [pool], slot_start_s=600000, seed=0)
    cold = time.perf_counter() - t0
    warm = _best(lambda: sources.read("servegen", [pool], slot_start_s=600000, seed=1), a.repeats)
    print(f"servegen slot ({pool}): cold {cold:.2f} s, warm {warm * 1e3:.0f} ms ({cold / warm:.0f}x)")


if __name__ == "__main__":
    main()
