"""Simulator-vs-real-engine comparison: per-request and per-run errors, rank agreement with planted
flips and ties, NaN handling, tau against scipy, the report section and `analyze --validation`."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from _synthstore import REGIONS6, make_runs, write_store
from schedport.errors import SchedportError
from schedport.engine.core.metrics import request_table
from schedport.analysis.validation_stats import (
    RUN_METRICS,
    load_validation,
    rank_agreement,
    request_errors,
    run_error_table,
    run_errors,
    runs_frame,
    summary_table_lines,
)
from schedport.report.validation import render_validation_section, write_validation_html

ELEVEN = 1 / 11  # |x - 1.1x| / 1.1x


def _table(n=40, seed=0, stretch=1.0, status=None):
    """A request table; `stretch` scales every request's TTFT and E2E (same arrivals)."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(0.5, n))
    ttft = rng.uniform(0.05, 2.0, n)
    dur = rng.uniform(0.5, 10.0, n)
    st = np.array(["completed"] * n, dtype=object) if status is None else np.asarray(status, dtype=object)
    first = np.where(st == "rejected", np.nan, arrival + stretch * ttft)
    finish = np.where(st == "completed", arrival + stretch * (ttft + dur), np.nan)
    return request_table(arrival_s=arrival, input_tokens=rng.integers(10, 500, n),
                         output_tokens=rng.integers(2, 300, n), client_id=None, status=st,
                         first_token_s=first, finish_s=finish, preemptions=np.zeros(n, dtype=np.int64),
                         extra_statuses=("error", "timeout", "truncated"))


# --------------------------------------------------------------------------- per request


def test_request_errors_identical_tables_are_zero():
    t = _table()
    e = request_errors(t, t.copy())
    assert e["n_matched"] == e["n_both"] == 40 and e["n_status_mismatch"] == 0
    for p in ("ttft", "e2e"):
        assert e[f"{p}_n"] == 40
        assert e[f"{p}_abs_pct_err_p50"] == 0.0 and e[f"{p}_abs_pct_err_p90"] == 0.0
        assert e[f"{p}_pct_err_p50"] == 0.0
    json.dumps(e, allow_nan=False)


def test_request_errors_real_ten_percent_slower():
    sim, real = _table(), _table(stretch=1.1)
    e = request_errors(sim, real)
    for p in ("ttft", "e2e"):
        assert e[f"{p}_abs_pct_err_p50"] == pytest.approx(ELEVEN, rel=1e-9)  # 9.09%
        assert e[f"{p}_abs_pct_err_p90"] == pytest.approx(ELEVEN, rel=1e-9)
        assert e[f"{p}_pct_err_p50"] == pytest.approx(-ELEVEN, rel=1e-9)  # the simulation is optimistic


def test_request_errors_count_status_mismatches_and_compare_only_both_completed():
    n = 40
    st = np.array(["completed"] * n, dtype=object)
    st[[1, 5, 9]] = "rejected"
    st[[2, 3]] = "error"
    st[4] = "truncated"
    sim = _table(n)
    real = _table(n, stretch=1.1, status=st)
    sim_st = np.array(["completed"] * n, dtype=object)
    sim_st[[9, 30]] = "unfinished"  # one also failed on the server, one only in the simulation
    sim = _table(n, status=sim_st)
    e = request_errors(sim, real)
    assert e["n_both"] == n
    assert e["n_status_mismatch"] == 7  # 1, 2, 3, 4, 5 (sim completed) + 9 (unfinished vs rejected) + 30
    assert e["n_completed_sim_only"] == 5 and e["n_completed_real_only"] == 1
    assert e["n_matched"] == n - 7 and e["ttft_n"] == e["e2e_n"] == n - 7
    assert e["ttft_abs_pct_err_p50"] == pytest.approx(ELEVEN)


def test_request_errors_nothing_comparable_gives_none():
    n = 6
    sim = _table(n)
    real = _table(n, status=["rejected"] * n)
    e = request_errors(sim, real)
    assert e["n_matched"] == 0 and e["n_status_mismatch"] == n
    assert e["ttft_abs_pct_err_p50"] is None and e["e2e_pct_err_p50"] is None
    json.dumps(e, allow_nan=False)
    with pytest.raises(ValueError, match="missing column"):
        request_errors(sim.drop(columns=["ttft_s"]), real)


# --------------------------------------------------------------------------- per run


