"""`[latency] request_overhead_s` in `schedport.engine.runner`: a fixed per-request delay before the engine.

The engine sees each request `o` seconds after it reaches the server; latencies are measured
from the arrival, slowdown's alone time includes `o`, and capacity (a throughput) ignores it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from schedport.engine.runner import capacity, load_scale, simulate
from schedport.engine.core.config import engine_config_from_dict
from schedport.workload.examples import make_example_trace
from schedport.engine.core.latency import make_latency_model
from schedport.workload.trace import Trace

O = 0.0067  # about a vLLM CPU server's per-request cost outside the engine loop (10.7 ms - 4 ms)

LINEAR = {"model": "linear", "a": 0.004, "b": 2e-5, "c": 1e-4, "d": 1e-7, "e": 3e-10}


def cfgs(latency: dict, overhead: float = O):
    """The same engine without and with the per-request overhead."""
    base = engine_config_from_dict({"latency": dict(latency)})
    return base, engine_config_from_dict({"latency": {**latency, "request_overhead_s": overhead}})


@pytest.mark.parametrize("latency", [LINEAR, {"model": "calibrated"}], ids=["linear-e", "calibrated"])
def test_one_request_ttft_and_e2e_grow_by_exactly_the_overhead(latency):
    base, over = cfgs(latency)
    t = Trace(np.array([0.0]), np.array([700]), np.array([12]))
    r0 = simulate(t, "vllm-fcfs", base).requests.iloc[0]
    r1 = simulate(t, "vllm-fcfs", over).requests.iloc[0]
    assert r1.arrival_s == r0.arrival_s == 0.0             # the table keeps the real arrival
    assert r1.ttft_s == r0.ttft_s + O                      # exactly, not approximately
    assert r1.first_token_s == r0.first_token_s + O        # absolute times: the whole run is later
    # later steps are summed from a different start time, so equal up to rounding only
    assert r1.e2e_s == pytest.approx(r0.e2e_s + O, rel=1e-14)
    assert r1.finish_s == pytest.approx(r0.finish_s + O, rel=1e-14)
    assert r1.tpot_s == pytest.approx(r0.tpot_s, rel=1e-12)
    # TTFT of a lone request = overhead + its prefill step
    assert r1.ttft_s == O + make_latency_model(over).prefill_time(700)


def test_lone_request_slowdown_stays_one():
    """The alone time used for slowdown includes the overhead: a lone request's slowdown is
    exactly 1 (not inflated by o) and no request's e2e is below its alone time plus o."""
    _, over = cfgs(LINEAR, overhead=0.5)                   # large, so leaving it out would show
    t = Trace(np.array([3.0]), np.array([40]), np.array([30]))
    s = simulate(t, "vllm-fcfs", over).summary
    assert s["slowdown_mean"] == pytest.approx(1.0, rel=1e-12)
    t = make_example_trace(60, seed=1)
    res = simulate(t, "vllm-fcfs", over)
    assert res.summary["slowdown_mean"] >= 1.0 - 1e-12
    done = res.requests[res.requests.status == "completed"]
    alone = make_latency_model(over).alone_time(done.input_tokens.to_numpy(), done.output_tokens.to_numpy())
    assert (done.e2e_s.to_numpy() >= alone + 0.5 - 1e-9).all()


def test_many_requests_are_the_shifted_run():
    """With an overhead, the engine run is the run of the trace with every arrival shifted."""
    base, over = cfgs(LINEAR)
    t = make_example_trace(80, seed=2)
    shifted = Trace(t.arrival_s + O, t.input_tokens, t.output_tokens, t.client_id, t.name)
    a = simulate(shifted, "sarathi", base).requests
    b = simulate(t, "sarathi", over).requests
    for col in ("status", "first_token_s", "finish_s", "preemptions"):
        assert np.array_equal(a[col].to_numpy(), b[col].to_numpy()), col
    assert np.array_equal(b.arrival_s.to_numpy(), t.arrival_s)
    c = simulate(t, "sarathi", base).requests
    done = (b.status == "completed").to_numpy()
    assert np.all(b.ttft_s.to_numpy()[done] > c.ttft_s.to_numpy()[done] + O * 0.999)


def test_fast_and_exact_agree_with_overhead():
    _, over = cfgs(LINEAR)
    t = make_example_trace(50, seed=3)
    fast = simulate(t, "vllm-fcfs", over, load=0.9).requests
    exact = simulate(t, "vllm-fcfs", over, load=0.9, exact=True).requests
    assert fast.equals(exact)


@pytest.mark.parametrize("latency", [LINEAR, {"model": "calibrated"}], ids=["linear-e", "calibrated"])
def test_capacity_and_load_scale_ignore_the_overhead(latency):
    base, over = cfgs(latency, overhead=0.25)
    t = make_example_trace(40, seed=4)
    assert capacity(t, over) == capacity(t, base)
    assert load_scale(t, 0.8, over) == load_scale(t, 0.8, base)
    assert simulate(t, "vllm-fcfs", over, load=0.8).scale == simulate(t, "vllm-fcfs", base, load=0.8).scale


def test_zero_overhead_is_bit_identical_to_none():
    base, zero = cfgs(LINEAR, overhead=0.0)
    assert zero == base and zero.config_hash() == base.config_hash()
    t = make_example_trace(40, seed=5)
    a, b = simulate(t, "vllm-fcfs", base), simulate(t, "vllm-fcfs", zero)
    assert a.requests.equals(b.requests) and a.summary == b.summary
    assert dataclasses.replace(base, request_overhead_s=0.0) == base
