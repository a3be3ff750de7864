"""A user's policy that misbehaves gets a loud refusal, never a wrong or hidden result (issue 52).

Each test writes a small policy file into tmp_path and runs the `schedport` CLI on it: a policy
that ends the process, imports a helper that changes, writes to the request, declares an unknown
parameter, returns a key that goes bad after arrival, kills its worker, keeps module-level state,
or starts with a byte-order mark.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from schedport.workload.examples import make_example_trace
from schedport.workload.trace import save_trace

HEAD = '''import os
import sys

from schedport.engine.batching import Continuous
from schedport.engine.policy import FIXED, WITH_TIME, Ordering, PerServedToken
from schedport.engine.schedulers import Policy
'''


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def error_line(p: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a failed command (progress lines may come before it)."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and p.stderr.strip().splitlines()[-1] == errors[0], p.stderr
    return errors[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from schedport.study.selection import write_demo_corpus

    return write_demo_corpus(tmp_path_factory.mktemp("corpus") / "corpus", windows_per_source=1,
                             requests_per_window=30)


@pytest.fixture()
def work(tmp_path) -> Path:
    save_trace(make_example_trace(60, 1), tmp_path / "trace.csv")
    return tmp_path


def simulate(work: Path, spec: str, *extra) -> subprocess.CompletedProcess:
    return cli("simulate", "--trace", "trace.csv", "--scheduler", spec, "--load", "1.2", "--out", "out", *extra,
               cwd=work)


def run(work: Path, corpus: Path, spec: str, out: str = "res", workers: int = 1) -> subprocess.CompletedProcess:
    return cli("run", "--corpus", corpus, "--out", out, "--schedulers", f"vllm-fcfs,{spec}", "--regions",
               "overload", "--workers", workers, "--no-analyze", cwd=work)


# ============================================================================ case 6: sys.exit, os._exit

EXITS = HEAD + '''

class SysExit(Ordering):
    def key(self, req, now):
        if req.idx == 5:
            sys.exit(0)
        return (req.idx,)


class OsExit(Ordering):
    def key(self, req, now):
        if req.idx == 5:
            os._exit(0)
        return (req.idx,)
'''


@pytest.mark.parametrize("name,call", [("SysExit", r"raised SystemExit\(0\) \(sys\.exit\)"),
                                       ("OsExit", r"called os\._exit\(0\)")])
def test_a_policy_ending_the_process_is_a_failure_in_every_command(work, corpus, name, call):
    (work / "exits.py").write_text(EXITS)
    line = rf"error: .*/exits\.py:\d+ \(in key\): scheduler '{name}' {call}: a policy may not end the process.*"
    p = simulate(work, f"exits.py:{name}")
    assert re.fullmatch(line, error_line(p))
    assert not (work / "out" / "summary.json").exists()
    assert re.fullmatch(line, error_line(cli("schedulers", f"exits.py:{name}", cwd=work)))
    for workers in (1, 2):             # in the driver, and in a pool worker
        out = f"res{workers}"
        assert re.search(line[len("error: "):], error_line(run(work, corpus, f"exits.py:{name}", out, workers)))
        assert json.loads((work / out / "manifest.json").read_text())["runs"][-1]["status"] == "failed"


def test_a_policy_file_ending_the_process_while_loading_is_one_line(work):
    (work / "gone.py").write_text("import os\n\nos._exit(0)\n")
    assert re.fullmatch(r"error: .*/gone\.py:3: loading the policy file called os\._exit\(0\): a policy may not end "
                        r"the process", error_line(simulate(work, "gone.py:X")))