def test_run_errors_signed_relative_and_undefined():
    sim = {m: 2.0 for m in RUN_METRICS}
    real = {m: 2.2 for m in RUN_METRICS}
    e = run_errors(sim, real)
    assert list(e) == list(RUN_METRICS)
    for m in RUN_METRICS:
        assert e[m] == pytest.approx(-0.0909090909, abs=1e-9)
    assert run_errors(sim, sim) == {m: 0.0 for m in RUN_METRICS}
    real.update(ttft_mean_s=None, ttft_p50_s=float("nan"), throughput_rps=0.0)
    del real["e2e_p99_s"]
    e = run_errors(sim, real)
    assert e["ttft_mean_s"] is None and e["ttft_p50_s"] is None and e["throughput_rps"] is None
    assert e["e2e_p99_s"] is None and e["tpot_mean_s"] == pytest.approx(-ELEVEN)
    assert run_errors({"x": 3.0}, {"x": 2.0}, metrics=("x",)) == {"x": 0.5}


# --------------------------------------------------------------------------- rank agreement


SCHEDS = ["edf", "fcfs", "sjf", "srpt"]
CONDS = [(0, "light"), (0, "high"), (1, "light"), (1, "high")]


def _runs(sim_fn, real_fn, metrics=("ttft_mean_s", "throughput_rps"), scheds=SCHEDS, conds=CONDS):
    rows = []
    for w, r in conds:
        for k, s in enumerate(scheds):
            row = {"window": w, "region": r, "scheduler": s}
            for m in metrics:
                row[f"sim_{m}"] = sim_fn(w, r, k, m)
                row[f"real_{m}"] = real_fn(w, r, k, m)
            rows.append(row)
    return pd.DataFrame(rows)


def _mono(w, r, k, m):
    """Scheduler k is better by 20% steps everywhere (lower latency, higher throughput)."""
    scale = (1 + w) * (3.0 if r == "high" else 1.0)
    return scale * (1.2 ** k if m != "throughput_rps" else 1.2 ** -k)


def _by_metric(ag, m):
    return next(d for d in ag["summary"]["by_metric"] if d["metric"] == m)


@pytest.mark.parametrize("factor", [1.0, 1.1])
def test_identical_or_proportional_real_engine_agrees_everywhere(factor):
    runs = _runs(_mono, lambda w, r, k, m: factor * _mono(w, r, k, m))
    ag = rank_agreement(runs, ["ttft_mean_s", "throughput_rps"])
    json.dumps(ag, allow_nan=False)
    assert len(ag["conditions"]) == 8 and len(ag["pairs"]) == 12  # 6 pairs x 2 metrics
    assert all(c["tau"] == pytest.approx(1.0) and c["top1_agree"] for c in ag["conditions"])
    assert {c["best_sim"][0] for c in ag["conditions"] if c["metric"] == "ttft_mean_s"} == {"edf"}
    assert {c["best_real"][0] for c in ag["conditions"] if c["metric"] == "throughput_rps"} == {"edf"}
    for m in ("ttft_mean_s", "throughput_rps"):
        s = _by_metric(ag, m)
        assert s["tau_mean"] == pytest.approx(1.0) and s["top1_agreement"] == 1.0
        assert s["n_pair_predictions"] == 24 and s["n_pair_held"] == 24 and s["pair_held_share"] == 1.0
        assert s["n_pair_real_tie"] == 0 and s["n_stable"] == s["n_stable_held"] == 6 and s["n_flip"] == 0
    assert _by_metric(ag, "throughput_rps")["direction"] == "higher"
    p = next(p for p in ag["pairs"] if p["metric"] == "ttft_mean_s" and p["scheduler_a"] == "edf"
             and p["scheduler_b"] == "fcfs")
    assert p["verdict"] == "stable" and p["sim_sign"] == -1 and p["a_better"] is True and p["held"] is True
    assert p["conditions"][0]["sim_diff"] == pytest.approx(1 / 1.2 - 1)
    assert p["conditions"][0]["real_diff"] == pytest.approx(1 / 1.2 - 1)
    q = next(p for p in ag["pairs"] if p["metric"] == "throughput_rps" and p["scheduler_a"] == "edf"
             and p["scheduler_b"] == "fcfs")
    assert q["sim_sign"] == 1 and q["a_better"] is True  # higher throughput is better
    assert ag["summary"]["most_dramatic_flip"] is None
    assert ag["summary"]["overall"]["pair_held_share"] == 1.0


