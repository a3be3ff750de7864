"""Statistics of the portability analysis: reference checks, planted effects, null behaviour, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from scipy import stats

from _synthstore import MANIFEST, METRICS_MAIN, REGIONS6, SOURCES3, make_runs, write_store
from schedport.analysis.directions import DIRECTIONS, metric_direction
from schedport.analysis.portability import compute_portability
from schedport.analysis.stats import bh_adjust, kendall_tau_b, relative_effect, spearman_rho, wilcoxon_pvalues
from schedport.analysis.store_loading import load_store
from schedport.api import analyze
from schedport.cli.analyze import analyze_command
from schedport.errors import SchedportError

SCHEDS5 = ["edf", "fastserve", "hrrn", "ltr", "orca"]


def _compute(runs, **kw):
    kw.setdefault("n_boot", 100)
    return compute_portability(runs, dict(MANIFEST), **kw)


# --------------------------------------------------------------------------- reference statistics


def test_tau_b_matches_scipy_on_known_vectors():
    cases = [
        ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], 1.0),
        ([1, 2, 3, 4, 5], [5, 4, 3, 2, 1], -1.0),
        ([12, 2, 1, 12, 2], [1, 4, 7, 1, 0], None),  # scipy docs example, ties on both sides
        ([1, 1, 2, 2, 3], [1, 2, 1, 2, 3], None),
        ([1.5, 1.5, 3, 4, 5, 6], [2, 1, 4, 3, 6, 5], None),
    ]
    for x, y, expected in cases:
        ref = stats.kendalltau(x, y).statistic
        got = float(kendall_tau_b(x, y))
        assert got == pytest.approx(ref, abs=1e-12)
        if expected is not None:
            assert got == pytest.approx(expected)
    assert float(kendall_tau_b([12, 2, 1, 12, 2], [1, 4, 7, 1, 0])) == pytest.approx(-0.47140452079103173)
    assert math.isnan(float(kendall_tau_b([1, 1, 1], [1, 2, 3])))  # constant vector: undefined


@settings(max_examples=150, deadline=None)
@given(hs.integers(2, 13).flatmap(lambda n: hs.tuples(
    hs.lists(hs.integers(0, 5), min_size=n, max_size=n), hs.lists(hs.integers(0, 5), min_size=n, max_size=n))))
def test_tau_and_spearman_match_scipy_property(xy):
    x, y = (np.array(v, dtype=float) for v in xy)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        assert math.isnan(float(kendall_tau_b(x, y)))
        assert math.isnan(float(spearman_rho(x, y)))
        return
    assert float(kendall_tau_b(x, y)) == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
    assert float(spearman_rho(x, y)) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def test_tau_vectorised_over_batches():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 4, (7, 3, 13)).astype(float)
    y = rng.integers(0, 4, (7, 3, 13)).astype(float)
    got = kendall_tau_b(x, y)
    for idx in np.ndindex(7, 3):
        assert got[idx] == pytest.approx(stats.kendalltau(x[idx], y[idx]).statistic, abs=1e-12)


def test_bh_matches_scipy_on_random_pvalues():
    rng = np.random.default_rng(0)
    for n in (1, 2, 10, 137, 5000):
        p = rng.uniform(size=n) ** rng.uniform(0.5, 4)
        if n > 10:
            p[: n // 10] = p[0]  # ties
        np.testing.assert_allclose(bh_adjust(p), stats.false_discovery_control(p, method="bh"), rtol=1e-12)
    p = np.array([0.01, np.nan, 0.04, 0.03, np.nan])
    q = bh_adjust(p)
    assert np.isnan(q[[1, 4]]).all()
    np.testing.assert_allclose(q[[0, 2, 3]], stats.false_discovery_control([0.01, 0.04, 0.03]))


def test_wilcoxon_pvalues_match_scipy_rowwise():
    rng = np.random.default_rng(3)
    e = rng.normal(0.1, 0.3, (40, 25))
    e[5, :3] = np.nan  # missing windows
    e[6, :4] = 0.0  # zeros are dropped
    e[7, :] = 0.0  # nothing left: p = 1
    e[8, :6] = 0.25  # tied |effects|: normal approximation
    p, n = wilcoxon_pvalues(e)
    assert n[5] == 22 and n[7] == 25
    assert p[7] == 1.0
    for i in (0, 1, 5):
        row = e[i][np.isfinite(e[i])]
        assert p[i] == pytest.approx(stats.wilcoxon(row, method="exact").pvalue, rel=1e-10)
    row6 = e[6][e[6] != 0]
    assert p[6] == pytest.approx(stats.wilcoxon(row6, method="exact").pvalue, rel=1e-10)
    assert p[8] == pytest.approx(stats.wilcoxon(e[8], method="asymptotic").pvalue, rel=1e-10)


def test_relative_effect_signs_and_edge_cases():
    # lower is better: A = 1 s vs B = 2 s -> A better -> positive
    assert float(relative_effect(1.0, 2.0, -1)) == pytest.approx(2 / 3)
    assert float(relative_effect(2.0, 1.0, 1)) == pytest.approx(2 / 3)
    assert float(relative_effect(0.0, 0.0, 1)) == 0.0
    assert float(relative_effect(1.0, 0.0, 1)) == pytest.approx(2.0)  # bounded
    assert math.isnan(float(relative_effect(np.nan, 1.0, 1)))


def test_directions():
    assert metric_direction("ttft_p99_s") == -1
    assert metric_direction("goodput_gold_rps") == 1
    assert metric_direction("slo_attainment_standard") == 1
    assert metric_direction("makespan_s") is None
    assert all(d in (-1, 1) for d in DIRECTIONS.values())


# --------------------------------------------------------------------------- the analysis


def _independent_mean_ranks(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Mean within-window ranks recomputed with pandas only (no schedport code)."""
    avg = runs.groupby(["source", "window_id", "region", "scheduler"])[metric].mean().reset_index()
    asc = metric_direction(metric) < 0
    avg["rank"] = avg.groupby(["source", "window_id", "region"])[metric].rank(method="average", ascending=asc)
    return avg.groupby(["source", "region", "scheduler"])["rank"].mean().reset_index()


