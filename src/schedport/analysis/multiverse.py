"""How robust is each verdict: the study's five claims under every defensible analysis protocol.

The study form (`schedport.analysis.studyform`) computes each of the original study's findings
one way. Several of its choices are defensible in more than one way, and each can move a verdict.
`robustness` recomputes the five claims under every combination of these choices (a *protocol*)
and says, per claim, under which share of protocols it holds, which choice flips it, and which
protocol comes closest to the study's own numbers. It is ``portability.json``'s ``robustness``
block (contract in `schedport.analysis.portability`'s docstring).

Axes (`AXES`; the study form's protocol is `DEFAULT`, with the analysis's own thresholds and q):

``aggregation`` (the rank claims)
    ``mean_rank``: a scheduler's score in a (source, region) condition is its mean within-window
    rank (the study form). ``rank_of_medians``: the schedulers are ranked once per condition, by
    their median value over windows. ``pooled_regions``: mean within-window rank over every
    (window, region) cell of a source, one ranking per source and metric.
``ties``, ``rel_threshold``, ``abs_threshold``
    With practical ties on, two schedulers whose values differ by less than the practical
    threshold (relative for unbounded metrics, absolute for bounded ones) tie: a scheduler's rank
    is 1 + (schedulers clearly better) + (schedulers within the threshold) / 2, which is the
    average rank when the threshold is 0; the tied-best set is every scheduler no one is
    clearly better than. The thresholds are also the reversal rule's practical threshold.
``test``
    The per-condition paired test of the per-window effects: ``wilcoxon`` (the study form),
    ``sign`` (exact binomial test of positive vs negative windows, zeros dropped), ``bootstrap``
    (the paired bootstrap of the lower median effect, X_(ceil(n/2)), with its exact bootstrap
    distribution instead of Monte-Carlo draws: P*(median <= 0) = P(Bin(n, F(0)) >= ceil(n/2)),
    p = 2 min(P*(median <= 0), P*(median >= 0)), capped at 1).
``bh_level``, ``bh_family``
    The false discovery rate, and whether Benjamini-Hochberg runs within each metric's tests
    (``per_metric``, the study form) or over every metric of the set at once (``all_metrics``).
``metric_set``
    ``main`` (`MAIN_METRICS`); ``survivor`` (latencies and slowdown fairness over completed
    requests only, the usual choice in papers); ``goodput`` (standard-SLO goodput in place of
    attainment: the same within-window ranking, a relative rather than absolute effect);
    ``no_tpot`` (main without tail TPOT, on which static wins by construction).
``scheduler_set``
    ``all`` (duplicates counted once, as everywhere), ``no_static``, ``no_fastserve``,
    ``no_slo_admission`` (only the values whose scheduler is in the store).
``comparison``
    ``cross_source`` (the study form) or ``with_cross_region`` (the reversal count also compares
    two regions of one source, as the pooled analysis does).
``region_def`` (only with ``analyze --compare`` of another store of the same study)
    This store's region definition and the other's: every claim is recomputed on the other
    store's runs too.

Each claim depends on some axes only (`RELEVANT`): its value and verdict are computed once per
combination of those (the *distinct analyses*, listed under ``n_distinct``), and a protocol's
other axes cannot move it. Shares are over the full product of the axes (``n_protocols``), which
weights every combination equally. The verdict rules are the study form's (`studyform.claims`):
the same thresholds, the same intervals (basic bootstrap for taus, percentile for the shares,
tests redone on every resample for the reversal share), with ``n_boot`` resamples of windows
(200 by default, fewer than the 1,000 of the intervals shown, and drawn apart from them), which
makes the verdicts of the default protocol agree with the study form's except where an interval
ends within resampling noise of the criterion.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Optional

import numpy as np
import pandas as pd

from schedport.analysis.defaults import MIN_WINDOWS
from schedport.analysis.directions import MAIN_METRICS, metric_is_bounded
from schedport.analysis.duplicates import duplicate_schedulers
from schedport.analysis.multiverse_reversals import TESTS, ReversalTests, reversal_protocols
from schedport.analysis.ranks import mean_ranks
from schedport.analysis.results import ClaimRobustness, Closest, Curve, OneMetric, ProtocolVerdict, Robustness
from schedport.analysis.stats import basic_ci, nanmean, percentile_ci, relative_effect, tau_features
from schedport.analysis.store_loading import Study
from schedport.analysis.studyform import (MODERATE, NEAR_PERFECT, STUDY_BEST_CHANGES, STUDY_LOW_TAU, STUDY_SHARE,
                                          builtin_sources, interval_verdict, window_best_changes)

__all__ = ["AXES", "DEFAULT", "RELEVANT", "METRIC_SETS", "SCHEDULER_SETS", "robustness", "protocol_axes",
           "N_BOOT_ROBUSTNESS", "STUDY_COMPARISONS", "tie_ranks"]

#: Resamples of windows behind each protocol's intervals (the report shows none of them).
N_BOOT_ROBUSTNESS = 200
#: "about 1,000 pairwise comparisons": the study's count, for the distance to the study.
STUDY_COMPARISONS = 1000

METRIC_SETS: dict[str, tuple[str, ...]] = {
    "main": MAIN_METRICS,
    "survivor": ("ttft_p99_completed_s", "tpot_p99_completed_s", "e2e_mean_completed_s", "slo_attainment_standard",
                 "slowdown_jain_completed"),
    "goodput": ("ttft_p99_s", "tpot_p99_s", "e2e_mean_s", "goodput_standard_rps", "slowdown_jain"),
    "no_tpot": tuple(m for m in MAIN_METRICS if m != "tpot_p99_s"),
}
SCHEDULER_SETS: dict[str, tuple[str, ...]] = {
    "all": (), "no_static": ("static",), "no_fastserve": ("fastserve",), "no_slo_admission": ("slo-admission",),
}
AXES: dict[str, list] = {
    "aggregation": ["mean_rank", "rank_of_medians", "pooled_regions"],
    "ties": ["off", "on"],
    "rel_threshold": [0.02, 0.05, 0.10],
    "abs_threshold": [0.01, 0.02, 0.05],
    "test": list(TESTS),
    "bh_level": [0.01, 0.05, 0.10],
    "bh_family": ["per_metric", "all_metrics"],
    "metric_set": list(METRIC_SETS),
    "scheduler_set": list(SCHEDULER_SETS),
    "comparison": ["cross_source", "with_cross_region"],
}
DEFAULT: dict[str, Any] = {"aggregation": "mean_rank", "ties": "off", "rel_threshold": 0.05, "abs_threshold": 0.02,
                           "test": "wilcoxon", "bh_level": 0.05, "bh_family": "per_metric", "metric_set": "main",
                           "scheduler_set": "all", "comparison": "cross_source"}
_RANK_AXES = ("aggregation", "ties", "rel_threshold", "abs_threshold", "metric_set", "scheduler_set")
RELEVANT: dict[str, tuple[str, ...]] = {
    "azure_bailian": _RANK_AXES,
    "burstgpt_low": _RANK_AXES,
    "reversals": ("rel_threshold", "abs_threshold", "test", "bh_level", "bh_family", "metric_set", "scheduler_set",
                  "comparison"),
    "metric_agreement": _RANK_AXES,
    "best_changes": ("ties", "rel_threshold", "abs_threshold", "metric_set", "scheduler_set"),
}
CLAIM_IDS = ("azure_bailian", "burstgpt_low", "reversals", "metric_agreement", "best_changes")
DISTANCE = {
    "azure_bailian": f"{NEAR_PERFECT} - tau when below {NEAR_PERFECT} (near-perfect), else 0",
    "burstgpt_low": f"|tau - {STUDY_LOW_TAU}|",
    "reversals": f"|share - {STUDY_SHARE}| / {STUDY_SHARE} + |comparisons - {STUDY_COMPARISONS}| / "
                 f"{STUDY_COMPARISONS}",
    "metric_agreement": f"distance of tau to [{MODERATE[0]}, {MODERATE[1]})",
    "best_changes": f"|share - {STUDY_BEST_CHANGES}|",
}


def protocol_axes(st: Study, *, practical_threshold: float, abs_threshold: float, q: float) -> tuple[dict, dict]:
    """The axes and the default protocol for a store: the analysis's own thresholds and q are the
    default values (added to their axes when not there), and a metric or scheduler set that the
    store cannot tell apart from another (its metrics absent, its scheduler not run) is left out."""
    axes = {k: list(v) for k, v in AXES.items()}
    default = dict(DEFAULT, rel_threshold=float(practical_threshold), abs_threshold=float(abs_threshold),
                   bh_level=float(q))
    for ax in ("rel_threshold", "abs_threshold", "bh_level"):
        if default[ax] not in axes[ax]:
            axes[ax] = sorted(axes[ax] + [default[ax]])
    have = set(st.metrics)
    axes["metric_set"] = [k for k, ms in METRIC_SETS.items()
                          if k == "main" or (sum(m in have for m in ms) >= 2
                                             and [m for m in ms if m in have]
                                             != [m for m in MAIN_METRICS if m in have])]
    axes["scheduler_set"] = [k for k, drop in SCHEDULER_SETS.items()
                             if k == "all" or (any(d in st.schedulers for d in drop)
                                               and len(st.schedulers) - len(drop) >= 3)]
    if len(st.sources) < 2:
        axes["comparison"] = ["with_cross_region"]
        default["comparison"] = "with_cross_region"
    return axes, default


# --------------------------------------------------------------------------- rankings under a protocol


def tie_ranks(ov: np.ndarray, thr: float, bounded: bool) -> tuple[np.ndarray, np.ndarray]:
    """Ranks along the last axis of oriented values `ov` (lower is better, inf = NaN = worst) with
    practical ties, and the tied-best mask.

    j is clearly better than k when ov_j < ov_k by at least `thr` (absolute when `bounded`, else
    relative to the pair's mean magnitude); rank_k = 1 + #clearly better + #neither / 2, which is
    ``scipy.stats.rankdata``'s average rank when `thr` is 0. Tied-best: no one clearly better.
    """
    a = ov[..., :, None]
    b = ov[..., None, :]
    with np.errstate(invalid="ignore"):
        lower = b < a                        # j below k
        if thr > 0:
            both = np.isfinite(a) & np.isfinite(b)
            if bounded:
                dist = np.abs(a - b)
            else:
                dist = relative_effect(a, b, 1)
                dist = np.abs(np.where(np.isfinite(dist), dist, 0.0))
            far = ~both | (dist >= thr)
        else:
            far = np.ones(lower.shape, dtype=bool)
    better = lower & far
    worse = (a < b) & far
    K = ov.shape[-1]
    n_better = better.sum(-1)
    n_tied = K - 1 - n_better - worse.sum(-1)
    return 1.0 + n_better + 0.5 * n_tied, n_better == 0


def _weighted_median(ov: np.ndarray, w: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Median over windows of oriented values `ov` (R, W, K) under window weights `counts` (B, W)
    and a validity mask `w` (R, W): the mean of the two middle draws, as ``numpy.median``."""
    R, W, K = ov.shape
    x = np.moveaxis(ov, 1, -1)                              # (R, K, W)
    order = np.argsort(x, axis=-1, kind="stable")
    xs = np.take_along_axis(x, order, -1)
    c = counts[:, None, None, :] * w[None, :, None, :]      # (B, R, 1, W)
    c = np.take_along_axis(np.broadcast_to(c, (counts.shape[0], R, K, W)), order[None], -1)
    C = np.cumsum(c, axis=-1)
    n = C[..., -1]
    k1 = np.floor((n - 1) / 2.0)
    k2 = np.floor(n / 2.0)
    j1 = (C > k1[..., None]).argmax(-1)
    j2 = (C > k2[..., None]).argmax(-1)
    xb = np.broadcast_to(xs[None], C.shape)
    m1 = np.take_along_axis(xb, j1[..., None], -1)[..., 0]
    m2 = np.take_along_axis(xb, j2[..., None], -1)[..., 0]
    with np.errstate(invalid="ignore"):
        med = np.where(np.isinf(m1) | np.isinf(m2), np.inf, (m1 + m2) / 2.0)
    return np.where(n > 0, med, np.nan)                     # (B, R, K)


class _Ranker:
    """Rank features per (scheduler set, aggregation, metric, tie threshold), cached: what the
    tau claims and the best-changes claim need, for point (row 0) and resamples (rows 1..B)."""

    def __init__(self, st: Study, counts: dict):
        self.st, self.counts = st, counts
        self.cache: dict = {}
        self.best_cache: dict = {}

    def _ranks(self, s: str, m: int, keep: np.ndarray, thr: float):
        st = self.st
        v = st.values[s][:, m][..., keep]                     # (R, W, K')
        ov = v * -st.direction[m]
        ov = np.where(np.isfinite(ov), ov, np.inf)
        valid = st.block[s] & np.isfinite(v).any(-1)          # (R, W)
        rk, best = tie_ranks(ov, thr, bool(metric_is_bounded(st.metrics[m])))
        return ov, np.where(valid[..., None], rk, 0.0), best & valid[..., None], valid

    def features(self, s: str, m: int, sset: str, keep: np.ndarray, agg: str, thr: float):
        key = (s, m, sset, agg, thr)
        if key in self.cache:
            return self.cache[key]
        ov, rk, _, valid = self._ranks(s, m, keep, thr)
        W = rk.shape[1]
        cnt = np.vstack([np.ones((1, W)), self.counts[s]])    # row 0: the point estimate
        n_valid = valid.sum(-1)                               # (R,)
        if agg == "mean_rank":
            mr = mean_ranks(cnt, rk[:, None], valid[:, None])[:, :, 0]           # (B+1, R, K')
            mr[:, n_valid < MIN_WINDOWS] = np.nan
        elif agg == "pooled_regions":
            R = rk.shape[0]
            num = sum(cnt @ rk[r] for r in range(R))
            den = sum(cnt @ valid[r].astype(np.float64) for r in range(R))
            with np.errstate(invalid="ignore", divide="ignore"):
                mr = np.where(den[:, None] > 0, num / den[:, None], np.nan)[:, None, :]
            if n_valid.sum() < MIN_WINDOWS:
                mr[:] = np.nan
        else:                                                 # rank_of_medians
            med = _weighted_median(ov, valid, cnt)            # (B+1, R, K')
            med_o = np.where(np.isfinite(med), med, np.inf)
            r_, _ = tie_ranks(med_o, thr, bool(metric_is_bounded(self.st.metrics[m])))
            mr = np.where(np.isnan(med).all(-1, keepdims=True), np.nan, r_)
            mr[:, n_valid < MIN_WINDOWS] = np.nan
        out = tau_features(mr)
        self.cache[key] = out
        return out

    def best(self, s: str, m: int, sset: str, keep: np.ndarray, thr: float):
        key = (s, m, sset, thr)
        if key not in self.best_cache:
            _, _, best, valid = self._ranks(s, m, keep, thr)
            self.best_cache[key] = (best, valid)
        return self.best_cache[key]


def _dot(fa, fb) -> np.ndarray:
    (a, da), (b, db) = fa, fb
    v = (a * b).sum(-1)
    return np.where(da & db, np.clip(v, -1.0, 1.0), np.nan)


def _basic(pt: float, bt: np.ndarray) -> tuple[Optional[float], Optional[float]]:
    if not np.isfinite(pt) or not np.isfinite(bt).any():
        return None, None
    lo, hi = basic_ci(pt, bt)
    return float(lo), float(hi)


def _pct(bt: np.ndarray) -> tuple[Optional[float], Optional[float]]:
    bt = np.asarray(bt, dtype=np.float64)
    if not np.isfinite(bt).any():
        return None, None
    lo, hi = percentile_ci(bt[:, None])
    return float(lo[0]), float(hi[0])


# --------------------------------------------------------------------------- the rank claims


def _rank_claims(st: Study, ranker: _Ranker, proto: dict, msets: dict, keeps: dict, az, bl, bg) -> dict:
    """azure_bailian, burstgpt_low and metric_agreement under one protocol: {claim: `ProtocolVerdict`}."""
    ms = msets[proto["metric_set"]]
    keep = keeps[proto["scheduler_set"]]
    agg = proto["aggregation"]

    def thr(m):
        if proto["ties"] == "off":
            return 0.0
        return proto["abs_threshold"] if metric_is_bounded(st.metrics[m]) else proto["rel_threshold"]

    feats = {s: [ranker.features(s, m, proto["scheduler_set"], keep, agg, thr(m)) for m in ms] for s in st.sources}
    pairs = {}
    for ia, a in enumerate(st.sources):
        for b in st.sources[ia + 1:]:
            t = np.stack([_dot(fa, fb) for fa, fb in zip(feats[a], feats[b])], -1)   # (B+1, Rr, Mset)
            flat = t.reshape(t.shape[0], -1)
            pt, bt = nanmean(flat[0], 0), nanmean(flat[1:], 1)
            lo, hi = _basic(float(pt), bt)
            pairs[(a, b)] = (float(pt), lo, hi, int(np.isfinite(flat[0]).sum()))
    out = {}
    ab = pairs.get((az, bl)) or pairs.get((bl, az)) if az and bl else None
    if ab is None or not np.isfinite(ab[0]):
        out["azure_bailian"] = ProtocolVerdict(None, "not comparable", 0)
    else:
        out["azure_bailian"] = ProtocolVerdict(ab[0], interval_verdict(ab[1], ab[2], lambda x: x >= NEAR_PERFECT),
                                               ab[3])
    bps = [v for k, v in pairs.items() if bg in k and np.isfinite(v[0])] if bg else []
    if not bps:
        out["burstgpt_low"] = ProtocolVerdict(None, "not comparable", 0)
    else:
        d = min(bps, key=lambda x: x[0])
        ok = d[1] is not None and d[1] <= STUDY_LOW_TAU <= d[2]
        out["burstgpt_low"] = ProtocolVerdict(d[0], "holds" if ok else "does not hold", d[3])
    vals = []
    for s in st.sources:
        f = feats[s]
        for i in range(len(f)):
            for j in range(i + 1, len(f)):
                vals.append(_dot(f[i], f[j]))                  # (B+1, Rr)
    if vals:
        t = np.stack(vals, -1).reshape(vals[0].shape[0], -1)
        pt, bt = float(nanmean(t[0], 0)), nanmean(t[1:], 1)
        lo, hi = _basic(pt, bt)
        v = interval_verdict(lo, hi, lambda x: MODERATE[0] <= x < MODERATE[1]) if np.isfinite(pt) else "not comparable"
        out["metric_agreement"] = ProtocolVerdict(pt if np.isfinite(pt) else None, v, int(np.isfinite(t[0]).sum()))
    else:
        out["metric_agreement"] = ProtocolVerdict(None, "not comparable", 0)
    return out


class _StudyView:
    """The names `window_best_changes` reads, for a scheduler subset and a metric list."""

    def __init__(self, sources, schedulers, metrics):
        self.sources, self.schedulers, self.metrics = sources, schedulers, metrics


def _best_changes_claim(st: Study, ranker: _Ranker, proto: dict, msets: dict, keeps: dict) -> ProtocolVerdict:
    """best_changes under one protocol: the study form's per (window, region) share and rule."""
    ms = msets[proto["metric_set"]]
    keep = keeps[proto["scheduler_set"]]
    if len(ms) < 2:
        return ProtocolVerdict(None, "not comparable", 0)
    ranks, valid = {}, {}
    for s in st.sources:
        bs, vs = [], []
        for m in ms:
            t = 0.0 if proto["ties"] == "off" else (proto["abs_threshold"] if metric_is_bounded(st.metrics[m])
                                                   else proto["rel_threshold"])
            b, v = ranker.best(s, m, proto["scheduler_set"], keep, t)
            bs.append(b)
            vs.append(v)
        ranks[s] = (~np.stack(bs, 1)).astype(np.float64)       # (R, Mset, W, K'): 0 = tied-best
        valid[s] = np.stack(vs, 1)
    view = _StudyView(st.sources, [k for k, x in zip(st.schedulers, keep) if x], [st.metrics[m] for m in ms])
    b = window_best_changes(view, ranks, valid, list(range(len(ms))), ranker.counts)
    share = b.share
    if share.statistic is None:
        return ProtocolVerdict(None, "not comparable", 0)
    if b.forced_by:
        return ProtocolVerdict(float(share.statistic), "not comparable", b.n_conditions)
    ok = share.ci_low is not None and share.ci_low <= STUDY_BEST_CHANGES <= share.ci_high
    return ProtocolVerdict(float(share.statistic), "holds" if ok else "does not hold", b.n_conditions)


# --------------------------------------------------------------------------- assembly


def _distance(cid: str, value: Optional[float], n: int) -> float:
    """How far a protocol's value is from the study's reported number (`DISTANCE` states each)."""
    if value is None or not np.isfinite(value):
        return math.inf
    if cid == "azure_bailian":
        return max(0.0, NEAR_PERFECT - value)
    if cid == "burstgpt_low":
        return abs(value - STUDY_LOW_TAU)
    if cid == "reversals":
        return abs(value - STUDY_SHARE) / STUDY_SHARE + abs(n - STUDY_COMPARISONS) / STUDY_COMPARISONS
    if cid == "metric_agreement":
        return max(0.0, MODERATE[0] - value, value - MODERATE[1])
    return abs(value - STUDY_BEST_CHANGES)


def _effective(proto: dict, cid: str, rel: Optional[tuple] = None) -> tuple:
    """The protocol's values on the axes that can move `cid` (thresholds only where they act)."""
    rel = RELEVANT[cid] if rel is None else rel
    eff = []
    for ax in rel:
        v = proto[ax]
        if ax in ("rel_threshold", "abs_threshold") and "ties" in rel and proto["ties"] == "off":
            v = None
        eff.append(v)
    return tuple(eff)


def _summary(verdict_by_axis: dict, share_by_axis: dict, verdicts: dict, n: int) -> tuple[str, list]:
    """The claim in one phrase ("robust: ..." or "depends on ...") and the axes that move it,
    those along which some verdict's share changes, the largest change first."""
    spread = []
    for ax, per_v in verdict_by_axis.items():
        change = max((max(d.values()) - min(d.values()) for d in per_v.values()), default=0.0)
        if change > 1e-12:
            spread.append((change, ax))
    spread.sort(key=lambda x: (-x[0], x[1]))
    depends = [ax for _, ax in spread]

    def _p(x: float) -> str:
        return f"{100 * x:.1f}%" if 0 < x < 0.01 or 0.99 < x < 1 else f"{100 * x:.0f}%"

    main_v = max(verdicts, key=verdicts.get)
    if len(verdicts) == 1:
        return f"robust: {main_v} under all {n:,} protocols", depends
    parts = ", ".join(f"{_p(s)} {v}" for v, s in sorted(verdicts.items(), key=lambda x: -x[1]))
    text = f"depends on {', '.join(depends[:3])}: {parts}"
    moved = [ax for ax in depends if max(share_by_axis[ax].values()) - min(share_by_axis[ax].values()) > 1e-12]
    if moved:
        ax = moved[0]
        d = share_by_axis[ax]
        hi_v, lo_v = max(d, key=d.get), min(d, key=d.get)
        text += f"; holds under {_p(d[hi_v])} of protocols with {ax} = {hi_v}, {_p(d[lo_v])} with {lo_v}"
    return text, depends


def _claim_grids(df: pd.DataFrame, *, practical_threshold: float, abs_threshold: float, q: float, seed: int,
                 n_boot: int) -> tuple[dict, dict, dict, dict]:
    """Every claim's `ProtocolVerdict` per combination of the axes that move it, for one store:
    (axes, default protocol, {claim: {combination: verdict}}, {claim: n_distinct})."""
    wanted = list(dict.fromkeys(m for ms in METRIC_SETS.values() for m in ms))
    have = [m for m in wanted if m in df.columns and pd.api.types.is_numeric_dtype(df[m]) and df[m].notna().any()]
    inner: list[str] = []
    st = Study(df, have, inner)
    labels = duplicate_schedulers(st)["labels"]
    axes, default = protocol_axes(st, practical_threshold=practical_threshold, abs_threshold=abs_threshold, q=q)
    msets = {k: [st.metrics.index(m) for m in METRIC_SETS[k] if m in st.metrics] for k in axes["metric_set"]}
    keeps = {k: np.array([s not in SCHEDULER_SETS[k] for s in st.schedulers]) for k in axes["scheduler_set"]}
    rng = np.random.default_rng([seed, 27])
    counts = {}
    for s in st.sources:
        W = len(st.windows[s])
        counts[s] = rng.multinomial(W, np.full(W, 1.0 / W), size=n_boot).astype(np.float64)
    ranker = _Ranker(st, counts)
    names = list(axes)
    sources = list(st.sources)
    az, bl, bg = builtin_sources(sources)

    results: dict = {cid: {} for cid in CLAIM_IDS}
    # the rank claims and best changes, once per effective protocol
    rank_cache: dict = {}
    for combo in itertools.product(*(axes[a] for a in _RANK_AXES)):
        proto = dict(default, **dict(zip(_RANK_AXES, combo)))
        key = _effective(proto, "azure_bailian")
        if key not in rank_cache:
            rank_cache[key] = _rank_claims(st, ranker, proto, msets, keeps, az, bl, bg)
        for cid in ("azure_bailian", "burstgpt_low", "metric_agreement"):
            results[cid][combo] = rank_cache[key][cid]
    best_cache: dict = {}
    bc_axes = RELEVANT["best_changes"]
    for combo in itertools.product(*(axes[a] for a in bc_axes)):
        proto = dict(default, **dict(zip(bc_axes, combo)))
        key = _effective(proto, "best_changes")
        if key not in best_cache:
            best_cache[key] = _best_changes_claim(st, ranker, proto, msets, keeps)
        results["best_changes"][combo] = best_cache[key]
    rev = ReversalTests(st, sorted({m for ms in msets.values() for m in ms}), counts)
    rp = reversal_protocols(st, rev, labels, axes, msets, keeps)
    rv_axes = RELEVANT["reversals"]
    for combo in itertools.product(*(axes[a] for a in rv_axes)):
        proto = dict(default, **dict(zip(rv_axes, combo)))
        k = (proto["scheduler_set"], proto["test"], proto["bh_family"], proto["metric_set"], float(proto["bh_level"]),
             float(proto["rel_threshold"]), float(proto["abs_threshold"]), proto["comparison"])
        results["reversals"][combo] = rp[k]
    distinct = {"azure_bailian": len(rank_cache), "burstgpt_low": len(rank_cache),
                "metric_agreement": len(rank_cache), "best_changes": len(best_cache), "reversals": len(rp)}
    return axes, default, results, distinct


def robustness(df: pd.DataFrame, *, practical_threshold: float, abs_threshold: float, q: float, seed: int = 0,
               n_boot: int = N_BOOT_ROBUSTNESS, compare: Optional[tuple] = None) -> Robustness:
    """The ``robustness`` block of portability.json: each claim's share of protocols under which
    it holds, per axis value, and the protocol closest to the study's numbers (module docstring).

    `compare` = (this store's region definition, the other's, the other store's runs table): the
    same study run under another region definition adds the axis ``region_def``. Pure and
    deterministic for `seed`: the resamples come from ``default_rng([seed, 27])``, apart from
    those of the intervals shown.
    """
    opts = dict(practical_threshold=practical_threshold, abs_threshold=abs_threshold, q=q, seed=seed, n_boot=n_boot)
    axes, default, results, distinct = _claim_grids(df, **opts)
    relevant = dict(RELEVANT)
    extra_note = ""
    if compare is not None:
        this_def, other_def, df2 = compare
        axes2, default2, results2, distinct2 = _claim_grids(df2, **opts)
        if axes2 != axes or this_def == other_def:
            extra_note = (" The --compare store was left out of the multiverse: "
                          + ("it uses the same region definition." if this_def == other_def else
                             "its schedulers or metrics give other axes."))
        else:
            axes["region_def"] = [this_def, other_def]
            default["region_def"] = this_def
            relevant = {c: r + ("region_def",) for c, r in RELEVANT.items()}
            results = {cid: {**{c + (this_def,): v for c, v in results[cid].items()},
                             **{c + (other_def,): v for c, v in results2[cid].items()}} for cid in CLAIM_IDS}
            distinct = {cid: distinct[cid] + distinct2[cid] for cid in CLAIM_IDS}
    names = list(axes)

    n_protocols = int(np.prod([len(axes[a]) for a in names]))
    claims_out = []
    for cid in CLAIM_IDS:
        rel = relevant[cid]
        grid = results[cid]
        combos = list(grid)
        vlist = np.array([grid[c].verdict for c in combos])
        holds = (vlist == "holds").astype(np.float64)
        share = float(holds.mean()) if combos else None
        kinds = sorted(set(vlist.tolist()))
        verdicts = {v: float((vlist == v).mean()) for v in kinds}
        by_axis, verdict_by_axis = {}, {}
        for ax in names:
            if ax in rel:
                i = rel.index(ax)
                sel = {v: np.array([c[i] == v for c in combos]) for v in axes[ax]}
                by_axis[ax] = {str(v): float(holds[m].mean()) for v, m in sel.items()}
                verdict_by_axis[ax] = {k: {str(v): float((vlist[m] == k).mean()) for v, m in sel.items()}
                                       for k in kinds}
            else:
                by_axis[ax] = {str(v): share for v in axes[ax]}

        def _rank(c):
            return (_distance(cid, grid[c].value, grid[c].n_comparisons),
                    sum(c[i] != default[a] for i, a in enumerate(rel)))
        best_c = min(combos, key=_rank)
        one_metric = None
        if cid == "reversals":
            # the study's "3.6% of about 1,000 comparisons" may be one metric's: every metric's own share too
            cands = [(_distance(cid, sh, nc), _rank(c)[1], c, name, sh, nc)
                     for c in combos for name, sh, nc in grid[c].per_metric]
            cands = [x for x in cands if np.isfinite(x[0])]
            if cands:
                dist, _, c, name, sh, nc = min(cands, key=lambda x: (x[0], x[1], x[3]))
                one_metric = OneMetric(protocol=dict(default, **dict(zip(rel, c))), metric=name, value=sh,
                                       n_comparisons=nc, distance=dist)
        closest = Closest(protocol=dict(default, **dict(zip(rel, best_c))), result=grid[best_c],
                          distance=_distance(cid, grid[best_c].value, grid[best_c].n_comparisons),
                          one_metric=one_metric)
        text, depends = _summary({a: verdict_by_axis[a] for a in rel}, {a: by_axis[a] for a in rel}, verdicts,
                                 n_protocols)
        seen, uniq = set(), []
        for c in combos:           # one point per distinct analysis (thresholds do not act with ties off)
            key = _effective(dict(default, **dict(zip(rel, c))), cid, rel)
            if key not in seen:
                seen.add(key)
                uniq.append(c)
        order = sorted(uniq, key=lambda c: (math.inf if grid[c].value is None else grid[c].value))
        claims_out.append(ClaimRobustness(
            id=cid, share_holds=share, verdicts=verdicts, by_axis=by_axis, robust=len(verdicts) == 1,
            depends_on=depends, summary=text, axes=list(rel), n_distinct=distinct[cid],
            default=grid[tuple(default[a] for a in rel)], closest=closest, distance=DISTANCE[cid],
            curve=Curve(tuple(grid[c] for c in order))))
    return Robustness(
        axes={k: list(v) for k, v in axes.items()},
        n_protocols=n_protocols,
        default_protocol=default,
        n_boot=int(n_boot),
        claims=tuple(claims_out),
        note=(f"{n_protocols:,} protocols (the product of the axes); each claim is computed once per combination "
              "of the axes it depends on (n_distinct); its intervals use "
              f"{n_boot} resamples of windows (not shown; the intervals shown use their own).{extra_note}"),
    )
