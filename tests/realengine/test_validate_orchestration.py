"""validate's orchestration without a server: the "real engine" is the simulator on a slower engine."""

from __future__ import annotations

import dataclasses
import json

import pytest

import schedport.realengine.replay as replay_mod
from schedport.engine.runner import simulate
from schedport.engine.core.config import engine_config_from_dict
from schedport.errors import SchedportError
from schedport.workload.examples import make_example_trace
from schedport.workload.trace import Trace
from schedport.realengine.validate import NamedTrace, head, validate
from schedport.analysis.validation_stats import summary_table_lines

ENGINE = {"engine": {"max_num_seqs": 8, "max_model_len": 8192},
          "latency": {"model": "linear", "a": 0.004, "b": 7e-5, "c": 2e-4, "d": 3e-7}}


def _install_slow_replay(monkeypatch, factor_for_call, calls: list, record) -> list:
    """Stand in for replay(): simulate the same scaled trace on an engine whose every step is
    `factor_for_call(len(calls))` times slower, appending `record(scheduler, factor)` to `calls`."""

    def fake_replay(trace, endpoint, *, engine, scheduler, time_scale, seed, **kw):
        f = factor_for_call(len(calls))
        calls.append(record(scheduler, f))
        slow = dataclasses.replace(engine, linear_a=engine.linear_a * f, linear_b=engine.linear_b * f,
                                   linear_c=engine.linear_c * f, linear_d=engine.linear_d * f)
        res = simulate(trace, scheduler, engine=slow, seed=seed, time_scale=time_scale)
        res.summary.update(client_lag_ok=True, send_lag_p99_s=0.001, n_error=0, n_timeout=0, n_truncated=0)
        res.lag_ok = True
        res.server = replay_mod.ServerInfo("fake-model", 8192)
        return res

    monkeypatch.setattr(replay_mod, "replay", fake_replay)
    return calls


@pytest.fixture
def fake_server(monkeypatch):
    """replay() stand-in: simulate the same scaled trace on an engine 10% slower per step."""
    return _install_slow_replay(monkeypatch, lambda k: 1.1, [], lambda sched, f: sched)


def _traces():
    return [NamedTrace("ex", make_example_trace(60, seed=1))]


def test_validate_runs_compares_and_resumes(fake_server, tmp_path):
    cfg = engine_config_from_dict(ENGINE)
    regions = {"light": 0.3, "overload": 1.2}
    v = validate("http://fake", _traces(), tmp_path, engine=cfg, schedulers=["vllm-fcfs", "sjf", "spf"],
                 regions=regions)
    assert len(v["runs"]) == 6 and len(fake_server) == 6
    for run in v["runs"]:
        assert run["client_lag_ok"]
        # every step 10% slower on the "real" engine: the simulator is faster (about -9% at light
        # load; more under overload, where the slower engine also queues more)
        assert run["run_errors"]["tpot_mean_s"] < -0.05 and run["run_errors"]["e2e_mean_s"] < -0.05
        if run["region"] == "light":
            assert -0.2 < run["run_errors"]["tpot_mean_s"] < -0.08
        assert run["request_errors"]["n_matched"] == run["sim"]["n_completed"]
    assert v["agreement"]["summary"]["by_metric"]
    assert (tmp_path / "validation.json").exists() and (tmp_path / "validation.html").exists()
    assert json.loads((tmp_path / "validation.json").read_text())["runs"] == v["runs"]
    cells = list((tmp_path / "runs").glob("*/*/*/cell.json"))
    assert len(cells) == 6
    # schedulers run in a seeded shuffled order within each condition
    order = list(fake_server)
    # a second call reuses every finished cell: no replay at all, same numbers
    fake_server.clear()
    v2 = validate("http://fake", _traces(), tmp_path, engine=cfg, schedulers=["vllm-fcfs", "sjf", "spf"],
                  regions=regions)
    assert fake_server == [] and v2["runs"] == v["runs"]
    assert sorted(order[:3]) == ["sjf", "spf", "vllm-fcfs"]


@pytest.fixture
def noisy_server(monkeypatch):
    """replay() stand-in whose engine is 10%, 30% or 20% slower per step, in turn: a noisy machine."""
    factors = [1.1, 1.3, 1.2]
    return _install_slow_replay(monkeypatch, lambda k: factors[k % 3], [], lambda sched, f: (sched, f))


