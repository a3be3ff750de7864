"""Nothing a user made is destroyed or misattributed (issue: outputs that know what they overwrite).

Every case goes through the CLI, as a user meets it: one output rule for every command
(`schedport.common.guard`), derived artefacts that record and check what they came from, failures that
are loud, long work that shows progress, and each small case a one-line error.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import _gate
from schedport.api import analyze
from schedport.workload.examples import make_example_trace
from schedport.analysis.explain import explain
from schedport.study.sweep import run_sweep, write_demo_corpus
from schedport.workload.trace import load_trace, save_trace
from _cli import cli, error_line, tree_digest


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_demo_corpus(tmp_path_factory.mktemp("corpus") / "corpus", windows_per_source=2,
                             requests_per_window=40)


def _store(root: Path, corpus: Path, schedulers: str) -> Path:
    out = root / "res"
    run_sweep(corpus, out, schedulers=schedulers, regions="light,overload", workers=1, progress=False)
    analyze(out, out, n_boot=50, n_splits=10)
    return out


@pytest.fixture(scope="module")
def store_a(corpus, tmp_path_factory) -> Path:
    return _store(tmp_path_factory.mktemp("a"), corpus, "vllm-fcfs,sjf")


@pytest.fixture(scope="module")
def store_b(corpus, tmp_path_factory) -> Path:
    return _store(tmp_path_factory.mktemp("b"), corpus, "vllm-fcfs,sjf,ltr")


@pytest.fixture(scope="module")
def explained(store_b, tmp_path_factory) -> tuple[Path, dict, Path]:
    """An explanation of sjf vs ltr in store B (its cache in its own folder) and its cache."""
    cache = tmp_path_factory.mktemp("cache") / "explain"
    d = explain(store_b, pair="sjf,ltr", metric="e2e_mean_s", region="overload", sources="demo-a,demo-b",
                cache_dir=cache, workers=1, progress=False, n_boot=50)
    return store_b, d, cache


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def trace_csv(tmp_path) -> Path:
    p = tmp_path / "t.csv"
    save_trace(make_example_trace(100), p)
    return p


# ============================================================================ 1. corpus build


def test_corpus_build_refuses_a_results_store_and_leaves_it_whole(store_a, tmp_path):
    d = _copy(store_a, tmp_path / "store")
    before = tree_digest(d)
    msg = error_line(cli("corpus", "build", "--out", d, "--data-dir", tmp_path))
    assert str(d) in msg and "results store" in msg and "refusing to replace" in msg
    assert tree_digest(d) == before


def test_corpus_build_refuses_a_folder_with_another_manifest(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"kind": "my-own-tool", "x": 1}))
    msg = error_line(cli("corpus", "build", "--out", d, "--data-dir", tmp_path))
    assert "files schedport did not make" in msg
    assert json.loads((d / "manifest.json").read_text()) == {"kind": "my-own-tool", "x": 1}


def test_run_with_a_store_as_corpus_advises_no_command_that_would_destroy_it(store_a, tmp_path):
    d = _copy(store_a, tmp_path / "store")
    msg = error_line(cli("run", "--corpus", d, "--out", tmp_path / "new", "--workers", "1"))
    assert "results store" in msg and f"--out {d}`" not in msg and "NEW_DIR" in msg


def test_corpus_build_removes_the_temporary_folders_a_killed_build_left(tmp_path):
    # what `kill -9` during a build leaves: a temporary folder named after a process that is gone
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".corpus.building-{dead}-0123abcd"
    (stale / "windows").mkdir(parents=True)
    (stale / "windows" / "x.parquet").write_bytes(b"half")
    live = tmp_path / f".corpus.building-{os.getpid()}-89abcdef"   # a build still running: left alone
    live.mkdir()
    spec = tmp_path / "spec.toml"
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"timestamp": 200 * i, "input_length": 10 + i, "output_length": 5,
                                       "hash_ids": [1]}) + "\n" for i in range(100)))
    spec.write_text(f'name = "mine"\n[[sources]]\nname = "mine"\nadapter = "jsonl"\nfiles = ["{src}"]\n'
                    'windows = { rule = "contiguous", count = 1, duration_s = 10 }\n')
    p = cli("corpus", "build", "--spec", spec, "--out", tmp_path / "corpus", "--data-dir", tmp_path)
    assert p.returncode == 0, p.stderr
    assert not stale.exists() and live.exists()


# ============================================================================ 2. analysis outputs


def test_analyze_into_another_store_is_refused(store_a, store_b, tmp_path):
    b = _copy(store_b, tmp_path / "b")
    before = tree_digest(b)
    msg = error_line(cli("analyze", "--results", store_a, "--out", b, "--boot", "20"))
    assert str(b) in msg and "results store" in msg
    assert tree_digest(b) == before
    # nor inside it, where it would pass for the store's own analysis
    msg = error_line(cli("analyze", "--results", store_a, "--out", b / "sub", "--boot", "20"))
    assert "inside a results store" in msg


def test_explain_refuses_a_portability_json_of_another_store(store_a, store_b, tmp_path):
    b = _copy(store_b, tmp_path / "b")
    shutil.copy(store_a / "portability.json", b / "portability.json")   # A's analysis, placed in B
    msg = error_line(cli("explain", "--results", b, "--list"))
    assert "analysis of another results store" in msg and f"analyze --results {b}" in msg


def test_analyze_into_an_earlier_analysis_folder_or_a_new_one_works(store_a, tmp_path):
    out = tmp_path / "report"
    for _ in range(2):   # a new folder, then the analysis it now holds, replaced
        p = cli("analyze", "--results", store_a, "--out", out, "--boot", "20", "--splits", "5")
        assert p.returncode == 0, p.stderr
    assert json.loads((out / "portability.json").read_text())["store"]["created"] == \
        json.loads((store_a / "manifest.json").read_text())["created"]


def test_analyze_never_overwrites_a_report_it_did_not_write(store_a, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.html").write_text("<p>my own report</p>")
    msg = error_line(cli("analyze", "--results", store_a, "--out", out, "--boot", "20"))
    assert "report.html" in msg and "not written by schedport" in msg
    assert (out / "report.html").read_text() == "<p>my own report</p>"


# ============================================================================ 3. --compare, ceiling


def test_compare_of_different_selections_is_flagged_on_the_first_screen(store_a, store_b, tmp_path):
    a = _copy(store_a, tmp_path / "a")
    p = cli("analyze", "--results", a, "--compare", store_b, "--boot", "20", "--splits", "5")
    assert p.returncode == 0, p.stderr
    assert "warning (--compare): the two analyses cover different selections" in p.stdout
    assert "2 schedulers x 4 windows" in p.stdout and "3 schedulers x 4 windows" in p.stdout
    html = (a / "report.html").read_text()
    assert html.index("id='compare-warning'") < html.index("id='card-claims'")   # above the claims
    res = json.loads((a / "portability.json").read_text())
    assert res["region_comparison"]["selection_differs"] is True


def test_ceiling_adjusted_values_above_one_are_marked():
    from schedport.report.html import _Nums
    from schedport.analysis.studyform import adjusted_text

    res = {"x": {"adjusted": 1.061}, "y": {"adjusted": 0.8}}
    assert "&gt;1</sup>" in _Nums(res)("x.adjusted") and "&gt;1" not in _Nums(res)("y.adjusted")
    assert adjusted_text(1.061).startswith("1.06 (above 1") and adjusted_text(0.8) == "0.80"


# ============================================================================ 4. explain cache


def test_an_edited_explain_cache_cell_is_recomputed_not_believed(explained, tmp_path):
    store, d, cache = explained
    c = _copy(cache, tmp_path / "cache")
    cells = sorted((c / "cells").rglob("*.json"))
    cell = json.loads(cells[0].read_text())
    key = next(k for k, v in cell["summary"].items() if isinstance(v, float) and v > 0)
    cell["summary"][key] *= 10   # a number edited by hand
    cells[0].write_text(json.dumps(cell))
    out = tmp_path / "why.json"
    p = cli("explain", "--results", store, "--pair", "sjf,ltr", "--metric", "e2e_mean_s", "--region", "overload",
            "--sources", "demo-a,demo-b", "--cache", c, "--out", out, "--workers", "1", "--boot", "50")
    assert p.returncode == 0, p.stderr
    assert "1 cached runs failed their checksum and were recomputed" in p.stdout
    again = json.loads(out.read_text())
    assert again["effects"] == d["effects"] and again["attribution"] == d["attribution"]
    assert json.loads(cells[0].read_text())["summary"][key] == pytest.approx(cell["summary"][key] / 10)


def test_explain_cache_refuses_a_store_or_a_corpus(store_a, corpus, explained, tmp_path):
    store, _, _ = explained
    for target, what in ((store_a, "results store"), (corpus, "corpus")):
        msg = error_line(cli("explain", "--results", store, "--pair", "sjf,ltr", "--metric", "e2e_mean_s",
                             "--region", "overload", "--sources", "demo-a,demo-b", "--cache", target))
        assert what in msg and "--cache" in msg


# ============================================================================ 6. own input


def test_trace_convert_refuses_to_overwrite_its_input(tmp_path, trace_csv):
    before = trace_csv.read_bytes()
    msg = error_line(cli("trace", "convert", trace_csv, "--from", "canonical", "--out", trace_csv, "--rows", "10"))
    assert "is this command's input" in msg
    assert trace_csv.read_bytes() == before


def test_simulate_refuses_to_write_into_a_store_or_a_corpus(store_a, corpus, trace_csv, tmp_path):
    for target, what in ((store_a, "results store"), (corpus, "corpus")):
        before = tree_digest(target)
        msg = error_line(cli("simulate", "--trace", trace_csv, "--scheduler", "vllm-fcfs", "--out", target))
        assert what in msg
        assert tree_digest(target) == before


# ============================================================================ 7. memory and silence


def _main(argv, monkeypatch, capsys) -> tuple[int, str]:
    from schedport import cli as cli_mod

    monkeypatch.setattr(sys, "argv", ["schedport", *map(str, argv)])
    with pytest.raises(SystemExit) as e:
        cli_mod.main()
    return e.value.code, capsys.readouterr().err


def test_a_trace_too_big_for_the_memory_available_is_refused_before_reading(trace_csv, monkeypatch, capsys):
    import schedport.workload.trace as tr

    monkeypatch.setattr(tr, "available_memory", lambda: 1000)
    code, err = _main(["trace", "check", trace_csv], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and "needs about" in err and "available" in err


def test_simulate_reports_progress_on_long_runs(trace_csv, tmp_path, monkeypatch, capsys):
    from schedport import cli as cli_mod

    monkeypatch.setattr(cli_mod._StepProgress, "FIRST_S", 0.0)
    monkeypatch.setattr(cli_mod._StepProgress, "EVERY_S", 0.0)
    big = tmp_path / "big.csv"
    save_trace(make_example_trace(3000), big)
    code, err = _main(["simulate", "--trace", big, "--scheduler", "vllm-fcfs", "--out", tmp_path / "o",
                       "--exact"], monkeypatch, capsys)
    assert code == 0, err
    lines = [ln for ln in err.splitlines() if ln.startswith("simulate: simulated ")]
    assert lines and "/3,000 requests arrived" in lines[-1]


def test_progress_does_not_change_a_result():
    from schedport.engine.runner import simulate

    calls = []
    t = make_example_trace(600)
    a = simulate(t, "sjf", load=1.2, exact=True)
    b = simulate(t, "sjf", load=1.2, exact=True, progress=lambda *x: calls.append(x))
    assert calls and a.requests.equals(b.requests) and a.summary == b.summary


def test_the_byte_path_and_the_text_path_read_the_same_trace(tmp_path):
    # a quote-free ASCII file goes through numpy on its bytes; with CRLF line ends, the text path
    t = make_example_trace(5000, seed=3)
    plain = tmp_path / "plain.csv"
    save_trace(t, plain)
    crlf = tmp_path / "crlf.csv"
    crlf.write_bytes(plain.read_bytes().replace(b"\n", b"\r\n"))
    a, b = load_trace(plain), load_trace(crlf)
    for col in ("arrival_s", "input_tokens", "output_tokens", "client_id"):
        assert (getattr(a, col) == getattr(t, col)).all() and (getattr(b, col) == getattr(t, col)).all(), col


def test_a_ragged_row_is_still_named_by_its_line(tmp_path):
    p = tmp_path / "r.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n0,5,6\n1,5\n2,5,6,7\n")
    msg = error_line(cli("trace", "check", p))
    assert "line 3" in msg and "expected 3 fields" in msg


def test_example_with_an_absurd_size_is_one_line(tmp_path):
    msg = error_line(cli("example", "--requests", "100000000000", "--out", tmp_path / "x.csv"))
    assert "--requests must be at most" in msg and not (tmp_path / "x.csv").exists()


# ============================================================================ 8. the smaller cases


def test_negative_seeds_of_analyze_and_explain_are_one_line(store_a):
    assert "--seed must be >= 0" in error_line(cli("analyze", "--results", store_a, "--seed", "-1"))
    assert "--seed must be >= 0" in error_line(cli("explain", "--results", store_a, "--seed", "-1", "--list"))


def test_the_manifest_names_the_corpus_by_its_absolute_path(corpus, tmp_path):
    rel = os.path.relpath(corpus, tmp_path)
    p = cli("run", "--corpus", rel, "--out", "res", "--schedulers", "vllm-fcfs,sjf", "--regions", "light",
            "--workers", "1", "--no-analyze", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    m = json.loads((tmp_path / "res" / "manifest.json").read_text())
    assert m["corpus_dir"] == str(corpus.resolve()) or Path(m["corpus_dir"]).resolve() == corpus.resolve()
    assert os.path.isabs(m["corpus_dir"])


def test_a_run_that_failed_before_any_cell_is_replaced_by_the_corrected_rerun(corpus, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine]\nmax_model_len = 1\n")
    out = tmp_path / "res"
    args = ["run", "--corpus", corpus, "--out", out, "--schedulers", "vllm-fcfs,sjf", "--regions", "light",
            "--workers", "1", "--no-analyze"]
    first = cli(*args, "--engine", bad)
    assert first.returncode != 0
    p = cli(*args)
    assert p.returncode == 0, p.stderr
    assert json.loads((out / "manifest.json").read_text())["status"] == "finished"


def test_explain_list_with_no_reversal_says_so(store_a, tmp_path):
    a = _copy(store_a, tmp_path / "a")
    res = json.loads((a / "portability.json").read_text())
    for e in res["study_form"]["reversals"]:
        e["items"] = []                       # an analysis that found no reversal
    (a / "portability.json").write_text(json.dumps(res))
    p = cli("explain", "--results", a, "--list")
    assert p.returncode == 0 and "finds no cross-source reversal" in p.stdout, p.stdout + p.stderr


def test_explain_stopped_by_ctrl_c_says_what_it_kept(explained, tmp_path):
    store, _, _ = explained
    gate = tmp_path / "gate"
    gate.mkdir()
    body = ("import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from schedport.cli import main\nmain()")
    args = ["explain", "--results", str(store), "--pair", "sjf,ltr", "--metric", "e2e_mean_s", "--region",
            "overload", "--sources", "demo-a,demo-b", "--cache", str(tmp_path / "fresh"), "--workers", "1",
            "--boot", "50"]
    proc = subprocess.Popen([sys.executable, "-c", _gate.driver(gate, [], body), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_gate.env())
    try:
        _gate.wait_held(gate, 1, proc)     # a run is in progress, held: the signal comes mid-work
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "interrupted: every finished run is kept in the explain cache; rerun the same command" in err


@pytest.mark.parametrize("value", ["0", "-1", "abc", ""])
def test_analyze_explain_is_checked_before_the_analysis(store_a, tmp_path, value):
    a = _copy(store_a, tmp_path / "a")
    (a / "portability.json").unlink()
    msg = error_line(cli("analyze", "--results", a, "--explain", value))
    assert "--explain" in msg
    assert not (a / "portability.json").exists()     # refused before any analysis was written


def test_simulate_with_every_request_over_length_says_so(tmp_path):
    p = tmp_path / "over.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n0,9000,10\n0.001,9500,10\n0.002,9900,10\n")
    msg = error_line(cli("simulate", "--trace", p, "--scheduler", "vllm-fcfs", "--out", tmp_path / "o"))
    assert "all 3 requests were rejected at arrival" in msg and "max_model_len" in msg
    assert "time scale" not in msg


def test_simulate_advice_names_options_it_has(tmp_path):
    p = tmp_path / "close.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n0,4000,500\n0.000001,4000,500\n")
    msg = error_line(cli("simulate", "--trace", p, "--scheduler", "vllm-fcfs", "--out", tmp_path / "o"))
    assert "metrics horizon" in msg and "--load" in msg and "time scale" not in msg


def test_a_file_or_a_missing_folder_as_results_or_data_dir(trace_csv, tmp_path):
    assert "is a file; --results takes" in error_line(cli("analyze", "--results", trace_csv))
    assert "no such directory" in error_line(cli("analyze", "--results", tmp_path / "nope"))
    assert "is a file; --results takes" in error_line(cli("explain", "--results", trace_csv, "--list"))
    assert "is a file; --data-dir takes" in error_line(cli("corpus", "build", "--data-dir", trace_csv,
                                                           "--out", tmp_path / "c"))
    # a missing folder is a valid --data-dir (a download fills it); where a file cannot be had,
    # the message says the folder is missing (the download itself depends on the network)
    from schedport.workload import datadir

    entry = next(iter(datadir.data_files().values()))
    msg = datadir._missing_message(entry, tmp_path / "nodata", tmp_path / "nodata", "download failed")
    assert f"{tmp_path / 'nodata'} (no such folder)" in msg


@pytest.mark.parametrize("args,flag", [
    (["analyze", "--results", "{store}", "--metrics", ""], "--metrics"),
    (["analyze", "--results", "{store}", "--explain", ""], "--explain"),
    (["analyze", "--results", ""], "--results"),
    (["explain", "--results", "{store}", "--features", "", "--list"], "--features"),
    (["explain", "--results", ""], "--results"),
])
def test_empty_values_are_refused_not_taken_for_all(store_a, args, flag):
    msg = error_line(cli(*[a.replace("{store}", str(store_a)) for a in args]))
    assert flag in msg and "empty" in msg


@pytest.mark.parametrize("regions,why", [("a=0.5,b=0.5", "both rho 0.5"), ("a/b=0.5", "a region name is"),
                                         ("../x=0.5", "a region name is")])
def test_bad_custom_regions_are_refused(corpus, tmp_path, regions, why):
    msg = error_line(cli("run", "--corpus", corpus, "--out", tmp_path / "r", "--regions", regions,
                         "--schedulers", "vllm-fcfs,sjf", "--workers", "1"))
    assert why in msg and not (tmp_path / "r").exists()


def test_run_says_what_its_closing_analysis_covered(corpus, tmp_path):
    p = cli("run", "--corpus", corpus, "--out", tmp_path / "r", "--schedulers", "vllm-fcfs,sjf",
            "--regions", "light,overload", "--workers", "1")
    assert p.returncode == 0, p.stderr
    assert "analysis over 2 schedulers x 4 windows x 2 regions of the store" in p.stdout


@pytest.mark.parametrize("flag,value", [("--splits", "0"), ("--boot", "0"), ("--q", "2")])
def test_analysis_option_errors_name_the_flag(store_a, flag, value):
    msg = error_line(cli("analyze", "--results", store_a, flag, value))
    assert msg.startswith(f"error: {flag} must")


def test_run_no_analyze_runs_one_window_and_one_scheduler(corpus, tmp_path):
    p = cli("run", "--corpus", corpus, "--out", tmp_path / "r", "--schedulers", "sjf", "--windows", "1",
            "--regions", "light", "--workers", "1", "--no-analyze")
    assert p.returncode == 0, p.stderr
    assert "analysis skipped (--no-analyze)" in p.stdout and not (tmp_path / "r" / "portability.json").exists()


# ============================================================================ the walk


def test_no_command_overwrites_an_artefact_of_another_kind(store_a, corpus, explained, trace_csv, tmp_path):
    """A store, a corpus, an analysis folder and an explain cache, each given as the output of
    every command that takes --out (or --cache): every command refuses them all but its own
    kind, and each artefact comes through byte for byte."""
    store_b, _, cache = explained
    arts = {"store": _copy(store_a, tmp_path / "store"), "corpus": _copy(corpus, tmp_path / "corpus"),
            "cache": _copy(cache, tmp_path / "cache")}
    analysis = tmp_path / "analysis"
    assert cli("analyze", "--results", arts["store"], "--out", analysis, "--boot", "20",
               "--splits", "5").returncode == 0
    arts["analysis"] = analysis
    before = {k: tree_digest(v) for k, v in arts.items()}
    engine = tmp_path / "engine.toml"
    engine.write_text("# defaults\n")
    commands = {
        "corpus build": lambda o: ["corpus", "build", "--out", o, "--data-dir", tmp_path / "nodata"],
        "run": lambda o: ["run", "--corpus", corpus, "--out", o, "--schedulers", "vllm-fcfs,sjf", "--regions",
                          "light", "--workers", "1"],
        "analyze": lambda o: ["analyze", "--results", store_b, "--out", o, "--boot", "20"],
        "simulate": lambda o: ["simulate", "--trace", trace_csv, "--scheduler", "vllm-fcfs", "--out", o],
        "replay": lambda o: ["replay", "--endpoint", "http://127.0.0.1:9", "--trace", trace_csv, "--engine",
                             engine, "--out", o],
        "validate": lambda o: ["validate", "--endpoint", "http://127.0.0.1:9", "--engine", engine, "--trace",
                               trace_csv, "--out", o],
        "explain --cache": lambda o: ["explain", "--results", store_b, "--pair", "sjf,ltr", "--metric",
                                      "e2e_mean_s", "--region", "overload", "--sources", "demo-a,demo-b",
                                      "--cache", o, "--workers", "1"],
    }
    own = {"corpus build": "corpus", "run": "store", "analyze": "analysis", "explain --cache": "cache"}
    for name, argv in commands.items():
        for kind, path in arts.items():
            if own.get(name) == kind:
                continue
            p = cli(*argv(path))
            msg = error_line(p)
            assert "refusing" in msg or "not overwriting" in msg or "inside" in msg, (name, kind, msg)
            assert tree_digest(path) == before[kind], (name, kind)
    # and a file output never lands inside a store or a corpus
    for kind in ("store", "corpus"):
        for argv in (["example", "--out", arts[kind] / "x.csv"],
                     ["trace", "convert", trace_csv, "--from", "canonical", "--out", arts[kind] / "x.csv"]):
            assert "refusing to write there" in error_line(cli(*argv))
            assert tree_digest(arts[kind]) == before[kind]


def test_a_simulation_too_big_for_the_memory_available_is_refused_before_it_starts(trace_csv, tmp_path,
                                                                                   monkeypatch, capsys):
    import schedport.engine.inputs as inputs

    real = inputs.available_memory
    # enough to read the 100-request file, not enough to simulate it at SIM_BYTES_PER_REQUEST
    monkeypatch.setattr(inputs, "available_memory", lambda: 50 * 1024 if real() else None)
    code, err = _main(["simulate", "--trace", trace_csv, "--scheduler", "vllm-fcfs", "--out", tmp_path / "o"],
                      monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and "simulating 100 requests needs about" in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_analyze_says_when_the_workload_figure_is_left_out(store_a, tmp_path):
    a = _copy(store_a, tmp_path / "a")
    m = json.loads((a / "manifest.json").read_text())
    m["corpus_dir"] = str(tmp_path / "moved-away")       # the corpus is no longer where the run found it
    (a / "manifest.json").write_text(json.dumps(m))
    p = cli("analyze", "--results", a, "--boot", "20", "--splits", "5")
    assert p.returncode == 0, p.stderr
    assert "workload figure left out of the report: the corpus named by the results manifest" in p.stdout
