"""A researcher's own scheduler, from their own file, through the whole map (docs/own-scheduler.md).

* the tutorial's commands, run in order on a fresh install (a new venv, the policy file outside the
  source tree), ending with the user policy in portability.json's rankings;
* one CLI test per bad input, each a one-line error naming the file;
* the store's integrity: a changed file refuses to resume, a fresh store runs; versions recorded in
  the manifest and in every part;
* workers (local pool, Ray) load the policy from the text they are sent, not from the path;
* the map treats it as any scheduler: duplicates, explain from the recorded text.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import schedport
from schedport.engine.policies.plugins import PolicyError, PolicySource, get_scheduler
from schedport.workload.examples import make_example_trace
from _paths import REPO

ROOT = REPO
DOC = ROOT / "docs" / "own-scheduler.md"
MIRROR = ROOT.parent / "shared" / "datasets"

LAS = '''
from schedport.engine.policies.batching import Continuous
from schedport.engine.policies.policy import Ordering, PerServedToken
from schedport.engine.policies.schedulers import Policy


class LeastAttained(Ordering):
    """Least attained service."""

    preemptive = True
    dynamics = PerServedToken(+1)
    params = {"preemption": "swap"}

    def key(self, req, now):
        return (req.generated, req.arrival, req.idx)


LAS = Policy("las", "Least attained service", Continuous, LeastAttained)
'''

BAD = '''
from schedport.engine.policies.batching import Continuous
from schedport.engine.policies.policy import Ordering, PerServedToken
from schedport.engine.policies.schedulers import Policy


class Raises(Ordering):
    def key(self, req, now):
        return (1 / (req.idx - 2), req.idx)


class Nan(Ordering):
    def key(self, req, now):
        return (float("nan") if req.idx == 3 else 1.0, req.idx)


class Mixed(Ordering):
    def key(self, req, now):
        return (req.idx,) if req.idx < 5 else ("late", req.idx)


class RaisesLater(Ordering):
    preemptive = True
    dynamics = PerServedToken(1)

    def key(self, req, now):
        if req.generated > 3:
            raise ValueError("no key past three tokens")
        return (req.generated, req.idx)


def helper():
    pass


CLASH = Policy("sjf", "a second sjf", Continuous, Nan)
'''


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def one_line_error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("policies")
    (d / "las.py").write_text(LAS)
    (d / "bad.py").write_text(BAD)
    (d / "syntax.py").write_text("from schedport.engine.policies.policy import Ordering\n\nclass X(Ordering)\n    pass\n")
    (d / "boom.py").write_text("import math\n\nraise RuntimeError('not today')\n")
    trace = make_example_trace(60, 1)
    from schedport.workload.trace import save_trace

    save_trace(trace, d / "trace.csv")
    return d


# ============================================================================ bad input: one line each


@pytest.mark.parametrize("spec,expected", [
    ("missing.py:LAS", r"error: .*/missing\.py: no such policy file \(from scheduler 'missing\.py:LAS'\)"),
    ("syntax.py:X", r"error: .*/syntax\.py:3: syntax error: expected ':'"),
    ("boom.py:X", r"error: .*/boom\.py:3: loading the policy file raised RuntimeError: not today"),
    ("las.py:Nope", r"error: .*/las\.py: no policy named 'Nope' \(it defines LeastAttained, LAS\)"),
    ("bad.py:helper", r"error: .*/bad\.py: helper is a function, so not a policy: give a schedport Policy"),
    ("las.py:Continuous", r"error: .*/las\.py: Continuous is the class Continuous, which is not an Ordering"),
    ("bad.py:CLASH", r"error: .*/bad\.py: CLASH is named 'sjf', the name of a built-in scheduler; give your "
                     r"policy another name"),
    ("bad.py:Raises", r"error: .*/bad\.py:9: scheduler 'Raises': Raises\.key\(request 2, now=[0-9.e-]+\) raised "
                      r"ZeroDivisionError: division by zero"),
    ("bad.py:Nan", r"error: .*/bad\.py: scheduler 'Nan': Nan\.key\(request 3, now=[0-9.e-]+\) returned \(nan, 3\): "
                   r"NaN does not order"),
    ("bad.py:Mixed", r"error: .*/bad\.py: scheduler 'Mixed': Mixed\.key\(request 5, now=[0-9.e-]+\) returned "
                     r"\('late', 5\), which does not compare with the previous request's key \(4,\)"),
    ("bad.py:RaisesLater", r"error: .*/bad\.py:28: scheduler 'RaisesLater' raised ValueError: no key past three "
                           r"tokens \(in key\)"),
    ("no_such_module_xyz:LAS", r"error: no_such_module_xyz: no such module"),
    ("las.py:", r"error: scheduler 'las\.py:': expected FILE\.py:NAME or module:NAME"),
    ("las.py", r"error: .*/las\.py: name the policy as las\.py:NAME \(it defines LeastAttained, LAS\)"),
])
def test_each_bad_policy_is_one_line_naming_the_file(files, spec, expected):
    p = cli("simulate", "--trace", "trace.csv", "--scheduler", spec, "--load", "1.5", "--out", "out", cwd=files)
    line = one_line_error(p)
    assert re.fullmatch(expected + ".*", line), line
    assert not (files / "out" / "summary.json").exists()


def test_bad_policies_in_run_are_the_same_one_line_errors(files, tmp_path):
    from schedport.study.selection import write_demo_corpus

    corpus = write_demo_corpus(tmp_path / "corpus", windows_per_source=1, requests_per_window=30)
    p = cli("run", "--corpus", corpus, "--out", tmp_path / "res", "--schedulers", "vllm-fcfs,las.py:Nope",
            cwd=files)
    assert "no policy named 'Nope'" in one_line_error(p)
    p = cli("run", "--corpus", corpus, "--out", tmp_path / "res", "--schedulers", "vllm-fcfs,bad.py:Nan",
            "--regions", "overload", "--workers", "1", "--no-analyze", cwd=files)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]      # after the progress lines
    assert last.startswith("error: ") and "bad.py: scheduler 'Nan': Nan.key(request 3" in last, p.stderr


def test_a_policy_named_twice_through_its_file_is_refused(files):
    from schedport.engine.policies.plugins import resolve_schedulers

    with pytest.raises(PolicyError, match="scheduler 'las' is named twice"):
        resolve_schedulers([f"{files}/las.py:LAS", f"{files}/./las.py:LAS"])
    assert [p.name for p in resolve_schedulers(["sjf", f"{files}/las.py:LAS", f"{files}/las.py:LeastAttained"])] \
        == ["sjf", "las", "LeastAttained"]


def test_wrong_dynamics_fail_the_check_naming_the_request(files, tmp_path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text(LAS.replace("    dynamics = PerServedToken(+1)\n", ""))
    p = cli("schedulers", f"{wrong}:LAS", cwd=files)
    line = one_line_error(p)
    assert re.search(r"wrong\.py: scheduler 'las': at rho [0-9.]+ the fast mode gives request \d+ \w+ = .*, stepping "
                     r"every iteration gives .*: the keys do not move as its dynamics \(FIXED\) declare", line), line
    ok = cli("schedulers", "las.py:LAS", cwd=files)
    assert ok.returncode == 0, ok.stderr
    assert "las: fast == exact on 300 example requests" in ok.stdout and "[file " in ok.stdout
    # the check reaches the preemption and swap paths (a tight KV pool in overload), and says how often
    got = re.search(r"on a \d+-block KV pool: 300/300 completed, (\d+) preemptions, (\d+) blocks swapped.*"
                    r"exercised (\d+) preemptions and (\d+) swapped blocks", ok.stdout)
    assert got and all(int(g) > 0 for g in got.groups()), ok.stdout


def test_every_name_of_a_policy_runs_one_scheduler_or_the_bare_one_is_an_error(files, tmp_path):
    """las.py:LAS and las.py:LeastAttained: the params live with the class, so both run the same
    requests; where a declaration's own params make it another scheduler, the bare class is refused."""
    runs = {}
    for name in ("LAS", "LeastAttained"):
        p = cli("simulate", "--trace", "trace.csv", "--scheduler", f"las.py:{name}", "--load", "1.2",
                "--out", tmp_path / name, cwd=files)
        assert p.returncode == 0, p.stderr
        runs[name] = pd.read_parquet(tmp_path / name / "requests.parquet")
    pd.testing.assert_frame_equal(runs["LAS"], runs["LeastAttained"])
    old = tmp_path / "old" / "las.py"          # the params in the declaration only: two schedulers, one class
    old.parent.mkdir()
    old.write_text(LAS.replace('    params = {"preemption": "swap"}\n', "").replace(
        "LeastAttained)", 'LeastAttained, params={"preemption": "swap"})'))
    line = one_line_error(cli("simulate", "--trace", files / "trace.csv", "--scheduler", "las.py:LeastAttained",
                              "--load", "1.2", "--out", tmp_path / "bare", cwd=old.parent))
    assert re.search(r"las\.py: LeastAttained is the ordering of the policy LAS \('las'\), declared with other "
                     r"params .*: name it as las\.py:LAS", line), line
    assert cli("simulate", "--trace", files / "trace.csv", "--scheduler", "las.py:LAS", "--load", "1.2",
               "--out", tmp_path / "decl", cwd=old.parent).returncode == 0