def test_validate_repeats_compare_the_median_and_report_the_engines_noise(noisy_server, tmp_path):
    cfg = engine_config_from_dict(ENGINE)
    kw = dict(engine=cfg, schedulers=["vllm-fcfs", "sjf"], regions={"light": 0.3})
    v1 = validate("http://fake", _traces(), tmp_path, **kw)
    assert len(noisy_server) == 2 and "real_spread" not in v1["runs"][0]
    assert v1["speed_index"] is None
    # extending to three repeats replays only the two missing rounds, in rounds; the machine's
    # speed is read before each replay
    readings = iter([1.0, 1.1, 1.2, 1.3])
    v = validate("http://fake", _traces(), tmp_path, repeats=3, speed_probe=lambda: next(readings), **kw)
    assert len(noisy_server) == 6 and v["repeats"] == 3
    assert v["speed_index"] == {"median": 1.15, "min": 1.0, "max": 1.3, "n": 4}
    assert all(len([r for r in run["real_repeats"] if r["speed_index"] is not None]) == 2 for run in v["runs"])
    assert any("machine speed index" in ln and "1.15x" in ln for ln in summary_table_lines(v))
    assert sorted(s for s, _ in noisy_server[2:4]) == ["sjf", "vllm-fcfs"]
    for run in v["runs"]:
        assert run["repeats"] == 3 and len(run["real_repeats"]) == 3
        tpots = [r["tpot_mean_s"] for r in run["real_repeats"]]
        assert run["real"]["tpot_mean_s"] == sorted(tpots)[1]
        # the engine's own spread: a few percent to ~20% between 1.1x, 1.2x and 1.3x engines
        assert 0.03 < run["real_spread"]["tpot_mean_s"] < 0.2
        assert run["request_errors"]["n_matched"] == run["sim"]["n_completed"]
    from schedport.analysis.validation_stats import run_error_table

    row = next(d for d in run_error_table(v) if d["metric"] == "tpot_mean_s")
    assert row["n_noise_runs"] == 2 and 0.03 < row["noise_p50"] < 0.2
    for cell in (tmp_path / "runs").glob("*/*/*"):
        assert {p.name for p in cell.iterdir()} >= {"cell.json", "sim", "real", "real-2", "real-3"}
    # everything reused on a rerun
    noisy_server.clear()
    assert validate("http://fake", _traces(), tmp_path, repeats=3, **kw)["runs"] == v["runs"]
    assert noisy_server == []
    with pytest.raises(SchedportError, match="--repeats"):
        validate("http://fake", _traces(), tmp_path, repeats=0, **kw)


def test_validate_refuses_cells_of_another_engine(fake_server, tmp_path):
    cfg = engine_config_from_dict(ENGINE)
    validate("http://fake", _traces(), tmp_path, engine=cfg, schedulers=["vllm-fcfs", "sjf"],
             regions={"light": 0.3})
    other = engine_config_from_dict({**ENGINE, "latency": {**ENGINE["latency"], "a": 0.005}})
    with pytest.raises(SchedportError, match="run with another engine_sha256"):
        validate("http://fake", _traces(), tmp_path, engine=other, schedulers=["vllm-fcfs", "sjf"],
                 regions={"light": 0.3})


@pytest.mark.parametrize("kw,msg", [
    ({"schedulers": ["vllm-fcfs", "srpt"]}, "cannot be replayed"),
    ({"schedulers": ["sjf"]}, "at least two"),
    ({"traces": []}, "at least one trace"),
    ({"traces": [NamedTrace("a", make_example_trace(5)), NamedTrace("a", make_example_trace(6))]}, "share the name"),
])
def test_validate_bad_input(fake_server, tmp_path, kw, msg):
    args = {"traces": _traces(), "schedulers": ["vllm-fcfs", "sjf"]}
    args.update(kw)
    with pytest.raises(SchedportError, match=msg):
        validate("http://fake", args.pop("traces"), tmp_path, engine=engine_config_from_dict(ENGINE), **args)
    assert fake_server == []


def test_head_keeps_the_first_requests():
    t = make_example_trace(50)
    h = head(t, 10)
    assert len(h) == 10 and (h.arrival_s == t.arrival_s[:10]).all()
    assert head(t, None) is t and head(t, 500) is t
    with pytest.raises(SchedportError):
        head(t, 1)
    # a window's warm-up stays whole in front of the first measured requests
    warm = Trace.from_arrays(t.arrival_s, t.input_tokens, t.output_tokens, t.client_id, warmup=20)
    hw = head(warm, 10)
    assert hw.warmup == 20 and len(hw) == 30 and (hw.input_tokens == t.input_tokens[:30]).all()
    assert head(warm, 30) is warm


def test_cli_validate_needs_exactly_one_source(tmp_path):
    from typer.testing import CliRunner

    from schedport.cli import _register, app

    _register()
    r = CliRunner().invoke(app, ["validate", "--endpoint", "http://x", "--engine", str(tmp_path / "e.toml"),
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code != 0