# Planted: three schedulers, two conditions. In the simulation the order reverses from light to high
# for all three pairs; the real engine reproduces a-vs-b only.
SIM = {"light": {"a": 1.0, "b": 1.3, "c": 1.6}, "high": {"a": 2.0, "b": 1.5, "c": 1.2}}
REAL = {"light": {"a": 1.0, "b": 1.3, "c": 1.6}, "high": {"a": 2.0, "b": 1.5, "c": 2.5}}


def _planted():
    rows = []
    for r in ("light", "high"):
        for s in "abc":
            rows.append({"window": "w0", "region": r, "scheduler": s, "sim_ttft_mean_s": SIM[r][s],
                         "real_ttft_mean_s": REAL[r][s]})
    return pd.DataFrame(rows)


def test_planted_flips_reproduced_and_not():
    ag = rank_agreement(_planted(), ["ttft_mean_s"])
    pairs = {(p["scheduler_a"], p["scheduler_b"]): p for p in ag["pairs"]}
    assert all(p["verdict"] == "flip" for p in pairs.values())
    assert pairs[("a", "b")]["reproduced"] is True
    assert pairs[("a", "c")]["reproduced"] is False and pairs[("b", "c")]["reproduced"] is False
    f = pairs[("a", "c")]["flip"]
    assert f["magnitude"] == pytest.approx(0.375)  # min(2/1.2 - 1, 1 - 1/1.6)
    assert f["condition_pos"] == {"window": "w0", "region": "high"}
    assert f["condition_neg"] == {"window": "w0", "region": "light"}
    assert f["real_diff_pos"] == pytest.approx(2 / 2.5 - 1)
    md = ag["summary"]["most_dramatic_flip"]
    assert (md["scheduler_a"], md["scheduler_b"], md["reproduced"]) == ("a", "c", False)
    assert md["magnitude"] == pytest.approx(0.375)
    s = _by_metric(ag, "ttft_mean_s")
    assert s["n_flip"] == 3 and s["n_flip_reproduced"] == 1 and s["n_stable"] == 0
    # per condition: light identical (3 held), high: a-b held, a-c and b-c contradicted
    assert s["n_pair_predictions"] == 6 and s["n_pair_held"] == 4
    taus = {c["region"]: c["tau"] for c in ag["conditions"]}
    assert taus["light"] == pytest.approx(1.0)
    assert taus["high"] == pytest.approx(stats.kendalltau([2.0, 1.5, 1.2], [2.0, 1.5, 2.5]).statistic)
    top = {c["region"]: c for c in ag["conditions"]}
    assert top["high"]["best_sim"] == ["c"] and top["high"]["best_real"] == ["b"]
    assert top["high"]["top1_agree"] is False and top["light"]["top1_agree"] is True
    assert s["top1_agreement"] == 0.5


def test_real_differences_within_threshold_are_ties_not_verdicts():
    rows = []
    for r in ("light", "high"):
        rows += [{"window": 0, "region": r, "scheduler": "a", "sim_e2e_mean_s": 1.0, "real_e2e_mean_s": 1.0},
                 {"window": 0, "region": r, "scheduler": "b", "sim_e2e_mean_s": 1.2,
                  "real_e2e_mean_s": 1.02 if r == "light" else 1.04}]
    ag = rank_agreement(pd.DataFrame(rows), ["e2e_mean_s"], threshold=0.05)
    (p,) = ag["pairs"]
    assert p["verdict"] == "stable" and p["held"] is None and p["n_real_beyond"] == 0
    assert all(c["real_tie"] and c["held"] is None and not c["sim_tie"] for c in p["conditions"])
    s = _by_metric(ag, "e2e_mean_s")
    assert s["n_pair_real_tie"] == 2 and s["n_pair_predictions"] == 0 and s["pair_held_share"] is None
    assert s["n_stable_real_tie"] == 1 and s["n_stable_held"] == 0 and s["n_stable_not_held"] == 0
    # a looser threshold turns the simulated 20% into a tie as well; a tighter one makes the real 2-4% count
    assert rank_agreement(pd.DataFrame(rows), ["e2e_mean_s"], threshold=0.25)["pairs"][0]["verdict"] == "tie"
    tight = rank_agreement(pd.DataFrame(rows), ["e2e_mean_s"], threshold=0.01)
    assert tight["pairs"][0]["held"] is True and _by_metric(tight, "e2e_mean_s")["n_pair_held"] == 2
    # at threshold 0 only an exact zero difference is a tie
    for row in rows:
        row["real_e2e_mean_s"] = 1.0
    zero = rank_agreement(pd.DataFrame(rows), ["e2e_mean_s"], threshold=0.0)
    assert zero["pairs"][0]["verdict"] == "stable" and zero["pairs"][0]["held"] is None
    assert _by_metric(zero, "e2e_mean_s")["n_pair_real_tie"] == 2