def test_rankings_and_concordance_recomputed_independently():
    order = {("burstgpt-modeled", 2): [2, 0, 1, 4, 3]}
    runs = make_runs(schedulers=SCHEDS5, seeds=(0, 1), n_windows=6, noise=0.2, spacing=0.1,
                     order=lambda s, r, m: order.get((s, r), list(range(5))))
    res = _compute(runs, n_boot=200)
    for metric in ("ttft_p99_s", "goodput_standard_rps"):
        mr = _independent_mean_ranks(runs, metric)
        got = {(d["source"], d["region"], d["scheduler"]): d["mean_rank"]
               for d in res["rankings"] if d["metric"] == metric}
        for row in mr.itertuples():
            assert got[(row.source, row.region, row.scheduler)] == pytest.approx(row.rank)
        for d in res["concordance"]["sources"]:
            if d["metric"] != metric:
                continue
            a = mr[(mr.source == d["source_a"]) & (mr.region == d["region"])].sort_values("scheduler")["rank"]
            b = mr[(mr.source == d["source_b"]) & (mr.region == d["region"])].sort_values("scheduler")["rank"]
            assert d["tau"] == pytest.approx(stats.kendalltau(a, b).statistic, abs=1e-12)
            assert d["spearman"] == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
            assert d["ci_low"] <= d["ci_high"]
    # every ranking CI brackets a plausible range
    for d in res["rankings"]:
        assert 1 <= d["ci_low"] <= d["ci_high"] <= 5


