"""The study's own form: per-metric cross-source reversals, best changes per window, noise ceilings, claims.

`schedport.analysis.portability.compute_portability` calls `study_form` with the arrays it has already
built (per-condition tests, within-window ranks, the bootstrap resamples of windows) and puts
the result under ``portability.json``'s ``study_form`` key; the fields are documented in the
analysis module's docstring. Everything here is a pure function of its arguments.

The bootstrap of a reversal share redoes the whole chain on every resample of windows: the
median effect of every (condition, scheduler pair), its Wilcoxon p-value, Benjamini-Hochberg
within the metric, and the count of cross-source sign flips. A resample repeats windows, so its
effects are tied and the Wilcoxon p-value is the normal approximation with tie correction
(which is what ``scipy.stats.wilcoxon`` uses for tied data); it is computed here from window
counts without materialising the resamples (`boot_wilcoxon`), checked against scipy in tests.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
from scipy import special

from schedport.analysis.results import (PERCENTILE, PERCENTILE_REDONE, CeilingClaim, Claim, CrossSourceHalf,
                                        Estimate, Flip, ForcedBest, HalfPair, HighLoad, MetricReversals,
                                        MetricVerdict, PairwiseBestChanges, ReversalClaim, SplitHalf, StudyForm,
                                        WindowBestChanges)
from schedport.workload.corpus_manifest import MODELED_ADAPTER, find_builtin

if TYPE_CHECKING:
    from schedport.analysis.results import ReversalTests

__all__ = ["boot_wilcoxon", "bh_rows", "window_best_changes", "split_half", "study_form", "claims", "interval_verdict",
           "STUDY_FINDINGS"]

#: The original study's findings, as its report states them (DESIGN.md), with the numbers compared.
STUDY_FINDINGS = {
    "azure_bailian": "Azure vs Bailian: almost perfect rank agreement (Kendall tau)",
    "burstgpt_low": "pairs that include BurstGPT agree as little as tau = 0.55",
    "reversals": "3.6% of about 1,000 pairwise comparisons reversed (significant and large enough to matter), "
                 "clustered at high load, all with the same scheduler pair and BurstGPT on one side",
    "metric_agreement": "agreement across metrics only moderate",
    "best_changes": "the single best scheduler changes with the metric in 68.1% of conditions",
}
NEAR_PERFECT = 0.9
STUDY_LOW_TAU = 0.55
STUDY_SHARE = 0.036
MODERATE = (0.3, 0.7)
STUDY_BEST_CHANGES = 0.681
HIGH_LOAD_RHO = 0.8
CLUSTER_FACTOR = 2.0


def boot_wilcoxon(x: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Wilcoxon p-values (normal approximation, tie-corrected) and medians of resampled rows.

    `x` (N, W): per-window effects of N tests (NaN = missing window); `counts` (B, W): how often
    each window is drawn in each of B resamples. Returns (p, median), each (B, N): the values
    ``scipy.stats.wilcoxon(method="asymptotic")`` and ``numpy.nanmedian`` give on the resampled
    rows (zeros dropped, p = 1 when no nonzero effect is drawn, NaN when no finite one is).
    """
    x = np.asarray(x, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float32)  # small integers: exact in float32
    N, W = x.shape
    finite = np.isfinite(x)
    nz = finite & (x != 0)
    ar = np.arange(W)
    # signed ranks of |x| with ties averaged, weighted by the draw counts
    a = np.where(nz, np.abs(x), np.inf)
    order = np.argsort(a, axis=1, kind="stable")
    a_s = np.take_along_axis(a, order, 1)
    sgn_s = np.take_along_axis(np.where(nz, np.sign(x), 0.0), order, 1).astype(np.float32)
    nz_s = np.take_along_axis(nz, order, 1)
    start = np.ones((N, W), dtype=bool)
    start[:, 1:] = a_s[:, 1:] != a_s[:, :-1]
    tied_row = (~start & nz_s).any(axis=1)
    c = counts[:, order]  # (B, N, W)
    if not nz_s.all():
        c = c * nz_s
    C = np.cumsum(c, axis=2)
    cpos = c * (sgn_s > 0)
    # untied rows: a window's draws form their own tie group, average rank C - c/2 + 1/2
    r_plus = (cpos * (C - 0.5 * c + 0.5)).sum(axis=2, dtype=np.float64)
    tie = (c * c * c - c).sum(axis=2, dtype=np.float64)
    if tied_row.any():
        t = np.flatnonzero(tied_row)
        end = np.ones((t.size, W), dtype=bool)
        end[:, :-1] = start[t, 1:]
        gs = np.maximum.accumulate(np.where(start[t], ar, 0), axis=1)
        ge = np.minimum.accumulate(np.where(end, ar, W - 1)[:, ::-1], axis=1)[:, ::-1]
        Ct, ct = C[:, t], c[:, t]
        bt = np.take_along_axis(Ct - ct, np.broadcast_to(gs, Ct.shape), 2)
        Gt = np.take_along_axis(Ct, np.broadcast_to(ge, Ct.shape), 2) - bt
        r_plus[:, t] = (cpos[:, t] * (bt + (Gt + 1.0) / 2.0)).sum(axis=2, dtype=np.float64)
        # each tie group's term once, at its first member
        g = Gt.astype(np.float64)
        first = np.broadcast_to(start[t] & nz_s[t], Ct.shape)
        tie[:, t] = np.where(first, g ** 3 - g, 0.0).sum(axis=2)
    n = C[..., -1].astype(np.float64)
    var = (n * (n + 1) * (2 * n + 1) - tie / 2.0) / 24.0
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (r_plus - n * (n + 1) / 4.0) / np.sqrt(np.maximum(var, 0.0))
    p = np.clip(2.0 * special.ndtr(-np.abs(z)), 0.0, 1.0)
    p = np.where(n > 0, p, 1.0)
    # medians of the finite effects drawn
    o2 = np.argsort(np.where(finite, x, np.inf), axis=1, kind="stable")
    xs = np.take_along_axis(np.where(finite, x, 0.0), o2, 1)
    c2 = counts[:, o2]
    if not finite.all():
        c2 = c2 * np.take_along_axis(finite, o2, 1)
    C2 = np.cumsum(c2, axis=2)
    n2 = C2[..., -1]
    k1 = np.floor((n2 - 1) / 2.0)
    k2 = np.floor(n2 / 2.0)
    j1 = (C2 > k1[..., None]).argmax(axis=2)
    j2 = (C2 > k2[..., None]).argmax(axis=2)
    rows = np.arange(N)[None, :]
    med = (xs[rows, j1] + xs[rows, j2]) / 2.0
    used = n2 > 0
    return np.where(used, p, np.nan), np.where(used, med, np.nan)