# ============================================================================ the Python API


def test_python_api_takes_a_spec_or_a_policy_and_gets_the_same_run(files):
    trace = make_example_trace(200, 3)
    a = schedport.simulate(trace, f"{files}/las.py:LAS", load=1.3)
    pol = get_scheduler(f"{files}/las.py:LAS")
    b = schedport.simulate(trace, pol, load=1.3)
    c = schedport.simulate(trace, f"{files}/las.py:LeastAttained", load=1.3)   # a bare Ordering class
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.requests, c.requests)      # the class's params: one scheduler, two names
    assert pol.params == {"preemption": "swap"}
    assert pol.name == "las" and pol.source.sha256 == hashlib.sha256(LAS.encode()).hexdigest()
    assert get_scheduler(f"{files}/las.py:LeastAttained").name == "LeastAttained"
    # LAS is neither FCFS nor srpt on this trace: the user's key really ranks
    fcfs = schedport.simulate(trace, "vllm-fcfs", load=1.3)
    assert not np.array_equal(c.requests["finish_s"].to_numpy(), fcfs.requests["finish_s"].to_numpy())


def test_a_user_table_in_the_engine_config_is_checked_against_the_user_policy(files, tmp_path):
    eng = tmp_path / "engine.toml"
    eng.write_text('[scheduler.las]\npreemption = "kill"\n')
    p = cli("simulate", "--trace", "trace.csv", "--scheduler", "las.py:LAS", "--engine", eng, "--load", "1.2",
            "--out", tmp_path / "o", cwd=files)
    assert '[scheduler.las] preemption: must be "recompute" or "swap", got "kill"' in one_line_error(p)
    eng.write_text('[scheduler.las]\npreemption = "recompute"\n')
    p = cli("simulate", "--trace", "trace.csv", "--scheduler", "las.py:LAS", "--engine", eng, "--load", "1.2",
            "--out", tmp_path / "o-las", cwd=files)
    assert p.returncode == 0, p.stderr
    # a run that does not know 'las' cannot check its table, and says why
    p = cli("simulate", "--trace", "trace.csv", "--scheduler", "vllm-fcfs", "--engine", eng, "--load", "1.2",
            "--out", tmp_path / "o-fcfs", cwd=files)
    assert "[scheduler.las]: unknown scheduler" in one_line_error(p) and "a run of it" in p.stderr
    eng.write_text('[scheduler.lass]\npreemption = "recompute"\n')
    p = cli("simulate", "--trace", "trace.csv", "--scheduler", "las.py:LAS", "--engine", eng, "--load", "1.2",
            "--out", tmp_path / "o2", cwd=files)
    assert "[scheduler.lass]: unknown scheduler; known: vllm-fcfs" in one_line_error(p)


