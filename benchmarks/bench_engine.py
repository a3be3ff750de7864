"""Engine speed: per-run cost of every scheduler on a real 1,000-request window, fast vs --exact.

    python benchmarks/bench_engine.py [--data-dir DIR] [--rho 0.95,1.6] [--repeats 5] [--requests 1000]
                                      [--processes N] [--check]

Reads the first N requests of the Azure LLM inference 2023 conversation trace (Patel et al.,
ISCA 2024) from the data directory, brings the window to offered load rho, and prints for every
scheduler: CPU time per run (this process's, the least of the repeats: a shared machine's stolen
and idle time counted out; the repeats are rounds of every scheduler in turn, so that a slow
spell hits every row alike) in the default (fast-forward) mode and with --exact, their
ratio, its cost over vllm-fcfs's in the same mode ("x fcfs"), runs/s, simulated requests per
wall-second and iterations per wall-second, with the run's iterations and decision points (steps
the policy had to plan). A run is timed from building its simulator to releasing it, with the
cyclic garbage collector paused, as a sweep's run (`schedport.engine.execution.simulate_scaled`).
Runs on one core (a single process), so the sweep's two-core throughput
is about twice runs/s.

The engine's cost bounds: at rho 0.95 and 1.6 every policy should cost at most
3x vllm-fcfs per run (fastserve 5x), and the fast mode should never be slower than --exact.
`--check` exits 1 naming each bound a row misses.

`--processes N` times the whole table in N fresh processes, one after another, and reports each
row's median over them: the times, and the ratios ("x fcfs", with its range over the processes, and
the speedup) as the median of each process's own ratio, its two sides timed side by side. A slow
spell of a shared machine can inflate every round of one process's row, and a process's layout
and string-hash salt are its own; the median of several processes is the figure to hold a bound
to (``--processes 5 --check``), as pyperf runs each benchmark in several worker processes.

The fast mode skips the iterations between decision points, so its gain over --exact is bounded
by iterations per decision point (the "it/dp" column) times what an exact step costs over a
planned one; give several loads (``--rho 0.2,0.95``) to see the ratio follow it.

Wall times on a shared virtual machine drift by tens of percent within an hour. To compare two
versions of the code, count instructions instead: run one mode under
``valgrind --tool=cachegrind --cache-sim=no`` with ``--mode fast --repeats 1`` and again with
``--repeats 3``; half the difference of the two "I refs" totals is one run's cost, free of
start-up and of the machine's noise. Set ``OPENBLAS_NUM_THREADS=1`` (and ``OMP_NUM_THREADS=1``):
numpy's idle pool threads otherwise spin a varying number of instructions, several percent of a run.
Set ``PYTHONHASHSEED=0`` too: string hashing is salted per process, and the salt moves a run's
dictionary probes by about a million instructions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from schedport.engine.runner import load_scale, rescale
from schedport.errors import SchedportError
from schedport.engine.core.config import load_engine_config
from schedport.workload.datadir import resolve_data_dir
from schedport.engine.core.simulator import collector_paused
from schedport.engine.modes import make_simulator
from schedport.engine.core.latency import make_latency_model
from schedport.engine.policies.schedulers import REGISTRY, get_policy
from schedport.workload.sources import read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--rho", default="0.95,1.6", help="offered load, or a comma-separated list")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--schedulers", default=",".join(REGISTRY))
    ap.add_argument("--mode", choices=("both", "fast", "exact"), default="both",
                    help="time both modes (the table), or run only one (for instruction counts)")
    ap.add_argument("--processes", type=int, default=1,
                    help="time the table in this many fresh processes, one after another, and report each "
                         "row's median over them (and the range of its cost over vllm-fcfs's)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if a policy costs over 3x vllm-fcfs (fastserve 5x) or fast is slower than exact")
    ap.add_argument("--emit-json", action="store_true", help=argparse.SUPPRESS)  # (a worker's results, on stdout)
    args = ap.parse_args()
    if args.processes < 1 or args.repeats < 1:
        raise SystemExit("bench_engine: --processes and --repeats must be at least 1")
    if args.processes > 1 and args.mode != "both":
        raise SystemExit("bench_engine: --processes times the table (--mode both)")
    names = args.schedulers.split(",")
    if "vllm-fcfs" in names:
        names.remove("vllm-fcfs")
        names.insert(0, "vllm-fcfs")        # the reference every other row is a multiple of
    if args.processes > 1:
        runs = [worker_results(args, i) for i in range(args.processes)]
    else:
        try:
            runs = [measure(args, names)]
        except SchedportError as e:
            raise SystemExit(f"bench_engine: {e}") from None
        if args.emit_json:
            print(json.dumps(runs[0]))
            return
    misses: list[str] = []
    if args.mode == "both":
        for rho in runs[0]:
            print(runs[0][rho]["window"])
            print(f"{'scheduler':<14} {'fast ms':>8} {'exact ms':>9} {'speedup':>8} {'x fcfs':>7} {'runs/s':>7} "
                  f"{'req/s':>8} {'iter/s':>9} {'iters':>6} {'dps':>6} {'it/dp':>6}"
                  + (f" {'x fcfs range':>13}" if len(runs) > 1 else ""))
            rows = [run[rho]["rows"] for run in runs]
            for name in names:
                row = summarize(name, rows)
                print_row(name, row, len(runs) > 1)
                misses += bound_misses(name, float(rho), row)
    for m in misses:
        print("bound missed:", m)
    if args.check and misses:
        raise SystemExit(1)


def measure(args, names: list[str]) -> dict:
    """This process's timings: for each load, the window's line and each scheduler's CPU seconds per
    run (the least of the rounds) in both modes, with its run's iterations and decision points."""
    data = resolve_data_dir(args.data_dir)
    path = data / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"
    trace = read("azure", [path], rows=args.requests).trace
    cfg = load_engine_config(None)
    lat = make_latency_model(cfg)
    results = {}
    for rho in (float(x) for x in args.rho.split(",")):
        t0 = time.perf_counter()
        scale = load_scale(trace, rho, cfg)
        cap_s = time.perf_counter() - t0
        window = rescale(trace, scale)
        line = (f"window: {len(trace)} requests of {path.name}, rho={rho}, time scale {scale:.3f}, "
                f"capacity measured in {cap_s * 1000:.0f} ms")
        if args.mode != "both":
            print(line)
            for name in names:
                policy = get_policy(name)
                for _ in range(args.repeats):
                    make_simulator(window, policy, cfg, lat, exact=args.mode == "exact").run()
            continue
        times, outs = time_rounds(names, window, cfg, lat, args.repeats)
        results[str(rho)] = {"window": line, "rows": {
            name: {"fast": min(times[name, False]), "exact": min(times[name, True]),
                   "iters": outs[name].iterations, "events": outs[name].events, "requests": len(window)}
            for name in names}}
    return results


