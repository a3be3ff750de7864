"""The protocol multiverse (`schedport.analysis.multiverse`): each claim under every protocol.

A planted store whose claim holds under one scheduler set and not the other must be found to
depend on that axis; the default protocol must give the study form's own values; the tests and
rankings it adds are checked against scipy and brute force.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from _synthstore import MANIFEST, METRICS_MAIN, REGIONS6, make_runs
from schedport.analysis.multiverse import AXES, RELEVANT, protocol_axes, robustness, tie_ranks
from schedport.analysis.multiverse_reversals import median_bootstrap_p, sign_test_p
from schedport.analysis.portability import compute_portability
from schedport.analysis.store_loading import Study

SCHEDS = ["edf", "hrrn", "ltr", "sjf", "srpt", "static"]


def _static_flips(s, r, m):
    """azure ranks static last, bailian first; every other scheduler in the same order everywhere."""
    if s == "bailian":
        return [1, 2, 3, 4, 5, 0]
    return list(range(6))


@pytest.fixture(scope="module")
def planted():
    runs = make_runs(sources=["azure", "bailian", "burstgpt-modeled"], schedulers=SCHEDS, n_windows=10,
                     regions=REGIONS6[:3], order=_static_flips, spacing=0.25, noise=0.02, seed=3)
    return runs, compute_portability(runs, dict(MANIFEST), n_boot=200, n_splits=100, robustness_boot=100)


def _claim(res, cid):
    return next(c for c in res["robustness"]["claims"] if c["id"] == cid)


def test_a_claim_that_holds_only_without_static_is_found_to_depend_on_the_scheduler_set(planted):
    _, res = planted
    c = _claim(res, "azure_bailian")
    assert c["by_axis"]["scheduler_set"] == {"all": 0.0, "no_static": 1.0}
    assert c["depends_on"][0] == "scheduler_set"
    assert not c["robust"] and c["share_holds"] == pytest.approx(0.5)
    assert c["summary"].startswith("depends on scheduler_set")
    # the study form (all schedulers) says it does not hold; the closest protocol drops static
    sf = next(x for x in res["study_form"]["claims"] if x["id"] == "azure_bailian")
    assert sf["verdict"] == "does not hold"
    assert c["closest"]["protocol"]["scheduler_set"] == "no_static" and c["closest"]["verdict"] == "holds"
    # an axis that cannot move the claim has the same share at every value
    assert len(set(c["by_axis"]["test"].values())) == 1


def test_the_default_protocol_gives_the_study_forms_values(planted):
    _, res = planted
    sf = {x["id"]: x for x in res["study_form"]["claims"]}
    for cid in ("azure_bailian", "burstgpt_low", "metric_agreement", "best_changes"):
        assert _claim(res, cid)["default"]["value"] == pytest.approx(sf[cid]["value"], abs=1e-12), cid
    per = sf["reversals"]["per_metric"]
    d = _claim(res, "reversals")["default"]
    assert d["n_comparisons"] == sum(p["n_comparisons"] for p in per)
    assert d["value"] == pytest.approx(sum(p["n_reversals"] for p in per) / d["n_comparisons"])


def test_the_contract(planted):
    _, res = planted
    rob = res["robustness"]
    assert set(rob["axes"]) == set(AXES)
    assert rob["n_protocols"] == int(np.prod([len(v) for v in rob["axes"].values()])) >= 500
    assert rob["default_protocol"]["test"] == "wilcoxon" and rob["default_protocol"]["bh_level"] == 0.05
    assert [c["id"] for c in rob["claims"]] == list(RELEVANT)
    for c in rob["claims"]:
        assert 0.0 <= c["share_holds"] <= 1.0
        assert set(c["by_axis"]) == set(rob["axes"])
        assert set(c["closest"]) >= {"protocol", "value", "verdict", "n_comparisons"}
        assert sum(c["verdicts"].values()) == pytest.approx(1.0)
        assert len(c["curve"]["value"]) == len(c["curve"]["verdict"]) == c["n_distinct"]
    assert sum(c["n_distinct"] for c in rob["claims"]) >= 500


def test_without_the_multiverse_the_block_says_so():
    runs = make_runs(schedulers=SCHEDS[:4], n_windows=6, metrics=METRICS_MAIN)
    res = compute_portability(runs, dict(MANIFEST), n_boot=50, n_splits=20, robustness=False)
    assert res["robustness"]["available"] is False


def test_axes_drop_what_the_store_cannot_tell_apart():
    runs = make_runs(schedulers=SCHEDS[:4], n_windows=6, metrics=METRICS_MAIN)
    st = Study(runs, None, [])
    axes, default = protocol_axes(st, practical_threshold=0.07, abs_threshold=0.02, q=0.05)
    assert axes["scheduler_set"] == ["all"]             # no static, fastserve or slo-admission here
    assert "survivor" not in axes["metric_set"]          # no survivor-only columns
    assert 0.07 in axes["rel_threshold"] and default["rel_threshold"] == 0.07


def test_the_multiverse_returns_typed_verdicts_written_in_the_blocks_order():
    from schedport.analysis.results import ClaimRobustness, ProtocolVerdict, Robustness, to_json

    runs = make_runs(schedulers=SCHEDS[:4], n_windows=6, metrics=METRICS_MAIN)
    rob = robustness(runs, practical_threshold=0.05, abs_threshold=0.02, q=0.05, n_boot=20)
    assert isinstance(rob, Robustness) and [c.id for c in rob.claims] == list(RELEVANT)
    block = to_json(rob)
    assert list(block) == ["axes", "n_protocols", "default_protocol", "n_boot", "claims", "note"]
    for c, w in zip(rob.claims, block["claims"]):
        assert isinstance(c, ClaimRobustness) and isinstance(c.default, ProtocolVerdict)
        assert list(w)[:3] == ["id", "share_holds", "verdicts"] and list(w["default"]) == ["value", "verdict",
                                                                                           "n_comparisons"]
        assert list(w["closest"])[:5] == ["protocol", "value", "verdict", "n_comparisons", "distance"]
        assert w["default"]["verdict"] == c.default.verdict and w["closest"]["verdict"] == c.closest.result.verdict
        # the specification curve: one point per distinct analysis, sorted by value (undefined last)
        vals = [p.value for p in c.curve.points]
        assert w["curve"] == {"value": vals, "verdict": [p.verdict for p in c.curve.points]}
        defined = [v for v in vals if v is not None]
        assert defined == sorted(defined) and vals[:len(defined)] == defined
    rv = next(c for c in rob.claims if c.id == "reversals")
    assert all(len(m) == 3 for p in rv.curve.points for m in p.per_metric)   # (metric, share, n_comparisons)


def test_tie_ranks_are_average_ranks_without_a_threshold_and_merge_close_values_with_one():
    rng = np.random.default_rng(0)
    x = np.round(rng.random((50, 7)), 1)
    x[0, 2] = np.inf
    r, best = tie_ranks(x, 0.0, True)
    np.testing.assert_array_equal(r, stats.rankdata(x, axis=-1))
    np.testing.assert_array_equal(best, x == x.min(-1, keepdims=True))
    r, best = tie_ranks(np.array([1.0, 1.04, 1.2]), 0.05, False)
    np.testing.assert_array_equal(r, [1.5, 1.5, 3.0])
    np.testing.assert_array_equal(best, [True, True, False])


def test_sign_test_is_scipys_binomial_test():
    for npos, nneg in [(0, 0), (3, 0), (12, 28), (20, 20), (1, 9)]:
        want = stats.binomtest(npos, npos + nneg).pvalue if npos + nneg else 1.0
        assert sign_test_p(np.array(float(npos)), np.array(float(nneg))) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("x", [[0.3, -0.1, 0.2, 0.0, 0.5], [-1, -2, 3, -4, -5], [0.1, 0.2, 0.3, 0.4, 0.5, -0.6]])
def test_the_bootstrap_test_is_the_exact_bootstrap_of_the_lower_median(x):
    x = np.asarray(x, dtype=float)
    n = x.size
    k = -(-n // 2)
    meds = np.array([np.sort(x[list(ix)])[k - 1] for ix in itertools.product(range(n), repeat=n)])
    want = min(1.0, 2 * min((meds <= 0).mean(), (meds >= 0).mean()))
    got = median_bootstrap_p(np.array(float((x <= 0).sum())), np.array(float((x >= 0).sum())), np.array(float(n)))
    assert got == pytest.approx(want, abs=1e-12)


def test_the_report_shows_each_claims_robustness(planted):
    from schedport.report.html import build_html

    _, res = planted
    page = build_html(res)
    sec = page[page.index("id='robustness'"):]
    assert "How robust is each verdict" in sec
    assert sec.count("alt=\"specification curve of") == 5
    # the first screen's verdict column says robust or what the verdict depends on
    claims = page[page.index("id='card-claims'"):page.index("id='robustness'")]
    assert "depends on scheduler_set" in claims and "robust: " in claims  # "robust: <verdict> under all N protocols"


def test_cli_robustness_flags(tmp_path):
    import json
    import subprocess
    import sys

    from _synthstore import write_store

    store = write_store(tmp_path / "s", make_runs(schedulers=SCHEDS[:4], n_windows=6, metrics=METRICS_MAIN))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "schedport.cli", "analyze", "--results", str(store), "--boot",
                               "50", "--splits", "20", *args], capture_output=True, text=True)

    r = cli("--robustness-boot", "0")
    assert r.returncode != 0 and r.stderr.strip() == "error: --robustness-boot must be at least 1, got 0"
    r = cli("--no-robustness")
    assert r.returncode == 0, r.stderr
    assert json.loads((store / "portability.json").read_text())["robustness"]["available"] is False
    r = cli()
    assert r.returncode == 0, r.stderr
    assert "across " in r.stdout and " protocols: " in r.stdout
    assert json.loads((store / "portability.json").read_text())["robustness"]["n_protocols"] >= 500
