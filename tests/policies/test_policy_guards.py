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

import numpy as np
import pandas as pd
import pytest

from schedport.workload.examples import make_example_trace
from schedport.workload.trace import save_trace

HEAD = '''import os
import sys

from schedport.engine.policies.batching import Continuous
from schedport.engine.policies.policy import FIXED, WITH_TIME, Ordering, PerServedToken
from schedport.engine.policies.schedulers import Policy
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


# ============================================================================ case 2: helpers are the policy too

USES_HELPER = '''from schedport.engine.policies.policy import Ordering
from helper import SIGN


class Signed(Ordering):
    def key(self, req, now):
        return (SIGN * req.output, req.idx)
'''


def test_a_changed_helper_is_a_new_version_and_the_manifest_says_what_was_hashed(work, corpus):
    import hashlib

    (work / "main.py").write_text(USES_HELPER)
    (work / "helper.py").write_text("SIGN = 1\n")
    p = run(work, corpus, "main.py:Signed")
    assert p.returncode == 0, p.stderr
    rec = json.loads((work / "res" / "manifest.json").read_text())["policies"]["Signed"]
    assert rec["file_sha256"] == hashlib.sha256(USES_HELPER.encode()).hexdigest() != rec["sha256"]
    assert rec["helpers"] == [{"module": "helper", "path": str(work / "helper.py"),
                               "sha256": hashlib.sha256(b"SIGN = 1\n").hexdigest()}]
    assert run(work, corpus, "main.py:Signed").returncode == 0          # the same helper resumes
    (work / "helper.py").write_text("SIGN = -1\n")                      # main.py itself is unchanged
    line = error_line(run(work, corpus, "main.py:Signed"))
    assert "its cells of scheduler 'Signed' were made by" in line and rec["sha256"][:12] in line, line
    assert "helper module(s) helper changed" in line, line


def test_a_recorded_policy_whose_helper_changed_is_not_rerun(tmp_path):
    (tmp_path / "main.py").write_text(USES_HELPER)
    (tmp_path / "helper.py").write_text("SIGN = 1\n")
    script = (f"import json; from schedport.engine.policies.plugins import get_scheduler; "
              f"print(json.dumps(get_scheduler({str(tmp_path / 'main.py:Signed')!r}).source.record()))")
    rec = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    (tmp_path / "helper.py").write_text("SIGN = -1\n")
    script = ("import json, sys; from schedport.engine.policies.plugins import PolicySource, from_source; "
              "from_source(PolicySource.from_record('Signed', json.loads(sys.stdin.read())))")
    p = subprocess.run([sys.executable, "-c", script], input=rec, capture_output=True, text=True)
    assert p.returncode == 1 and re.search(r"PolicyError: .*/helper\.py: this helper of scheduler 'Signed' hashes to "
                                           r"\w{12} here, but the policy was recorded with its sha256 \w{12}.*: another "
                                           r"version", p.stderr), p.stderr


# ============================================================================ cases 8, 14, 7: the request, the keys

LATE = HEAD + '''

class Writer(Ordering):
    def key(self, req, now):
        req.output = 1
        return (req.output, req.arrival, req.idx)


class HookWriter(Ordering):
    def key(self, req, now):
        return (req.output, req.arrival, req.idx)

    def on_admit(self, req, now):
        req.prompt += 1


class LateStr(Ordering):
    dynamics = WITH_TIME

    def key(self, req, now):
        return ("late", req.idx) if now - req.arrival > 0.5 else (req.output, req.idx)


class PreStr(Ordering):
    preemptive = True
    dynamics = PerServedToken(1)

    def key(self, req, now):
        return ("x", req.idx) if req.generated > 3 else (req.generated, req.idx)


class LateNan(Ordering):
    dynamics = WITH_TIME

    def key(self, req, now):
        return (float("nan") if now - req.arrival > 0.5 else req.output, req.idx)
