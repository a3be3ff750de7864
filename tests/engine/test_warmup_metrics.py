"""A trace's warm-up (docs/corpus.md, "Warm caches") is simulated but never measured.

The warm-up requests run through the engine first, brought to the window's load; every metric,
count, horizon and time scale is that of the measured requests alone, and the request table
flags the warm-up.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from schedport.engine.core.config import engine_config_from_dict
from schedport.engine.core.latency import make_latency_model
from schedport.engine.core.metrics import REQUEST_COLUMNS
from schedport.engine.runner import simulate
from schedport.errors import SchedportError
from schedport.workload.examples import make_example_trace
from schedport.workload.trace import Trace

LINEAR = {"model": "linear", "a": 0.004, "b": 2e-5, "c": 1e-4, "d": 1e-7, "e": 3e-10}
CFG = engine_config_from_dict({"latency": LINEAR, "slo": {"tight": {"ttft_s": 0.05, "tpot_s": 1.0}}})

# Warm-up: three requests at once, one too long for the context (rejected at arrival), two that
# keep the engine busy for a while. Measured: two requests long after the engine has gone idle,
# so each runs alone and its latency is the latency model's alone time.
WARM = Trace.from_arrays([0.0, 0.0, 0.0, 1000.0, 1010.0], [9000, 3000, 2500, 700, 120], [5, 400, 300, 12, 30],
                         warmup=3)


def test_metrics_ignore_the_warm_up_and_match_the_hand_computed_values():
    res = simulate(WARM, "vllm-fcfs", CFG)
    s = res.summary
    alone = make_latency_model(CFG).alone_time(np.array([700, 120]), np.array([12, 30]))
    # counts: the two measured requests; the rejected and the busy warm-up requests are not there
    assert (s["n_requests"], s["n_completed"], s["n_rejected"], s["n_unfinished"]) == (2, 2, 0, 0)
    # the horizon is 1.5 x the measured span (10 s), not 1.5 x 1010 s
    assert s["horizon_s"] == 15.0
    # each measured request ran alone: E2E = its alone time, slowdown 1
    assert s["e2e_mean_s"] == pytest.approx(alone.mean(), rel=1e-9)
    assert s["slowdown_mean"] == pytest.approx(1.0, rel=1e-9)
    t = res.requests
    m = t[~t["warmup"]]
    assert s["ttft_mean_s"] == pytest.approx(m["ttft_s"].mean(), rel=1e-12)
    assert s["makespan_s"] == pytest.approx(m["finish_s"].max() - 1000.0, rel=1e-12)
    assert s["throughput_rps"] == pytest.approx(2 / s["makespan_s"], rel=1e-12)
    # a first token within 50 ms: the 700-token prefill (4 ms + 700 x 20 us + ...) meets it, both do
    ttft = m["ttft_s"].to_numpy()
    assert (ttft < 0.05).all()
    assert s["slo_attainment_tight"] == 1.0 and s["goodput_tight_rps"] == pytest.approx(2 / 15.0, rel=1e-12)
    # of the two, only the last has no first token when it arrives (with the warm-up counted: 1 of 4)
    assert s["backlog_at_last_arrival"] == 0.5 and s["preemptions"] == 0
    # the warm-up did run: its rejection and its completions are in the table, flagged
    assert t["warmup"].tolist() == [True, True, True, False, False]
    assert t["status"].tolist() == ["rejected", "completed", "completed", "completed", "completed"]


def test_the_same_metrics_as_the_measured_requests_run_alone():
    """With the engine idle when the window starts, the warm-up changes nothing the window sees."""
    warm = simulate(WARM, "vllm-fcfs", CFG).summary
    alone = simulate(WARM.measured(), "vllm-fcfs", CFG).summary
    for k, v in alone.items():
        if k in ("iterations",):        # the run's engine total, warm-up included
            continue
        if isinstance(v, float):
            assert warm[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
        else:
            assert warm[k] == v, k


def test_the_warm_up_is_brought_to_the_windows_load():
    base = make_example_trace(120, seed=3)
    warm = Trace.from_arrays(base.arrival_s, base.input_tokens, base.output_tokens, base.client_id, warmup=40)
    measured = warm.measured()
    a, b = simulate(warm, "vllm-fcfs", CFG, load=0.8), simulate(measured, "vllm-fcfs", CFG, load=0.8)
    # the time scale is the measured requests' (their rate and capacity), the warm-up is stretched by it
    assert a.scale == b.scale
    # (the warm-up's first arrival is the origin it is stretched around: equal up to rounding)
    assert a.summary["n_requests"] == 80 and a.summary["horizon_s"] == pytest.approx(b.summary["horizon_s"], rel=1e-12)
    gaps = np.diff(a.requests["arrival_s"].to_numpy())
    assert gaps == pytest.approx(np.diff(base.arrival_s) * a.scale, rel=1e-9, abs=1e-12)


def test_a_trace_without_warm_up_has_no_warmup_column(tmp_path):
    res = simulate(make_example_trace(30, seed=1), "vllm-fcfs", CFG)
    assert list(res.requests.columns) == [*REQUEST_COLUMNS, "cached_tokens", "recomputed_tokens", "reject_reason"]
    res.save(tmp_path / "plain")
    assert "warmup" not in pd.read_parquet(tmp_path / "plain" / "requests.parquet").columns
    simulate(WARM, "vllm-fcfs", CFG).save(tmp_path / "warm")
    assert pd.read_parquet(tmp_path / "warm" / "requests.parquet")["warmup"].tolist() == [True] * 3 + [False] * 2


def test_a_run_needs_a_measured_request():
    with pytest.raises(SchedportError, match="every request is a warm-up request"):
        simulate(WARM.head(2), "vllm-fcfs", CFG)


def test_a_sweep_cell_stores_the_measured_requests_only():
    from schedport.study.tasks import run_chunk

    rows, reqs, _ = run_chunk(WARM, CFG, "vllm-fcfs", ("s", "w", "sha", 1.0), [("r", 0.5, 0)], keep_requests=True)
    assert rows[0]["n_requests"] == 2 and len(reqs[0]) == 2
    assert reqs[0]["request_id"].tolist() == [3, 4]