# ============================================================================ the store: versions


def _sweep(corpus, out, spec, **kw):
    from schedport.study.sweep import run_sweep

    return run_sweep(corpus, out, schedulers=f"vllm-fcfs,{spec}", regions="moderate,overload", workers=1,
                     progress=False, **kw)


def test_store_records_the_version_and_refuses_another(files, tmp_path):
    from schedport.study.selection import write_demo_corpus
    from schedport.study.store import POLICIES_META, StoreMismatch

    corpus = write_demo_corpus(tmp_path / "corpus", windows_per_source=1, requests_per_window=40)
    pol = tmp_path / "mine.py"
    pol.write_text(LAS)
    sha = hashlib.sha256(LAS.encode()).hexdigest()
    res = _sweep(corpus, tmp_path / "st", f"{pol}:LAS")
    assert res.cells_run == 8
    man = json.loads((tmp_path / "st" / "manifest.json").read_text())
    assert man["policies"]["las"]["sha256"] == sha and man["policies"]["las"]["text"] == LAS
    assert man["policies"]["las"]["kind"] == "file" and man["policies"]["las"]["path"] == str(pol)
    for part in (tmp_path / "st" / "runs").iterdir():
        assert json.loads(pq.read_schema(part).metadata[POLICIES_META]) == {"las": sha}
    # the same file resumes (nothing to run); one character changed refuses, naming both hashes
    assert _sweep(corpus, tmp_path / "st", f"{pol}:LAS").cells_run == 0
    pol.write_text(LAS.replace("Least attained service.", "Least attained service!"))
    new_sha = hashlib.sha256(pol.read_bytes()).hexdigest()
    with pytest.raises(StoreMismatch) as e:
        _sweep(corpus, tmp_path / "st", f"{pol}:LAS", seeds=2)
    msg = str(e.value)
    assert "\n" not in msg and sha[:12] in msg and new_sha[:12] in msg and "'las'" in msg
    assert _sweep(corpus, tmp_path / "fresh", f"{pol}:LAS").cells_run == 8        # a fresh store runs fine
    # the built-ins of the refused store were not touched, nor its record
    assert json.loads((tmp_path / "st" / "manifest.json").read_text())["policies"]["las"]["sha256"] == sha
    assert len(pd.read_parquet(tmp_path / "st" / "runs")) == 8
    # the analysis reads a part's record against the manifest's: an edited record is refused
    from schedport.study.store import StoreError, verified_runs

    man["policies"]["las"]["sha256"] = new_sha
    with pytest.raises(StoreError, match="holds cells of user scheduler 'las' made by sha256 " + sha[:12]):
        verified_runs(tmp_path / "st", man)