def test_stable_prediction_contradicted_is_not_held():
    runs = _runs(_mono, lambda w, r, k, m: _mono(w, r, 3 - k if (w, r) == (1, "high") else k, m),
                 metrics=("ttft_mean_s",))
    ag = rank_agreement(runs, ["ttft_mean_s"])
    s = _by_metric(ag, "ttft_mean_s")
    assert s["n_stable"] == 6 and s["n_stable_not_held"] == 6 and s["n_stable_held"] == 0
    assert s["n_pair_predictions"] == 24 and s["n_pair_held"] == 18
    bad = next(c for c in ag["conditions"] if (c["window"], c["region"]) == (1, "high"))
    assert bad["tau"] == pytest.approx(-1.0)
    p = ag["pairs"][0]
    assert p["n_real_agree"] == 3 and p["n_real_contradict"] == 1


def test_scheduler_with_no_completed_requests_ranks_last_and_its_pairs_are_undefined():
    def sim(w, r, k, m):
        return math.nan if k == 3 else _mono(w, r, k, m)

    def real(w, r, k, m):  # on the real engine it completes nothing only at window 1
        return math.nan if (k == 3 and w == 1) else _mono(w, r, k, m)

    ag = rank_agreement(_runs(sim, real, metrics=("ttft_mean_s",)), ["ttft_mean_s"])
    json.dumps(ag, allow_nan=False)
    for c in ag["conditions"]:
        assert c["n_nan_sim"] == 1 and c["n_nan_real"] == (1 if c["window"] == 1 else 0)
        # NaN ranks worst, where the finite value also is: the order agrees
        assert c["tau"] == pytest.approx(1.0) and c["top1_agree"] is True
    undefined = [p for p in ag["pairs"] if "srpt" in (p["scheduler_a"], p["scheduler_b"])]
    assert len(undefined) == 3 and all(p["verdict"] == "undefined" for p in undefined)
    assert all(x["held"] is None and x["sim_diff"] is None for p in undefined for x in p["conditions"])
    s = _by_metric(ag, "ttft_mean_s")
    assert s["n_undefined"] == 3 and s["n_pair_undefined"] == 12 and s["n_pair_held"] == 12

    # NaN in the simulation only, where the real scheduler is the best: ranks last in sim, first in real
    def real2(w, r, k, m):
        return 0.1 if k == 3 else _mono(w, r, k, m)

    ag = rank_agreement(_runs(sim, real2, metrics=("ttft_mean_s",)), ["ttft_mean_s"])
    c = ag["conditions"][0]
    assert c["tau"] == pytest.approx(stats.kendalltau([1, 2, 3, 4], [2, 3, 4, 1]).statistic)
    assert c["best_sim"] == ["edf"] and c["best_real"] == ["srpt"] and c["top1_agree"] is False

    # everything NaN on one side: tau and top-1 are undefined, not errors
    ag = rank_agreement(_runs(lambda *a: math.nan, _mono, metrics=("ttft_mean_s",)), ["ttft_mean_s"])
    assert all(c["tau"] is None and c["top1_agree"] is None for c in ag["conditions"])
    assert _by_metric(ag, "ttft_mean_s")["tau_mean"] is None
    assert _by_metric(ag, "ttft_mean_s")["top1_agreement"] is None


