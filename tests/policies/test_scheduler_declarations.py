"""Scheduler declarations: parameter validation, EDF's deadlines, ltr's calibrated predictor."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import numpy as np
import pytest

from schedport.engine.runner import simulate
from schedport.engine.core.config import engine_config_from_dict, load_engine_config
from schedport.engine.modes import make_simulator
from schedport.errors import ConfigError
from schedport.workload.examples import make_example_trace
from schedport.engine.core.latency import make_latency_model
from schedport.engine.policies.schedulers import (
    LTR_REFERENCE_LOG_SD, MODE_KEYS, PARAM_RULES, REGISTRY, achieved_tau, get_policy, ltr_noise_sigma,
    predicted_scores, reference_log_sd, request_deadlines, validate_scheduler_params,
)
from schedport.workload.trace import Trace

SRC = "engine.toml"


def cfg_with(tables: dict):
    return engine_config_from_dict({"scheduler": tables}, source=SRC)


# ============================================================================ validation

BAD = [
    # (tables, the one-line message)
    ({"fastserv": {"levels": 4}},
     "engine.toml: [scheduler.fastserv]: unknown scheduler; known: " + ", ".join(REGISTRY)),
    ({"ltr": {"taux": 0.5}}, "engine.toml: [scheduler.ltr] unknown key 'taux'; known keys: tau, "),
    ({"fastserve": {"levels": 0}}, "engine.toml: [scheduler.fastserve] levels: must be an integer in [1, 64], got 0"),
    ({"fastserve": {"levels": 4.0}}, "[scheduler.fastserve] levels: must be an integer in [1, 64], got 4.0"),
    ({"fastserve": {"q1_s": 0}}, "[scheduler.fastserve] q1_s: must be a number > 0 (seconds), got 0"),
    ({"fastserve": {"ratio": 0.5}}, "[scheduler.fastserve] ratio: must be a number >= 1"),
    ({"fastserve": {"starve_limit_s": -1.0}}, "[scheduler.fastserve] starve_limit_s: must be a number > 0"),
    ({"vtc": {"w_p": -1.0}}, "[scheduler.vtc] w_p: must be a number >= 0 (weight per input token), got -1.0"),
    ({"vtc": {"w_q": "2"}}, '[scheduler.vtc] w_q: must be a number >= 0 (weight per output token), got "2"'),
    ({"vtc": {"w_p": 0, "w_q": 0}}, "[scheduler.vtc] w_p, w_q: at least one weight must be > 0"),
    ({"srpt": {"preemption": "kill"}}, '[scheduler.srpt] preemption: must be "recompute" or "swap", got "kill"'),
    ({"ltr": {"tau": 0.0}}, "[scheduler.ltr] tau: must be a number in (0, 1]"),
    ({"ltr": {"tau": 1.5}}, "[scheduler.ltr] tau: must be a number in (0, 1]"),
    ({"ltr": {"tau": True}}, "[scheduler.ltr] tau: must be a number in (0, 1] (Kendall tau of the predictor), got true"),
    ({"ltr": {"starvation_threshold": -1}}, "[scheduler.ltr] starvation_threshold: must be an integer >= 0, got -1"),
    ({"ltr": {"starvation_quantum": 0}}, "[scheduler.ltr] starvation_quantum: must be a positive integer, got 0"),
    ({"sarathi": {"chunk_size": 0}}, "[scheduler.sarathi] chunk_size: must be a positive integer, got 0"),
    ({"sarathi": {"max_num_batched_tokens": 1024}},
     "[scheduler.sarathi] max_num_batched_tokens: sarathi's per-step token budget is its chunk_size"),
    ({"vllm-fcfs": {"max_num_seqs": 0}}, "[scheduler.vllm-fcfs] max_num_seqs: must be a positive integer, got 0"),
    ({"sjf": {"max_num_batched_tokens": -5}}, "[scheduler.sjf] max_num_batched_tokens: must be a positive integer"),
    ({"orca": {"watermark": 0.5}}, "[scheduler.orca] watermark: must be a fraction in [0, 0.5), got 0.5"),
    ({"orca": {"reserve": "all"}}, '[scheduler.orca] reserve: must be "max_model_len" or "request", got "all"'),
    ({"static": {"batch_size": 0}}, "[scheduler.static] batch_size: must be a positive integer, got 0"),
    ({"static": {"pad_compute": 1}}, "[scheduler.static] pad_compute: must be true or false, got 1"),
    ({"spf": {"aging": -0.1}}, "[scheduler.spf] aging: must be a number >= 0"),
    ({"edf": {"slo_profile": "fast"}},
     "[scheduler.edf] slo_profile: must name an SLO profile of this config ([slo.<name>]) "
     "(known: strict, standard, relaxed), got \"fast\""),
    ({"edf": {"deadline": "soon"}}, '[scheduler.edf] deadline: must be "last-token" or "first-token", got "soon"'),
    ({"hrrn": {"size": "guess"}}, '[scheduler.hrrn] size: must be "oracle" or "prompt", got "guess"'),
    ({"slo-admission": {"slack": -0.5}}, "[scheduler.slo-admission] slack: must be a number >= 0"),
    ({"slo-admission": {"slo_profile": 2}}, "[scheduler.slo-admission] slo_profile: must name an SLO profile"),
]


@pytest.mark.parametrize("tables,message", BAD, ids=[m.split("]")[0].split("[")[-1] + ":" + str(i)
                                                        for i, (_, m) in enumerate(BAD)])
def test_bad_scheduler_tables_are_one_line_errors_in_the_python_api(tables, message):
    cfg = cfg_with(tables)
    with pytest.raises(ConfigError) as e:
        validate_scheduler_params(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("engine.toml: [scheduler.")
    # any simulation on that config refuses it, whatever scheduler it runs
    with pytest.raises(ConfigError) as e2:
        simulate(make_example_trace(20), "vllm-fcfs", engine=cfg)
    assert str(e2.value) == str(e.value)


def test_every_default_passes_and_every_parameter_has_a_rule():
    for name, pol in REGISTRY.items():
        for key in pol.params:
            assert key in PARAM_RULES, (name, key)
        validate_scheduler_params(cfg_with({name: dict(pol.params)}))
    for key in MODE_KEYS:
        assert key in PARAM_RULES


def test_swap_rules_for_a_policy_that_takes_them():
    """pcie_gb_s = 0 or a negative swap space is refused wherever a policy declares them."""
    from schedport.engine.policies.batching import Continuous
    from schedport.engine.policies.queues import Fifo
    from schedport.engine.policies.schedulers import Policy

    pol = Policy("swapper", "test", Continuous, Fifo, params={"swap_space_gib": 4.0, "pcie_gb_s": 25.0})
    known = {"swapper": pol}
    for table, message in (({"pcie_gb_s": 0}, "[scheduler.swapper] pcie_gb_s: must be a number > 0 (GB/s), got 0"),
                           ({"swap_space_gib": -1.0}, "[scheduler.swapper] swap_space_gib: must be a number >= 0")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            validate_scheduler_params(cfg_with({"swapper": table}), known)
    validate_scheduler_params(cfg_with({"swapper": {"swap_space_gib": 0.0, "pcie_gb_s": 1}}), known)


def test_good_values_at_the_edges_are_accepted():
    validate_scheduler_params(cfg_with({
        "fastserve": {"levels": 1, "ratio": 1.0, "q1_s": 1},            # an int is a number
        "ltr": {"tau": 1.0, "starvation_threshold": 0},
        "vtc": {"w_p": 0.0, "w_q": 1.0},
        "orca": {"watermark": 0.0, "reserve": "request"},
        "slo-admission": {"slack": 0.0, "slo_profile": "strict"},
    }))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def _one_line(p):
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


def test_cli_simulate_and_run_refuse_a_bad_table_before_any_work(tmp_path):
    eng = tmp_path / "engine.toml"
    eng.write_text("[scheduler.fastserve]\nlevels = 0\n")
    trace = tmp_path / "t.csv"
    assert _cli("example", "--out", trace, "--requests", "30").returncode == 0
    msg = _one_line(_cli("simulate", "--trace", trace, "--scheduler", "vllm-fcfs", "--engine", eng,
                         "--out", tmp_path / "o"))
    assert msg == f"error: {eng}: [scheduler.fastserve] levels: must be an integer in [1, 64], got 0"
    # `run` checks the tables before it opens the corpus (which does not even exist here)
    msg = _one_line(_cli("run", "--corpus", tmp_path / "no-corpus", "--engine", eng, "--out", tmp_path / "r"))
    assert msg == f"error: {eng}: [scheduler.fastserve] levels: must be an integer in [1, 64], got 0"
    assert not (tmp_path / "r").exists()


def test_sarathi_budget_is_its_chunk_size_whatever_the_engine_budget():
    """Sarathi-Serve's token budget is chunk_size (its config's get_max_num_batched_tokens
    returns chunk_size), so [engine] max_num_batched_tokens does not change sarathi."""
    t = make_example_trace(10)
    for engine, tables, want in (({}, {}, 512), ({"max_num_batched_tokens": 4096}, {}, 512),
                                 ({"max_num_batched_tokens": 4096}, {"sarathi": {"chunk_size": 1024}}, 1024)):
        cfg = engine_config_from_dict({"engine": engine, "scheduler": tables})
        sim = make_simulator(t, get_policy("sarathi"), cfg, make_latency_model(cfg))
        assert sim.sched.mode.budget == want
    cfg = engine_config_from_dict({"engine": {"max_num_batched_tokens": 4096}})
    assert make_simulator(t, get_policy("vllm-fcfs"), cfg, make_latency_model(cfg)).sched.mode.budget == 4096


# ============================================================================ EDF


def test_last_token_deadline_grows_with_the_request_own_work():
    arr = np.array([0.0, 0.0, 1.0])
    out = np.array([1, 11, 1])
    d = request_deadlines(arr, out, 2.0, 0.1)
    assert d.tolist() == pytest.approx([2.0, 3.0, 3.0])
    assert request_deadlines(arr, out, 2.0, 0.1, "first-token").tolist() == [2.0, 2.0, 3.0]
    with pytest.raises(ConfigError, match="deadline rule"):
        request_deadlines(arr, out, 2.0, 0.1, "whenever")


def _busy(n=300, seed=0):
    rng = np.random.default_rng(seed)
    return Trace(np.sort(rng.uniform(0, 20, n)), rng.integers(20, 800, n), rng.integers(1, 600, n))


def test_edf_differs_from_fcfs_where_requests_differ_and_its_ttft_rule_is_fcfs():
    t = _busy()
    fcfs = simulate(t, "vllm-fcfs", load=1.3)
    edf = simulate(t, "edf", load=1.3)
    assert not np.array_equal(edf.requests["finish_s"], fcfs.requests["finish_s"], equal_nan=True)
    # the TTFT-only rule orders by arrival + one constant: the same schedule as FCFS
    ttft_only = engine_config_from_dict({"scheduler": {"edf": {"deadline": "first-token"}}})
    same = simulate(t, "edf", engine=ttft_only, load=1.3)
    assert np.array_equal(same.requests["finish_s"], fcfs.requests["finish_s"], equal_nan=True)


def test_edf_admits_in_deadline_order():
    """Everything arrives while one long request runs (one sequence slot): the waiting ones are
    served by last-token deadline, not by arrival."""
    arrival = np.array([0.0, 0.01, 0.02, 0.03])
    out = np.array([50, 30, 2, 10])                  # deadlines 0+2+4.9, .01+2+2.9, .02+2+.1, .03+2+.9
    t = Trace(arrival, np.full(4, 8), out)
    cfg = engine_config_from_dict({"engine": {"max_num_seqs": 1},
                                   "latency": {"model": "linear", "a": 0.01, "b": 0, "c": 0, "d": 0}})
    res = simulate(t, "edf", engine=cfg)
    order = np.argsort(res.requests["first_token_s"].to_numpy()).tolist()
    assert order == [0, 2, 3, 1]


# ============================================================================ ltr


def test_ltr_runs_as_its_headline_runs_without_the_starvation_guard():
    p = REGISTRY["ltr"].params
    assert p["starvation_threshold"] == 0 and p["tau"] == 0.52


def test_noise_is_calibrated_once_so_tau_follows_the_spread_of_lengths():
    sigma = ltr_noise_sigma(0.52)
    rho = math.sin(math.pi * 0.52 / 2)
    assert sigma == pytest.approx(LTR_REFERENCE_LOG_SD * math.sqrt(1 / rho ** 2 - 1))
    assert ltr_noise_sigma(1.0) == 0.0
    rng = np.random.default_rng(5)
    taus = {}
    for sd in (0.8, LTR_REFERENCE_LOG_SD, 2.4):
        out = np.maximum(1, np.round(np.exp(rng.normal(5.0, sd, 4000)))).astype(np.int64)
        scores = predicted_scores(out, 0.52, seed=3)
        # the same noise scale on every trace: scores - ln L has the calibrated sd
        assert float(np.std(scores - np.log(out))) == pytest.approx(sigma, rel=0.05)
        taus[sd] = achieved_tau(out, scores)
    assert taus[LTR_REFERENCE_LOG_SD] == pytest.approx(0.52, abs=0.02)
    assert taus[0.8] < 0.40 < 0.60 < taus[2.4]           # narrow spread ranks worse, wide better


def test_scores_are_deterministic_and_perfect_at_tau_one():
    out = np.random.default_rng(1).integers(1, 2000, 500)
    a, b = predicted_scores(out, 0.52, 7), predicted_scores(out, 0.52, 7)
    assert np.array_equal(a, b) and not np.array_equal(a, predicted_scores(out, 0.52, 8))
    assert np.array_equal(predicted_scores(out, 1.0, 7), np.log(out.astype(np.float64)))
    assert reference_log_sd(out) == pytest.approx(float(np.log(out).std()))


def test_achieved_tau_lands_in_the_summary_for_ltr_only():
    t = _busy(200, seed=4)
    s = simulate(t, "ltr", load=1.0, seed=2).summary
    scores = predicted_scores(t.output_tokens, 0.52, 2)
    assert s["predictor_tau"] == pytest.approx(achieved_tau(t.output_tokens, scores))
    assert 0.0 < s["predictor_tau"] < 1.0
    assert simulate(t, "sjf", load=1.0).summary["predictor_tau"] is None
    exact = engine_config_from_dict({"scheduler": {"ltr": {"tau": 1.0}}})
    assert simulate(t, "ltr", engine=exact, load=1.0).summary["predictor_tau"] == pytest.approx(1.0)


def test_summary_keys_declared_for_the_store_include_predictor_tau():
    from schedport.study.sweep import metric_columns

    cfg = load_engine_config(None)
    cols = metric_columns(cfg)
    s = simulate(_busy(50), "ltr", load=0.8).summary
    assert list(s) == cols and "predictor_tau" in cols