'''

CALL = r"(\w+)\.(key|on_admit)\(request (\d+), now=[0-9.e+-]+\)"


def test_a_policy_writing_to_the_request_is_refused_in_every_mode(work, corpus):
    (work / "late.py").write_text(LATE)
    fast = error_line(simulate(work, "late.py:Writer"))        # fast mode: found at the run's end
    assert re.fullmatch(r"error: .*/late\.py: scheduler 'Writer' wrote request \d+'s output \(\d+ -> 1\) during the "
                        r"run: a policy reads the request and never writes it .*", fast), fast
    assert not (work / "out" / "summary.json").exists()
    at_call = (r"error: .*/late\.py: scheduler '{0}': {0}\.{1}\(request \d+, now=[0-9.e+-]+\) wrote request\.{2} "
               r"\(\d+ -> \d+\): a policy reads the request and never writes it.*")
    assert re.fullmatch(at_call.format("Writer", "key", "output"), error_line(simulate(work, "late.py:Writer",
                                                                                       "--exact")))
    assert re.fullmatch(at_call.format("Writer", "key", "output"), error_line(cli("schedulers", "late.py:Writer",
                                                                                  cwd=work)))
    assert re.fullmatch(at_call.format("HookWriter", "on_admit", "prompt"),
                        error_line(cli("schedulers", "late.py:HookWriter", cwd=work)))
    assert "scheduler 'Writer' wrote request" in error_line(run(work, corpus, "late.py:Writer"))


def test_a_key_that_stops_comparing_after_arrival_is_one_line(work, corpus):
    (work / "late.py").write_text(LATE)
    shape = r"error: .*/late\.py: scheduler '{0}': {0}\.key\(request \d+, now=[0-9.e+-]+\) returned .*, which " \
            r"does not compare with .*key.*"
    # fast mode: the engine's own comparison fails, and the keys at that time are looked at
    for p in (simulate(work, "late.py:LateStr"), simulate(work, "late.py:LateStr", "--exact"),
              cli("schedulers", "late.py:LateStr", cwd=work)):
        assert re.fullmatch(shape.format("LateStr"), error_line(p))
    assert re.search(shape.format("LateStr")[len("error: "):], error_line(run(work, corpus, "late.py:LateStr")))
    # a preemptive key whose running requests' keys change shape as they are served
    for p in (simulate(work, "late.py:PreStr", "--exact"), cli("schedulers", "late.py:PreStr", cwd=work)):
        assert re.fullmatch(shape.format("PreStr"), error_line(p))


def test_a_key_that_turns_nan_after_arrival_fails_the_check_and_exact_mode(work):
    (work / "late.py").write_text(LATE)
    nan = r"error: .*/late\.py: scheduler 'LateNan': LateNan\.key\(request \d+, now=[0-9.e+-]+\) returned \(nan, \d+\): " \
          r"NaN does not order.*"
    assert re.fullmatch(nan, error_line(cli("schedulers", "late.py:LateNan", cwd=work)))
    assert re.fullmatch(nan, error_line(simulate(work, "late.py:LateNan", "--exact")))


# ============================================================================ cases 9, 20: params

PARAMS = HEAD + '''

class Las(Ordering):
    preemptive = True
    dynamics = PerServedToken(+1)

    def key(self, req, now):
        return (req.generated, req.arrival, req.idx)


class Own(Ordering):
    params = {"alpha": 2.0}

    def key(self, req, now):
        return (req.output * self.params["alpha"], req.idx)


class Unknown(Own):
    params = {"alpha": 2.0, "beta": 1.0}


TYPO = Policy("typo", "a typo", Continuous, Las, params={"preemtion": "swap"})
STRAY = Policy("stray", "a key nothing declares", Continuous, Las, params={"beta": 1})
BADVAL = Policy("badval", "a bad value", Continuous, Las, params={"preemption": "kill"})
BADSEQ = Policy("badseq", "a bad count", Continuous, Las, params={"max_num_seqs": 0})
OWN = Policy("own", "its own parameter", Continuous, Own, params={"alpha": 3.0, "preemption": "swap"})
'''


@pytest.mark.parametrize("name,expected", [
    ("TYPO", r"TYPO's params has unknown key 'preemtion': did you mean 'preemption'\? a parameter of the policy's own "
             r"is declared in its ordering class's params"),
    ("STRAY", r"STRAY's params has unknown key 'beta': the engine's parameters are aging, .*"),
    ("BADVAL", r"""BADVAL's params preemption: must be "recompute" or "swap", got 'kill'"""),
    ("BADSEQ", r"BADSEQ's params max_num_seqs: must be a positive integer, got 0"),
])
def test_a_policys_params_are_checked_as_an_engine_configs_tables_are(work, name, expected):
    (work / "params.py").write_text(PARAMS)
    line = rf"error: {re.escape(str(work))}/params\.py: {expected}.*"
    assert re.fullmatch(line, error_line(simulate(work, f"params.py:{name}")))
    assert re.fullmatch(line, error_line(cli("schedulers", f"params.py:{name}", cwd=work)))


def test_a_policys_own_declared_parameters_are_taken(work):
    (work / "params.py").write_text(PARAMS)
    for name in ("OWN", "Unknown"):
        p = simulate(work, f"params.py:{name}")
        assert p.returncode == 0, p.stderr
        (work / "out" / "summary.json").unlink()
    # OWN declares Own with another alpha: the bare class would be a second scheduler, so it is refused
    assert re.search(r"Own is the ordering of the policy OWN \('own'\), declared with other params .* name it as "
                     r"params\.py:OWN", error_line(simulate(work, "params.py:Own")))


# ============================================================================ case 15: a worker that dies

KILLER = HEAD + '''import signal


