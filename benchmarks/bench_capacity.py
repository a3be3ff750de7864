"""Cost of measuring capacity: the sustainable definition against the drain one, over a corpus.

    python benchmarks/bench_capacity.py [--corpus corpus] [--engine FILE] [--every 1]

For every window of the corpus (or every k-th, ``--every k``), measures its capacity under
``sustainable`` (the default: the steady completion rate of a saturated replay, on copies of the
mix when the window is shorter than four batches) and under ``drain`` (requests / makespan of
the same all-at-once replay), each from cold (the in-process cache is cleared), and prints the
total wall time of each, their ratio, the requests each simulated, and the median ratio of the
two capacities per source. Both run in this one process, interleaved window by window, so a
busy machine slows both alike and the ratio stays meaningful.
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics
import time

from schedport.engine.capacity import SATURATED_BATCHES, SATURATED_MAX, capacity, clear_capacity_cache
from schedport.engine.core.config import load_engine_config
from schedport.workload.corpus import load_corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="corpus")
    ap.add_argument("--engine", default=None)
    ap.add_argument("--every", type=int, default=1)
    args = ap.parse_args()
    cfg = load_engine_config(args.engine)
    corpus = load_corpus(args.corpus)
    windows = corpus.windows[::args.every]
    wall = {"sustainable": 0.0, "drain": 0.0}
    simulated = {"sustainable": 0, "drain": 0}
    ratio = collections.defaultdict(list)
    for w in windows:
        t = corpus.trace(w.window_id)
        caps = {}
        for d in ("sustainable", "drain"):
            clear_capacity_cache()
            t0 = time.perf_counter()
            caps[d] = capacity(t, cfg, d)
            wall[d] += time.perf_counter() - t0
            copies = 1 if d == "drain" else max(1, min(math.ceil(SATURATED_BATCHES * cfg.max_num_seqs / len(t)),
                                                       SATURATED_MAX // len(t)))
            simulated[d] += copies * len(t)
        ratio[w.source].append(caps["sustainable"] / caps["drain"])
    print(f"{len(windows)} windows: sustainable {wall['sustainable']:.1f} s ({simulated['sustainable']:,} requests "
          f"simulated), drain {wall['drain']:.1f} s ({simulated['drain']:,}); cost ratio "
          f"{wall['sustainable'] / wall['drain']:.2f}x")
    for s, r in ratio.items():
        print(f"  {s}: sustainable / drain capacity, median {statistics.median(r):.2f} "
              f"(range {min(r):.2f}-{max(r):.2f}, {len(r)} windows)")


if __name__ == "__main__":
    main()
