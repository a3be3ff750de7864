"""The portability analysis's steps, each on its own, on small hand-built runs tables.

`compute_portability` runs load, duplicates, ranks, concordance, reversals, study form and
claims in order; these tests call one step at a time with inputs small enough to know the
answer by hand.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from schedport.analysis.concordance import best_changes, metric_concordance, source_concordance
from schedport.analysis.duplicates import find_duplicates
from schedport.analysis.portability import check_parameters, main_metrics
from schedport.analysis.ranks import rank_schedulers
from schedport.analysis.reversals import pooled_reversals
from schedport.analysis.store_loading import Study
from schedport.errors import SchedportError


def _runs(value, *, sources=("a",), regions=(("light", 0.3),), schedulers=("x", "y", "z"), n_windows=4,
          metrics=("ttft_p99_s",)) -> pd.DataFrame:
    """One row per (source, window, region, scheduler), seed 0; metric m is value(s, w, k, m)."""
    rows = []
    for s in sources:
        for w in range(n_windows):
            for reg, rho in regions:
                for k, sc in enumerate(schedulers):
                    row = {"source": s, "window_id": w, "region": reg, "scheduler": sc, "seed": 0, "rho": rho}
                    row.update({m: value(s, w, k, m) for m in metrics})
                    rows.append(row)
    return pd.DataFrame(rows)


def _study(df: pd.DataFrame) -> tuple[Study, list[str]]:
    notes: list[str] = []
    return Study(df, None, notes), notes


def test_load_keeps_the_complete_block_and_says_what_it_left_out():
    df = _runs(lambda s, w, k, m: 1.0 + k + w)
    gap = (df.window_id == 2) & (df.scheduler == "z")
    st, notes = _study(df[~gap])
    assert st.block["a"][0].tolist() == [True, True, False, True]
    assert np.isnan(st.values["a"][0, :, 2]).all() and np.isfinite(st.values["a"][0, :, 3]).all()
    assert st.missing_cells == [{"source": "a", "window_id": 2, "region": "light", "scheduler": "z"}]
    assert any("complete block of 3 of 4 windows" in n for n in notes)
    # one complete window left: below MIN_WINDOWS, nothing to analyse
    with pytest.raises(SchedportError, match="2 or more windows"):
        _study(df[~(df.window_id.isin([1, 2, 3]) & (df.scheduler == "z"))])


def test_duplicates_step_drops_a_metric_family_and_joins_identical_schedulers():
    def value(s, w, k, m):
        att = [0.9, 0.5, 0.5][k] - 0.01 * w          # y and z identical everywhere
        if m == "slo_attainment_standard":
            return att
        if m == "goodput_standard_rps":
            return 3.0 * att                         # the same ranking as attainment, measured again
        return [1.0, 2.0, 2.0][k] if w else [3.0, 2.0, 2.0][k]   # ttft: its own ranking (x worst in window 0)

    df = _runs(value, metrics=("ttft_p99_s", "slo_attainment_standard", "goodput_standard_rps"))
    st, notes = _study(df)
    families, dups = find_duplicates(st, notes)
    assert families["groups"] == [["slo_attainment_standard", "goodput_standard_rps"]]
    assert st.metrics == ["ttft_p99_s", "slo_attainment_standard"] and st.values["a"].shape[1] == 2
    assert dups["by_source"] == {"a": [["y", "z"]]}
    assert dups["labels"][0, 0].tolist() == [0, 1, 1]
    assert any("y = z give identical results" in n for n in notes)


def test_ranks_step_ranks_nan_worst_and_draws_seeded_resamples():
    # z is the best where it has a value and NaN in window 0, where it must rank worst
    def value(s, w, k, m):
        return np.nan if (k == 2 and w == 0) else [2.0, 3.0, 1.0][k] + w

    st, notes = _study(_runs(value))
    rk = rank_schedulers(st, 50, np.random.default_rng(3), notes)
    assert rk.point["a"][0, 0].tolist() == [1.75, 2.75, 1.5]        # z: (3 + 1 + 1 + 1) / 4
    assert rk.boot["a"].shape == (50, 1, 1, 3) and len(rk.table) == 3
    assert rk.point_top["a"][0, 0].tolist() == [False, False, True]
    again = rank_schedulers(st, 50, np.random.default_rng(3), [])
    other = rank_schedulers(st, 50, np.random.default_rng(4), [])
    assert np.array_equal(again.counts["a"], rk.counts["a"])
    assert not np.array_equal(other.counts["a"], rk.counts["a"])


def _flipped(schedulers=("x", "y", "z")):
    """Two sources that order x < y < z (ttft) oppositely in each of 8 windows, z's twin w if asked."""
    quality = {"x": 0, "y": 1, "z": 2, "w": 2}

    def value(s, w, k, m):
        q = quality[schedulers[k]]
        return (1.0 + 0.5 * (q if s == "a" else 2 - q)) * (1 + 0.1 * w)

    df = _runs(value, sources=("a", "b"), schedulers=schedulers, n_windows=8)
    st, notes = _study(df)
    _, dups = find_duplicates(st, notes)
    return st, dups


