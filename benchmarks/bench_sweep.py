"""Benchmark the sweep: wall time of a subset, extrapolated to the full default matrix, and the
sweep machinery's overhead relative to pure simulation time.

    python benchmarks/bench_sweep.py                      # synthetic fixture corpus
    python benchmarks/bench_sweep.py --corpus corpus      # the real corpus (first N windows/source)

The subset runs every scheduler at every region (their costs differ by two orders of
magnitude) on a few windows per source, into a temporary results directory. It prints:

- the subset's wall time and throughput (runs/s);
- the machinery overhead on the subset: (wall x workers) / (sum of in-worker `simulate()`
  and capacity times) - 1, split into start-up (corpus load, worker processes), the idle
  tail (workers without a task at the end) and the per-task rest (pickling, transfer,
  store writes, driver CPU);
- the full default matrix (13 schedulers x 120 windows x 6 regions = 9,360 runs) on the
  same executor and workers, extrapolated: simulation and per-task costs scale with the
  number of runs, start-up and the idle tail are paid once. Its wall time and overhead
  are the figures to compare with the targets (10 minutes, 5%);
- the simulation time per scheduler, which shows where the time goes.

Without ``--corpus`` (or when the directory does not exist) a fixture corpus of 3 synthetic
sources x 2 windows x 800 requests (the real windows' size) is generated, so the benchmark
runs anywhere; its extrapolation is indicative, the real corpus's is the figure to quote.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

FULL_RUNS = 13 * 120 * 6


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its report; returns the process exit code."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=None, help="real corpus directory (default: fixture)")
    ap.add_argument("--windows", type=int, default=None,
                    help="windows per source (default: 1 on a real corpus, 2 on the fixture)")
    ap.add_argument("--schedulers", default=None, help="comma-separated (default: all 13)")
    ap.add_argument("--regions", default=None, help="comma-separated (default: all 6)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--executor", default="local", choices=("local", "ray"))
    ap.add_argument("--requests", type=int, default=800, help="fixture: requests per window")
    ap.add_argument("--out", type=Path, default=None, help="keep the results here (default: temporary)")
    args = ap.parse_args(argv)

    from schedport.errors import SchedportError
    from schedport.engine.policies.schedulers import REGISTRY
    from schedport.study.sweep import run_sweep, write_demo_corpus

    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        tmp = Path(tmp)
        if args.corpus is not None and args.corpus.exists():
            corpus, label = args.corpus, str(args.corpus)
            windows = args.windows or 1
        else:
            if args.corpus is not None:
                print(f"{args.corpus} does not exist: using the synthetic fixture corpus", file=sys.stderr)
            corpus = write_demo_corpus(tmp / "corpus", sources=("demo-a", "demo-b", "demo-c"),
                                       windows_per_source=2, requests_per_window=args.requests)
            label = f"fixture (3 synthetic sources x 2 windows x {args.requests} requests)"
            windows = args.windows or 2
        out = args.out or tmp / "results"
        try:
            t0 = time.perf_counter()
            res = run_sweep(corpus, out, schedulers=args.schedulers, regions=args.regions, windows=windows,
                            executor=args.executor, workers=args.workers, progress=sys.stderr.isatty())
            wall = time.perf_counter() - t0
        except SchedportError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if res.cells_run == 0:
            print(f"error: nothing ran ({out} already holds these cells); use another --out", file=sys.stderr)
            return 2

    n = res.cells_run
    startup = res.timings.get("load_s", 0.0) + res.timings.get("executor_start_s", 0.0)
    sim = res.sim_s + res.capacity_s
    steady_wall = wall - startup
    print(f"corpus: {label}")
    print(f"subset: {n} runs ({len(res.sim_by_scheduler)} schedulers, {windows} windows/source, "
          f"all selected regions), {res.workers} {res.executor} workers")
    print(f"wall: {wall:.1f} s ({n / wall:.2f} runs/s); start-up {startup:.1f} s, "
          f"capacities {res.timings.get('capacity_wall_s', 0.0):.1f} s, "
          f"runs {res.timings.get('runs_wall_s', 0.0):.1f} s")
    print(f"pure simulation: {res.sim_s:.1f} s in simulate() + {res.capacity_s:.1f} s capacity = {sim:.1f} s "
          f"(mean {res.sim_s / n * 1000:.0f} ms/run)")
    w = res.workers
    idle = res.timings.get("idle_worker_s", 0.0)
    per_task = max(steady_wall * w - sim - idle, 0.0)  # pickling, transfer, store writes, driver CPU
    print(f"machinery overhead: {wall * w / sim - 1:+.1%} of simulation time overall "
          f"(start-up {startup * w / sim:.1%}, idle tail {idle / sim:.1%}, per-task {per_task / sim:.1%})")
    scale = FULL_RUNS / n
    full_sim = sim * scale
    full = startup + (full_sim + idle + per_task * scale) / w
    full_over = (startup * w + idle + per_task * scale) / full_sim
    print(f"extrapolated full default matrix (13 x 120 x 6 = {FULL_RUNS:,} runs) on {w} workers: "
          f"{full / 60:.1f} min wall (target <= 10 min); machinery overhead {full_over:.1%} "
          f"(target <= 5%; start-up and tail amortized, per-task cost scaled)")
    if len(res.sim_by_scheduler) < len(REGISTRY):
        print("  (subset lacks some schedulers: the extrapolation assumes they cost the same)")
    print("simulation time by scheduler (share of total):")
    for s, t in sorted(res.sim_by_scheduler.items(), key=lambda kv: -kv[1]):
        print(f"  {s:<14} {t:8.1f} s  {t / res.sim_s:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
