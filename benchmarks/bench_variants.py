"""Benchmark the simulator axis: what `run --variants SET` costs against one study.

    python benchmarks/bench_variants.py --corpus corpus                  # the whole default study
    python benchmarks/bench_variants.py --corpus corpus --windows 8      # a subset, every scheduler

Into a fresh results directory it runs the plain study (`run_sweep`, capacities included), then
`run_variant_sweeps` with the set (the default's cells reused, every variant's capacities
measured on its own engine), and prints each variant's wall time and the bound of the simulator
axis: the variants' total over V x the plain study's, which should stay at or under 1.1 (the
engine's perturbed latency models cost what the default one does; each variant pays its own
process pool, capacities and tail). A busy machine moves both sides; the load average before
and after is printed so a slow spell can be told.

With ``--executor ray`` the variants run on a local Ray instance, and with ``--compare DIR`` the
variants' stores are compared cell for cell with those of an earlier run (the same rows on any
executor).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures; returns the process exit code."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a built corpus directory")
    ap.add_argument("--variants", default="uncertainty", help="variant set name or TOML (default: uncertainty)")
    ap.add_argument("--windows", type=int, default=None, help="windows per source (default: all)")
    ap.add_argument("--schedulers", default=None, help="comma-separated (default: all 13)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--executor", default="local", choices=("local", "ray"))
    ap.add_argument("--out", type=Path, default=None, help="keep the results here (default: temporary)")
    ap.add_argument("--compare", type=Path, default=None, help="a store of an earlier run to compare with")
    args = ap.parse_args(argv)

    from schedport.errors import SchedportError
    from schedport.study.sweep import run_sweep
    from schedport.study.variants import load_variant_set, run_variant_sweeps

    if not (args.corpus / "manifest.json").is_file():
        print(f"bench_variants: {args.corpus}: not a built corpus (run `schedport corpus build`)", file=sys.stderr)
        return 1
    try:
        vset = load_variant_set(args.variants)
    except SchedportError as e:
        print(f"bench_variants: {e}", file=sys.stderr)
        return 1
    opts = dict(schedulers=args.schedulers, windows=args.windows, executor=args.executor, workers=args.workers,
                progress=False)
    with tempfile.TemporaryDirectory(prefix="bench-variants-") as tmp:
        out = args.out or Path(tmp) / "results"
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        plain = run_sweep(args.corpus, out, **opts)
        t_plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        results = run_variant_sweeps(args.corpus, out, vset, **opts)
        t_var = time.perf_counter() - t0
        load1 = os.getloadavg()[0]
        V = len(results) - 1
        print(f"plain study: {plain.cells_run} runs in {t_plain:.1f} s wall (capacities {plain.capacity_s:.1f} "
              f"worker-s, {plain.capacities_measured} measured)")
        names = ["default"] + [v.name for v in vset.variants]
        for name, r in zip(names, results):
            print(f"  {name:<18} {r.cells_run:>6} runs ({r.cells_skipped} reused) {r.wall_s:7.1f} s wall, "
                  f"capacities {r.capacities_measured}")
        print(f"variants: {V} x {plain.cells_run} runs in {t_var:.1f} s wall = {t_var / (V * t_plain):.3f} x "
              f"(V x the plain study's {t_plain:.1f} s; bound 1.1)")
        print(f"load average: {load0:.2f} before, {load1:.2f} after ({args.workers} {args.executor} workers)")
        if args.compare is not None:
            import pandas as pd

            from schedport.study.variants import variant_store

            key = ["source", "window_id", "region", "scheduler", "seed"]
            same = True
            for name in names:
                a = pd.read_parquet(variant_store(out, name) / "runs").sort_values(key).reset_index(drop=True)
                b = pd.read_parquet(variant_store(args.compare, name) / "runs").sort_values(key).reset_index(drop=True)
                ok = a.equals(b)
                same &= ok
                print(f"  {name:<18} {'identical' if ok else 'DIFFERENT'} to {args.compare}")
            if not same:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