def test_planted_reversal_is_found_and_only_it():
    # fastserve beats edf everywhere on e2e_mean_s except burstgpt-modeled @ high, where edf wins.
    def order(s, r, m):
        if m == "e2e_mean_s":
            return [0, 1, 2, 3, 4] if (s, r) == ("burstgpt-modeled", 2) else [1, 0, 2, 3, 4]
        return [0, 1, 2, 3, 4]

    runs = make_runs(schedulers=SCHEDS5, n_windows=8, order=order, spacing=0.2, noise=0.02)
    res = _compute(runs)
    rv = res["reversals"]
    got = {(d["kind"], d["source_a"], d["region_a"], d["source_b"], d["region_b"]) for d in rv["items"]}
    expected = {
        ("source", "azure", "high", "burstgpt-modeled", "high"),
        ("source", "bailian", "high", "burstgpt-modeled", "high"),
        ("region", "burstgpt-modeled", "light", "burstgpt-modeled", "high"),
        ("region", "burstgpt-modeled", "moderate", "burstgpt-modeled", "high"),
    }
    assert got == expected
    assert all(d["metric"] == "e2e_mean_s" and {d["scheduler_a"], d["scheduler_b"]} == {"edf", "fastserve"}
               for d in rv["items"])
    for d in rv["items"]:
        assert d["q_a"] <= 0.05 and d["q_b"] <= 0.05
        assert abs(d["effect_a"]) >= 0.05 and abs(d["effect_b"]) >= 0.05
        assert np.sign(d["effect_a"]) != np.sign(d["effect_b"])
        assert d["q_a"] >= d["p_a"]
        bad_side = "a" if (d["source_a"], d["region_a"]) == ("burstgpt-modeled", "high") else "b"
        assert d[f"better_{bad_side}"] == "edf"
    # comparisons: pairs x metrics x (regions x source pairs + sources x region pairs)
    P, M, S, R = 10, len(METRICS_MAIN), 3, 3
    assert rv["n_comparisons"] == P * M * (R * S * (S - 1) // 2 + S * R * (R - 1) // 2)
    assert rv["n_significant_practical"] == 4
    assert rv["share"] == pytest.approx(4 / rv["n_comparisons"])
    # breakdowns divide by the reversals of their own kind and add up to them
    cs, cr = rv["cross_source"], rv["cross_region"]
    assert cs["n_reversals"] == 2 and cr["n_reversals"] == 2
    assert {k: v["n_reversals"] for k, v in cs["by_region"].items()} == {"light": 0, "moderate": 0, "high": 2}
    assert cs["by_region"]["high"]["share_of_reversals"] == 1.0
    assert cs["by_region"]["high"]["n_comparisons"] == P * M * 3
    assert cs["by_source_pair"]["azure vs burstgpt-modeled"]["n_reversals"] == 1
    assert cs["by_source_pair"]["azure vs burstgpt-modeled"]["share_of_reversals"] == 0.5
    assert cs["by_source_pair"]["azure vs bailian"]["n_reversals"] == 0
    assert sum(v["n_reversals"] for v in cs["by_source_pair"].values()) == cs["n_reversals"]
    assert {k: v["n_reversals"] for k, v in cr["by_region_pair"].items() if v["n_reversals"]} == {
        "light vs high": 1, "moderate vs high": 1}
    assert cr["by_source"]["burstgpt-modeled"]["n_reversals"] == 2
    assert rv["by_scheduler_pair"] == {"edf vs fastserve": 4}
    assert res["headline"]["reversals"]["top_region"]["key"] == "high"
    assert res["headline"]["reversals"]["top_region"]["share_of_reversals"] == 1.0
    # the study's form: e2e_mean_s alone, cross-source only
    sf = {e["metric"]: e for e in res["study_form"]["reversals"]}
    e = sf["e2e_mean_s"]
    assert e["n_comparisons"] == P * 3 * R and e["n_reversals"] == 2
    assert e["one_scheduler_pair"] is True and e["sources_on_every_reversal"] == ["burstgpt-modeled"]
    assert e["by_region"]["high"]["n_reversals"] == 2 and e["high_load"]["n_reversals"] == 2
    assert e["ci_low"] <= e["share"] <= e["ci_high"]
    assert all(sf[m]["n_reversals"] == 0 for m in sf if m != "e2e_mean_s")


def test_practical_threshold_filters_small_reversals():
    def order(s, r, m):
        if m == "e2e_mean_s" and (s, r) == ("burstgpt-modeled", 2):
            return [1, 0, 2, 3, 4]
        return [0, 1, 2, 3, 4]

    runs = make_runs(schedulers=SCHEDS5, n_windows=8, order=order, spacing=0.03, noise=0.002)
    assert _compute(runs, practical_threshold=0.01)["reversals"]["n_significant_practical"] == 4
    assert _compute(runs, practical_threshold=0.05)["reversals"]["n_significant_practical"] == 0


def test_no_true_differences_keeps_false_discoveries_near_q():
    shares, rev, raw = [], [], []
    for seed in range(5):
        runs = make_runs(schedulers=SCHEDS5, n_windows=12, spacing=0.0, noise=0.1, seed=seed)
        res = _compute(runs, n_boot=20)
        rv = res["reversals"]
        shares.append(rv["n_tests_significant"] / rv["n_tests"])
        raw.append(rv["n_tests_raw_p_below_q"] / rv["n_tests"])
        rev.append(rv["share"])
    assert np.mean(shares) <= 0.05
    assert max(rev) <= 0.05
    # the uncorrected tests are calibrated: about 5% below 0.05
    assert 0.02 <= np.mean(raw) <= 0.08


def test_nan_ranks_worst_and_all_nan_metric_dropped():
    runs = make_runs(schedulers=SCHEDS5, n_windows=5, sources=["azure", "bailian"], regions=REGIONS6[:2])
    # edf (best) completes nothing at azure/light: no TTFT -> must rank worst there
    m = (runs.source == "azure") & (runs.region == "light") & (runs.scheduler == "edf")
    runs.loc[m, "ttft_p99_s"] = np.nan
    runs["client_jain"] = np.where(runs.source == "azure", np.nan, 0.5 + 0.01 * runs.window_id)
    res = _compute(runs)
    r = {d["scheduler"]: d["mean_rank"] for d in res["rankings"]
         if (d["source"], d["region"], d["metric"]) == ("azure", "light", "ttft_p99_s")}
    assert r["edf"] == 5 and r["fastserve"] == 1
    assert not any(d["metric"] == "client_jain" and d["source"] == "azure" for d in res["rankings"])
    assert any(d["metric"] == "client_jain" and d["source"] == "bailian" for d in res["rankings"])
    assert any("client_jain" in n for n in res["notes"])


def test_missing_cells_listed_and_complete_blocks_used():
    runs = make_runs(schedulers=SCHEDS5, n_windows=6)
    drop = ((runs.source == "azure") & (runs.window_id == 3) & (runs.region == "high") & (runs.scheduler == "orca"))
    drop |= ((runs.source == "bailian") & (runs.window_id.isin([0, 1])) & (runs.region == "moderate")
             & (runs.scheduler == "hrrn"))
    res = _compute(runs[~drop].reset_index(drop=True))
    cells = {(c["source"], c["window_id"], c["region"], c["scheduler"]) for c in res["missing_cells"]}
    assert cells == {("azure", 3, "high", "orca"), ("bailian", 0, "moderate", "hrrn"),
                     ("bailian", 1, "moderate", "hrrn")}
    blocks = {(b["source"], b["region"]): b for b in res["complete_blocks"]}
    assert blocks[("azure", "high")]["n_complete"] == 5 and blocks[("azure", "high")]["n_windows"] == 6
    assert blocks[("bailian", "moderate")]["n_complete"] == 4
    assert res["complete_blocks_only"] is True
    nw = {d["n_windows"] for d in res["rankings"] if (d["source"], d["region"]) == ("azure", "high")}
    assert nw == {5}
    assert any("complete block" in n for n in res["notes"])
    # ranks on the block match an independent computation over the complete windows only
    kept = runs[~((runs.source == "azure") & (runs.region == "high") & (runs.window_id == 3))]
    mr = _independent_mean_ranks(kept, "e2e_mean_s")
    want = mr[(mr.source == "azure") & (mr.region == "high")].set_index("scheduler")["rank"]
    got = {d["scheduler"]: d["mean_rank"] for d in res["rankings"]
           if (d["source"], d["region"], d["metric"]) == ("azure", "high", "e2e_mean_s")}
    for k, v in want.items():
        assert got[k] == pytest.approx(v)


def test_best_changes_with_metric_share():
    # at high load, slowdown_jain's best is the otherwise-worst scheduler -> best changes there only
    def order(s, r, m):
        if m == "slowdown_jain" and r == 2:
            return [4, 3, 2, 1, 0]
        return [0, 1, 2, 3, 4]

    runs = make_runs(schedulers=SCHEDS5, n_windows=6, order=order)
    res = _compute(runs)
    bc = res["best_changes_with_metric"]
    assert bc["n_conditions"] == 9 and bc["n_changed"] == 3
    assert res["best_changes_with_metric_share"] == pytest.approx(3 / 9)
    assert bc["ci_low"] <= 1 / 3 <= bc["ci_high"]
    changed = {(c["source"], c["region"]) for c in bc["conditions"] if c["changed"]}
    assert changed == {(s, "high") for s in SOURCES3}
    # metric concordance: slowdown_jain vs the others is -1 at high, +1 elsewhere
    taus = [d["tau"] for d in res["concordance"]["metrics"]
            if "slowdown_jain" in (d["metric_a"], d["metric_b"]) and d["region"] == "high"]
    assert taus and all(t == pytest.approx(-1) for t in taus)


def test_output_schema_and_strict_json(tmp_path):
    runs = make_runs(schedulers=SCHEDS5, n_windows=5)
    write_store(tmp_path, runs)
    res = analyze(tmp_path, n_boot=1000, seed=7).portability  # the one test at the reporting B
    text = (tmp_path / "portability.json").read_text()

    def _refuse(name):
        raise AssertionError(f"non-finite number {name} in portability.json")

    on_disk = json.loads(text, parse_constant=_refuse)
    json.dumps(on_disk, allow_nan=False)
    for key in ("concordance", "rankings", "best_changes_with_metric_share", "reversals", "parameters",
                "provenance", "missing_cells"):
        assert key in on_disk
    for key in ("sources", "regions", "metrics"):
        assert on_disk["concordance"][key]
    need = {"metric", "region", "source_a", "source_b", "tau", "ci_low", "ci_high", "spearman", "top1"}
    assert need <= set(on_disk["concordance"]["sources"][0])
    assert {"metric", "source", "region_a", "region_b", "tau", "ci_low", "ci_high"} <= set(
        on_disk["concordance"]["regions"][0])
    assert {"metric_a", "metric_b", "source", "region", "tau", "ci_low", "ci_high"} <= set(
        on_disk["concordance"]["metrics"][0])
    assert {"metric", "region", "source", "scheduler", "mean_rank", "ci_low", "ci_high"} <= set(on_disk["rankings"][0])
    assert {"n_comparisons", "n_significant_practical", "share", "cross_source", "cross_region",
            "by_scheduler_pair", "items"} <= set(on_disk["reversals"])
    # the study_form contract
    sf = on_disk["study_form"]
    assert {"reversals", "best_changes_with_metric", "cross_source_tau", "duplicates", "split_half",
            "claims"} <= set(sf)
    for e in sf["reversals"]:
        assert {"metric", "n_comparisons", "n_reversals", "share", "ci_low", "ci_high", "by_region",
                "by_source_pair", "by_scheduler_pair"} <= set(e)
    assert [e["metric"] for e in sf["reversals"]] == on_disk["headline"]["main_metrics"]
    bc = sf["best_changes_with_metric"]
    assert bc["condition"] == "window x region" and {"n_conditions", "share", "pairwise"} <= set(bc)
    assert {"source_a", "source_b", "metric", "value", "ci_low", "ci_high"} <= set(sf["cross_source_tau"][0])
    assert len(sf["cross_source_tau"]) == 3 * len(on_disk["headline"]["main_metrics"])
    assert isinstance(sf["duplicates"], dict)
    assert {(d["source"], d["region"]) for d in sf["split_half"]} == {
        (s, r) for s in SOURCES3 for r in ("light", "moderate", "high")}
    for d in sf["split_half"]:
        assert {"value", "ci_low", "ci_high"} <= set(d) and d["ci_low"] - 1e-12 <= d["value"] <= d["ci_high"] + 1e-12
    assert len(sf["claims"]) == 5
    for c in sf["claims"]:
        assert {"study", "here", "verdict"} <= set(c)
        assert c["verdict"] in ("holds", "does not hold", "partly holds", "inconclusive", "not comparable")
    assert on_disk["parameters"]["n_boot"] == 1000 and on_disk["parameters"]["seed"] == 7
    assert on_disk["provenance"]["corpus_sha256"] == MANIFEST["corpus_sha256"]
    assert on_disk["provenance"]["engine_config"] == MANIFEST["engine_config"]
    modeled = [d for d in on_disk["provenance"]["data_sources"] if d["source"] == "burstgpt-modeled"]
    assert modeled and modeled[0]["modeled"] is True
    assert (tmp_path / "report.html").is_file()
    # deterministic for a seed (apart from the wall time)
    again = compute_portability(*load_store(tmp_path), n_boot=1000, seed=7, results_dir=str(tmp_path))
    for r in (res, again):
        r.pop("run_info")
    assert json.dumps(again, sort_keys=True) == json.dumps(res, sort_keys=True)


def test_metrics_option_restricts_and_validates():
    runs = make_runs(schedulers=SCHEDS5, n_windows=4)
    res = _compute(runs, metrics=["ttft_p99_s", "e2e_mean_s"])
    assert res["parameters"]["metrics"] == ["ttft_p99_s", "e2e_mean_s"]
    with pytest.raises(SchedportError, match="not in the results store"):
        _compute(runs, metrics=["nope"])
    runs["makespan_s"] = 1.0
    with pytest.raises(SchedportError, match="no known direction"):
        _compute(runs, metrics=["makespan_s"])
    runs["mystery"] = 1.0
    assert any("mystery" in n for n in _compute(runs)["notes"])


# --------------------------------------------------------------------------- bad input


def test_bad_stores_are_refused_with_one_line(tmp_path):
    runs = make_runs(schedulers=SCHEDS5, n_windows=3, regions=REGIONS6[:2])

    def err(path, **kw):
        with pytest.raises(SchedportError) as ei:
            load_store(path, **kw)
        msg = str(ei.value)
        assert "\n" not in msg
        return msg

    assert "not found" in err(tmp_path / "absent")
    d = write_store(tmp_path / "nomanifest", runs, manifest=None)
    assert "manifest.json" in err(d)
    d = tmp_path / "noruns"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps(MANIFEST))
    assert "no runs" in err(d)
    d = write_store(tmp_path / "empty", runs.iloc[:0])
    (d / "runs" / "part-0.parquet").unlink(missing_ok=True)
    runs.iloc[:0].to_parquet(d / "runs" / "part-0.parquet", index=False)
    assert "holds no runs" in err(d)
    d = write_store(tmp_path / "nocol", runs.drop(columns=["scheduler"]))
    assert "scheduler" in err(d)
    d = write_store(tmp_path / "badjson", runs)
    (d / "manifest.json").write_text("{not json")
    assert "not valid JSON" in err(d)
    mixed = runs.copy()
    mixed["corpus_sha256"] = np.where(mixed.source == "azure", "aaa", "bbb")
    d = write_store(tmp_path / "mixed", mixed, manifest={**MANIFEST, "corpus_sha256": None})
    assert "2 corpora" in err(d)
    d = write_store(tmp_path / "other", runs)
    assert "differs from the expected" in err(d, expect_corpus="f" * 64)
    assert "engine" in err(d, expect_engine="0" * 16)
    load_store(d, expect_corpus=MANIFEST["corpus_sha256"], expect_engine=MANIFEST["engine_hash"])  # ok
    dup = pd.concat([runs, runs.iloc[:1]])
    d = write_store(tmp_path / "dup", dup)
    assert "duplicated run" in err(d)
    single = runs[runs.window_id == 0]
    with pytest.raises(SchedportError, match="nothing to analyse"):
        compute_portability(single, dict(MANIFEST))
    partial = compute_portability(runs, {**MANIFEST, "status": "failed"}, n_boot=10)
    assert any("status = 'failed'" in n for n in partial["notes"])
    one = runs[runs.scheduler == "edf"]
    d = write_store(tmp_path / "one", one)
    with pytest.raises(SchedportError, match="one scheduler"):
        compute_portability(*load_store(d))