def test_workers_load_the_policy_from_the_text_they_are_sent(files, tmp_path):
    from schedport.engine.core.config import load_engine_config
    from schedport.study.executors import make_executor
    from schedport.study.tasks import run_chunk

    pol = tmp_path / "gone.py"
    pol.write_text(LAS)
    src = get_scheduler(f"{pol}:LAS").source
    pol.unlink()                    # a remote worker has no copy of the file
    trace = make_example_trace(80, 2)
    cfg = load_engine_config(None)
    ex = make_executor("local", 2, None)
    try:
        h = ex.submit(run_chunk, trace, cfg, src, ("demo", "w0", "x", 5.0), [("r", 1.2, 0)], False)
        (_, (rows, _, _)), = [x for x in ex.as_completed([h], tick=1.0) if x[0] is not None]
    finally:
        ex.shutdown()
    assert rows[0]["scheduler"] == "las"
    local, _, _ = run_chunk(trace, cfg, src, ("demo", "w0", "x", 5.0), [("r", 1.2, 0)])
    assert rows == local


def test_a_recorded_source_whose_text_was_edited_is_refused():
    src = PolicySource("las", "file", "/x/las.py:LAS", "LAS", "/x/las.py",
                       hashlib.sha256(LAS.encode()).hexdigest(), LAS)
    rec = src.record()
    assert PolicySource.from_record("las", rec).text == LAS
    rec["text"] = LAS + "# edited\n"
    with pytest.raises(PolicyError, match="does not hash to its recorded sha256"):
        PolicySource.from_record("las", rec)


# ============================================================================ the map treats it as a scheduler


