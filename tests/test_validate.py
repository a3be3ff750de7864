"""validate's orchestration without a server: the "real engine" is the simulator on a slower engine."""

from __future__ import annotations

import dataclasses
import json

import pytest

import schedport.replay as replay_mod
from schedport.api import simulate
from schedport.config import engine_config_from_dict
from schedport.errors import SchedportError
from schedport.examples import make_example_trace
from schedport.validate import NamedTrace, head, validate

ENGINE = {"engine": {"max_num_seqs": 8, "max_model_len": 8192},
          "latency": {"model": "linear", "a": 0.004, "b": 7e-5, "c": 2e-4, "d": 3e-7}}


@pytest.fixture
def fake_server(monkeypatch):
    """replay() stand-in: simulate the same scaled trace on an engine 10% slower per step."""
    calls = []

    def fake_replay(trace, endpoint, *, engine, scheduler, time_scale, seed, **kw):
        calls.append(scheduler)
        slow = dataclasses.replace(engine, linear_a=engine.linear_a * 1.1, linear_b=engine.linear_b * 1.1,
                                   linear_c=engine.linear_c * 1.1, linear_d=engine.linear_d * 1.1)
        res = simulate(trace, scheduler, engine=slow, seed=seed, time_scale=time_scale)
        res.summary.update(client_lag_ok=True, send_lag_p99_s=0.001, n_error=0, n_timeout=0, n_truncated=0)
        res.lag_ok = True
        res.server = replay_mod.ServerInfo("fake-model", 8192)
        return res

    monkeypatch.setattr(replay_mod, "replay", fake_replay)
    return calls


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


def test_validate_refuses_cells_of_another_engine(fake_server, tmp_path):
    cfg = engine_config_from_dict(ENGINE)
    validate("http://fake", _traces(), tmp_path, engine=cfg, schedulers=["vllm-fcfs", "sjf"],
             regions={"light": 0.3})
    other = engine_config_from_dict({**ENGINE, "latency": {**ENGINE["latency"], "a": 0.005}})
    with pytest.raises(SchedportError, match="another trace, engine or seed"):
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


def test_cli_validate_needs_exactly_one_source(tmp_path):
    from typer.testing import CliRunner

    from schedport.cli import _register, app

    _register()
    r = CliRunner().invoke(app, ["validate", "--endpoint", "http://x", "--engine", str(tmp_path / "e.toml"),
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code != 0