def test_corpus_manifest_for_workload(tmp_path):
    runs = make_runs(schedulers=SCHEDS5, n_windows=3, regions=REGIONS6[:2])
    d = write_store(tmp_path / "store", runs)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    wins = [{"source": s, "window_id": w, "stats": {"n_requests": 100 + w, "duration_s": 600.0,
                                                     "mean_input_tokens": 500.0 + w, "p50_input_tokens": 400.0,
                                                     "p99_input_tokens": 3000.0, "mean_output_tokens": 200.0,
                                                     "p50_output_tokens": 150.0, "p99_output_tokens": 900.0,
                                                     "mean_rate_rps": 2.0, "index_of_dispersion": 1.5 + w}}
            for s in SOURCES3 for w in range(3)]
    (corpus / "manifest.json").write_text(json.dumps({"corpus_sha256": MANIFEST["corpus_sha256"], "windows": wins}))
    res = analyze(d, tmp_path / "out", n_boot=50, corpus_dir=corpus).portability
    wl = res["workload"]
    assert wl["available"] and len(wl["windows"]) == 9
    assert {"input_mean", "output_p99", "rate_mean_rps", "dispersion", "input_p50"} <= set(wl["stats"])
    assert wl["windows"][1]["input_mean"] == 501.0 and wl["windows"][1]["dispersion"] == 2.5
    assert (tmp_path / "out" / "report.html").is_file()
    (corpus / "manifest.json").write_text(json.dumps({"corpus_sha256": "0" * 64, "windows": wins}))
    with pytest.raises(SchedportError, match="not the one the results were run on"):
        analyze(d, tmp_path / "out2", n_boot=50, corpus_dir=corpus)


def test_analyze_command_prints_summary_and_report_path(tmp_path):
    import typer
    from typer.testing import CliRunner

    runs = make_runs(schedulers=SCHEDS5, n_windows=4, regions=REGIONS6[:2])
    d = write_store(tmp_path / "store", runs)
    app = typer.Typer()
    app.command("analyze")(analyze_command)
    app.command("noop")(lambda: None)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["analyze", "--results", str(d), "--out", str(out), "--boot", "50"])
    assert r.exit_code == 0, r.output
    assert "reversals on ttft_p99_s:" in r.output and "pooled reversals" in r.output
    assert f"report: {out / 'report.html'}" in r.output
    assert (out / "portability.json").is_file() and (out / "report.html").is_file()
    r = CliRunner().invoke(app, ["analyze", "--results", str(tmp_path / "absent")])
    assert r.exit_code != 0 and isinstance(r.exception, SchedportError)