def test_duplicates_and_explain_treat_a_user_policy_as_any_other(tmp_path):
    """A user's copy of sjf is found to be sjf's duplicate; explain reruns the user policy from the
    text the store recorded, with the file gone."""
    from schedport.analysis.explain.runner import Explainer
    from schedport.api import analyze
    from schedport.study.selection import write_demo_corpus

    corpus = write_demo_corpus(tmp_path / "corpus", windows_per_source=3, requests_per_window=40)
    pol = tmp_path / "myjf.py"
    pol.write_text("from schedport.engine.policies.policy import Ordering\n\n\nclass MySjf(Ordering):\n"
                   "    def key(self, req, now):\n        return (req.output, req.arrival, req.idx)\n")
    from schedport.study.sweep import run_sweep

    run_sweep(corpus, tmp_path / "st", schedulers=f"vllm-fcfs,sjf,srpt,{pol}:MySjf", regions="moderate,overload",
              workers=1, progress=False)
    res = analyze(tmp_path / "st", corpus_dir=corpus, n_boot=50).portability
    dups = json.dumps(res["duplicates"])
    assert "MySjf" in dups and "sjf" in dups
    assert res["provenance"]["user_policies"]["MySjf"]["kind"] == "file"
    html = (tmp_path / "st" / "report.html").read_text()
    assert "Schedulers from user files: <b>MySjf</b>" in html
    pol.unlink()
    ex = Explainer(tmp_path / "st", corpus_dir=corpus, workers=1, progress=False, n_boot=20)
    try:
        t = ex.trace("demo-a-00")
        out = ex.run_cells([(t, t.content_sha256(), "MySjf")], rho=1.0)
    finally:
        ex.close()
    assert len(out) == 1 and ex.timings["runs"] == 1
    (summary,) = out.values()
    # the rerun is the store's MySjf exactly: MySjf is sjf's key, so its numbers are sjf's
    sjf = ex.run_cells([(t, t.content_sha256(), "sjf")], rho=1.0)
    assert list(sjf.values())[0] == summary


# ============================================================================ the tutorial, on a fresh install


def _doc_steps(text: str):
    """The tutorial in order: ('file', path, content) for each named code block, ('cmd', line,
    expected error or None) for each `$` line of a console block."""
    steps = []
    for m in re.finditer(r"```(\w+)(?: ([^\n]+))?\n(.*?)```", text, re.S):
        lang, name, body = m.group(1), m.group(2), m.group(3)
        if lang == "console":
            lines = body.splitlines()
            for i, ln in enumerate(lines):
                if ln.startswith("$ "):
                    nxt = lines[i + 1] if i + 1 < len(lines) else ""
                    steps.append(("cmd", ln[2:], nxt if nxt.startswith("error: ") else None))
        elif name:
            steps.append(("file", name.strip(), body))
    return steps


@pytest.mark.data
@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the public data mirror ../shared/datasets")
def test_the_tutorial_runs_on_a_fresh_install(tmp_path):
    """`pip install .` into a new venv (dependencies included: from pip's cache after `make setup`),
    then every command of docs/own-scheduler.md in a directory outside the source tree, ending with
    the user policy in portability.json's rankings."""
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", env_dir], check=True, timeout=300)
    pyver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = env_dir / "lib" / pyver / "site-packages"
    pip = [str(env_dir / "bin" / "python"), "-m", "pip"]
    r = subprocess.run(pip + ["install", "-q", str(ROOT)], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr
    work = tmp_path / "home"
    work.mkdir()
    env = {**os.environ, "PATH": f"{env_dir / 'bin'}:{os.environ['PATH']}", "SCHEDPORT_DATA": str(MIRROR),
           "VIRTUAL_ENV": str(env_dir)}
    env.pop("PYTHONPATH", None)
    where = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import schedport; print(schedport.__file__)"],
                           capture_output=True, text=True, cwd=work, env=env, check=True).stdout.strip()
    assert where.startswith(str(site)), where          # the installed copy, not the source tree
    steps = _doc_steps(DOC.read_text())
    assert sum(s[0] == "cmd" for s in steps) >= 10
    for step in steps:
        if step[0] == "file":
            p = work / step[1]
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(step[2])
            continue
        _, cmd, error = step
        p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=work, env=env, timeout=900)
        if error is None:
            assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-2000:])
        else:
            assert p.returncode == 2, (cmd, p.stdout[-2000:], p.stderr[-2000:])
            pattern = ".*".join(re.escape(part) for part in error.split("..."))
            assert re.fullmatch(pattern, p.stderr.strip()), (p.stderr, pattern)
        if cmd.startswith("python -c"):
            assert "'las'" in p.stdout and "'sjf'" in p.stdout, p.stdout
        if cmd == "schedport schedulers":
            assert re.search(r"^las-pkg\s+Least attained service.*\[installed: my-policies, my_las:LeastAttained\]",
                             p.stdout, re.M), p.stdout
    port = json.loads((work / "results-las" / "portability.json").read_text())
    assert {"las", "vllm-fcfs", "sjf", "srpt"} <= {r["scheduler"] for r in port["rankings"]}
    assert "Schedulers from user files: <b>las</b>" in (work / "results-las" / "report.html").read_text()
    assert (work / "run-las-pkg" / "summary.json").exists()
    assert json.loads((work / "results-las-v2" / "manifest.json").read_text())["policies"]["las"]["sha256"] != \
        json.loads((work / "results-las" / "manifest.json").read_text())["policies"]["las"]["sha256"]
    shutil.rmtree(env_dir, ignore_errors=True)


