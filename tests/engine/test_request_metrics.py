"""Tests for schedport.engine.core.metrics: hand-computed tables, edge cases and properties."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedport.errors import ConfigError
from schedport.engine.core.metrics import (
    BASE_SUMMARY_KEYS,
    REQUEST_COLUMNS,
    jain_index,
    percentiles,
    request_columns,
    request_table,
    summarize,
    summary_keys,
    table_of,
)

NAN = math.nan


def make(rows, clients=None):
    """rows: (arrival, N, status, first, finish[, preemptions]) tuples."""
    rows = [r if len(r) == 6 else (*r, 0) for r in rows]
    return request_table(
        arrival_s=[r[0] for r in rows],
        input_tokens=[10] * len(rows),
        output_tokens=[r[1] for r in rows],
        client_id=clients,
        status=[r[2] for r in rows],
        first_token_s=[r[3] for r in rows],
        finish_s=[r[4] for r in rows],
        preemptions=[r[5] for r in rows],
    )


# A five-request run, all numbers below computed by hand.
#   r0: a=0 N=3 completed t1=1 f=3 -> ttft 1, tpot 1, e2e 3, alone 1 -> slowdown 3
#   r1: a=1 N=1 completed t1=3 f=3 -> ttft 2, tpot -, e2e 2, alone 1 -> slowdown 2
#   r2: a=2 N=5 rejected
#   r3: a=2 N=4 unfinished t1=4 -> ttft 2 (in the table, not in the stats)
#   r4: a=3 N=2 completed t1=4 f=6 -> ttft 1, tpot 2, e2e 3, alone 1.5 -> slowdown 2
ROWS = [
    (0.0, 3, "completed", 1.0, 3.0, 1),
    (1.0, 1, "completed", 3.0, 3.0, 0),
    (2.0, 5, "rejected", NAN, NAN, 0),
    (2.0, 4, "unfinished", 4.0, NAN, 2),
    (3.0, 2, "completed", 4.0, 6.0, 0),
]
CLIENTS = ["a", "b", "a", None, "b"]
ALONE = np.array([1.0, 1.0, 1.0, 1.0, 1.5])
PROFILES = {"strict": (1.0, 1.0), "loose": (2.0, 5.0)}


@pytest.fixture
def table():
    return make(ROWS, CLIENTS)


def run(table, horizon=5.0, profiles=PROFILES, alone=ALONE, counters=None):
    return summarize(table, horizon_s=horizon, slo_profiles=profiles, alone_s=alone,
                     counters={"preemptions": 3, "iterations": 17} if counters is None else counters)


# ----------------------------------------------------------------- request_table


def test_request_table_columns_and_derived_values(table):
    assert tuple(table.columns) == REQUEST_COLUMNS
    assert table["request_id"].tolist() == [0, 1, 2, 3, 4]
    assert table["request_id"].dtype == np.int64
    assert table["client_id"].tolist() == ["a", "b", "a", None, "b"]
    np.testing.assert_array_equal(table["ttft_s"], [1.0, 2.0, NAN, 2.0, 1.0])
    np.testing.assert_array_equal(table["tpot_s"], [1.0, NAN, NAN, NAN, 2.0])
    np.testing.assert_array_equal(table["e2e_s"], [3.0, 2.0, NAN, NAN, 3.0])
    assert table["preemptions"].tolist() == [1, 0, 0, 2, 0]
    assert table["status"].tolist() == ["completed", "completed", "rejected", "unfinished", "completed"]


def test_request_table_without_clients_has_none_column():
    t = make(ROWS)
    assert t["client_id"].tolist() == [None] * 5


def test_request_table_empty():
    t = make([])
    assert len(t) == 0 and tuple(t.columns) == REQUEST_COLUMNS


def test_request_table_parquet_roundtrip(table, tmp_path):
    path = tmp_path / "requests.parquet"
    table.to_parquet(path)
    back = pd.read_parquet(path)
    assert tuple(back.columns) == REQUEST_COLUMNS
    assert run(back) == run(table)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([(0.0, 2, "done", 1.0, 2.0)], "status"),
        ([(0.0, 2, "completed", 1.0, NAN)], "completed without"),
        ([(0.0, 2, "rejected", 1.0, NAN)], "rejected but"),
        ([(0.0, 2, "unfinished", 1.0, 2.0)], "unfinished but"),
        ([(1.0, 2, "completed", 0.5, 2.0)], "before arrival"),
        ([(0.0, 2, "completed", 2.0, 1.0)], "before first_token"),
        ([(0.0, 0, "completed", 1.0, 1.0)], "output_tokens"),
        ([(0.0, 2, "completed", 1.0, math.inf)], "completed without"),
    ],
)
def test_request_table_rejects_impossible_rows(rows, message):
    with pytest.raises(ValueError, match=message):
        make(rows)


def test_request_table_rejects_length_mismatch():
    with pytest.raises(ValueError, match="finish_s"):
        request_table(arrival_s=[0.0, 1.0], input_tokens=[1, 1], output_tokens=[1, 1],
                      client_id=None, status=["completed"] * 2, first_token_s=[1.0, 2.0],
                      finish_s=[1.0], preemptions=[0, 0])


# ----------------------------------------------------------------- summarize: hand-computed


def test_counts_and_throughput(table):
    s = run(table)
    assert (s["n_requests"], s["n_completed"], s["n_rejected"], s["n_unfinished"]) == (5, 3, 1, 1)
    assert s["makespan_s"] == 6.0
    assert s["throughput_rps"] == pytest.approx(0.5)
    assert s["output_tokens_per_s"] == pytest.approx(1.0)  # (3 + 1 + 2) / 6


def test_backlog_at_last_arrival_counts_the_accepted_requests_still_queued(table):
    # last arrival at 3.0; accepted: r0, r1 (first tokens 1 and 3, served), r3, r4 (first token 4,
    # still queued); the rejected r2 was never queued
    assert run(table)["backlog_at_last_arrival"] == 0.5
    everyone_rejected = make([(0.0, 2, "rejected", NAN, NAN), (1.0, 2, "rejected", NAN, NAN)])
    assert run(everyone_rejected, alone=np.ones(2))["backlog_at_last_arrival"] is None


def test_latency_stats_count_every_request_censored_at_the_end_of_observation(table):
    """horizon 5, last finish 6: T_end = 6. r2 (rejected, a=2) and r3 (unfinished, a=2, t1=4)
    count as if what they lacked arrived at T_end."""
    s = run(table)
    # ttft: r0 1, r1 2, r2 6-2=4, r3 2 (it got one), r4 1 -> sorted [1, 1, 2, 2, 4]
    assert s["ttft_mean_s"] == pytest.approx(2.0)
    assert s["ttft_p50_s"] == pytest.approx(2.0)
    assert s["ttft_p90_s"] == pytest.approx(3.2)   # index 3.6 between 2 and 4
    assert s["ttft_p99_s"] == pytest.approx(3.92)
    # tpot (N > 1): r0 1, r2 (6-2)/4 = 1 (stalled from arrival), r3 (6-4)/3, r4 2
    assert s["tpot_mean_s"] == pytest.approx((1 + 1 + 2 / 3 + 2) / 4)
    assert s["tpot_p50_s"] == pytest.approx(1.0)
    assert s["tpot_p99_s"] == pytest.approx(1.97)
    # e2e: [3, 2, 6-2, 6-2, 3]
    assert s["e2e_mean_s"] == pytest.approx(16 / 5)
    assert s["e2e_p99_s"] == pytest.approx(4.0)
    # e2e / N = [1, 2, 0.8, 1, 1.5]
    assert s["norm_latency_mean_s"] == pytest.approx(1.26)


def test_completed_only_variants_keep_the_survivor_statistics(table):
    s = run(table)
    # ttft over completed = [1, 2, 1] (a tie), sorted [1, 1, 2]
    assert s["ttft_mean_completed_s"] == pytest.approx(4 / 3)
    assert s["ttft_p50_completed_s"] == pytest.approx(1.0)
    assert s["ttft_p90_completed_s"] == pytest.approx(1.8)   # index 1.8 between 1 and 2
    assert s["ttft_p99_completed_s"] == pytest.approx(1.98)
    # tpot over completed with N > 1 = [1, 2]; the N == 1 request is left out
    assert s["tpot_mean_completed_s"] == pytest.approx(1.5)
    assert s["tpot_p50_completed_s"] == pytest.approx(1.5)
    assert s["tpot_p99_completed_s"] == pytest.approx(1.99)
    # e2e = [3, 2, 3]
    assert s["e2e_mean_completed_s"] == pytest.approx(8 / 3)
    assert s["e2e_p99_completed_s"] == pytest.approx(3.0)
    # e2e / N = [1, 2, 1.5]
    assert s["norm_latency_mean_completed_s"] == pytest.approx(1.5)
    # slowdowns [3, 2, 2]: mean 7/3, Jain 49 / (3 * 17)
    assert s["slowdown_mean_completed"] == pytest.approx(7 / 3)
    assert s["slowdown_jain_completed"] == pytest.approx(49 / 51)
    # per-client mean slowdown: a -> 3, b -> (2 + 2) / 2 = 2; Jain 25 / (2 * 13)
    assert s["client_jain_completed"] == pytest.approx(25 / 26)


def test_slowdown_and_fairness_count_every_request(table):
    s = run(table)
    # censored e2e [3, 2, 4, 4, 3] / alone [1, 1, 1, 1, 1.5] = [3, 2, 4, 4, 2]
    assert s["slowdown_mean"] == pytest.approx(3.0)
    assert s["slowdown_jain"] == pytest.approx(225 / 245)
    # per-client mean slowdown: a -> (3 + 4) / 2, b -> 2 (r3 has no client id)
    assert s["client_jain"] == pytest.approx(5.5 ** 2 / (2 * (3.5 ** 2 + 4)))


def test_a_refused_request_counts_as_finishing_when_observation_ends():
    """Refusing a request that would finish within observation never improves the counted
    latencies: it counts as finishing at T_end, the end of observation."""
    served = make([(0.0, 2, "completed", 1.0, 2.0), (1.0, 2, "completed", 2.0, 2.5)])
    refused = make([(0.0, 2, "completed", 1.0, 2.0), (1.0, 2, "rejected", NAN, NAN)])
    alone = np.array([1.0, 1.0])
    a, b = run(served, horizon=3.0, alone=alone), run(refused, horizon=3.0, alone=alone)
    for key in ("ttft_mean_s", "ttft_p99_s", "tpot_p99_s", "e2e_mean_s", "e2e_p99_s", "slowdown_mean",
                "norm_latency_mean_s"):
        assert b[key] > a[key], key
    # T_end = max(0 + 3, last finish 2) = 3: the refused request's e2e and ttft are 3 - 1 = 2
    assert b["e2e_mean_s"] == pytest.approx((2.0 + 2.0) / 2)
    assert b["ttft_mean_s"] == pytest.approx((1.0 + 2.0) / 2)
    assert b["tpot_mean_s"] == pytest.approx((1.0 + 2.0) / 2)   # stalled from arrival: (3 - 1) / 1


def test_end_of_observation_covers_late_completions():
    """T_end is the later of the horizon and the run's last event, so a request still waiting
    counts at least as late as the last one served."""
    t = make([(0.0, 2, "completed", 1.0, 8.0), (1.0, 2, "unfinished", NAN, NAN)])
    s = run(t, horizon=3.0, alone=np.array([1.0, 1.0]))
    assert s["e2e_mean_s"] == pytest.approx((8.0 + 7.0) / 2)   # T_end = 8, not 3
    assert s["e2e_mean_completed_s"] == pytest.approx(8.0)


def test_horizon_and_slo(table):
    s = run(table, horizon=5.0)
    assert s["horizon_s"] == 5.0
    assert s["completed_within_horizon"] == 2  # r4 finishes at 6 > 5
    # strict (1, 1): r0 meets (ttft 1 <= 1 and tpot 1 <= 1, ties count); r1 ttft 2 > 1
    assert s["slo_attainment_strict"] == pytest.approx(1 / 5)
    assert s["goodput_strict_rps"] == pytest.approx(1 / 5)
    # loose (2, 5): r0, r1 (N == 1: no TPOT test); r4 would meet but is past the horizon
    assert s["slo_attainment_loose"] == pytest.approx(2 / 5)
    assert s["goodput_loose_rps"] == pytest.approx(2 / 5)

    s = run(table, horizon=10.0)
    assert s["completed_within_horizon"] == 3
    assert s["slo_attainment_loose"] == pytest.approx(3 / 5)
    assert s["goodput_loose_rps"] == pytest.approx(3 / 10)
    assert s["slo_attainment_strict"] == pytest.approx(1 / 5)  # r4 tpot 2 > 1


def test_infinite_threshold_switches_half_of_slo_off(table):
    s = run(table, horizon=10.0, profiles={"ttft_only": (1.0, math.inf)})
    assert s["slo_attainment_ttft_only"] == pytest.approx(2 / 5)  # r0 and r4


def test_time_origin_is_first_arrival():
    shifted = [(a + 100.0, n, stt, f1 + 100.0, f + 100.0, p) for a, n, stt, f1, f, p in ROWS]
    a = run(make(ROWS, CLIENTS))
    b = run(make(shifted, CLIENTS))
    for key in a:
        if a[key] is None or isinstance(a[key], int):
            assert a[key] == b[key], key
        else:
            assert a[key] == pytest.approx(b[key], rel=1e-9), key


def test_counters_copied_through_in_order(table):
    s = run(table, counters={"kv_peak": 0.9, "iterations": 17, "preemptions": 3, "swaps": 0})
    keys = list(s)
    assert keys == summary_keys(list(PROFILES), ["kv_peak", "iterations", "preemptions", "swaps"])
    assert keys[-4:] == ["preemptions", "iterations", "kv_peak", "swaps"]
    assert (s["preemptions"], s["iterations"], s["kv_peak"], s["swaps"]) == (3, 17, 0.9, 0)


def test_missing_counters_fall_back(table):
    s = run(table, counters={})
    assert s["preemptions"] == 3  # 1 + 2 from the per-request column
    assert s["iterations"] is None


def test_counter_collision_is_an_error(table):
    with pytest.raises(ValueError, match="collides"):
        run(table, counters={"n_requests": 1})


def test_key_order_is_stable(table):
    s = run(table)
    assert list(s)[: len(BASE_SUMMARY_KEYS)] == list(BASE_SUMMARY_KEYS)
    assert list(s) == summary_keys(["strict", "loose"])


def test_numpy_scalar_counters_become_python(table):
    s = run(table, counters={"preemptions": np.int64(3), "iterations": np.int32(17),
                             "util": np.float32(0.5), "bad": np.float64("nan")})
    assert type(s["preemptions"]) is int and type(s["iterations"]) is int
    assert type(s["util"]) is float and s["bad"] is None
    json.dumps(s, allow_nan=False)


# ----------------------------------------------------------------- summarize: edge cases


def test_empty_trace():
    s = run(make([]), alone=np.empty(0), counters={"preemptions": 0, "iterations": 0})
    assert (s["n_requests"], s["n_completed"], s["completed_within_horizon"]) == (0, 0, 0)
    assert s["makespan_s"] == 0.0 and s["throughput_rps"] == 0.0 and s["output_tokens_per_s"] == 0.0
    for key in ("ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "e2e_p99_s", "norm_latency_mean_s",
                "slowdown_mean", "slowdown_jain", "client_jain", "slo_attainment_strict"):
        assert s[key] is None, key
    assert s["goodput_strict_rps"] == 0.0
    json.dumps(s, allow_nan=False)


def test_all_rejected():
    t = make([(0.0, 3, "rejected", NAN, NAN), (1.0, 2, "rejected", NAN, NAN)], ["a", "b"])
    s = run(t, alone=np.array([1.0, 2.0]))
    assert (s["n_completed"], s["n_rejected"], s["n_unfinished"]) == (0, 2, 0)
    assert s["makespan_s"] == 0.0 and s["throughput_rps"] == 0.0
    # censored at T_end = 0 + horizon 5: ttft [5, 4], e2e [5, 4], slowdowns [5, 2]
    assert s["ttft_p50_s"] == pytest.approx(4.5) and s["e2e_mean_s"] == pytest.approx(4.5)
    assert s["slowdown_jain"] == pytest.approx(49 / 58) and s["client_jain"] == pytest.approx(49 / 58)
    assert s["ttft_p50_completed_s"] is None and s["slowdown_jain_completed"] is None
    assert s["client_jain_completed"] is None
    assert s["slo_attainment_loose"] == 0.0 and s["goodput_loose_rps"] == 0.0
    json.dumps(s, allow_nan=False)


def test_all_single_token_requests_have_no_tpot():
    t = make([(0.0, 1, "completed", 1.0, 1.0), (0.5, 1, "completed", 2.0, 2.0)])
    s = run(t, horizon=10.0, profiles={"p": (1.5, 1e-9)}, alone=np.array([0.5, 0.5]))
    assert s["tpot_mean_s"] is None and s["tpot_p50_s"] is None and s["tpot_p99_s"] is None
    assert s["ttft_mean_s"] == pytest.approx(1.25)  # ttft [1.0, 1.5]
    assert s["slo_attainment_p"] == 1.0  # N == 1 needs only the TTFT SLO
    assert s["norm_latency_mean_s"] == pytest.approx(1.25)


def test_zero_makespan_throughput_is_none():
    t = make([(0.0, 1, "completed", 0.0, 0.0)])
    s = run(t, alone=np.array([1.0]))
    assert s["makespan_s"] == 0.0 and s["throughput_rps"] is None and s["output_tokens_per_s"] is None


def test_client_jain_needs_two_clients_and_its_completed_variant_two_served():
    rows = [(0.0, 2, "completed", 1.0, 2.0), (0.0, 2, "unfinished", 1.0, NAN)]
    alone = np.array([1.0, 1.0])
    for key in ("client_jain", "client_jain_completed"):
        assert run(make(rows, ["a", "a"]), alone=alone)[key] is None  # one client id
        assert run(make(rows), alone=alone)[key] is None              # no client ids
    assert run(make(rows, ["a", "b"]), alone=alone)["client_jain_completed"] is None  # b got nothing
    # every request: a's slowdown 2, b's censored at T_end = 5: 5 -> Jain 49 / (2 * 29)
    assert run(make(rows, ["a", "b"]), alone=alone)["client_jain"] == pytest.approx(49 / 58)
    both = rows[:1] * 2
    assert run(make(both, ["a", "b"]), alone=alone)["client_jain"] == 1.0
    assert run(make(both, ["a", "b"]), alone=alone)["client_jain_completed"] == 1.0


def test_client_ids_that_read_the_same_as_text_are_one_client_and_nan_is_none():
    rows = [(0.0, 2, "completed", 1.0, 2.0), (0.0, 2, "completed", 1.0, 3.0),
            (0.0, 2, "completed", 1.0, 5.0), (0.0, 2, "completed", 1.0, 4.0)]
    alone = np.ones(4)
    raw = np.array([7, "7", "b", NAN], dtype=object)     # 7 and "7" are one client; NaN none
    as_text = make(rows, ["7", "7", "b", None])
    cols = request_columns(arrival_s=[0.0] * 4, input_tokens=[10] * 4, output_tokens=[2] * 4,
                           client_id=raw, status=["completed"] * 4, first_token_s=[1.0] * 4,
                           finish_s=[2.0, 3.0, 5.0, 4.0], preemptions=[0] * 4)
    assert table_of(cols)["client_id"].tolist() == ["7", "7", "b", None]
    want = run(as_text, alone=alone)["client_jain"]
    # clients 7 (slowdowns 2, 3) and b (5): Jain of means 2.5, 5
    assert want == pytest.approx(7.5 ** 2 / (2 * (2.5 ** 2 + 25)))
    assert run(cols, alone=alone)["client_jain"] == want
    assert run(table_of(cols), alone=alone)["client_jain"] == want


def test_bad_arguments():
    t = make(ROWS, CLIENTS)
    for horizon in (0.0, -1.0, math.inf, NAN):
        with pytest.raises(ConfigError, match="horizon_s"):
            run(t, horizon=horizon)
    with pytest.raises(ConfigError, match="SLO profile"):
        run(t, profiles={"x": (0.0, 1.0)})
    with pytest.raises(ConfigError, match="SLO profile"):
        run(t, profiles={"x": (1.0,)})
    with pytest.raises(ValueError, match="alone_s"):
        run(t, alone=np.ones(4))
    with pytest.raises(ValueError, match="alone_s"):
        run(t, alone=np.array([1.0, 0.0, 1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="alone_s"):          # a rejected request's counts too
        run(t, alone=np.array([1.0, 1.0, NAN, 1.0, 1.0]))


def test_json_valid_with_nan_values(table):
    s = run(table)
    assert s["tpot_mean_s"] is not None
    text = json.dumps(s, allow_nan=False)
    assert json.loads(text) == s
    assert all(v is None or type(v) in (int, float, str, bool) for v in s.values())


# ----------------------------------------------------------------- properties


@given(st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=1, max_size=60))
def test_jain_bounds(xs):
    x = np.array(xs)
    j = jain_index(x)
    if not x.any():
        assert math.isnan(j)
        return
    n = len(xs)
    assert 1.0 / n - 1e-12 <= j <= 1.0


@given(st.floats(1e-6, 1e6), st.integers(1, 50))
def test_jain_extremes(v, n):
    assert jain_index(np.full(n, v)) == pytest.approx(1.0)
    one_hot = np.zeros(n)
    one_hot[0] = v
    assert jain_index(one_hot) == pytest.approx(1.0 / n)


def test_jain_empty_is_nan():
    assert math.isnan(jain_index([]))


@given(st.lists(st.floats(-1e9, 1e9, allow_nan=False), min_size=1, max_size=200),
       st.lists(st.floats(0.0, 100.0), min_size=1, max_size=5))
def test_percentiles_match_numpy_bit_for_bit(xs, ps):
    assert percentiles(xs, ps) == np.percentile(np.array(xs), ps).tolist()


@st.composite
def runs(draw):
    n = draw(st.integers(0, 40))
    arrivals = np.cumsum(draw(st.lists(st.floats(0.0, 5.0), min_size=n, max_size=n)))
    rows, alone = [], []
    for a in arrivals:
        n_out = draw(st.integers(1, 20))
        status = draw(st.sampled_from(["completed", "rejected", "unfinished"]))
        wait = draw(st.floats(0.0, 10.0))
        service = draw(st.floats(0.0, 10.0))
        if status == "completed":
            rows.append((float(a), n_out, status, a + wait, a + wait + service))
        elif status == "unfinished" and draw(st.booleans()):
            rows.append((float(a), n_out, status, a + wait, NAN))
        else:
            rows.append((float(a), n_out, status, NAN, NAN))
        alone.append(draw(st.floats(0.01, 5.0)))
    clients = draw(st.none() | st.lists(st.sampled_from(["x", "y", "z", None]), min_size=n, max_size=n))
    return make(rows, clients), np.array(alone), draw(st.floats(0.1, 300.0))


@settings(max_examples=100, deadline=None)
@given(runs())
def test_summary_of_the_columns_equals_the_summary_of_their_table(case):
    """A run summarizes its checked columns (no DataFrame); a stored table gives the same bits."""
    table, alone, horizon = case
    cols = {c: table[c].to_numpy() for c in REQUEST_COLUMNS}
    again = request_columns(**{c: cols[c] for c in ("arrival_s", "input_tokens", "output_tokens", "client_id",
                                                   "status", "first_token_s", "finish_s", "preemptions")})
    pd.testing.assert_frame_equal(table_of(again), table)
    a = summarize(table, horizon_s=horizon, slo_profiles=PROFILES, alone_s=alone, counters={"iterations": 1})
    b = summarize(again, horizon_s=horizon, slo_profiles=PROFILES, alone_s=alone, counters={"iterations": 1})
    assert json.dumps(a) == json.dumps(b)


@settings(max_examples=200, deadline=None)
@given(runs())
def test_summary_invariants(case):
    table, alone, horizon = case
    profiles = {"tight": (0.5, 0.1), "mid": (2.0, 0.5), "loose": (20.0, 5.0)}
    s = summarize(table, horizon_s=horizon, slo_profiles=profiles, alone_s=alone,
                  counters={"preemptions": 0, "iterations": 1})
    json.dumps(s, allow_nan=False)
    assert list(s) == summary_keys(list(profiles))
    n = s["n_requests"]
    assert s["n_completed"] + s["n_rejected"] + s["n_unfinished"] == n == len(table)
    assert 0 <= s["completed_within_horizon"] <= s["n_completed"]
    last = None
    for p in ("tight", "mid", "loose"):
        att, good = s[f"slo_attainment_{p}"], s[f"goodput_{p}_rps"]
        if n == 0:
            assert att is None and good == 0.0
            continue
        assert 0.0 <= att <= s["completed_within_horizon"] / n + 1e-12
        assert good * horizon == pytest.approx(att * n)
        if last is not None:
            assert att >= last  # looser profile never attains less
        last = att
    for key in ("slowdown_jain", "client_jain"):
        if s[key] is not None:
            assert 0.0 < s[key] <= 1.0
    for tag in ("", "_completed"):
        if s[f"ttft_p50{tag}_s"] is not None:
            assert s[f"ttft_p50{tag}_s"] <= s[f"ttft_p90{tag}_s"] <= s[f"ttft_p99{tag}_s"]
        if s[f"slowdown_jain{tag}"] is not None:
            assert 0.0 < s[f"slowdown_jain{tag}"] <= 1.0
    # every offered request has a counted latency; survivors only where some completed
    assert (s["e2e_mean_s"] is None) == (n == 0)
    assert (s["e2e_mean_completed_s"] is None) == (s["n_completed"] == 0)
    if s["n_completed"] == n and n:
        for k in ("ttft_mean_s", "e2e_mean_s", "e2e_p99_s", "norm_latency_mean_s"):
            assert s[k] == s[k[:-2] + "_completed_s"], k
        assert s["slowdown_jain"] == s["slowdown_jain_completed"]


# ----------------------------------------------------------------- performance
