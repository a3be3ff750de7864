"""Engine speed: per-run cost of every scheduler on a real 1,000-request window, fast vs --exact.

    python benchmarks/bench_engine.py [--data-dir DIR] [--rho 0.95] [--repeats 5] [--requests 1000]

Reads the first N requests of the Azure LLM inference 2023 conversation trace (Patel et al.,
ISCA 2024) from the data directory, brings the window to offered load rho, and prints for every
scheduler: median wall time per run in the default (fast-forward) mode and with --exact, their
ratio, runs/s, simulated requests per wall-second and iterations per wall-second. Runs on one
core (a single process), so the sweep's two-core throughput is about twice runs/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

from schedport.api import load_scale, rescale
from schedport.config import load_engine_config
from schedport.datadir import resolve_data_dir
from schedport.engine import Simulator
from schedport.latency import make_latency_model
from schedport.schedulers import REGISTRY, get_policy
from schedport.sources import read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--rho", type=float, default=0.95)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--schedulers", default=",".join(REGISTRY))
    args = ap.parse_args()

    data = resolve_data_dir(args.data_dir)
    path = data / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"
    trace = read("azure", [path], rows=args.requests).trace
    cfg = load_engine_config(None)
    lat = make_latency_model(cfg)
    t0 = time.perf_counter()
    scale = load_scale(trace, args.rho, cfg)
    cap_s = time.perf_counter() - t0
    window = rescale(trace, scale)
    print(f"window: {len(trace)} requests of {path.name}, rho={args.rho}, time scale {scale:.3f}, "
          f"capacity measured in {cap_s * 1000:.0f} ms")
    print(f"{'scheduler':<14} {'fast ms':>8} {'exact ms':>9} {'speedup':>8} {'runs/s':>7} "
          f"{'req/s':>8} {'iter/s':>9} {'iters':>6} {'events':>6}")
    for name in args.schedulers.split(","):
        policy = get_policy(name)
        res = {}
        for exact in (False, True):
            times = []
            for _ in range(args.repeats if not exact else max(1, args.repeats // 2)):
                t0 = time.perf_counter()
                out = Simulator(window, policy, cfg, lat, exact=exact).run()
                times.append(time.perf_counter() - t0)
            res[exact] = (statistics.median(times), out)
        fast, out = res[False]
        exact = res[True][0]
        print(f"{name:<14} {fast * 1e3:8.1f} {exact * 1e3:9.1f} {exact / fast:7.1f}x {1 / fast:7.1f} "
              f"{len(trace) / fast:8.0f} {out.iterations / fast:9.0f} {out.iterations:6d} {out.events:6d}")


if __name__ == "__main__":
    main()