def test_kendall_tau_matches_scipy_per_condition():
    rng = np.random.default_rng(5)
    scheds = [f"s{k:02d}" for k in range(13)]
    conds = [(w, r) for w in range(3) for r in ("light", "high", "overload")]
    vals = {(w, r, k): rng.lognormal(0, 0.5, 2) for w, r in conds for k in range(13)}
    # a few exact ties in the real values, as rounding on a real engine would give
    for (w, r) in conds[:3]:
        vals[(w, r, 1)][1] = vals[(w, r, 2)][1]
    runs = _runs(lambda w, r, k, m: vals[(w, r, k)][0], lambda w, r, k, m: vals[(w, r, k)][1],
                 metrics=("ttft_p99_s", "throughput_rps"), scheds=scheds, conds=conds)
    ag = rank_agreement(runs, ["ttft_p99_s", "throughput_rps"])
    for c in ag["conditions"]:
        sub = runs[(runs.window == c["window"]) & (runs.region == c["region"])].sort_values("scheduler")
        ref = stats.kendalltau(sub[f"sim_{c['metric']}"], sub[f"real_{c['metric']}"]).statistic
        assert c["tau"] == pytest.approx(ref, abs=1e-12)
        lo = c["metric"] != "throughput_rps"
        pick = (lambda col: sub.loc[sub[col].idxmin() if lo else sub[col].idxmax(), "scheduler"])
        assert c["best_sim"] == [pick(f"sim_{c['metric']}")]
        assert c["top1_agree"] == (pick(f"sim_{c['metric']}") == pick(f"real_{c['metric']}"))
    taus = [c["tau"] for c in ag["conditions"] if c["metric"] == "ttft_p99_s"]
    s = _by_metric(ag, "ttft_p99_s")
    assert s["tau_mean"] == pytest.approx(np.mean(taus)) and s["tau_median"] == pytest.approx(np.median(taus))
    assert s["n_tau"] == 9 and len(ag["pairs"]) == 2 * 78


def test_rank_agreement_refuses_bad_input():
    runs = _planted()
    with pytest.raises(ValueError, match="real_e2e_mean_s"):
        rank_agreement(runs, ["ttft_mean_s", "e2e_mean_s"])
    with pytest.raises(ValueError, match="more than one row"):
        rank_agreement(pd.concat([runs, runs.iloc[:1]]), ["ttft_mean_s"])
    with pytest.raises(ValueError, match="threshold"):
        rank_agreement(runs, ["ttft_mean_s"], threshold=-1)


# --------------------------------------------------------------------------- report


def _validation():
    """A validation dict as `schedport validate` writes it: the planted flips on every run metric, the real
    mean TTFT 10% above the planted value, every real request 10% slower than its simulated twin."""
    runs = []
    for r in ("light", "high"):
        for s in "abc":
            sim = {m: SIM[r][s] for m in RUN_METRICS}
            real = {m: REAL[r][s] for m in RUN_METRICS}
            real["ttft_mean_s"] *= 1.1
            sim["n_completed"] = real["n_completed"] = 40
            t_sim, t_real = _table(seed=len(runs)), _table(seed=len(runs), stretch=1.1)
            runs.append({"window": "w0", "region": r, "scheduler": s, "load": 0.5 if r == "light" else 0.9,
                         "sim": sim, "real": real, "request_errors": request_errors(t_sim, t_real),
                         "run_errors": run_errors(sim, real), "client_lag_ok": not (r == "high" and s == "c")})
    ag = rank_agreement(runs_frame(runs), RUN_METRICS)
    return {"runs": runs, "agreement": ag, "engine": {"block_size": 16}, "server": {"model": "tiny-test-model"},
            "created": "2026-01-02T03:04:05Z"}


def _no_network(html):
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']""", html, flags=re.I)
    assert refs, "expected at least the embedded figure"
    for ref in refs:
        assert not ref.lower().startswith(("http://", "https://", "//")), ref
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert "http://" not in html and "https://" not in html


def test_validation_section_shows_the_numbers_and_is_self_contained():
    v = _validation()
    json.dumps(v, allow_nan=False)
    html = render_validation_section(load_validation(v))
    assert html.startswith('<section id="validation"') and html.rstrip().endswith("</section>")
    _no_network(html)
    assert html.count("data:image/png;base64,") == 1
    ttft = next(d for d in run_error_table(v) if d["metric"] == "ttft_mean_s")
    assert ttft["abs_err_p50"] == pytest.approx(ELEVEN) and ttft["err_p50"] == pytest.approx(-ELEVEN)
    for text in ("Does the simulator predict a real engine?", "9.1%", "-9.1%", "ttft_mean_s", "throughput_rps",
                 "reproduced", "not reproduced", "Most dramatic simulated flip", "<b>a vs c</b>", "+66.7%",
                 "-37.5%", "-20.0%", "tiny-test-model", "2026-01-02T03:04:05Z", "client fell behind",
                 "1 / 3", "0.333", "50.0%", "within measurement noise"):
        assert text in html, text
    # the per-request row: real 10% slower on every request -> 9.1% median error
    assert "<td>9.1%</td><td>9.1%</td><td>-9.1%</td>" in html


