"""Analysis speed: the protocol multiverse (`analyze --robustness`) on a results store.

    python benchmarks/bench_robustness.py [--results results] [--boot 200] [--repeats 1]

Loads the store once, then times `schedport.analysis.multiverse.robustness` alone (CPU and wall
seconds, the least of `--repeats`) and prints the protocols it covers, the distinct analyses it
computes per claim, and the cost per distinct analysis. On the default study (`make run`) the
issue's bound is at most 120 s on 2 cores on top of the rest of the analysis.
"""

from __future__ import annotations

import argparse
import time

from schedport.analysis.defaults import ABS_THRESHOLD, PRACTICAL_THRESHOLD, Q
from schedport.analysis.multiverse import N_BOOT_ROBUSTNESS, robustness
from schedport.analysis.store_loading import load_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default="results")
    ap.add_argument("--boot", type=int, default=N_BOOT_ROBUSTNESS)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    df, _ = load_store(a.results)
    best_wall = best_cpu = float("inf")
    rob = None
    for _ in range(a.repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        rob = robustness(df, practical_threshold=PRACTICAL_THRESHOLD, abs_threshold=ABS_THRESHOLD, q=Q,
                         n_boot=a.boot)
        best_wall = min(best_wall, time.perf_counter() - w0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    n_distinct = sum(c["n_distinct"] for c in rob["claims"])
    print(f"store {a.results}: {len(df):,} runs; {rob['n_protocols']:,} protocols, {n_distinct:,} distinct "
          f"analyses, B = {a.boot}")
    for c in rob["claims"]:
        print(f"  {c['id']:<17} {c['n_distinct']:>6,} distinct  holds under {100 * c['share_holds']:5.1f}%")
    print(f"wall {best_wall:.1f} s, CPU {best_cpu:.1f} s; {1000 * best_cpu / n_distinct:.2f} ms CPU per distinct "
          f"analysis, {1e6 * best_cpu / rob['n_protocols']:.0f} us per protocol")


if __name__ == "__main__":
    main()
