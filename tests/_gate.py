"""A gate for the tests that stop a sweep mid-way: they synchronise on the sweep's state, never on
the clock.

A driver script started by a test calls `install(gate_dir, open_windows)`. From then on
`schedport.study.sweep.run_chunk` runs the chunks of the windows in `open_windows` as usual and holds
every other chunk: it writes a `held-*` file into `gate_dir` and waits until the test creates
`gate_dir/release` (or signals or kills the process). Chunks are submitted window-major, so once
as many chunks are held as there are workers, every chunk of the open windows has been handed out
and at least one chunk of another window is pending. The test waits for exactly that state
(`wait_held`), so "some cells written, some still to do" holds on a fast machine and a slow one
alike.

The wrapper is a module-level function of this module, so a process pool pickles it by name and
its workers import it (the test puts this folder on their PYTHONPATH).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent

_state: dict = {}


def install(gate_dir: str, open_windows: list[str]) -> None:
    """Route the sweep's chunks through the gate (call in the driver, before the sweep starts)."""
    import schedport.study.sweep as sweep

    os.environ["SCHEDPORT_TEST_GATE"] = gate_dir
    os.environ["SCHEDPORT_TEST_GATE_OPEN"] = ",".join(open_windows)
    _state["real"] = sweep.run_chunk
    sweep.run_chunk = gated_run_chunk


def gated_run_chunk(trace, cfg, scheduler, window, cells, keep_requests=False):
    """`run_chunk`, held at the gate unless its window is open (see the module docstring)."""
    import schedport.study.sweep as sweep

    real = _state.get("real")
    if real is None:  # a pool worker: this module was imported there afresh, unpatched
        real = _state["real"] = sweep.run_chunk
    gate = Path(os.environ["SCHEDPORT_TEST_GATE"])
    if window[1] not in os.environ["SCHEDPORT_TEST_GATE_OPEN"].split(","):
        (gate / f"held-{os.getpid()}-{uuid.uuid4().hex}").write_text(f"{window[1]} {scheduler}\n")
        # a poll, not a timed wait: it ends when the test releases the gate or stops the process
        while not (gate / "release").exists():
            time.sleep(0.005)
    return real(trace, cfg, scheduler, window, cells, keep_requests)


def driver(gate_dir: Path, open_windows: list[str], body: str) -> str:
    """Python source for a driver process: the gate installed, then `body`."""
    return (f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport _gate\n"
            f"_gate.install({str(gate_dir)!r}, {list(open_windows)!r})\n{body}\n")


def env() -> dict:
    """The environment for a driver process whose pool workers must import this module."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [e.get("PYTHONPATH")])])
    return e


def wait_held(gate_dir: Path, n: int, proc: subprocess.Popen, limit_s: float = 300.0) -> None:
    """Wait until `n` chunks are held at the gate.

    The limit only turns a broken sweep (one that never reaches the gate) into a failure with a
    message instead of a hang; on a working sweep the wait ends on the sweep's state, however
    slow the machine.
    """
    end = time.monotonic() + limit_s
    while len(list(gate_dir.glob("held-*"))) < n:
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended (exit {proc.returncode}) before {n} chunks reached the gate: "
                                 f"{(proc.stderr.read() if proc.stderr else '')!r}")
        if time.monotonic() > end:
            raise AssertionError(f"{n} chunks never reached the gate within {limit_s} s")
        time.sleep(0.01)
