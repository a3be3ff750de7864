"""The engine bench's verdict: a row's cost over vllm-fcfs is the median of each process's own ratio,
and the bounds are held to it (benchmarks/bench_engine.py; its timings are never asserted here)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from _paths import REPO

BENCH = REPO / "benchmarks" / "bench_engine.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_engine", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(fast: float, exact: float) -> dict:
    return {"fast": fast, "exact": exact, "iters": 100, "events": 50, "requests": 10}


def test_ratio_is_the_median_of_each_process_ratio(bench):
    # process 2 ran on a slow spell: both of its rows are slow, and its own ratio is still 4.5x
    rows = [
        {"vllm-fcfs": _row(0.010, 0.05), "fastserve": _row(0.047, 0.20)},
        {"vllm-fcfs": _row(0.020, 0.09), "fastserve": _row(0.090, 0.40)},
        {"vllm-fcfs": _row(0.010, 0.05), "fastserve": _row(0.052, 0.21)},
    ]
    row = bench.summarize("fastserve", rows)
    assert row["x_fcfs"] == pytest.approx(4.7)
    assert row["x_fcfs_range"] == pytest.approx((4.5, 5.2))
    assert row["fast"] == pytest.approx(0.052)          # the median of the times
    assert bench.bound_misses("fastserve", 1.6, row) == []
    # the ratio of the median times (0.052 / 0.010 = 5.2x) would have missed the bound
    assert row["fast"] / bench.summarize("vllm-fcfs", rows)["fast"] > 5


def test_bounds_name_the_row_that_misses(bench):
    rows = [{"vllm-fcfs": _row(0.010, 0.05), "srpt": _row(0.031, 0.02)}]
    misses = bench.bound_misses("srpt", 0.95, bench.summarize("srpt", rows))
    assert len(misses) == 2
    assert misses[0].startswith("srpt at rho 0.95: 3.10x vllm-fcfs, bound 3x")
    assert "slower than --exact" in misses[1]
    # without vllm-fcfs in the table there is no ratio to hold, only fast against exact
    alone = bench.summarize("srpt", [{"srpt": _row(0.031, 0.05)}])
    assert alone["x_fcfs"] is None and bench.bound_misses("srpt", 0.95, alone) == []


@pytest.mark.parametrize("args, why", [
    (["--processes", "0"], "--processes and --repeats must be at least 1"),
    (["--repeats", "0"], "--processes and --repeats must be at least 1"),
    (["--processes", "2", "--mode", "fast"], "--processes times the table (--mode both)"),
    (["--data-dir", "/nonexistent-schedport-data"], "file not found"),
])
def test_bad_options_get_one_line_and_exit_1(args, why):
    p = subprocess.run([sys.executable, str(BENCH), "--rho", "0.5", "--requests", "20", "--repeats", "1",
                        "--schedulers", "vllm-fcfs", *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    assert p.stdout == ""
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench_engine: ") and why in err[0]