def test_concordance_step_sees_two_sources_rank_in_opposite_orders():
    st, _ = _flipped()
    rk = rank_schedulers(st, 40, np.random.default_rng(0), [])
    sc = source_concordance(st, rk)
    assert sc.pairs == [("a", "b")]
    (entry,) = sc.entries
    assert entry["tau"] == pytest.approx(-1.0) and entry["spearman"] == pytest.approx(-1.0)
    assert entry["top1"] == 0.0 and sc.top_pt[0, 0, 0] == 0.0


@pytest.mark.parametrize("schedulers", [("x", "y", "z"), ("x", "y", "z", "w")])
def test_reversals_step_counts_each_flipped_pair_once(schedulers):
    st, dups = _flipped(schedulers)
    rev = pooled_reversals(st, 0.05, 0.02, 0.05, dups["labels"])
    s = rev.summary
    # x-y, x-z, y-z flip between the sources; w (z's twin) adds no comparison and no reversal
    assert s.n_comparisons == 3 and s.n_significant_practical == 3
    # schedulers are sorted, so w (first) stands for the pair of twins
    twins = len(schedulers) == 4
    assert sorted(d.pair for d in s.items) == (["w = z vs x", "w = z vs y", "x vs y"] if twins
                                                     else ["x vs y", "x vs z", "y vs z"])
    assert all(d.q_a <= 0.05 and d.effect_a * d.effect_b < 0 for d in s.items)
    assert s.cross_source["by_region"]["light"]["rate"] == 1.0
    assert rev.headline.share.statistic == 1.0 and s.share.ci_low < 1.0 == s.share.ci_high


@pytest.mark.parametrize("same_best", [True, False])
def test_best_changes_step_when_the_metrics_disagree_on_the_best(same_best):
    def value(s, w, k, m):
        if m == "e2e_mean_s" and not same_best:
            return [3.0, 1.0, 2.0][k] + w                # y best on e2e, x best on ttft
        return [1.0, 2.0, 3.0][k] + w

    st, notes = _study(_runs(value, metrics=("ttft_p99_s", "e2e_mean_s")))
    main, mi = main_metrics(st, notes)
    assert main == ["ttft_p99_s", "e2e_mean_s"] and any("Main metrics absent" in n for n in notes)
    rk = rank_schedulers(st, 30, np.random.default_rng(0), notes)
    bc = best_changes(st, rk, metric_concordance(st, rk, mi), mi, notes)
    assert bc.value == (0.0 if same_best else 1.0)
    est = bc.share   # a result object: the share with its interval, what it counts and its definition
    assert est.statistic == bc.value and 0.0 <= est.ci_low <= est.ci_high <= 1.0
    assert est.of("n_changed") == (0 if same_best else est.of("n_conditions")) and est.of("n_conditions") > 0
    assert [k for k, _ in est.json_fields()][:5] == ["value", "ci_low", "ci_high", "boot_bias", "n_conditions"]
    assert bc.conditions[0]["best"] == {"ttft_p99_s": ["x"], "e2e_mean_s": ["x" if same_best else "y"]}
    # written in full with the pairwise share and the conditions after the share's own keys
    assert [k for k, _ in bc.detailed().json_fields()][-3:] == ["definition", "pairwise", "conditions"]
    assert bc.detailed().of("pairwise") is bc.pairwise


@pytest.mark.parametrize("bad, flag", [(dict(q=1.0), "q must"), (dict(n_boot=0), "n_boot"),
                                       (dict(practical_threshold=-0.1), "practical threshold"),
                                       (dict(abs_threshold=1.0), "absolute threshold"),
                                       (dict(n_splits=0), "n_splits")])
def test_parameters_are_refused_before_any_work(bad, flag):
    good = dict(practical_threshold=0.05, q=0.05, n_boot=10, abs_threshold=0.02, n_splits=10)
    check_parameters(**good)
    with pytest.raises(SchedportError, match=flag):
        check_parameters(**{**good, **bad})