class Killer(Ordering):
    def key(self, req, now):
        if req.idx == 5 and os.environ.get("SCHEDPORT_TEST_KILL"):
            os.kill(os.getpid(), signal.SIGKILL)
        return (req.output, req.idx)
'''


def test_a_worker_killed_mid_cell_is_one_line_naming_the_cell_and_the_store_resumes(work, corpus):
    import os

    (work / "kill.py").write_text(KILLER)
    args = ["run", "--corpus", corpus, "--out", "res", "--schedulers", "vllm-fcfs,kill.py:Killer", "--regions",
            "overload,moderate", "--workers", "2", "--no-analyze"]
    p = subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)], capture_output=True, text=True,
                       cwd=work, timeout=600, env={**os.environ, "SCHEDPORT_TEST_KILL": "1"})
    line = error_line(p)
    assert re.fullmatch(r"error: a worker process died \(pid \d+, killed by signal 9 \(SIGKILL\), while running window "
                        r"[\w-]+ under scheduler 'Killer' \(regions overload, moderate\)\); the cells finished before "
                        r"it are kept in the store, and rerunning the same command resumes from them.*", line), line
    man = json.loads((work / "res" / "manifest.json").read_text())
    assert man["runs"][-1]["status"] == "failed"
    kept = man["cells_done"]
    p = cli(*args, cwd=work)                                   # the same command, without the kill: resumes
    assert p.returncode == 0, p.stderr
    assert re.search(rf"(\d+) runs \({kept} already done, 8 in the selection\)", p.stdout), (kept, p.stdout)


def test_a_policy_error_in_run_names_the_window_and_region_as_well_as_the_request(work, corpus):
    (work / "raises.py").write_text(HEAD + "\n\nclass Raises(Ordering):\n    def key(self, req, now):\n"
                                           "        return (1 / (req.idx - 2), req.idx)\n")
    line = error_line(run(work, corpus, "raises.py:Raises"))
    assert re.fullmatch(r"error: .*/raises\.py:\d+: scheduler 'Raises': Raises\.key\(request 2, now=[0-9.e+-]+\) raised "
                        r"ZeroDivisionError: division by zero \(in window [\w-]+, region overload at rho [0-9.]+\)", line)


# ============================================================================ case 11: state kept across runs

STATEFUL = HEAD + '''
SEEN = [0]


class Stateful(Ordering):
    def key(self, req, now):
        SEEN[0] += 1
        return (req.output if SEEN[0] < 500 else -req.output, req.idx)
'''


def test_module_level_state_is_reported_as_state_not_as_wrong_dynamics(work):
    (work / "state.py").write_text(STATEFUL)
    line = error_line(cli("schedulers", "state.py:Stateful", cwd=work))
    assert re.fullmatch(r"error: .*/state\.py: scheduler 'Stateful': at rho 0\.5 the same exact run twice in one process "
                        r"gives request \d+ \w+ = .*, then .*: the policy keeps state from one run to the next .*depend on "
                        r"which cells a worker ran before \(--workers\).*", line), line
    assert "dynamics" not in line


# ============================================================================ case 19: a byte-order mark

def test_a_policy_file_with_a_utf8_bom_loads_as_python_runs_it(work):
    import hashlib

    text = HEAD + "\n\nclass Bom(Ordering):\n    def key(self, req, now):\n        return (req.output, req.idx)\n"
    data = b"\xef\xbb\xbf" + text.encode()
    (work / "bom.py").write_bytes(data)
    assert subprocess.run([sys.executable, "bom.py"], cwd=work).returncode == 0      # Python runs it
    p = cli("schedulers", "bom.py:Bom", cwd=work)
    assert p.returncode == 0, p.stderr
    assert f"sha256 {hashlib.sha256(data).hexdigest()[:12]}" in p.stdout and "fast == exact" in p.stdout


# ============================================================================ the run's seed and generator

RANDOM = HEAD + """

class Coin(Ordering):
    def key(self, req, now):
        return (float(self.rng.random()), req.idx)
"""


def test_a_policy_that_draws_from_self_rng_follows_the_runs_seed(work):
    (work / "coin.py").write_text(RANDOM)
    finish = {}
    for tag, seed in (("a", 1), ("b", 1), ("c", 2)):
        p = cli("simulate", "--trace", "trace.csv", "--scheduler", "coin.py:Coin", "--load", "1.6", "--seed", seed,
                "--out", tag, cwd=work)
        assert p.returncode == 0, p.stderr
        finish[tag] = pd.read_parquet(work / tag / "requests.parquet")["finish_s"].to_numpy()
    assert np.array_equal(finish["a"], finish["b"])
    assert not np.array_equal(finish["a"], finish["c"])
    assert cli("schedulers", "coin.py:Coin", cwd=work).returncode == 0     # one process, runs identical