def test_validation_section_renders_degenerate_input():
    html = render_validation_section(load_validation({"runs": [], "agreement": {}, "created": "x"}))
    assert 'id="validation"' in html and "No run with both" in html
    v = _validation()
    for r in v["runs"]:
        r["real"] = {m: None for m in RUN_METRICS}
        r["run_errors"] = run_errors(r["sim"], r["real"])
    html = render_validation_section(load_validation(v))
    assert "n/a" in html


def test_write_validation_html_is_a_standalone_page(tmp_path):
    path = write_validation_html(load_validation(_validation()), tmp_path / "validation.html")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and '<section id="validation"' in text and "<style>" in text
    _no_network(text)


def test_summary_table_lines():
    lines = summary_table_lines(_validation())
    assert lines[0].split()[:2] == ["metric", "|err|"]
    ttft = next(x for x in lines if x.startswith("ttft_mean_s"))
    assert ttft.split()[1:] == ["9.1%", "32.7%", "n/a", "0.333", "50.0%", "50.0%", "4/6"]
    assert any(x.startswith("flip predictions: 21, reproduced 7") for x in lines), lines
    assert any(x.startswith("most dramatic flip: a vs c") and x.endswith("not reproduced") for x in lines)
    assert any("client fell behind" in x for x in lines)


def test_load_validation_adds_the_overview_the_report_renders():
    v = _validation()
    before = json.dumps(v, sort_keys=True)
    got = load_validation(v)
    assert json.dumps(v, sort_keys=True) == before and "overview" not in v  # the given dict is not modified
    ov = got["overview"]
    assert ov["run_errors"] == run_error_table(v) and ov["threshold"] == 0.05 and ov["speed"] is None
    assert ov["totals"]["n_runs"] == 6 and ov["totals"]["n_lag_bad"] == 1
    json.dumps(got, allow_nan=False)
    # the report computes nothing: a dict not read through load_validation is refused in one line
    with pytest.raises(SchedportError, match="no 'overview'.*load_validation"):
        render_validation_section(v)


def test_load_validation_refuses_what_is_not_a_validation(tmp_path):
    good = tmp_path / "v.json"
    good.write_text(json.dumps(_validation()))
    assert load_validation(good)["created"] == "2026-01-02T03:04:05Z"
    for body, msg in (("[1]", "JSON object"), ("{}", "not a validation result"), ("{", "not a readable"),
                      ('{"runs": 3, "agreement": {}}', "'runs' must be a list")):
        bad = tmp_path / "bad.json"
        bad.write_text(body)
        with pytest.raises(SchedportError, match=msg):
            load_validation(bad)
    with pytest.raises(SchedportError, match="no such validation file"):
        load_validation(tmp_path / "absent.json")