def bh_rows(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg q-values along the last axis of a 2-d array (each row one family; NaN stays NaN)."""
    p = np.asarray(p, dtype=np.float64)
    Bn, m = p.shape
    nan = np.isnan(p)
    pp = np.where(nan, np.inf, p)
    order = np.argsort(pp, axis=1, kind="stable")
    ps = np.take_along_axis(pp, order, 1)
    mcount = (~nan).sum(axis=1, keepdims=True)
    scaled = np.where(np.isfinite(ps), ps * mcount / np.arange(1, m + 1), np.inf)
    qs = np.clip(np.minimum.accumulate(scaled[:, ::-1], axis=1)[:, ::-1], 0.0, 1.0)
    out = np.empty_like(qs)
    np.put_along_axis(out, order, qs, 1)
    return np.where(nan, np.nan, out)


def _pct(boot: np.ndarray, level: float = 0.95) -> tuple[Optional[float], Optional[float]]:
    b = np.asarray(boot, dtype=np.float64)
    b = b[np.isfinite(b)]
    if b.size == 0:
        return None, None
    lo, hi = np.percentile(b, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


# --------------------------------------------------------------------------- reversals per metric


def _reversal_share_bootstrap(st, raw: ReversalTests, m: int, counts: dict, q: float, thr: float,
                              comps: list) -> np.ndarray:
    """The reversal share of metric `m` on each window resample: the Wilcoxon tests, BH and
    reversal counts redone on every bootstrap replicate, with the same resamples as every other
    interval (`counts`). `comps` lists the (region, source, source, pairs compared) of the point
    estimate, so a replicate compares exactly the pairs the point estimate did."""
    S, R = len(st.sources), len(st.regions)
    P = len(raw.I)
    made, distinct, test_rep = raw.made[:, :, m], raw.distinct[:, :, m], raw.test_rep
    B = next(iter(counts.values())).shape[0]
    p_b = np.full((B, S, R, P), np.nan)
    med_b = np.full((B, S, R, P), np.nan)
    for si, s in enumerate(st.sources):
        W = counts[s].shape[1]
        for r in range(R):
            rows = raw.eff[si, r, m, :, :W]
            if not np.isfinite(rows).any():
                continue
            pb, mb = boot_wilcoxon(rows, counts[s])
            p_b[:, si, r], med_b[:, si, r] = pb, mb
    dmask = distinct.reshape(-1)
    q_b_flat = np.full((B, S * R * P), np.nan)
    if dmask.any():
        q_b_flat[:, dmask] = bh_rows(p_b.reshape(B, -1)[:, dmask])
    q_b = q_b_flat.reshape(B, S, R, P)
    si_ix = np.arange(S)[:, None, None]
    r_ix = np.arange(R)[None, :, None]
    rep_ix = np.where(test_rep >= 0, test_rep, 0)
    q_b = q_b[:, si_ix, r_ix, rep_ix]
    made_b = made[None] & np.isfinite(med_b)
    sig_b = made_b & (q_b <= q) & (np.abs(med_b) >= thr)
    sign_b = np.sign(med_b)
    nrev_b = np.zeros(B)
    ncomp_b = np.zeros(B)
    for r, s1, s2, both in comps:
        bb = both[None] & made_b[:, s1, r] & made_b[:, s2, r]
        ncomp_b += bb.sum(axis=1)
        nrev_b += (bb & sig_b[:, s1, r] & sig_b[:, s2, r] & (sign_b[:, s1, r] * sign_b[:, s2, r] < 0)).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        share_b = np.where(ncomp_b > 0, nrev_b / np.maximum(ncomp_b, 1), np.nan)
    return share_b


def _reversals_for_metric(ctx: dict, m: int, counts: dict, q: float) -> MetricReversals:
    """Cross-source reversals of one main metric: point counts, breakdowns and their window bootstrap."""
    st, raw, labels = ctx["st"], ctx["raw"], ctx["labels"]
    pair_keys, pair_label = ctx["pair_keys"], ctx["pair_label"]
    S, R, K = len(st.sources), len(st.regions), len(st.schedulers)
    I, J = raw.I, raw.J
    P = len(I)
    thr = float(raw.thr_m[m])
    made, med, qm = raw.made[:, :, m], raw.med[:, :, m], raw.q_metric[:, :, m]
    distinct = raw.distinct[:, :, m]
    sig = made & (qm <= q) & (np.abs(med) >= thr)
    sign = np.sign(med)
    comps = []  # (r, s1, s2, keep mask over pairs)
    n_comp, hits = 0, []
    by_region, by_pair_src, by_sched = {}, {}, {}
    comp_region, comp_pair_src = {}, {}
    for r in range(R):
        for s1 in range(S):
            for s2 in range(s1 + 1, S):
                rep = pair_keys(labels[s1, r], labels[s2, r], I, J, K)
                both = made[s1, r] & made[s2, r] & (rep == np.arange(P))
                comps.append((r, s1, s2, both))
                nc = int(both.sum())
                n_comp += nc
                reg, sp = st.regions[r], f"{st.sources[s1]} vs {st.sources[s2]}"
                comp_region[reg] = comp_region.get(reg, 0) + nc
                comp_pair_src[sp] = comp_pair_src.get(sp, 0) + nc
                flip = both & sig[s1, r] & sig[s2, r] & (sign[s1, r] * sign[s2, r] < 0)
                for pp in np.flatnonzero(flip):
                    pair = (f"{pair_label(st, int(I[pp]), labels[s1, r], labels[s2, r])} vs "
                            f"{pair_label(st, int(J[pp]), labels[s1, r], labels[s2, r])}")
                    hits.append(Flip(scheduler_pair=pair, scheduler_a=st.schedulers[int(I[pp])],
                                     scheduler_b=st.schedulers[int(J[pp])], region=reg, source_a=st.sources[s1],
                                     source_b=st.sources[s2], effect_a=float(med[s1, r, pp]),
                                     effect_b=float(med[s2, r, pp]), q_a=float(qm[s1, r, pp]),
                                     q_b=float(qm[s2, r, pp])))
                    by_region[reg] = by_region.get(reg, 0) + 1
                    by_pair_src[sp] = by_pair_src.get(sp, 0) + 1
                    by_sched[pair] = by_sched.get(pair, 0) + 1
    n_rev = len(hits)
    share = n_rev / n_comp if n_comp else None

    share_b = _reversal_share_bootstrap(st, raw, m, counts, q, thr, comps)
    lo, hi = _pct(share_b)

    rho = st.rho
    high = [r for r in st.regions if rho.get(r) is not None and rho[r] >= HIGH_LOAD_RHO]
    n_high = sum(by_region.get(r, 0) for r in high)
    c_high = sum(comp_region.get(r, 0) for r in high)
    c_low = n_comp - c_high
    rate_high = n_high / c_high if c_high else None
    rate_low = (n_rev - n_high) / c_low if c_low else None
    sources_every = None
    if hits:
        common = set(st.sources)
        for h in hits:
            common &= {h.source_a, h.source_b}
        sources_every = sorted(common)

    def _table(hitd: dict, compd: dict, keys: list) -> dict:
        return {k: {"n_reversals": int(hitd.get(k, 0)), "n_comparisons": int(compd.get(k, 0)),
                    "share_of_reversals": hitd.get(k, 0) / n_rev if n_rev else None,
                    "rate": hitd.get(k, 0) / compd[k] if compd.get(k) else None} for k in keys}

    src_pairs = [f"{a} vs {b}" for i, a in enumerate(st.sources) for b in st.sources[i + 1:]]
    hits.sort(key=lambda d: -min(abs(d.effect_a), abs(d.effect_b)))
    return MetricReversals(
        metric=st.metrics[m],
        effect_scale="absolute" if raw.bounded[m] else "relative",
        practical_threshold=thr,
        n_tests=int(distinct.sum()),
        n_comparisons=n_comp,
        n_reversals=n_rev,
        share=Estimate(share, lo, hi, PERCENTILE_REDONE),
        boot_mean=float(np.nanmean(share_b)) if np.isfinite(share_b).any() else None,
        by_region=_table(by_region, comp_region, list(st.regions)),
        by_source_pair=_table(by_pair_src, comp_pair_src, src_pairs),
        by_scheduler_pair={k: by_sched[k] for k in sorted(by_sched, key=lambda k: (-by_sched[k], k))},
        one_scheduler_pair=(len(by_sched) == 1) if hits else None,
        sources_on_every_reversal=sources_every,
        one_source=bool(sources_every) if hits else None,
        high_load=HighLoad(rho_min=HIGH_LOAD_RHO, regions=high, n_reversals=n_high, n_comparisons=c_high,
                           share_of_reversals=n_high / n_rev if n_rev else None, rate=rate_high,
                           rate_elsewhere=rate_low),
        items=tuple(hits),
    )


# --------------------------------------------------------------------------- best changes per window


def window_best_changes(st, ranks: dict, valid: dict, mi: Sequence[int], counts: dict) -> WindowBestChanges:
    """Best scheduler changes with the metric, per (window, region), and the pairwise variant.

    In a window (of a condition's complete block) the best scheduler on a metric is the set tied
    for rank 1. The window changes when no scheduler is best on every main metric; the pairwise
    variant counts (window, main-metric pair) whose best sets are disjoint. Shares are means of
    per-window indicators over all sources and regions; their interval is the percentile
    bootstrap over windows. ``forced_by`` lists (metric, scheduler) where one scheduler is the sole
    best on that metric in every window and in no window best on every other main metric: the
    share is then 100% by construction, whatever the other metrics do; each entry carries the
    share without that metric (``share_without`` and its interval).
    """
    mi = list(mi)
    Mm = len(mi)
    tops = {}
    for s in st.sources:
        rk = ranks[s][:, mi]  # (R, Mm, W, K)
        ok = valid[s][:, mi]  # (R, Mm, W)
        top = (rk == rk.min(axis=-1, keepdims=True)) & ok[..., None]
        tops[s] = (top, ok.all(axis=1))
    K = len(st.schedulers)
    forced = []
    for a in range(Mm):
        others = [x for x in range(Mm) if x != a]
        for k in range(K):
            every, n_cells = True, 0
            for s in st.sources:
                top, okw = tops[s]
                if okw.any():
                    t = top[:, a][okw]  # (cells, K)
                    wins_rest = top[..., k][:, others].all(axis=1)[okw] if others else np.ones(int(okw.sum()), bool)
                    every &= bool(t[:, k].all() and (t.sum(axis=1) == 1).all() and not wins_rest.any())
                    n_cells += int(okw.sum())
            if every and n_cells:
                forced.append((a, st.schedulers[k], n_cells))

    def _share(use: list) -> WindowBestChanges:
        num = den = 0.0
        pnum = pden = 0.0
        B = next(iter(counts.values())).shape[0]
        bnum, bden, bpn, bpd = (np.zeros(B) for _ in range(4))
        ps: dict = {}
        for s in st.sources:
            top, okw = tops[s]
            t = top[:, use]
            changed = ~t.all(axis=1).any(axis=-1) & okw  # (R, W)
            pairs = [(i, j) for i in range(len(use)) for j in range(i + 1, len(use))]
            dis = np.zeros(okw.shape)
            for i, j in pairs:
                dis += (~(t[:, i] & t[:, j]).any(axis=-1)) & okw
            wn = changed.sum(axis=0).astype(float)  # per window over regions
            wd = okw.sum(axis=0).astype(float)
            num += wn.sum()
            den += wd.sum()
            pnum += dis.sum()
            pden += wd.sum() * len(pairs)
            c = counts[s]
            bnum += c @ wn
            bden += c @ wd
            bpn += c @ dis.sum(axis=0)
            bpd += (c @ wd) * len(pairs)
            ps[s] = {"n_conditions": int(wd.sum()), "n_changed": int(wn.sum())}
        with np.errstate(invalid="ignore", divide="ignore"):
            sb, pb = bnum / bden, bpn / bpd
        lo, hi = _pct(sb)
        plo, phi = _pct(pb)
        pairwise = PairwiseBestChanges(Estimate(pnum / pden if pden else None, plo, phi, PERCENTILE),
                                       n_pairs=int(pden), n_disjoint=int(pnum))
        return WindowBestChanges(n_conditions=int(den), n_changed=int(num),
                                 share=Estimate(num / den if den else None, lo, hi, PERCENTILE), by_source=ps,
                                 pairwise=pairwise)

    undefined = Estimate.undefined(PERCENTILE)
    out = (_share(list(range(Mm))) if Mm >= 2 else
           WindowBestChanges(n_conditions=0, n_changed=0, share=undefined, by_source=None,
                             pairwise=PairwiseBestChanges(undefined)))
    forced_by = []
    for a, scheduler, n_cells in forced:
        keep = [x for x in range(Mm) if st.metrics[mi[x]] != st.metrics[mi[a]]]
        without = _share(keep).share if len(keep) >= 2 else undefined
        forced_by.append(ForcedBest(st.metrics[mi[a]], scheduler, n_cells, without))
    return replace(out, forced_by=tuple(forced_by))


# --------------------------------------------------------------------------- noise ceiling


def split_half(st, ranks: dict, valid: dict, mi: Sequence[int], mean_ranks, tau_features,
               n_splits: int, rng: np.random.Generator) -> SplitHalf:
    """Split-half reliability of mean-rank vectors per source and region, and cross-source tau at half size.

    Each of `n_splits` random splits cuts a source's windows into two disjoint halves of
    floor(W/2) windows; the reliability is Kendall's tau-b between the two halves' mean-rank
    vectors (main metrics averaged). Cross-source tau at the same window count is the mean of the
    four half-vs-half taus of two sources under independent splits; the reliability-adjusted
    portability is tau_ab(half) / sqrt(rel_a(half) rel_b(half)) (1 = the sources agree as well as
    a source agrees with itself; undefined when a reliability is <= 0). Values are means over
    splits; intervals are the 2.5-97.5 percentiles over splits.
    """
    mi = list(mi)
    R, Mm = len(st.regions), len(mi)
    halves = {}
    for s in st.sources:
        W = ranks[s].shape[2]
        h = W // 2
        if h < 1:
            continue
        perm = np.argsort(rng.random((n_splits, W)), axis=1)
        w1 = np.zeros((n_splits, W))
        w2 = np.zeros((n_splits, W))
        rows = np.arange(n_splits)[:, None]
        w1[rows, perm[:, :h]] = 1.0
        w2[rows, perm[:, h:2 * h]] = 1.0
        rk, ok = ranks[s][:, mi], valid[s][:, mi]
        f1, d1 = tau_features(mean_ranks(w1, rk, ok))  # (n, R, Mm, P)
        f2, d2 = tau_features(mean_ranks(w2, rk, ok))
        halves[s] = (f1, d1, f2, d2)

    def _dot(fa, da, fb, db):
        v = (fa * fb).sum(axis=-1)
        return np.where(da & db, np.clip(v, -1, 1), np.nan)

    def _mean(x, axis):
        with np.errstate(invalid="ignore"):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                return np.nanmean(x, axis=axis)

    rel = {}
    out_rel, rel_metric = [], []
    for s, (f1, d1, f2, d2) in halves.items():
        rs = _dot(f1, d1, f2, d2)  # (n, R, Mm)
        rel[s] = rs
        per_split = _mean(rs, 2)  # (n, R)
        for r in range(R):
            v = per_split[:, r]
            if not np.isfinite(v).any():
                continue
            lo, hi = _pct(v)
            out_rel.append({"source": s, "region": st.regions[r], "value": float(np.nanmean(v)), "ci_low": lo,
                            "ci_high": hi, "n_windows_half": int(ranks[s].shape[2] // 2)})
            for a in range(Mm):
                x = rs[:, r, a]
                if np.isfinite(x).any():
                    rel_metric.append({"source": s, "region": st.regions[r], "metric": st.metrics[mi[a]],
                                       "value": float(np.nanmean(x))})
    pairs_out, pair_region_out, pair_metric_out = [], [], []
    srcs = [s for s in st.sources if s in halves]
    for ia, a in enumerate(srcs):
        for b in srcs[ia + 1:]:
            fa1, da1, fa2, da2 = halves[a]
            fb1, db1, fb2, db2 = halves[b]
            four = np.stack([_dot(fa1, da1, fb1, db1), _dot(fa2, da2, fb2, db2),
                             _dot(fa1, da1, fb2, db2), _dot(fa2, da2, fb1, db1)])
            t_half = _mean(four, 0)  # (n, R, Mm)
            ra, rb = rel[a], rel[b]
            adj_regions = []
            tau_regions = []
            for r in range(R):
                t_s = _mean(t_half[:, r], 1)  # per split, main-metric mean
                a_s, b_s = _mean(ra[:, r], 1), _mean(rb[:, r], 1)
                if not (np.isfinite(t_s).any() and np.isfinite(a_s).any() and np.isfinite(b_s).any()):
                    continue
                tv, av, bv = float(np.nanmean(t_s)), float(np.nanmean(a_s)), float(np.nanmean(b_s))
                adj = tv / math.sqrt(av * bv) if av > 0 and bv > 0 else None
                with np.errstate(invalid="ignore", divide="ignore"):
                    ratio = np.where((a_s > 0) & (b_s > 0), t_s / np.sqrt(np.abs(a_s * b_s)), np.nan)
                lo, hi = _pct(ratio)
                tlo, thi = _pct(t_s)
                pair_region_out.append({"source_a": a, "source_b": b, "region": st.regions[r], "tau_half": tv,
                                        "tau_half_ci_low": tlo, "tau_half_ci_high": thi, "rel_a": av, "rel_b": bv,
                                        "adjusted": adj, "adjusted_ci_low": lo, "adjusted_ci_high": hi})
                if adj is not None:
                    adj_regions.append(adj)
                tau_regions.append(tv)
            for k in range(Mm):
                t_m = float(np.nanmean(t_half[:, :, k])) if np.isfinite(t_half[:, :, k]).any() else None
                ra_m = float(np.nanmean(ra[:, :, k])) if np.isfinite(ra[:, :, k]).any() else None
                rb_m = float(np.nanmean(rb[:, :, k])) if np.isfinite(rb[:, :, k]).any() else None
                adj = (t_m / math.sqrt(ra_m * rb_m) if None not in (t_m, ra_m, rb_m) and ra_m > 0 and rb_m > 0
                       else None)
                pair_metric_out.append({"source_a": a, "source_b": b, "metric": st.metrics[mi[k]], "tau_half": t_m,
                                        "rel_a": ra_m, "rel_b": rb_m, "adjusted": adj})
            pairs_out.append(HalfPair(source_a=a, source_b=b,
                                      tau_half=float(np.mean(tau_regions)) if tau_regions else None,
                                      adjusted=float(np.mean(adj_regions)) if adj_regions else None,
                                      n_regions=len(adj_regions)))
    return SplitHalf(by_source_region=out_rel, by_source_region_metric=rel_metric, n_splits=int(n_splits),
                     cross_source_half=CrossSourceHalf(tuple(pairs_out), pair_region_out, pair_metric_out))


# --------------------------------------------------------------------------- assembly and claims


def study_form(ctx: dict, *, q: float, counts: dict, ranks: dict, valid: dict, mi: Sequence[int],
               n_splits: int, split_rng: np.random.Generator, cross_source_tau: list,
               duplicates: dict, metric_families: dict, main_metrics: list) -> StudyForm:
    """The ``study_form`` block of portability.json (see the analysis module docstring), without
    its claims (`claims` judges them from it; the claims step adds them)."""
    st = ctx["st"]
    return StudyForm(
        reversals=tuple(_reversals_for_metric(ctx, m, counts, q) for m in mi),
        best_changes_with_metric=window_best_changes(st, ranks, valid, mi, counts),
        cross_source_tau=cross_source_tau,
        duplicates=duplicates["by_source"],
        duplicates_by_condition=duplicates["by_condition"],
        split_half=split_half(st, ranks, valid, mi, ctx["mean_ranks"], ctx["tau_features"], n_splits, split_rng),
        metric_families=metric_families,
        main_metrics=main_metrics,
    )


def _pc(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def builtin_sources(sources: Sequence[str]) -> tuple[Optional[str], Optional[str], Optional[str]]:
    """The sources the study's claims are about, by exact name (`find_builtin`): Azure, Bailian,
    and BurstGPT (the real trace, else the modeled one, named as modeled in the claims). A user's
    source never stands in for one of them, whatever it is called."""
    return (find_builtin(sources, "azure"), find_builtin(sources, "bailian"),
            find_builtin(sources, "burstgpt") or find_builtin(sources, MODELED_ADAPTER))


def interval_verdict(lo: Optional[float], hi: Optional[float], inside) -> str:
    """holds when the whole interval meets the criterion (`inside`), does not hold when none of it
    does, inconclusive between; not comparable without a finite interval. The one rule that turns
    an interval into a verdict, for the study form's claims and for every protocol of the
    multiverse (`schedport.analysis.multiverse`)."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "not comparable"
    a, b = inside(lo), inside(hi)
    if a and b:
        return "holds"
    return "inconclusive" if (a or b) else "does not hold"


def _reversals_claim(sf: StudyForm, n_sources: int, bg: str | None, note: str) -> ReversalClaim:
    """The study's reversal finding, judged per main metric: the share's interval, clustering at
    high load, one scheduler pair, BurstGPT on every reversal; `note` says which source is modeled."""
    per = []
    for e in sf.reversals:
        parts = {}
        parts["share"] = (e.share.ci_low is not None and e.share.ci_low <= STUDY_SHARE <= e.share.ci_high)
        hl = e.high_load
        parts["high_load"] = (e.n_reversals > 0 and hl.rate is not None and
                              (hl.rate_elsewhere is None or hl.rate_elsewhere == 0 and hl.rate > 0 or
                               (hl.rate_elsewhere and hl.rate >= CLUSTER_FACTOR * hl.rate_elsewhere)))
        parts["one_scheduler_pair"] = bool(e.one_scheduler_pair)
        on_every = e.sources_on_every_reversal
        parts["burstgpt_one_side"] = bool(bg and on_every and bg in on_every)
        ok = all(parts.values())
        per.append(MetricVerdict(metric=e.metric, share=e.share, n_reversals=e.n_reversals,
                                 n_comparisons=e.n_comparisons, parts=parts,
                                 verdict="holds" if ok else "does not hold"))
    nh = sum(p.verdict == "holds" for p in per)
    if not per or n_sources < 2 or not any(p.n_comparisons for p in per):
        v3 = "not comparable"  # no scheduler pair was compared across sources: nothing to judge
    else:
        v3 = "holds" if nh == len(per) else ("does not hold" if nh == 0 else "partly holds")
    def _tags(x: MetricVerdict) -> str:
        p_ = x.parts
        if not x.n_reversals:
            return "no reversal"
        return ", ".join([f"3.6% {'inside' if p_['share'] else 'outside'} the interval",
                          f"{'' if p_['high_load'] else 'not '}clustered at high load",
                          f"{'one' if p_['one_scheduler_pair'] else 'not one'} scheduler pair",
                          f"BurstGPT {'on' if p_['burstgpt_one_side'] else 'not on'} every one"])

    desc = "; ".join(f"{x.metric} {x.n_reversals}/{x.n_comparisons} = {_pc(x.share.statistic)} "
                     f"[{_pc(x.share.ci_low)}, {_pc(x.share.ci_high)}] ({_tags(x)})" for x in per)
    return ReversalClaim(
        id="reversals", study=STUDY_FINDINGS["reversals"],
        here=f"holds on {nh} of {len(per)} main metrics: {desc}{note}", verdict=v3, per_metric=tuple(per),
        rule=f"per main metric, holds when 3.6% lies in the 95% interval of the cross-source reversal "
             f"share AND the reversal rate at rho >= {HIGH_LOAD_RHO} is at least {CLUSTER_FACTOR:g}x the "
             "rate below it AND every reversal has the same scheduler pair AND every reversal has "
             "BurstGPT on one side; the finding holds if it holds on every main metric, does not hold "
             "on none, partly otherwise")


def claims(st, sf: StudyForm, cross_pairs: list[Estimate], metric_tau: Estimate,
           modeled: Sequence[str]) -> list[Claim]:
    """One verdict per study finding, computed from this run's study-form numbers (rules stated in each)."""
    out = []
    sources = list(st.sources)
    az, bl, bg = builtin_sources(sources)
    def _mod(*names) -> str:
        mod = [s for s in names if s and s in set(modeled)]
        return f" ({', '.join(mod)} is modeled, not the real trace)" if mod else ""

    def _pair(a, b):
        for d in cross_pairs:
            if {d.of("source_a"), d.of("source_b")} == {a, b}:
                return d
        return None

    def _adj(a, b):
        for d in sf.split_half.cross_source_half.by_pair:
            if {d.source_a, d.source_b} == {a, b}:
                return d.adjusted
        return None

    # 1. Azure vs Bailian near-perfect
    d = _pair(az, bl) if az and bl else None
    if d is None or d.statistic is None:
        out.append(Claim(id="azure_bailian", study=STUDY_FINDINGS["azure_bailian"],
                         here="no Azure and Bailian sources in this run", verdict="not comparable", rule=""))
    else:
        adj = _adj(az, bl)
        v = interval_verdict(d.ci_low, d.ci_high, lambda x: x >= NEAR_PERFECT)
        out.append(CeilingClaim(
            id="azure_bailian", study=STUDY_FINDINGS["azure_bailian"],
            here=f"tau {d.statistic:.3f} [{d.ci_low:.3f}, {d.ci_high:.3f}] ({az} vs {bl}, main "
                 f"metrics and regions averaged); ceiling-adjusted {adjusted_text(adj)}{_mod(az, bl)}",
            verdict=v, estimate=d, adjusted=adj,
            rule=f"near-perfect = tau >= {NEAR_PERFECT}: holds if the whole 95% interval is >= "
                 f"{NEAR_PERFECT}, does not hold if all of it is below, inconclusive otherwise"))
    # 2. BurstGPT pairs as low as 0.55
    bpairs = ([d for d in cross_pairs if bg in (d.of("source_a"), d.of("source_b")) and d.statistic is not None]
              if bg else [])
    if not bpairs:
        out.append(Claim(id="burstgpt_low", study=STUDY_FINDINGS["burstgpt_low"], here="no BurstGPT pair in this run",
                         verdict="not comparable", rule=""))
    else:
        d = min(bpairs, key=lambda x: x.statistic)
        lowest = min((x for x in cross_pairs if x.statistic is not None), key=lambda x: x.statistic)
        v = "holds" if d.ci_low <= STUDY_LOW_TAU <= d.ci_high else "does not hold"
        side = "" if v == "holds" else (" (higher here)" if d.ci_low > STUDY_LOW_TAU else " (lower here)")
        out.append(Claim(
            id="burstgpt_low", study=STUDY_FINDINGS["burstgpt_low"],
            here=f"lowest BurstGPT pair {d.of('source_a')} vs {d.of('source_b')}: tau {d.statistic:.3f} "
                 f"[{d.ci_low:.3f}, {d.ci_high:.3f}]{side}; "
                 f"{'it is' if lowest is d else 'it is not'} the lowest pair of the run{_mod(bg)}",
            verdict=v, estimate=d,
            rule=f"holds if {STUDY_LOW_TAU} lies in the 95% interval of the lowest pair with BurstGPT"))
    # 3. reversals, per main metric
    out.append(_reversals_claim(sf, len(sources), bg, _mod(bg)))
    # 4. moderate metric agreement
    lo, hi = metric_tau.ci_low, metric_tau.ci_high
    v4 = interval_verdict(lo, hi, lambda x: MODERATE[0] <= x < MODERATE[1])
    out.append(Claim(
        id="metric_agreement", study=STUDY_FINDINGS["metric_agreement"],
        here=("n/a" if metric_tau.statistic is None else
              f"mean pairwise tau between main metrics {metric_tau.statistic:.3f} [{lo:.3f}, {hi:.3f}]"),
        verdict=v4, estimate=metric_tau,
        rule=f"moderate = {MODERATE[0]} <= tau < {MODERATE[1]}: holds if the whole 95% interval is in "
             "that range, does not hold if none of it is, inconclusive otherwise"))
    # 5. best changes with the metric
    b = sf.best_changes_with_metric
    share = b.share
    if share.statistic is None:
        v5, here = "not comparable", "fewer than two main metrics"
    else:
        here = (f"{_pc(share.statistic)} [{_pc(share.ci_low)}, {_pc(share.ci_high)}] of {b.n_conditions} "
                "window x region cells")
        if b.forced_by:
            v5 = "not comparable"
            for f in b.forced_by:
                w = f.share_without
                here += (f"; by construction: {f.scheduler} is the sole best on {f.metric} in every window "
                         f"and never best on all the others (without {f.metric}: {_pc(w.statistic)} "
                         f"[{_pc(w.ci_low)}, {_pc(w.ci_high)}])")
        else:
            v5 = "holds" if share.ci_low <= STUDY_BEST_CHANGES <= share.ci_high else "does not hold"
    out.append(Claim(
        id="best_changes", study=STUDY_FINDINGS["best_changes"], here=here, verdict=v5, estimate=share,
        rule="holds if 68.1% lies in the 95% interval of the (window x region) share; not comparable when "
             "one scheduler is the sole best on one main metric in every window and never best on all the "
             "others (the share is then 100% by construction; the share without that metric is given)"))
    return out



def adjusted_text(adj) -> str:
    """A ceiling-adjusted tau for display; above 1 (a ratio over a noisy ceiling) it is marked."""
    if adj is None:
        return "n/a"
    return f"{adj:.2f}" + (" (above 1: at the noise ceiling, which is itself noisy here)" if adj > 1 else "")
