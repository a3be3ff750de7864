"""The Python API (`schedport.api`, reached as `schedport.NAME`): each stage on a small input, its
typed result, and its one-line errors on bad input, without the command line."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import schedport
from _synthstore import SCHEDULERS13, make_runs, write_store
from schedport import api
from schedport.errors import SchedportError, TraceError
from schedport.workload.examples import make_example_trace
from schedport.workload.trace import save_trace
from _paths import FIXTURES



def _frozen(result) -> None:
    """`result` is a frozen dataclass: assigning a field fails."""
    field = dataclasses.fields(result)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(result, field, None)


def test_import_schedport_stays_cheap_and_names_the_api():
    code = ("import sys, schedport\nheavy = [m for m in ('numpy', 'pandas', 'schedport.api') if m in sys.modules]\n"
            "assert not heavy, heavy\nassert schedport.run is schedport.api.run\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    for name in ("run", "analyze", "explain", "simulate", "validate", "calibrate", "check_policy", "conformance",
                 "convert_trace", "trace_stats"):
        assert getattr(schedport, name) is getattr(api, name) and name in schedport.__all__
    with pytest.raises(AttributeError):
        schedport.no_such_function


# --------------------------------------------------------------------------- one trace


@pytest.fixture(scope="module")
def trace_csv(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("trace") / "example.csv"
    save_trace(make_example_trace(300, seed=2), p)
    return p


def test_simulate_writes_its_files_and_checks_its_options(trace_csv, tmp_path):
    out = tmp_path / "run"
    res = schedport.simulate(trace_csv, "sjf", load=0.8, out_dir=out)
    assert isinstance(res, api.SimulationResult) and len(res.requests) == 300
    assert json.loads((out / "summary.json").read_text())["n_completed"] == res.summary["n_completed"] > 0
    assert (out / "requests.parquet").is_file() and api.unserved(res, trace_csv) is None
    with pytest.raises(SchedportError, match="--horizon must be a positive, finite"):
        schedport.simulate(trace_csv, "sjf", horizon_s=float("inf"))
    with pytest.raises(SchedportError, match="--region-def says what --load is relative to"):
        schedport.simulate(trace_csv, "sjf", region_def="drain")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "summary.json").write_text("{}")
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(SchedportError, match="mine"):   # a folder that is not a run's output alone is refused...
        schedport.simulate(trace_csv, "sjf", out_dir=tmp_path / "mine")
    assert (tmp_path / "mine" / "summary.json").read_text() == "{}"        # ...and left as it was


def test_unserved_names_the_trace_and_the_first_reason(tmp_path):
    from schedport.workload.trace import Trace

    t = Trace.from_arrays([0.0, 1.0], [100_000, 100_000], [10, 10], name="huge")
    res = schedport.simulate(t, "vllm-fcfs")
    why = api.unserved(res, "huge.csv")
    assert why.startswith("huge.csv: all 2 requests were rejected at arrival (first: ") and "max_model_len" in why


def test_trace_stats(trace_csv, tmp_path):
    st = schedport.trace_stats(trace_csv)
    assert isinstance(st, api.TraceStats) and st.n_requests == 300 and st.span_s > 0
    assert st.rate_rps == pytest.approx(299 / st.span_s) and st.input_p99 >= st.input_mean > 0
    _frozen(st)
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,-3,5\n")
    with pytest.raises(TraceError):
        schedport.trace_stats(bad)


def test_convert_trace(tmp_path):
    out = tmp_path / "t.csv"
    res = schedport.convert_trace(FIXTURES / "sources" / "azure_conv_small.csv", "azure", out, rows=5)
    assert isinstance(res, api.TraceConversion) and res.out == out and res.n_requests == 5
    assert schedport.trace_stats(out).n_requests == 5
    assert set(res.dropped) and all(v >= 0 for v in res.dropped.values()) and res.skipped == ()
    _frozen(res)
    with pytest.raises(SchedportError, match="--from servegen needs --slot"):
        schedport.convert_trace(FIXTURES / "sources" / "servegen_pool", "servegen", tmp_path / "s.csv")
    src = FIXTURES / "sources" / "canonical_small.csv"
    with pytest.raises(SchedportError):                     # never over its own input
        schedport.convert_trace(src, "canonical", src)


def test_check_policy_of_a_builtin_and_of_a_bad_spec():
    res = schedport.check_policy("sjf")
    assert isinstance(res, api.PolicyCheckResult) and res.name == "sjf" and res.origin == "built-in"
    assert res.check.n_requests > 0 and len(res.check.labels) == 4 and "fast == exact" in res.check.summary()
    _frozen(res)
    with pytest.raises(SchedportError):
        schedport.check_policy("no-such-policy")


# --------------------------------------------------------------------------- the study


@pytest.fixture(scope="module")
def demo_corpus(tmp_path_factory) -> Path:
    from schedport.study.sweep import write_demo_corpus

    return write_demo_corpus(tmp_path_factory.mktemp("corpus") / "corpus", windows_per_source=2,
                             requests_per_window=40)


def test_run_without_the_analysis(demo_corpus, tmp_path):
    swept = []
    res = schedport.run(demo_corpus, tmp_path / "res", schedulers="sjf,vllm-fcfs", regions="light", workers=1,
                        analysis=False, on_swept=swept.append)
    assert isinstance(res, api.RunResult) and swept == [res] and res.analysis is None
    assert res.sweep.cells_run == res.sweep.cells_total == 2 * 4 and res.variant_sweeps == ()
    assert not res.corpus_built and res.variant_set is None and res.wall_s > 0
    _frozen(res)
    again = schedport.run(demo_corpus, tmp_path / "res", schedulers="sjf,vllm-fcfs", regions="light", workers=1,
                          analysis=False)
    assert again.sweep.cells_run == 0 and again.sweep.cells_skipped == 8


def test_run_refuses_a_selection_the_analysis_cannot_use_before_running(demo_corpus, tmp_path):
    with pytest.raises(SchedportError, match="--schedulers: the analysis that ends `run` ranks schedulers"):
        schedport.run(demo_corpus, tmp_path / "res", schedulers="sjf", regions="light", workers=1)
    assert not (tmp_path / "res" / "runs").exists()
    with pytest.raises(SchedportError, match="no such scheduler|unknown"):
        schedport.run(demo_corpus, tmp_path / "res2", schedulers="sjf,nope", workers=1)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    d = tmp_path_factory.mktemp("store")
    write_store(d, make_runs(schedulers=SCHEDULERS13[:4], n_windows=4, seed=1))
    return d, schedport.analyze(d, n_boot=50, n_splits=10, robustness=False)


def test_analyze_returns_the_portability_and_its_paths(analysed):
    d, res = analysed
    assert isinstance(res, api.AnalysisResult) and res.out_dir == d
    assert res.portability_json == d / "portability.json" and res.report_html.is_file()
    assert json.loads(res.portability_json.read_text())["headline"] == res.portability["headline"]
    _frozen(res)


@pytest.mark.parametrize("options, flag", [(dict(q=1.5), "--q"), (dict(n_boot=0), "--boot"), (dict(seed=-1), "--seed"),
                                           (dict(metrics=[]), "--metrics"), (dict(robustness_boot=0),
                                                                               "--robustness-boot"),
                                           (dict(explain=" "), "--explain")])
def test_analyze_checks_every_option_before_any_work(analysed, tmp_path, options, flag):
    d, _ = analysed
    with pytest.raises(SchedportError, match=flag):
        schedport.analyze(d, tmp_path / "a", **options)
    assert not (tmp_path / "a" / "portability.json").exists()


def test_analyze_refuses_a_corpus_as_its_output_and_a_folder_that_is_no_store(analysed, demo_corpus, tmp_path):
    d, _ = analysed
    with pytest.raises(SchedportError, match="corpus"):
        schedport.analyze(d, demo_corpus, n_boot=20)
    with pytest.raises(SchedportError, match="not a results store"):
        schedport.analyze(tmp_path)


def test_report_writes_the_pages_again(analysed, tmp_path):
    d, res = analysed
    page = tmp_path / "study.md"
    out = api.report(d, study_md=page)
    assert isinstance(out, api.ReportResult) and out.html == d / "report.html" and out.study_md == page
    assert page.read_text().startswith("# The study's figures\n")
    assert api.report(d, html=False) == api.ReportResult(None, None)
    notes = tmp_path / "notes.md"
    notes.write_text("mine")
    with pytest.raises(SchedportError, match="was not written by `schedport report --study-md`"):
        api.report(d, study_md=notes)
    assert notes.read_text() == "mine"


def test_explain_lists_the_reversals_and_checks_its_options(analysed, tmp_path):
    d, res = analysed
    listed = schedport.explain(d, list_only=True)
    assert isinstance(listed, api.ExplainResult) and listed.explanation is None and listed.out is None
    assert [r["id"] for r in listed.reversals] == list(range(1, len(listed.reversals) + 1))
    for kw, flag in ((dict(seed=-1), "--seed"), (dict(n_boot=0), "--boot"), (dict(features=[]), "--features"),
                     (dict(out=tmp_path), "--out")):
        with pytest.raises(SchedportError, match=flag):
            schedport.explain(d, **kw)


def test_explain_runs_and_writes_its_explanation(tmp_path):
    from test_explain import _study

    res_dir = _study(tmp_path, [("short", False, "short"), ("long", False, "long")], "static,fastserve", 0.95, 4, 60)
    out = tmp_path / "why.json"
    res = schedport.explain(res_dir, pair="static,fastserve", metric="slo_attainment_standard", region="r",
                            sources="short,long", out=out, workers=1, n_boot=100)
    assert isinstance(res, api.ExplainResult) and res.out == out and res.reversals == ()
    assert json.loads(out.read_text()) == json.loads(json.dumps(res.explanation))
    assert res.explanation["verdict"]["sentence"] and res.explanation["run_info"]["runs"] > 0


# --------------------------------------------------------------------------- a real server


def test_validate_on_a_stand_in_server(monkeypatch, trace_csv, tmp_path):
    from test_validate_orchestration import ENGINE, _install_slow_replay

    calls = _install_slow_replay(monkeypatch, lambda k: 1.1, [], lambda sched, f: sched)
    engine = tmp_path / "engine.toml"
    engine.write_text("[engine]\nmax_num_seqs = 8\nmax_model_len = 8192\n[latency]\nmodel = \"linear\"\n"
                      + "".join(f"{k} = {v}\n" for k, v in ENGINE["latency"].items() if k != "model"))
    res = schedport.validate("http://fake", engine, tmp_path / "v", traces=[trace_csv], max_requests=60,
                             schedulers="vllm-fcfs,sjf", regions="light", speed_probe=False)
    assert isinstance(res, api.ValidationResult) and res.lag_ok and res.predicted is None
    assert sorted(calls) == ["sjf", "vllm-fcfs"]
    assert res.validation_json.is_file() and res.validation_html.is_file()
    assert json.loads(res.validation_json.read_text())["runs"] == res.validation["runs"]
    _frozen(res)
    with pytest.raises(SchedportError, match="give either --trace FILE"):
        schedport.validate("http://fake", engine, tmp_path / "w")


def test_calibrate_checks_its_limits_and_output_before_any_probe(tmp_path, analysed):
    with pytest.raises(SchedportError, match="--max-num-seqs must be a positive integer"):
        schedport.calibrate("http://127.0.0.1:9", tmp_path / "e.toml", max_num_seqs=0)
    with pytest.raises(SchedportError, match="unknown limit 'max_seqs'"):
        schedport.calibrate("http://127.0.0.1:9", tmp_path / "e.toml", max_seqs=4)
    d, _ = analysed
    with pytest.raises(SchedportError):     # never a file inside a results store
        schedport.calibrate("http://127.0.0.1:9", d / "runs" / "e.toml")


def test_calibrate_against_a_real_server(tmp_path):
    from _vllm import require_vllm

    require_vllm()
    from schedport.realengine.localserver import VllmCpuServer, build_tiny_model

    model = build_tiny_model(tmp_path / "model")
    with VllmCpuServer(model, max_num_seqs=8, max_model_len=2048, log_path=tmp_path / "server.log") as srv:
        res = schedport.calibrate(srv.endpoint, tmp_path / "engine.toml", repeats=1, max_num_seqs=8,
                                  max_num_batched_tokens=2048)
    assert isinstance(res, api.CalibrationResult) and res.out.is_file()
    assert res.limits["max_num_seqs"] == 8 and res.fit.r2 > 0 and res.model
    from schedport.engine.core.config import load_engine_config

    assert load_engine_config(res.out).max_num_seqs == 8


def test_conformance_checks_its_options_before_any_case(trace_csv, demo_corpus, tmp_path):
    with pytest.raises(SchedportError, match="--mode: must be exact, fast or exact,fast, got 'slow'"):
        schedport.conformance(trace=trace_csv, modes="slow")
    with pytest.raises(SchedportError, match="--load must be a positive finite number"):
        schedport.conformance(trace=trace_csv, load=-1.0)
    with pytest.raises(SchedportError, match="srpt"):             # vLLM's policies cannot run it
        schedport.conformance(trace=trace_csv, schedulers="vllm-fcfs,srpt")
    with pytest.raises(SchedportError, match="is a directory"):
        schedport.conformance(trace=trace_csv, out=tmp_path)


def test_conformance_of_a_trace_against_vllm(tmp_path):
    from _vllm import require_vllm

    require_vllm()
    p = tmp_path / "t.csv"
    save_trace(make_example_trace(40, seed=3), p)
    res = schedport.conformance(trace=p, schedulers="vllm-fcfs,sjf", load=1.2, modes="fast", out=tmp_path / "c.json")
    assert isinstance(res, api.ConformanceResult) and len(res.results) == 2 and res.agrees
    assert json.loads((tmp_path / "c.json").read_text())["vllm_version"] == res.vllm_version != "?"


def test_replay_against_a_stand_in_server(tmp_path):
    from test_replay import FakeServer, clean_trace

    p = tmp_path / "t.csv"
    save_trace(clean_trace(), p)
    server = FakeServer()
    server.start()
    try:
        server.configure()
        res = api.replay(server.url, p, tmp_path / "r", seed=7, max_lag_s=60.0)
    finally:
        server.close()
    assert res.summary["n_completed"] == 16 and res.lag_ok and api.replay_failure(res, server.url) is None
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["n_completed"] == 16
    with pytest.raises(SchedportError):         # its own input is never the output folder
        api.replay(server.url, p, tmp_path)