def test_analyze_with_validation_appends_the_section(tmp_path):
    import typer
    from typer.testing import CliRunner

    from schedport.cli.analyze import analyze_command

    runs = make_runs(schedulers=["edf", "fastserve", "hrrn"], n_windows=4, regions=REGIONS6[:2])
    d = write_store(tmp_path / "store", runs)
    vfile = tmp_path / "validation.json"
    vfile.write_text(json.dumps(_validation(), allow_nan=False))
    app = typer.Typer()
    app.command("analyze")(analyze_command)
    app.command("noop")(lambda: None)
    plain, withv = tmp_path / "plain", tmp_path / "withv"
    r = CliRunner().invoke(app, ["analyze", "--results", str(d), "--out", str(plain), "--boot", "30"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["analyze", "--results", str(d), "--out", str(withv), "--boot", "30",
                                 "--validation", str(vfile)])
    assert r.exit_code == 0, r.output
    assert "validation section" in r.output
    a = (plain / "report.html").read_text(encoding="utf-8")
    b = (withv / "report.html").read_text(encoding="utf-8")
    assert 'id="validation"' not in a and 'id="validation"' in b
    # the section sits before the methodology, and the rest of the page is unchanged
    assert b.index('id="validation"') < b.index('id="methodology"')
    section = render_validation_section(load_validation(vfile))
    elapsed = re.compile(r"computed in [0-9.]+ s")
    assert elapsed.sub("", b.replace(section + "\n", "")) == elapsed.sub("", a)
    r = CliRunner().invoke(app, ["analyze", "--results", str(d), "--out", str(tmp_path / "x"), "--boot", "30",
                                 "--validation", str(tmp_path / "absent.json")])
    assert r.exit_code != 0 and isinstance(r.exception, SchedportError)
    assert not (tmp_path / "x" / "report.html").exists()


# --------------------------------------------------------------------------- repeated replays


def test_median_summary_takes_the_median_of_each_metric_and_ignores_missing():
    from schedport.analysis.validation_stats import median_summary

    s = [{"ttft_mean_s": 1.0, "e2e_mean_s": 2.0}, {"ttft_mean_s": 3.0, "e2e_mean_s": None},
         {"ttft_mean_s": 2.5, "e2e_mean_s": 4.0}]
    m = median_summary(s, ("ttft_mean_s", "e2e_mean_s", "tpot_mean_s"))
    assert m == {"ttft_mean_s": 2.5, "e2e_mean_s": 3.0, "tpot_mean_s": None}


def test_repeat_spread_is_each_repeats_distance_from_the_others():
    from schedport.analysis.validation_stats import repeat_spread

    # leave-one-out: |1/2.75-1|=0.636..., |3/1.75-1|=0.714..., |2.5/2-1|=0.25 -> median 0.636...
    s = [{"m": 1.0}, {"m": 3.0}, {"m": 2.5}]
    assert repeat_spread(s, ("m",))["m"] == pytest.approx(1 - 1 / 2.75)
    # identical repeats have no spread; one repeat has no spread defined
    assert repeat_spread([{"m": 2.0}] * 3, ("m",))["m"] == 0.0
    assert repeat_spread([{"m": 2.0}], ("m",))["m"] is None
    # two repeats: both distances are |a/b - 1| and |b/a - 1|; the median is their mean
    assert repeat_spread([{"m": 1.0}, {"m": 1.25}], ("m",))["m"] == pytest.approx((0.25 + 0.2) / 2)


def test_median_request_table_medians_latencies_and_completes_only_if_every_repeat_did():
    from schedport.analysis.validation_stats import median_request_table

    a = _table(n=10, seed=3)
    b = _table(n=10, seed=3, stretch=1.2)
    c = _table(n=10, seed=3, stretch=2.0, status=["completed"] * 9 + ["error"])
    m = median_request_table([a, b, c])
    assert list(m["request_id"]) == list(a["request_id"])
    np.testing.assert_allclose(m["ttft_s"].to_numpy()[:9], b["ttft_s"].to_numpy()[:9])
    assert list(m["status"])[:9] == ["completed"] * 9 and m["status"].iloc[9] == "error"
    assert math.isnan(m["ttft_s"].iloc[9])
    # one table is returned as is
    assert median_request_table([a]) is a
    with pytest.raises(ValueError, match="same requests"):
        median_request_table([a, a.iloc[:5]])


def test_run_error_table_and_summary_show_the_real_engines_own_noise():
    from schedport.analysis.validation_stats import run_error_table

    runs = [{"run_errors": {"ttft_mean_s": -0.3}, "real_spread": {"ttft_mean_s": 0.1}},
            {"run_errors": {"ttft_mean_s": -0.1}, "real_spread": {"ttft_mean_s": 0.2}},
            {"run_errors": {"ttft_mean_s": 0.2}, "real_spread": {"ttft_mean_s": None}}]
    row = next(d for d in run_error_table({"runs": runs}) if d["metric"] == "ttft_mean_s")
    assert row["abs_err_p50"] == pytest.approx(0.2) and row["noise_p50"] == pytest.approx(0.15)
    assert row["n_noise_runs"] == 2
    lines = summary_table_lines({"runs": runs})
    assert "real noise" in lines[0] and "15.0%" in next(ln for ln in lines if ln.startswith("ttft_mean_s"))
    # without repeats there is no noise column value
    row = next(d for d in run_error_table({"runs": [{"run_errors": {"ttft_mean_s": -0.3}}]})
               if d["metric"] == "ttft_mean_s")
    assert row["noise_p50"] is None and row["n_noise_runs"] == 0


def test_speed_error_correlation_follows_the_machines_drift():
    from schedport.analysis.validation_stats import speed_error_correlation

    # the simulation says 1.0 s; the real engine is slower exactly when the machine is
    reps = [{"speed_index": i, "e2e_mean_s": 1.1 * i} for i in (1.0, 1.1, 1.2, 1.3)]
    v = {"runs": [{"sim": {"e2e_mean_s": 1.0}, "real_repeats": reps}]}
    c = speed_error_correlation(v)
    assert c["n"] == 4 and c["spearman_rho"] == pytest.approx(-1.0)
    # single replays carry their index in the real summary
    runs = [{"sim": {"e2e_mean_s": 1.0}, "real": {"speed_index": i, "e2e_mean_s": 2.0 - i}} for i in (0.9, 1.0, 1.1)]
    assert speed_error_correlation({"runs": runs})["spearman_rho"] == pytest.approx(1.0)
    # too few or no indices
    assert speed_error_correlation({"runs": runs[:2]}) is None
    assert speed_error_correlation({"runs": [{"sim": {"e2e_mean_s": 1.0}, "real": {"e2e_mean_s": 2.0}}] * 3}) is None


def test_real_differences_need_the_repeats_apart():
    """With repeated replays a real difference beyond the threshold still ties when the two
    schedulers' repeats overlap; apart, it is judged as before."""
    def rows(b_lo):
        out = []
        for r in ("light", "high"):
            out += [{"window": 0, "region": r, "scheduler": "a", "sim_e2e_mean_s": 1.0, "real_e2e_mean_s": 1.0,
                     "real_lo_e2e_mean_s": 0.9, "real_hi_e2e_mean_s": 1.1},
                    {"window": 0, "region": r, "scheduler": "b", "sim_e2e_mean_s": 1.2, "real_e2e_mean_s": 1.2,
                     "real_lo_e2e_mean_s": b_lo, "real_hi_e2e_mean_s": 1.4}]
        return pd.DataFrame(out)

    apart = rank_agreement(rows(1.15), ["e2e_mean_s"])
    (p,) = apart["pairs"]
    assert p["verdict"] == "stable" and p["held"] is True and p["n_real_beyond"] == 2
    overlap = rank_agreement(rows(1.05), ["e2e_mean_s"])
    (p,) = overlap["pairs"]
    assert p["verdict"] == "stable" and p["held"] is None and p["n_real_beyond"] == 0
    assert all(c["real_tie"] for c in p["conditions"])
    assert _by_metric(overlap, "e2e_mean_s")["n_pair_real_tie"] == 2
    # without ranges (single replays) the threshold alone decides
    single = rows(1.05).drop(columns=["real_lo_e2e_mean_s", "real_hi_e2e_mean_s"])
    assert rank_agreement(single, ["e2e_mean_s"])["pairs"][0]["held"] is True


def test_top1_within_noise_counts_near_ties_and_overlapping_repeats():
    def cond(region, sim_a, sim_b, real_a, real_b):
        (ra, la, ha), (rb, lb, hb) = real_a, real_b
        return [{"window": 0, "region": region, "scheduler": "a", "sim_ttft_mean_s": sim_a, "real_ttft_mean_s": ra,
                 "real_lo_ttft_mean_s": la, "real_hi_ttft_mean_s": ha},
                {"window": 0, "region": region, "scheduler": "b", "sim_ttft_mean_s": sim_b, "real_ttft_mean_s": rb,
                 "real_lo_ttft_mean_s": lb, "real_hi_ttft_mean_s": hb}]

    rows = (cond("near", 1.0, 1.01, (1.2, 1.1, 1.3), (1.0, 0.9, 1.15))       # sim near-tie, real repeats overlap
            + cond("wrong", 1.0, 1.5, (1.5, 1.45, 1.55), (1.0, 0.95, 1.05)))  # a clear miss
    ag = rank_agreement(pd.DataFrame(rows), ["ttft_mean_s"])
    c = {x["region"]: x for x in ag["conditions"]}
    assert c["near"]["top1_agree"] is False and c["near"]["top1_agree_within_noise"] is True
    assert c["near"]["near_best_sim"] == ["a", "b"] and c["near"]["near_best_real"] == ["a", "b"]
    assert c["wrong"]["top1_agree"] is False and c["wrong"]["top1_agree_within_noise"] is False
    s = _by_metric(ag, "ttft_mean_s")
    assert s["top1_agreement"] == 0.0 and s["top1_agreement_within_noise"] == 0.5
