"""Start-up time of the command line: `schedport --help`, `--version` and `schedulers`.

    python benchmarks/bench_cli.py [--runs 7] [--python PYTHON]

Runs each command `--runs` times, each in a fresh interpreter (`PYTHON -m schedport.cli ...`,
the same work as the `schedport` entry point), and prints the median and the least wall time in
seconds. The target is under 0.3 s for `--help` and `schedulers` on a quiet 2-core machine: the
command modules import numpy, pandas, scipy and the analysis only inside the commands that use
them. A busy machine reads slower; this is a benchmark to run, not a timed test.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = (["--help"], ["--version"], ["schedulers"])
TARGET_S = 0.3


def time_command(python: str, args: list[str], runs: int) -> list[float]:
    """Wall seconds of `runs` fresh `python -m schedport.cli ARGS` processes (output discarded);
    a command that fails stops the benchmark, as its time would mean nothing."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run([python, "-m", "schedport.cli", *args], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - t0)
        if p.returncode != 0:
            sys.exit(f"error: schedport {' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-300:]}")
    return times


def main() -> None:
    """Time every command in `COMMANDS` and print one line each: median, least, target."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="fresh processes per command (the median is reported)")
    ap.add_argument("--python", default=sys.executable, help="interpreter with schedport installed")
    a = ap.parse_args()
    if a.runs < 1:
        sys.exit("error: --runs must be at least 1")
    time_command(a.python, ["--version"], 1)   # a first run warms the file cache, not counted
    print(f"schedport start-up, {a.runs} fresh processes each (seconds)")
    for args in COMMANDS:
        ts = time_command(a.python, args, a.runs)
        med = statistics.median(ts)
        target = f"  (target < {TARGET_S} s: {'met' if med < TARGET_S else 'NOT met'})" \
            if args != ["--version"] else ""
        print(f"  schedport {' '.join(args):<12} median {med:.3f}  least {min(ts):.3f}{target}")


if __name__ == "__main__":
    main()
