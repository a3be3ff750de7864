"""The study's form: recomputed from the store by independent code, planted duplicates caught, thresholds,
claims and the bootstrap helpers checked against scipy."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from _synthstore import MANIFEST, SCHEDULERS13, REGIONS6, make_runs, write_store
from schedport.analysis.portability import compute_portability
from schedport.api import analyze
from schedport.analysis.studyform import bh_rows, boot_wilcoxon

MAIN = ("ttft_p99_s", "tpot_p99_s", "e2e_mean_s", "slo_attainment_standard", "slowdown_jain")
LOWER = {"ttft_p99_s", "tpot_p99_s", "e2e_mean_s"}
BOUNDED = {"slo_attainment_standard", "slowdown_jain"}
SCHEDS6 = SCHEDULERS13[:6]


def _compute(runs, **kw):
    kw.setdefault("n_boot", 200)
    kw.setdefault("n_splits", 200)
    return compute_portability(runs, dict(MANIFEST), **kw)


def _order(s, r, m):
    base = list(range(6))
    if m == "ttft_p99_s" and s == "burstgpt-modeled" and r == 2:
        return base[::-1]
    if m == "slo_attainment_standard" and s == "bailian" and r == 1:
        return base[::-1]
    if m == "slowdown_jain" and s == "azure":
        return [2, 1, 0, 3, 4, 5]
    return base


@pytest.fixture(scope="module")
def planted():
    runs = make_runs(schedulers=SCHEDS6, n_windows=10, order=_order, spacing=0.1, noise=0.05, seed=4)
    return runs, _compute(runs)


# --------------------------------------------------------------------------- independent recomputation


def _tests_for(runs: pd.DataFrame, metric: str, thr: float, abs_thr: float) -> dict:
    """(source, region, a, b) -> (p, median effect) with pandas and scipy only."""
    avg = runs.groupby(["source", "region", "window_id", "scheduler"])[metric].mean().reset_index()
    d = -1.0 if metric in LOWER else 1.0
    out = {}
    scheds = sorted(runs.scheduler.unique())
    for (s, r), sub in avg.groupby(["source", "region"]):
        piv = sub.pivot(index="window_id", columns="scheduler", values=metric)
        for a, b in itertools.combinations(scheds, 2):
            A, B = piv[a].to_numpy(), piv[b].to_numpy()
            if metric in BOUNDED:
                e = d * (A - B)
            else:
                den = (np.abs(A) + np.abs(B)) / 2
                e = np.where(den == 0, 0.0, d * (A - B) / np.where(den == 0, 1, den))
            e = e[np.isfinite(e)]
            nz = e[e != 0]
            if nz.size == 0:
                p = 1.0
            else:
                tied = np.unique(np.abs(nz)).size < nz.size
                p = stats.wilcoxon(nz, method="asymptotic" if tied or nz.size > 50 else "exact").pvalue
            out[(s, r, a, b)] = (p, float(np.median(e)))
    return out


def _independent_reversals(runs, metric, thr=0.05, abs_thr=0.02, q=0.05) -> dict:
    tests = _tests_for(runs, metric, thr, abs_thr)
    keys = list(tests)
    qv = dict(zip(keys, stats.false_discovery_control([tests[k][0] for k in keys])))
    t = abs_thr if metric in BOUNDED else thr
    srcs, regs = sorted(runs.source.unique()), list(dict.fromkeys(runs.region))
    scheds = sorted(runs.scheduler.unique())
    n, hits = 0, []
    for r in regs:
        for s1, s2 in itertools.combinations(srcs, 2):
            for a, b in itertools.combinations(scheds, 2):
                k1, k2 = (s1, r, a, b), (s2, r, a, b)
                n += 1
                e1, e2 = tests[k1][1], tests[k2][1]
                if qv[k1] <= q and qv[k2] <= q and abs(e1) >= t and abs(e2) >= t and e1 * e2 < 0:
                    hits.append((r, f"{s1} vs {s2}", f"{a} vs {b}"))
    return {"n": n, "hits": hits}


def test_study_form_reversals_recomputed_independently(planted):
    runs, res = planted
    got = {e["metric"]: e for e in res["study_form"]["reversals"]}
    assert list(got) == list(MAIN)
    total = 0
    for m in MAIN:
        ind = _independent_reversals(runs, m)
        e = got[m]
        assert e["n_comparisons"] == ind["n"] == 15 * 3 * 3
        assert e["n_reversals"] == len(ind["hits"]), m
        assert e["share"] == pytest.approx(len(ind["hits"]) / ind["n"])
        for reg in ("light", "moderate", "high"):
            assert e["by_region"][reg]["n_reversals"] == sum(h[0] == reg for h in ind["hits"])
        for sp, v in e["by_source_pair"].items():
            assert v["n_reversals"] == sum(h[1] == sp for h in ind["hits"])
        want_pairs = {}
        for h in ind["hits"]:
            want_pairs[h[2]] = want_pairs.get(h[2], 0) + 1
        assert e["by_scheduler_pair"] == want_pairs
        assert sum(v["n_reversals"] for v in e["by_region"].values()) == e["n_reversals"]
        total += e["n_reversals"]
        if e["n_reversals"]:
            assert e["ci_low"] <= e["share"] <= e["ci_high"] or e["ci_low"] <= e["ci_high"]
    # the planted flips are found: ttft at high (burstgpt), attainment at moderate (bailian), jain (azure)
    assert got["ttft_p99_s"]["by_region"]["high"]["n_reversals"] > 0
    assert got["slo_attainment_standard"]["by_region"]["moderate"]["n_reversals"] > 0
    assert got["slowdown_jain"]["n_reversals"] > 0
    assert total > 0


def test_best_changes_per_window_and_cross_source_tau_recomputed(planted):
    runs, res = planted
    avg = runs.groupby(["source", "region", "window_id", "scheduler"])[list(MAIN)].mean().reset_index()
    changed = cells = 0
    pair_dis = pair_n = 0
    for _, sub in avg.groupby(["source", "region", "window_id"]):
        sets = []
        for m in MAIN:
            v = sub[m] if m not in LOWER else -sub[m]
            sets.append(set(sub.loc[v == v.max(), "scheduler"]))
        cells += 1
        changed += not set.intersection(*sets)
        for x, y in itertools.combinations(sets, 2):
            pair_n += 1
            pair_dis += not (x & y)
    bc = res["study_form"]["best_changes_with_metric"]
    assert bc["n_conditions"] == cells == 3 * 3 * 10
    assert bc["n_changed"] == changed
    assert bc["share"] == pytest.approx(changed / cells)
    assert bc["pairwise"]["share"] == pytest.approx(pair_dis / pair_n)
    assert bc["ci_low"] <= bc["share"] <= bc["ci_high"]
    # cross-source tau per pair and main metric: mean over regions of tau between mean-rank vectors
    for d in res["study_form"]["cross_source_tau"]:
        m = d["metric"]
        asc = m in LOWER
        a = avg.copy()
        a["rank"] = a.groupby(["source", "region", "window_id"])[m].rank(ascending=asc)
        mr = a.groupby(["source", "region", "scheduler"])["rank"].mean()
        taus = [stats.kendalltau(mr[d["source_a"], r].sort_index(), mr[d["source_b"], r].sort_index()).statistic
                for r in ("light", "moderate", "high")]
        assert d["value"] == pytest.approx(np.mean(taus), abs=1e-12)
        assert d["ci_low"] <= d["ci_high"]


def test_split_half_ceiling_and_adjusted_portability(planted):
    _, res = planted
    sf = res["study_form"]
    rel = {(d["source"], d["region"]): d["value"] for d in sf["split_half"]}
    assert len(rel) == 9
    for d in sf["cross_source_half"]["by_pair_region"]:
        ra, rb = rel[(d["source_a"], d["region"])], rel[(d["source_b"], d["region"])]
        assert d["rel_a"] == pytest.approx(ra) and d["rel_b"] == pytest.approx(rb)
        assert d["adjusted"] == pytest.approx(d["tau_half"] / np.sqrt(ra * rb))
    # a store with clear, consistent differences is reliable; one with none is not
    clear = _compute(make_runs(schedulers=SCHEDS6, n_windows=10, spacing=0.3, noise=0.01, distinct_metrics=False))
    assert min(d["value"] for d in clear["study_form"]["split_half"]) > 0.95
    null = _compute(make_runs(schedulers=SCHEDS6, n_windows=10, spacing=0.0, noise=0.2, seed=2))
    assert abs(np.mean([d["value"] for d in null["study_form"]["split_half"]])) < 0.25


# --------------------------------------------------------------------------- planted duplicates


def test_planted_duplicate_metric_is_caught_and_analysed_once():
    runs = make_runs(schedulers=SCHEDS6[:5], n_windows=6, noise=0.05, spacing=0.1)
    runs["n_requests"] = 100 + runs["window_id"] * 7
    runs["horizon_s"] = 60.0 + runs["window_id"] * 3.5
    runs["goodput_standard_rps"] = runs["slo_attainment_standard"] * runs["n_requests"] / runs["horizon_s"]
    res = _compute(runs)
    assert ["slo_attainment_standard", "goodput_standard_rps"] in res["metric_families"]["groups"]
    assert "goodput_standard_rps" not in res["parameters"]["metrics"]
    assert "slo_attainment_standard" in res["parameters"]["metrics"]
    assert any("goodput_standard_rps" in n and "identically" in n for n in res["notes"])
    assert not any(d["metric"] == "goodput_standard_rps" for d in res["reversals"]["items"])
    # a main metric that copies another is refused as a pair: the first main metric is kept
    runs2 = runs.copy()
    runs2["e2e_mean_s"] = 3.0 * runs2["ttft_p99_s"] ** 2
    res2 = _compute(runs2)
    assert ["ttft_p99_s", "e2e_mean_s"] in res2["metric_families"]["groups"]
    assert "e2e_mean_s" not in res2["headline"]["main_metrics"]
    assert [e["metric"] for e in res2["study_form"]["reversals"]] == res2["headline"]["main_metrics"]
    # distinct metrics are left alone
    assert res2["metric_families"]["groups"] == [["ttft_p99_s", "e2e_mean_s"],
                                                  ["slo_attainment_standard", "goodput_standard_rps"]]


def _with_clone(runs: pd.DataFrame, of: str, name: str, where=None) -> pd.DataFrame:
    c = runs[runs.scheduler == of].copy()
    c["scheduler"] = name
    if where is not None:
        other = runs[runs.scheduler == SCHEDS6[4]]
        c = c.set_index(["source", "window_id", "region", "seed"])
        o = other.set_index(["source", "window_id", "region", "seed"])
        keep = where(c.reset_index())
        c = c.reset_index()
        o = o.reset_index()
        c.loc[~keep.to_numpy(), MAIN] = o.loc[~keep.to_numpy(), MAIN].to_numpy() * 1.01
    return pd.concat([runs, c], ignore_index=True)


def test_planted_duplicate_scheduler_is_caught_and_counted_once(tmp_path):
    def order(s, r, m):
        if m == "e2e_mean_s" and s == "burstgpt-modeled" and r == 2:
            return [1, 0, 2, 3, 4]
        return [0, 1, 2, 3, 4]

    base = make_runs(schedulers=SCHEDS6[:5], n_windows=8, order=order, spacing=0.2, noise=0.02)
    res0 = _compute(base)
    runs = _with_clone(base, "edf", "aaa-clone")
    write_store(tmp_path, runs)
    res = analyze(tmp_path, n_boot=200, n_splits=100).portability
    assert res["duplicates"]["by_source"] == {s: [["aaa-clone", "edf"]] for s in ("azure", "bailian",
                                                                                 "burstgpt-modeled")}
    assert res["study_form"]["duplicates"] == res["duplicates"]["by_source"]
    e0 = {e["metric"]: e for e in res0["study_form"]["reversals"]}
    e1 = {e["metric"]: e for e in res["study_form"]["reversals"]}
    for m in e0:  # the clone adds no comparison and no reversal
        assert e1[m]["n_comparisons"] == e0[m]["n_comparisons"]
        assert e1[m]["n_reversals"] == e0[m]["n_reversals"]
    assert e1["e2e_mean_s"]["n_reversals"] == 2
    assert e1["e2e_mean_s"]["by_scheduler_pair"] == {"aaa-clone = edf vs fastserve": 2}
    assert res["reversals"]["n_significant_practical"] == res0["reversals"]["n_significant_practical"]
    assert res["reversals"]["n_comparisons"] == res0["reversals"]["n_comparisons"]
    html = (tmp_path / "report.html").read_text()
    assert "aaa-clone = edf" in html
    # a clone in one condition only is reported for that condition
    part = _with_clone(base, "edf", "aaa-clone", where=lambda c: (c.source == "azure") & (c.region == "light"))
    rp = _compute(part)
    assert rp["duplicates"]["by_source"] == {}
    assert rp["duplicates"]["by_condition"] == {"azure": {"light": [["aaa-clone", "edf"]]}}


# --------------------------------------------------------------------------- thresholds, flags, claims


def test_bounded_metric_uses_absolute_threshold():
    def order(s, r, m):
        return [2, 1, 0] if (s, r) == ("burstgpt-modeled", 2) else [0, 1, 2]

    runs = make_runs(schedulers=SCHEDS6[:3], n_windows=10, order=order, spacing=0.2, noise=0.001)
    # attainment between 1.5% and 3%: relative effects of ~0.4-0.7, absolute ones of 0.75-1.5 points
    q = runs.scheduler.map({sc: i for i, sc in enumerate(SCHEDS6[:3])}).to_numpy()
    qual = np.where((runs.source == "burstgpt-modeled") & (runs.region == "high"), 2 - q, q)
    # its own ranking in one window (else it would repeat ttft_p99_s's and be analysed as that metric)
    cell = ((runs.source == "bailian") & (runs.region == "light") & (runs.window_id == 0)).to_numpy()
    qual = np.where(cell & (q > 0), 3 - q, qual)
    rng = np.random.default_rng(0)
    runs["slo_attainment_standard"] = 0.03 - 0.0075 * qual + rng.normal(0, 1e-5, len(runs))
    e = {x["metric"]: x for x in _compute(runs)["study_form"]["reversals"]}["slo_attainment_standard"]
    assert e["effect_scale"] == "absolute" and e["practical_threshold"] == 0.02
    assert e["n_reversals"] == 0
    e = {x["metric"]: x for x in _compute(runs, abs_threshold=0.01)["study_form"]["reversals"]}[
        "slo_attainment_standard"]
    assert e["n_reversals"] == 2  # edf vs hrrn, burstgpt-modeled at high against each other source
    # an unbounded metric with the same relative flip keeps the relative 5% threshold
    assert {x["metric"]: x for x in _compute(runs)["study_form"]["reversals"]}["e2e_mean_s"]["n_reversals"] > 0


def test_tied_vectors_are_flagged():
    runs = make_runs(schedulers=SCHEDS6[:5], n_windows=4, regions=REGIONS6[:2])
    best = runs.scheduler == SCHEDS6[0]
    runs["slowdown_jain"] = np.where(best, 0.9, 0.5)
    res = _compute(runs)
    jain = [d for d in res["concordance"]["sources"] if d["metric"] == "slowdown_jain"]
    assert jain and all(d["tied"] and d["n_distinct_a"] == 2 for d in jain)
    ttft = [d for d in res["concordance"]["sources"] if d["metric"] == "ttft_p99_s"]
    assert not any(d["tied"] for d in ttft)
    ct = {(d["source_a"], d["source_b"], d["metric"]): d for d in res["study_form"]["cross_source_tau"]}
    assert ct[("azure", "bailian", "slowdown_jain")]["n_tied_regions"] == 2


def test_claims_verdicts_follow_the_stated_rules():
    # every source agrees exactly: near-perfect agreement holds; one scheduler owns tpot: not comparable
    def order(s, r, m):
        return [4, 3, 2, 1, 0] if m == "tpot_p99_s" else [0, 1, 2, 3, 4]

    kw = dict(schedulers=SCHEDS6[:5], n_windows=8, spacing=0.4, noise=0.005, order=order)
    runs = make_runs(**kw)
    runs["tpot_p99_s"] = make_runs(**kw, distinct_metrics=False)["tpot_p99_s"]  # orca best in every window
    res = _compute(runs)
    cl = {c["id"]: c for c in res["study_form"]["claims"]}
    assert cl["azure_bailian"]["value"] == pytest.approx(1.0) and cl["azure_bailian"]["verdict"] == "holds"
    assert cl["burstgpt_low"]["verdict"] == "does not hold" and "higher here" in cl["burstgpt_low"]["here"]
    assert cl["reversals"]["verdict"] == "does not hold"  # no reversal at all: 3.6% is outside [0, x]
    bc = res["study_form"]["best_changes_with_metric"]
    # orca owns tpot, edf every other metric: each makes every cell "changed" by construction
    forced = {f["metric"]: f for f in bc["forced_by"]}
    assert forced["tpot_p99_s"]["scheduler"] == SCHEDS6[4] and forced["tpot_p99_s"]["n_cells"] == 72
    assert forced["ttft_p99_s"]["scheduler"] == SCHEDS6[0]
    assert forced["tpot_p99_s"]["share_without"] == 0.0  # without tpot, edf wins everything
    assert forced["ttft_p99_s"]["share_without"] == 1.0
    assert bc["share"] == 1.0
    assert cl["best_changes"]["verdict"] == "not comparable"
    # the interval rule: inconclusive when the interval straddles the criterion
    from schedport.analysis.studyform import interval_verdict

    assert interval_verdict(0.85, 0.95, lambda x: x >= 0.9) == "inconclusive"
    assert interval_verdict(0.91, 0.95, lambda x: x >= 0.9) == "holds"
    assert interval_verdict(0.5, 0.8, lambda x: x >= 0.9) == "does not hold"
    # one rule for the study form and the multiverse: an interval that is not finite compares nothing
    assert interval_verdict(float("nan"), 0.95, lambda x: x >= 0.9) == "not comparable"
    assert interval_verdict(None, 0.95, lambda x: x >= 0.9) == "not comparable"
    # one source only: nothing to compare
    one = _compute(make_runs(sources=["azure"], schedulers=SCHEDS6[:4], n_windows=4))
    assert {c["id"]: c["verdict"] for c in one["study_form"]["claims"]}["azure_bailian"] == "not comparable"


def test_the_study_form_is_a_typed_result_that_to_json_writes_as_the_block(planted):
    import dataclasses

    from schedport.analysis.defaults import ABS_THRESHOLD, PRACTICAL_THRESHOLD, Q
    from schedport.analysis.portability import core_steps
    from schedport.analysis.results import Claim, MetricReversals, StudyForm, to_json
    from schedport.analysis.steps import CoreSteps

    runs, res = planted
    core = core_steps(runs, dict(MANIFEST), practical_threshold=PRACTICAL_THRESHOLD, q=Q, n_boot=200, seed=0,
                      metrics=None, abs_threshold=ABS_THRESHOLD, n_splits=200)
    assert isinstance(core, CoreSteps)       # the steps' results by name, frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        core.study_form = None
    sf = core.study_form
    assert isinstance(sf, StudyForm) and all(isinstance(e, MetricReversals) for e in sf.reversals)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sf.claims = ()
    block = json.loads(json.dumps(to_json(sf)))
    assert block == res["study_form"] and list(block) == list(res["study_form"])
    # the fields by name are the numbers written
    for e, w in zip(sf.reversals, res["study_form"]["reversals"]):
        assert (e.metric, e.n_reversals, e.share.statistic, e.share.ci_low, e.share.method) == \
            (w["metric"], w["n_reversals"], w["share"], w["ci_low"], w["ci_method"])
        assert [(i.scheduler_pair, i.region, i.effect_a) for i in e.items] == \
            [(i["scheduler_pair"], i["region"], i["effect_a"]) for i in w["items"]]
    per = next(c for c in sf.claims if c.id == "reversals").per_metric
    assert [p.share for p in per] == [e.share for e in sf.reversals]
    assert sf.best_changes_with_metric.share.statistic == res["study_form"]["best_changes_with_metric"]["share"]
    # a finding without its sources is written with its rule before the (null) numbers
    nc = Claim(id="azure_bailian", study="s", here="h", verdict="not comparable", rule="")
    assert [k for k, _ in nc.json_fields()] == ["id", "study", "here", "verdict", "rule", "value", "ci_low",
                                                "ci_high"]
    assert list(next(c for c in block["claims"] if c["id"] == "azure_bailian")) == \
        ["id", "study", "here", "verdict", "value", "ci_low", "ci_high", "adjusted", "rule"]


def test_subset_run_says_so_in_its_title(tmp_path):
    runs = make_runs(schedulers=SCHEDS6[:4], n_windows=4)
    write_store(tmp_path, runs, manifest={**MANIFEST, "selectors": {"quick": True}})
    res = analyze(tmp_path, n_boot=50, n_splits=50).portability
    assert res["subset"]["is_subset"] and "the --quick selection" in res["subset"]["reasons"]
    html = (tmp_path / "report.html").read_text()
    assert "Subset run" in html[:html.index('id="headline"')]
    assert "<title>schedport portability report (subset run:" in html


def test_abs_threshold_and_splits_flags(tmp_path):
    import typer
    from typer.testing import CliRunner

    from schedport.cli.analyze import analyze_command

    d = write_store(tmp_path / "store", make_runs(schedulers=SCHEDS6[:4], n_windows=4, regions=REGIONS6[:2]))
    app = typer.Typer()
    app.command("analyze")(analyze_command)
    app.command("noop")(lambda: None)
    r = CliRunner().invoke(app, ["analyze", "--results", str(d), "--boot", "50", "--abs-threshold", "0.01",
                                 "--splits", "20"])
    assert r.exit_code == 0, r.output
    on_disk = json.loads((d / "portability.json").read_text())
    assert on_disk["parameters"]["abs_threshold"] == 0.01 and on_disk["parameters"]["n_splits"] == 20
    r = CliRunner().invoke(app, ["analyze", "--results", str(d), "--abs-threshold", "1.5"])
    assert r.exit_code != 0 and "--abs-threshold" in str(r.exception)


# --------------------------------------------------------------------------- bootstrap helpers


def test_boot_wilcoxon_matches_scipy_on_materialised_resamples():
    rng = np.random.default_rng(0)
    N, W, B = 24, 30, 40
    x = rng.normal(0.1, 1, (N, W))
    x[:4, :8] = 0.0  # zeros are dropped
    x[4:9, :10] = np.round(x[4:9, :10])  # ties among |effects|
    x[9:11, 20:] = np.nan  # missing windows
    x[11] = 0.0
    x[12] = np.nan
    counts = rng.multinomial(W, np.ones(W) / W, size=B).astype(float)
    p, med = boot_wilcoxon(x, counts)
    for b in range(B):
        for i in range(N):
            v = np.repeat(x[i], counts[b].astype(int))
            v = v[np.isfinite(v)]
            if v.size == 0:
                assert np.isnan(p[b, i]) and np.isnan(med[b, i])
                continue
            nz = v[v != 0]
            ref = 1.0 if nz.size == 0 else stats.wilcoxon(nz, method="asymptotic").pvalue
            assert p[b, i] == pytest.approx(ref, abs=1e-12)
            assert med[b, i] == pytest.approx(np.median(v), abs=1e-15)


def test_bh_rows_matches_scipy():
    rng = np.random.default_rng(3)
    p = rng.uniform(0, 1, (20, 50)) ** 3
    p[0, :5] = np.nan
    q = bh_rows(p)
    for row, qrow in zip(p, q):
        ok = np.isfinite(row)
        assert np.allclose(qrow[ok], stats.false_discovery_control(row[ok]))
        assert np.isnan(qrow[~ok]).all()
