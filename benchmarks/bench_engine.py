"""Engine speed: per-run cost of every scheduler on a real 1,000-request window, fast vs --exact.

    python benchmarks/bench_engine.py [--data-dir DIR] [--rho 0.95,1.6] [--repeats 5] [--requests 1000] [--check]

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
import time

from schedport.engine.runner import load_scale, rescale
from schedport.engine.config import load_engine_config
from schedport.workload.datadir import resolve_data_dir
from schedport.engine.simulator import Simulator, collector_paused
from schedport.engine.latency import make_latency_model
from schedport.engine.schedulers import REGISTRY, get_policy
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
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if a policy costs over 3x vllm-fcfs (fastserve 5x) or fast is slower than exact")
    args = ap.parse_args()
    misses: list[str] = []

    data = resolve_data_dir(args.data_dir)
    path = data / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"
    trace = read("azure", [path], rows=args.requests).trace
    cfg = load_engine_config(None)
    lat = make_latency_model(cfg)
    for rho in (float(x) for x in args.rho.split(",")):
        t0 = time.perf_counter()
        scale = load_scale(trace, rho, cfg)
        cap_s = time.perf_counter() - t0
        window = rescale(trace, scale)
        print(f"window: {len(trace)} requests of {path.name}, rho={rho}, time scale {scale:.3f}, "
              f"capacity measured in {cap_s * 1000:.0f} ms")
        if args.mode == "both":
            print(f"{'scheduler':<14} {'fast ms':>8} {'exact ms':>9} {'speedup':>8} {'x fcfs':>7} {'runs/s':>7} "
                  f"{'req/s':>8} {'iter/s':>9} {'iters':>6} {'dps':>6} {'it/dp':>6}")
        names = args.schedulers.split(",")
        if args.mode == "both" and "vllm-fcfs" in names:
            names.remove("vllm-fcfs")
            names.insert(0, "vllm-fcfs")        # the reference every other row is a multiple of
        if args.mode == "both":
            times, outs = time_rounds(names, window, cfg, lat, args.repeats)
            fcfs = min(times["vllm-fcfs", False]) if "vllm-fcfs" in names else None
            for name in names:
                fast, exact = min(times[name, False]), min(times[name, True])
                print_row(name, fast, exact, outs[name], len(window), fcfs)
                misses += bound_misses(name, rho, fast, exact, fcfs)
        else:
            for name in names:
                policy = get_policy(name)
                for _ in range(args.repeats):
                    Simulator(window, policy, cfg, lat, exact=args.mode == "exact").run()


    for m in misses:
        print("bound missed:", m)
    if args.check and misses:
        raise SystemExit(1)


#: The most a policy's run may cost, as a multiple of vllm-fcfs's on the same window.
COST_BOUND = {"fastserve": 5.0}
COST_BOUND_DEFAULT = 3.0


def bound_misses(name: str, rho: float, fast: float, exact: float, fcfs: float | None) -> list[str]:
    """The engine's cost bounds this row misses, one line each."""
    out = []
    bound = COST_BOUND.get(name, COST_BOUND_DEFAULT)
    if fcfs and fast / fcfs > bound:
        out.append(f"{name} at rho {rho}: {fast / fcfs:.1f}x vllm-fcfs, bound {bound:g}x")
    if fast > exact:
        out.append(f"{name} at rho {rho}: fast {fast * 1e3:.1f} ms is slower than --exact {exact * 1e3:.1f} ms")
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
                    sim = Simulator(window, policies[name], cfg, lat, exact=exact)
                    out = sim.run()
                    sim.release()
                times[name, exact].append(time.process_time() - t0)
                if not exact:
                    outs[name] = out
    return times, outs


def print_row(name: str, fast: float, exact: float, out, n_requests: int, fcfs: float | None) -> None:
    """One scheduler's row of the table (times in seconds, the least of the rounds)."""
    ratio = f"{fast / fcfs:6.1f}x" if fcfs else f"{1.0:6.1f}x"
    print(f"{name:<14} {fast * 1e3:8.1f} {exact * 1e3:9.1f} {exact / fast:7.1f}x {ratio} {1 / fast:7.1f} "
          f"{n_requests / fast:8.0f} {out.iterations / fast:9.0f} {out.iterations:6d} {out.events:6d} "
          f"{out.iterations / max(out.events, 1):6.1f}", flush=True)


if __name__ == "__main__":
    main()
