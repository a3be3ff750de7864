"""Start-up of one simulation: `schedport simulate` of a 1,000-request trace, the whole process.

    python benchmarks/bench_startup.py [--runs 15] [--trace FILE] [--scheduler vllm-fcfs] [--python PYTHON]

Each run is a fresh `PYTHON -m schedport.cli simulate --trace T --scheduler S --out DIR` (the work
of the `schedport` entry point) into a new directory. Printed, in seconds: the least and the
median wall time, the least and the median CPU time of the process (user + system, from
`wait4`), and, from `--import-runs` further runs under `python -X importtime`, the import time
(how much of a start is imports): each module's least own time over those runs, summed, in all
and by top-level package. The modules of
`pandas`, `scipy` and `matplotlib` that the run imported are named (none is the goal).

Without `--trace` the trace is `make_example_trace(1000)` written as CSV into a temporary
directory. The target is 0.35 s of wall time on a quiet 2-core machine. On a busy machine
the wall time reads slower and varies; the CPU time and the import sum much less so, and the
least of many runs is the figure nearest the quiet machine's. Children run with bytecode
caching on (a first, uncounted run writes the `.pyc` files an installed package has), so
`PYTHONDONTWRITEBYTECODE` in the environment does not turn start-up into compilation.
This is a benchmark to run, not a timed test.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.35
#: Packages the simulate path should not import (the analysis and report stack's).
UNWANTED = ("pandas", "scipy", "matplotlib")
#: Packages whose import time is listed one by one, the rest summed as "other".
SHOWN = ("numpy", "pyarrow", "pandas", "typer", "pydantic", "pydantic_core", "rich", "schedport")


def child_env() -> dict[str, str]:
    """The environment of every child: this one, with bytecode caching on."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system) and stderr of one child; a failing command
    stops the benchmark, as its time would mean nothing."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = p.stderr.read().decode("utf-8", "replace")
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {p.returncode}: {err.strip()[-400:]}")
    return wall, ru.ru_utime + ru.ru_stime, err


def own_times(stderr: str) -> dict[str, float]:
    """Each module's own import time (s) from `-X importtime` output."""
    own = {}
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \| *(\S+)", line)
        if m:
            own[m.group(2)] = int(m.group(1)) / 1e6
    return own


def import_profile(runs: list[dict[str, float]]) -> tuple[float, dict[str, float], list[str]]:
    """From several runs' `own_times`: the sum over modules of each one's least own time (s),
    that sum by top-level package (`SHOWN`, the rest as "other"), and the imported modules of the
    `UNWANTED` packages. The least of several runs is what a busy machine hides least."""
    least: dict[str, float] = {}
    for own in runs:
        for name, t in own.items():
            least[name] = min(t, least.get(name, t))
    by_pkg: dict[str, float] = {}
    for name, t in least.items():
        top = name.split(".")[0]
        key = top if top in SHOWN else "other"
        by_pkg[key] = by_pkg.get(key, 0.0) + t
    return sum(least.values()), by_pkg, sorted(n for n in least if n.split(".")[0] in UNWANTED)


def main() -> None:
    """Time `--runs` fresh simulate processes and print the figures (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="fresh processes (least and median reported)")
    ap.add_argument("--trace", type=Path, help="trace to simulate (default: the 1,000-request example)")
    ap.add_argument("--scheduler", default="vllm-fcfs", help="policy to simulate under")
    ap.add_argument("--import-runs", type=int, default=5, help="runs under -X importtime (each module's least)")
    ap.add_argument("--python", default=sys.executable, help="interpreter with schedport installed")
    a = ap.parse_args()
    if a.runs < 1 or a.import_runs < 1:
        sys.exit("error: --runs and --import-runs must be at least 1")
    env = child_env()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        trace = a.trace
        if trace is None:
            trace = Path(tmp) / "example-1000.csv"
            make = ("import sys; from schedport.workload.examples import make_example_trace; "
                    "from schedport.workload.trace import save_trace; "
                    "save_trace(make_example_trace(1000), sys.argv[1])")
            run_once([a.python, "-c", make, str(trace)], env)

        def cmd(i: int, *pre: str) -> list[str]:
            return [a.python, *pre, "-m", "schedport.cli", "simulate", "--trace", str(trace),
                    "--scheduler", a.scheduler, "--out", str(Path(tmp) / f"out{i}")]

        run_once(cmd(-1), env)  # writes the bytecode and warms the file cache, not counted
        walls, cpus = [], []
        for i in range(a.runs):
            w, c, _ = run_once(cmd(i), env)
            walls.append(w)
            cpus.append(c)
        profiles = [own_times(run_once(cmd(a.runs + i, "-X", "importtime"), env)[2]) for i in range(a.import_runs)]
    total, by_pkg, unwanted = import_profile(profiles)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"schedport simulate, {trace.name}, {a.scheduler}: {a.runs} fresh processes, "
          f"load average {load:.2f} ({os.cpu_count()} CPUs)")
    print(f"  wall  least {min(walls):.3f} s  median {statistics.median(walls):.3f} s  "
          f"(target < {TARGET_S} s on a quiet 2-core machine: {'met' if min(walls) < TARGET_S else 'NOT met'})")
    print(f"  CPU   least {min(cpus):.3f} s  median {statistics.median(cpus):.3f} s  (user + system)")
    shown = ", ".join(f"{k} {v:.3f}" for k, v in sorted(by_pkg.items(), key=lambda kv: -kv[1]))
    print(f"  imports (-X importtime, each module's least of {a.import_runs} runs) {total:.3f} s: {shown}")
    print(f"  imported of {', '.join(UNWANTED)}: {len(unwanted)} modules"
          + (f" ({', '.join(sorted({u.split('.')[0] for u in unwanted}))})" if unwanted else ""))


if __name__ == "__main__":
    main()
