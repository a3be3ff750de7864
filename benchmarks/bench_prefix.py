"""Prefix caching: per-run cost with `[engine] enable_prefix_caching` on vs off, and what it changes,
on windows of the Mooncake conversation trace.

    python benchmarks/bench_prefix.py [--data-dir DIR] [--rho 0.5,0.95,1.3] [--requests 1000]
                                      [--windows 0,3,6] [--schedulers vllm-fcfs,sarathi] [--repeats 3]

Each window is `--requests` consecutive requests of Mooncake's conversation trace (Kimi, FAST'25;
window k starts at request k x N), on the long-context deployment `llama3.1-8b-a100-128k`
(docs/engine.md §3.7), brought to offered load rho against the engine's sustainable capacity
without the cache (the same time axis on both sides). The requests before a window are not
replayed here: each window starts with an empty cache, so its hit rate is a window's own reuse.

For every (window, rho, scheduler) it prints the CPU time per run (this process's, the least of
`--repeats` rounds, the rounds alternating the three configurations) with the cache off in the
default fast mode, off with --exact, and on (which steps every iteration), the ratio of "on" to
each, and the run's outcome: hit rate (prompt tokens found cached at first admission over prompt
tokens admitted), TTFT p99 and E2E mean, off and on.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from schedport.engine.core.config import engine_config_from_dict
from schedport.engine.core.deployments import engine_overlay
from schedport.engine.core.latency import make_latency_model
from schedport.engine.core.simulator import collector_paused
from schedport.engine.execution import simulate_scaled
from schedport.engine.modes import make_simulator
from schedport.engine.policies.schedulers import get_policy
from schedport.engine.runner import load_scale, rescale
from schedport.workload.datadir import resolve_data_dir
from schedport.workload.sources import read

DEPLOYMENT = "llama3.1-8b-a100-128k"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--rho", default="0.5,0.95,1.3")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--windows", default="0,3,6", help="window indices (window k starts at request k x N)")
    ap.add_argument("--schedulers", default="vllm-fcfs,sarathi")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    path = resolve_data_dir(args.data_dir) / "mooncake-fast25" / "conversation_trace.jsonl"
    full = read("mooncake", [path]).trace
    off = engine_config_from_dict({"engine": engine_overlay(DEPLOYMENT), "latency": {"deployment": DEPLOYMENT}},
                                  source="bench_prefix")
    on = dataclasses.replace(off, enable_prefix_caching=True)
    lat = make_latency_model(off)
    n = args.requests
    print(f"{path.name}: {len(full)} requests; windows of {n}; deployment {DEPLOYMENT}; CPU ms per run, "
          f"least of {args.repeats}")
    print(f"{'window':>6} {'rho':>5} {'scheduler':<10} {'off ms':>8} {'exact ms':>9} {'on ms':>8} {'on/off':>7} "
          f"{'on/exact':>8} {'hit':>6} {'ttft99 off':>10} {'ttft99 on':>10} {'e2e off':>8} {'e2e on':>8}")
    ratios = []
    for k in (int(x) for x in args.windows.split(",")):
        window = full.take(np.arange(k * n, min((k + 1) * n, len(full))))
        window = dataclasses.replace(window, arrival_s=window.arrival_s - window.arrival_s[0])
        for rho in (float(x) for x in args.rho.split(",")):
            scale = load_scale(window, rho, off)
            scaled = rescale(window, scale)
            for name in args.schedulers.split(","):
                policy = get_policy(name)
                times = {c: [] for c in ("off", "exact", "on")}
                for _ in range(args.repeats):
                    for c, cfg, exact in (("off", off, False), ("exact", off, True), ("on", on, False)):
                        t0 = time.process_time()
                        with collector_paused():
                            sim = make_simulator(scaled, policy, cfg, lat, exact=exact)
                            sim.run()
                            sim.release()
                        times[c].append(time.process_time() - t0)
                best = {c: min(v) for c, v in times.items()}
                res_off = simulate_scaled(scaled, scale, policy, off).summary
                res_on = simulate_scaled(scaled, scale, policy, on).summary
                ratios.append(best["on"] / best["off"])
                print(f"{k:>6} {rho:>5} {name:<10} {best['off'] * 1e3:8.0f} {best['exact'] * 1e3:9.0f} "
                      f"{best['on'] * 1e3:8.0f} {best['on'] / best['off']:6.2f}x {best['on'] / best['exact']:7.2f}x "
                      f"{res_on['prefix_hit_rate']:6.1%} {res_off['ttft_p99_s']:10.2f} {res_on['ttft_p99_s']:10.2f} "
                      f"{res_off['e2e_mean_s']:8.2f} {res_on['e2e_mean_s']:8.2f}")
    print(f"on/off over all rows: median {np.median(ratios):.2f}x, max {max(ratios):.2f}x")


if __name__ == "__main__":
    main()