def test_conformance_takes_a_user_policy_only_where_vllm_priorities_express_it(files):
    p = cli("conformance", "--trace", "trace.csv", "--scheduler", "las.py:LAS", "--load", "1.2", cwd=files)
    assert one_line_error(p).endswith("conformance: scheduler 'las' has no vLLM counterpart: it is preemptive; "
                                      "vLLM's priority policy never preempts for priority")
    from schedport.realengine.replay import user_priorities

    files.joinpath("lpf.py").write_text("from schedport.engine.policies.policy import Ordering\n\n\nclass Lpf(Ordering):\n"
                                        "    def key(self, req, now):\n        return (-req.prompt, req.arrival, req.idx)\n")
    trace = make_example_trace(50, 0)
    prio = user_priorities(trace, f"{files}/lpf.py:Lpf")
    order = np.lexsort((np.arange(len(trace)), trace.arrival_s, -trace.input_tokens))
    assert prio.tolist() == np.argsort(order).tolist()      # rank of each request's key


def test_a_module_on_the_path_is_a_policy_too(tmp_path, monkeypatch):
    (tmp_path / "my_las_module.py").write_text(LAS)
    monkeypatch.syspath_prepend(str(tmp_path))
    pol = get_scheduler("my_las_module:LAS")
    assert pol.name == "las" and pol.source.kind == "module" and pol.source.path == str(tmp_path / "my_las_module.py")
    trace = make_example_trace(100, 5)
    a = schedport.simulate(trace, "my_las_module:LAS", load=1.2)
    b = schedport.simulate(trace, pol.source, load=1.2)          # a worker's form: the recorded source
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert pol.params == {"preemption": "swap"}
    from schedport.engine.policies.plugins import from_source

    changed = PolicySource("las", "module", "my_las_module:LAS", "LAS", pol.source.path, "0" * 64)
    with pytest.raises(PolicyError, match="recorded as sha256 000000000000: another version"):
        from_source(changed)


def test_an_error_in_a_helper_beside_the_policy_file_names_the_helper(tmp_path):
    (tmp_path / "las_helpers.py").write_text("def served(req):\n    if req.generated > 2:\n"
                                             "        raise KeyError('no history')\n    return req.generated\n")
    (tmp_path / "uses_helper.py").write_text(
        "from schedport.engine.policies.policy import Ordering, PerServedToken\nfrom las_helpers import served\n\n\n"
        "class Las(Ordering):\n    preemptive = True\n    dynamics = PerServedToken(+1)\n\n"
        "    def key(self, req, now):\n        return (served(req), req.arrival, req.idx)\n")
    with pytest.raises(PolicyError) as e:
        schedport.simulate(make_example_trace(60, 1), f"{tmp_path}/uses_helper.py:Las", load=1.2)
    assert str(e.value) == (f"{tmp_path}/las_helpers.py:3: scheduler 'Las' raised KeyError: 'no history' "
                            f"(in served)")