def worker_results(args, i: int) -> dict:
    """One fresh process's timings (`measure`): its own address-space layout and string-hash salt, the
    part of a run's cost that moves with the process and that no number of rounds in one averages out."""
    cmd = [sys.executable, os.path.abspath(__file__), "--rho", args.rho, "--repeats", str(args.repeats),
           "--requests", str(args.requests), "--schedulers", args.schedulers, "--emit-json"]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)     # (its errors go to this process's stderr)
    if p.returncode:
        raise SystemExit(f"bench_engine: timing process {i + 1} of {args.processes} failed")
    print(f"process {i + 1}/{args.processes} timed in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return json.loads(p.stdout)


def summarize(name: str, rows: list[dict]) -> dict:
    """A scheduler's row over the processes: median times, and its cost over vllm-fcfs's and fast's
    gain over --exact as the median of each process's own ratio (both sides timed in one process)."""
    fcfs = [r["vllm-fcfs"]["fast"] for r in rows] if "vllm-fcfs" in rows[0] else None
    own = [r[name] for r in rows]
    row = dict(own[0])
    row["fast"] = statistics.median(o["fast"] for o in own)
    row["exact"] = statistics.median(o["exact"] for o in own)
    row["speedup"] = statistics.median(o["exact"] / o["fast"] for o in own)
    if fcfs:
        ratios = [o["fast"] / f for o, f in zip(own, fcfs)]
        row["x_fcfs"] = statistics.median(ratios)
        row["x_fcfs_range"] = (min(ratios), max(ratios))
    else:
        row["x_fcfs"] = None
    return row


#: The most a policy's run may cost, as a multiple of vllm-fcfs's on the same window.
COST_BOUND = {"fastserve": 5.0}
COST_BOUND_DEFAULT = 3.0


def bound_misses(name: str, rho: float, row: dict) -> list[str]:
    """The engine's cost bounds this row (`summarize`) misses, one line each."""
    out = []
    bound = COST_BOUND.get(name, COST_BOUND_DEFAULT)
    if row["x_fcfs"] is not None and row["x_fcfs"] > bound:
        out.append(f"{name} at rho {rho}: {row['x_fcfs']:.2f}x vllm-fcfs, bound {bound:g}x")
    if row["speedup"] < 1:
        out.append(f"{name} at rho {rho}: fast {row['fast'] * 1e3:.1f} ms is slower than --exact "
                   f"{row['exact'] * 1e3:.1f} ms")
    return out


def time_rounds(names: list[str], window, cfg, lat, repeats: int) -> tuple[dict, dict]:
    """CPU seconds of every scheduler in both modes, `repeats` rounds of each scheduler once per
    mode in turn, so that a slow spell of the machine hits every row (and the vllm-fcfs row every
    other is a multiple of) alike; and each scheduler's last fast-mode output."""
    policies = {name: get_policy(name) for name in names}
    times: dict[tuple[str, bool], list[float]] = {(n, e): [] for n in names for e in (False, True)}
    outs = {}
    for _ in range(repeats):
        for name in names:
            for exact in (False, True):
                t0 = time.process_time()
                with collector_paused():    # as a sweep's run: its objects freed before the collector is back
                    sim = make_simulator(window, policies[name], cfg, lat, exact=exact)
                    out = sim.run()
                    sim.release()
                times[name, exact].append(time.process_time() - t0)
                if not exact:
                    outs[name] = out
    return times, outs


def print_row(name: str, row: dict, spread: bool) -> None:
    """One scheduler's row of the table (times in seconds, the least of the rounds)."""
    fast = row["fast"]
    ratio = f"{row['x_fcfs']:6.2f}x" if row["x_fcfs"] is not None else f"{1.0:6.2f}x"
    line = (f"{name:<14} {fast * 1e3:8.1f} {row['exact'] * 1e3:9.1f} {row['speedup']:7.1f}x {ratio} {1 / fast:7.1f} "
            f"{row['requests'] / fast:8.0f} {row['iters'] / fast:9.0f} {row['iters']:6d} {row['events']:6d} "
            f"{row['iters'] / max(row['events'], 1):6.1f}")
    if spread and row["x_fcfs"] is not None:
        lo, hi = row["x_fcfs_range"]
        line += f" {lo:6.2f}-{hi:.2f}x"
    print(line, flush=True)


if __name__ == "__main__":
    main()
