"""Reversals: where a scheduler pair's order flips between two conditions (pooled analysis).

For every scheduler pair, metric and (source, region) condition: the per-window effects (the
relative effect, or the absolute difference for a bounded metric), the condition's median
effect and its two-sided Wilcoxon signed-rank p-value; Benjamini-Hochberg over every test
made. A reversal between two conditions (two sources at one region, or two regions at one
source) is counted when the median effects have opposite signs, both q <= q and both
|effects| reach the practical threshold; a comparison repeated through a duplicate
scheduler counts once. The method is in `schedport.analysis.portability`; the study form
(`schedport.analysis.studyform`) reuses the per-test arrays (`ReversalTests`); the results are
the types of `schedport.analysis.results`.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Optional

import numpy as np

from schedport.analysis.directions import metric_is_bounded
from schedport.analysis.duplicates import pair_keys, pair_label
from schedport.analysis.results import (WILSON, Estimate, PooledReversals, Reversal, ReversalHeadline,
                                        ReversalSummary, ReversalTests, Top)
from schedport.analysis.stats import (bh_adjust, bh_by_group, pair_index, relative_effect, wilcoxon_pvalues,
                                      wilson_interval)
from schedport.analysis.store_loading import Study


def reversal_tests(st: Study, thr: float, abs_thr: float, q: float, labels: np.ndarray) -> ReversalTests:
    """Every per-condition paired test: effects, Wilcoxon p-values, medians, BH q-values.

    Arrays are (S, R, M, P) over sources, regions, metrics and scheduler pairs (``eff`` has the
    windows last). A test is made per condition, metric and *distinct* pair: twins are no
    test, and a pair that repeats another through a duplicate takes that test's q-values
    (``test_rep``). ``q_all`` is BH over every test at once (the pooled analysis), ``q_metric``
    BH within each metric (the study form); ``sigprac`` marks tests with q <= q and
    |median effect| at least the practical threshold (``thr_m``, per metric).
    """
    S, R, M, K = len(st.sources), len(st.regions), len(st.metrics), len(st.schedulers)
    I, J = pair_index(K)
    P = len(I)
    Wmax = max(len(st.windows[s]) for s in st.sources)
    bounded = np.array([metric_is_bounded(m) for m in st.metrics])
    thr_m = np.where(bounded, abs_thr, thr)  # (M,)
    eff = np.full((S, R, M, P, Wmax), np.nan)
    for si, s in enumerate(st.sources):
        v = st.values[s]  # (R, M, W, K), NaN outside the complete block
        a, b = v[..., I], v[..., J]  # (R, M, W, P)
        rel = relative_effect(a, b, 1)
        absd = np.where(np.isfinite(a) & np.isfinite(b), a - b, np.nan)
        e = np.where(bounded[None, :, None, None], absd, rel) * st.direction[None, :, None, None]
        eff[si, :, :, :, : v.shape[2]] = e.transpose(0, 1, 3, 2)
    # a test per (condition, metric, distinct pair): twins are no test, a duplicate pair is its representative
    test_rep = np.empty((S, R, P), dtype=np.int64)
    for si in range(S):
        for r in range(R):
            test_rep[si, r] = pair_keys(labels[si, r], None, I, J, K)
    flat = eff.reshape(-1, Wmax)
    p, n_used = wilcoxon_pvalues(flat)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ok_rows = n_used > 0
        med = np.where(ok_rows, np.nanmedian(np.where(ok_rows[:, None], flat, 0.0), axis=1), np.nan)
        mean = np.where(ok_rows, np.nanmean(np.where(ok_rows[:, None], flat, 0.0), axis=1), np.nan)
    shape = (S, R, M, P)
    p, med, mean, n_used = (x.reshape(shape) for x in (p, med, mean, n_used))
    rep_b = np.broadcast_to(test_rep[:, :, None, :], shape)
    is_rep = rep_b == np.arange(P)
    made = (n_used > 0) & (rep_b >= 0)
    distinct = made & is_rep
    # q over the distinct tests (all at once for the pooled analysis, per metric for the study form)
    q_all = np.full(shape, np.nan)
    q_all[distinct] = bh_adjust(p[distinct])
    metric_of = np.broadcast_to(np.arange(M)[None, None, :, None], shape)
    q_met = np.full(shape, np.nan)
    q_met[distinct] = bh_by_group(p[distinct], metric_of[distinct])
    src_ix = np.broadcast_to(np.arange(S)[:, None, None, None], shape)
    reg_ix = np.broadcast_to(np.arange(R)[None, :, None, None], shape)
    met_ix = metric_of
    safe_rep = np.where(rep_b >= 0, rep_b, 0)
    q_all = np.where(made, q_all[src_ix, reg_ix, met_ix, safe_rep], np.nan)
    q_met = np.where(made, q_met[src_ix, reg_ix, met_ix, safe_rep], np.nan)
    sign = np.sign(med)
    n_tests = int(distinct.sum())
    n_sig = int((distinct & (q_all <= q)).sum())
    n_raw = int((distinct & (p <= q)).sum())
    sigprac = made & (q_all <= q) & (np.abs(med) >= thr_m[None, None, :, None])
    return ReversalTests(eff=eff, p=p, med=med, mean=mean, n_used=n_used, made=made, distinct=distinct,
                         test_rep=test_rep, q_all=q_all, q_metric=q_met, sign=sign, sigprac=sigprac,
                         n_tests=n_tests, n_sig=n_sig, n_raw=n_raw, thr_m=thr_m, bounded=bounded, I=I, J=J)


class ReversalCounter:
    """Counts the comparisons of two conditions and collects their reversals, with breakdowns.

    `add` compares two conditions on every metric and distinct pair tested in both; the
    counters (comparisons and reversals by region, source pair, region pair, source, scheduler
    pair, metric) feed `reversal_summary`.
    """

    def __init__(self, st: Study, tests: ReversalTests, labels: np.ndarray):
        self.st, self.t, self.labels = st, tests, labels
        self.items: list[Reversal] = []
        self.n_comp = {"source": 0, "region": 0}
        self.comp_region, self.comp_src_pair, self.comp_reg_pair, self.comp_source = (Counter(), Counter(),
                                                                                      Counter(), Counter())
        self.by_region, self.by_source_pair, self.by_region_pair, self.by_source = (Counter(), Counter(),
                                                                                    Counter(), Counter())
        self.by_sched, self.by_metric = Counter(), Counter()
        self.map_counts = Counter()

    def add(self, kind: str, s1: int, r1: int, s2: int, r2: int) -> None:
        """Compare condition (s1, r1) with (s2, r2); `kind` "source" (one region) or "region" (one source)."""
        st, t, labels = self.st, self.t, self.labels
        I, J = t.I, t.J
        made, sigprac, sign = t.made, t.sigprac, t.sign
        rep = pair_keys(labels[s1, r1], labels[s2, r2], I, J, len(st.schedulers))
        keep = rep == np.arange(len(I))
        both = made[s1, r1] & made[s2, r2] & keep[None, :]
        nc = int(both.sum())
        self.n_comp[kind] += nc
        if kind == "source":
            self.comp_region[st.regions[r1]] += nc
            self.comp_src_pair[f"{st.sources[s1]} vs {st.sources[s2]}"] += nc
        else:
            self.comp_reg_pair[f"{st.regions[r1]} vs {st.regions[r2]}"] += nc
            self.comp_source[st.sources[s1]] += nc
        hit = both & sigprac[s1, r1] & sigprac[s2, r2] & (sign[s1, r1] * sign[s2, r2] < 0)
        for m, pp in zip(*np.nonzero(hit)):
            A = pair_label(st, int(I[pp]), labels[s1, r1], labels[s2, r2])
            Bn = pair_label(st, int(J[pp]), labels[s1, r1], labels[s2, r2])
            sa, sb, ra, rb = st.sources[s1], st.sources[s2], st.regions[r1], st.regions[r2]
            pair = f"{A} vs {Bn}"
            self.items.append(self._item(kind, m, pp, (s1, r1), (s2, r2), pair))
            self.by_sched[pair] += 1
            self.by_metric[st.metrics[m]] += 1
            if kind == "source":
                self.by_region[ra] += 1
                self.by_source_pair[f"{sa} vs {sb}"] += 1
                self.map_counts[(pair, ra)] += 1
            else:
                self.by_region_pair[f"{ra} vs {rb}"] += 1
                self.by_source[sa] += 1

    def _item(self, kind: str, m: int, pp: int, c1: tuple, c2: tuple, pair: str) -> Reversal:
        """One reversal's entry: both conditions' effects, p- and q-values and better scheduler."""
        st, t = self.st, self.t
        (s1, r1), (s2, r2) = c1, c2
        I, J, med, mean, p, q_all, n_used = t.I, t.J, t.med, t.mean, t.p, t.q_all, t.n_used
        return Reversal(
            kind=kind, scheduler_a=st.schedulers[I[pp]], scheduler_b=st.schedulers[J[pp]],
            pair=pair, metric=st.metrics[m], effect_scale="absolute" if t.bounded[m] else "relative",
            source_a=st.sources[s1], region_a=st.regions[r1], source_b=st.sources[s2], region_b=st.regions[r2],
            effect_a=med[s1, r1, m, pp], effect_b=med[s2, r2, m, pp],
            mean_effect_a=mean[s1, r1, m, pp], mean_effect_b=mean[s2, r2, m, pp],
            p_a=p[s1, r1, m, pp], p_b=p[s2, r2, m, pp],
            q_a=q_all[s1, r1, m, pp], q_b=q_all[s2, r2, m, pp],
            n_windows_a=n_used[s1, r1, m, pp], n_windows_b=n_used[s2, r2, m, pp],
            better_a=st.schedulers[I[pp]] if med[s1, r1, m, pp] > 0 else st.schedulers[J[pp]],
            better_b=st.schedulers[I[pp]] if med[s2, r2, m, pp] > 0 else st.schedulers[J[pp]],
        )


def _table(hits: Counter, comps: Counter, total: int, order: Optional[list] = None) -> dict:
    """A breakdown: per key its reversals, comparisons, share of all reversals and rate."""
    keys = order if order is not None else sorted(set(hits) | set(comps), key=lambda k: (-hits[k], k))
    return {k: {"n_reversals": int(hits.get(k, 0)), "n_comparisons": int(comps.get(k, 0)),
                "share_of_reversals": (hits.get(k, 0) / total) if total else None,
                "rate": (hits.get(k, 0) / comps[k]) if comps.get(k) else None} for k in keys}


def _top(c: Counter, total: int) -> Optional[Top]:
    """The key with the most reversals (ties: the largest key) and its share; None if none."""
    if not c:
        return None
    k, v = max(c.items(), key=lambda kv: (kv[1], kv[0]))
    return Top(key=k, count=v, share_of_reversals=v / total if total else None)


def _ordered(c: Counter) -> dict:
    """Counts by decreasing count, then key."""
    return {k: int(c[k]) for k in sorted(c, key=lambda k: (-c[k], k))}


def reversal_summary(st: Study, tests: ReversalTests, rc: ReversalCounter) -> tuple[ReversalSummary,
                                                                                      ReversalHeadline]:
    """The pooled ``reversals`` block of portability.json and its headline, from the counted reversals
    (`rc.items` already strongest first)."""
    items, n_comp = rc.items, rc.n_comp
    n_rev = len(items)
    n_comp_all = n_comp["source"] + n_comp["region"]
    lo, hi = wilson_interval(n_rev, n_comp_all)
    share = Estimate(n_rev / n_comp_all if n_comp_all else None, lo, hi, WILSON, replicated=False)
    n_src = sum(1 for d in items if d.kind == "source")
    n_reg = n_rev - n_src
    src_pair_keys = [f"{a} vs {b}" for i, a in enumerate(st.sources) for b in st.sources[i + 1:]]
    reg_pair_keys = [f"{a} vs {b}" for i, a in enumerate(st.regions) for b in st.regions[i + 1:]]
    summary = ReversalSummary(
        n_tests=tests.n_tests,
        n_tests_raw_p_below_q=tests.n_raw,
        n_tests_significant=tests.n_sig,
        n_tests_significant_practical=int((tests.sigprac & tests.distinct).sum()),
        n_comparisons=n_comp_all,
        n_significant_practical=n_rev,
        share=share,
        by_kind={"source": {"n_reversals": n_src, "n_comparisons": n_comp["source"],
                            "rate": n_src / n_comp["source"] if n_comp["source"] else None},
                 "region": {"n_reversals": n_reg, "n_comparisons": n_comp["region"],
                            "rate": n_reg / n_comp["region"] if n_comp["region"] else None}},
        cross_source={
            "n_comparisons": n_comp["source"], "n_reversals": n_src,
            "by_region": _table(rc.by_region, rc.comp_region, n_src, st.regions),
            "by_source_pair": _table(rc.by_source_pair, rc.comp_src_pair, n_src, src_pair_keys),
        },
        cross_region={
            "n_comparisons": n_comp["region"], "n_reversals": n_reg,
            "by_region_pair": _table(rc.by_region_pair, rc.comp_reg_pair, n_reg, reg_pair_keys),
            "by_source": _table(rc.by_source, rc.comp_source, n_reg, st.sources),
        },
        by_scheduler_pair=_ordered(rc.by_sched),
        by_metric=_ordered(rc.by_metric),
        map=[{"scheduler_pair": k[0], "region": k[1], "count": v} for k, v in sorted(rc.map_counts.items())],
        items=items,
    )
    headline = ReversalHeadline(
        n_comparisons=n_comp_all,
        n_significant_practical=n_rev,
        share=share,
        n_tests=tests.n_tests,
        n_cross_source=n_src,
        n_cross_region=n_reg,
        top_region=_top(rc.by_region, n_src),
        top_source_pair=_top(rc.by_source_pair, n_src),
        top_scheduler_pair=_top(rc.by_sched, n_rev),
        top_metric=_top(rc.by_metric, n_rev),
    )
    return summary, headline


def pooled_reversals(st: Study, thr: float, abs_thr: float, q: float, labels: np.ndarray) -> PooledReversals:
    """The reversals step: per-condition paired tests, BH over all of them, and the cross-condition
    reversals (pooled: every metric, cross-source and cross-region).

    Returns the pooled ``summary`` and ``headline`` and, as ``tests``, the per-test arrays
    (effects, p-values, medians, test representatives) that the study form reuses.
    """
    S, R = len(st.sources), len(st.regions)
    tests = reversal_tests(st, thr, abs_thr, q, labels)
    rc = ReversalCounter(st, tests, labels)
    for r in range(R):
        for s1 in range(S):
            for s2 in range(s1 + 1, S):
                rc.add("source", s1, r, s2, r)
    for s in range(S):
        for r1 in range(R):
            for r2 in range(r1 + 1, R):
                rc.add("region", s, r1, s, r2)
    # strongest flips first: by the smaller of the two |median effects| relative to its threshold
    rc.items.sort(key=lambda d: -min(abs(d.effect_a), abs(d.effect_b))
                  / (abs_thr if d.effect_scale == "absolute" else max(thr, 1e-12)))
    summary, headline = reversal_summary(st, tests, rc)
    return PooledReversals(summary=summary, headline=headline, tests=tests)
