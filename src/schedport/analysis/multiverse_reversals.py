"""The reversal claim of the protocol multiverse: every test, BH level and family, threshold,
metric set, scheduler set and comparison kind (`schedport.analysis.multiverse`).

The per-window effects are the study form's; each condition's test is made three ways (`TESTS`)
on the point estimate (row 0) and on every resample of windows, so the share's interval redoes
the tests, BH and the count, as the study form's does. Reversals are counted under every
(level, threshold) pair in one pass (`count_reversals`), and the study form's rule is applied per
metric (`reversal_verdict`).
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import stats

from schedport.analysis.directions import metric_is_bounded
from schedport.analysis.duplicates import pair_keys
from schedport.analysis.results import ProtocolVerdict
from schedport.analysis.stats import pair_index, percentile_ci, relative_effect, wilcoxon_pvalues
from schedport.analysis.store_loading import Study
from schedport.analysis.studyform import CLUSTER_FACTOR, HIGH_LOAD_RHO, STUDY_SHARE, boot_wilcoxon, bh_rows
from schedport.workload.corpus_manifest import MODELED_ADAPTER, builtin_source

__all__ = ["TESTS", "ReversalTests", "reversal_protocols", "sign_test_p", "median_bootstrap_p"]

#: The per-condition paired tests (`schedport.analysis.multiverse`'s docstring defines each).
TESTS = ("wilcoxon", "sign", "bootstrap")


def sign_test_p(npos: np.ndarray, nneg: np.ndarray) -> np.ndarray:
    """Two-sided exact sign test (``scipy.stats.binomtest``'s p) of `npos` positive against `nneg`
    negative windows, vectorised; 1 when there is neither."""
    n = npos + nneg
    k = np.minimum(npos, nneg)
    with np.errstate(invalid="ignore"):
        p = np.minimum(1.0, 2.0 * stats.binom.cdf(k, n, 0.5))
    return np.where(n > 0, p, 1.0)


def median_bootstrap_p(nle: np.ndarray, nge: np.ndarray, n: np.ndarray) -> np.ndarray:
    """p of the exact paired bootstrap of the lower median: 2 min(P*(med <= 0), P*(med >= 0))."""
    k = np.ceil(n / 2.0)
    nn = np.maximum(n, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        p_le = stats.binom.sf(k - 1, nn, nle / nn)
        p_ge = stats.binom.sf(nn - k, nn, nge / nn)
        p = np.minimum(1.0, 2.0 * np.minimum(p_le, p_ge))
    return np.where(n > 0, p, 1.0)


class ReversalTests:
    """Per-window effects and every test's p-values and medians, point (row 0) and resampled
    (``p[test][metric]`` and ``med[metric]``: (B+1, S, R, P); ``made[metric]``: (S, R, P))."""

    def __init__(self, st: Study, metrics: Sequence[int], counts: dict):
        self.st = st
        S, R, K = len(st.sources), len(st.regions), len(st.schedulers)
        self.I, self.J = pair_index(K)
        P = len(self.I)
        self.P = P
        B = next(iter(counts.values())).shape[0]
        self.p = {t: {} for t in TESTS}
        self.med, self.made = {}, {}
        for m in metrics:
            bounded = metric_is_bounded(st.metrics[m])
            med = np.full((B + 1, S, R, P), np.nan)
            made = np.zeros((S, R, P), dtype=bool)
            ps = {t: np.full((B + 1, S, R, P), np.nan) for t in TESTS}
            for si, s in enumerate(st.sources):
                v = st.values[s][:, m]                           # (R, W, K)
                a, b = v[..., self.I], v[..., self.J]
                if bounded:
                    e = np.where(np.isfinite(a) & np.isfinite(b), a - b, np.nan)
                else:
                    e = relative_effect(a, b, 1)
                e = e * st.direction[m]                           # (R, W, P)
                c = counts[s]
                for r in range(R):
                    x = e[r].T                                    # (P, W)
                    fin = np.isfinite(x)
                    if not fin.any():
                        continue
                    pw, n_used = wilcoxon_pvalues(x)
                    ok = n_used > 0
                    made[si, r] = ok
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)     # all-NaN rows: NaN, as meant
                        med[0, si, r] = np.where(fin.any(1), np.nanmedian(np.where(fin, x, np.nan), 1), np.nan)
                    pb, mb = boot_wilcoxon(x, c)
                    med[1:, si, r] = mb
                    ps["wilcoxon"][0, si, r] = pw
                    ps["wilcoxon"][1:, si, r] = pb
                    pos, neg = (fin & (x > 0)).astype(np.float64), (fin & (x < 0)).astype(np.float64)
                    le, ge = (fin & (x <= 0)).astype(np.float64), (fin & (x >= 0)).astype(np.float64)
                    cc = np.vstack([np.ones((1, x.shape[1])), c])  # (B+1, W)
                    ps["sign"][:, si, r] = sign_test_p(cc @ pos.T, cc @ neg.T)
                    ps["bootstrap"][:, si, r] = median_bootstrap_p(cc @ le.T, cc @ ge.T, cc @ fin.T.astype(np.float64))
            for t in ps:
                self.p[t][m] = ps[t]
            self.med[m], self.made[m] = med, made


def _comparisons(st: Study, labels: np.ndarray, keep: np.ndarray, I, J) -> dict:
    """The comparisons of a scheduler set, as flat indices into (S, R, P) arrays: per kind, the
    test (representative) and the pair of each side, the rep pair id, high load, BurstGPT on it."""
    S, R, K = len(st.sources), len(st.regions), len(st.schedulers)
    P = len(I)
    kp = keep[I] & keep[J]
    test_rep = np.empty((S, R, P), dtype=np.int64)
    for si in range(S):
        for r in range(R):
            test_rep[si, r] = pair_keys(labels[si, r], None, I, J, K, keep=kp)
    rho = [st.rho.get(r_) for r_ in st.regions]
    high_r = np.array([x is not None and x >= HIGH_LOAD_RHO for x in rho])
    bg = [i for i, s in enumerate(st.sources) if builtin_source(s) in ("burstgpt", MODELED_ADAPTER)]
    out = {}
    for kind in ("cross_source", "cross_region"):
        t1, t2, p1, p2, pid, high, hasbg = [], [], [], [], [], [], []
        if kind == "cross_source":
            conds = [((s1, r), (s2, r)) for r in range(R) for s1 in range(S) for s2 in range(s1 + 1, S)]
        else:
            conds = [((s, r1), (s, r2)) for s in range(S) for r1 in range(R) for r2 in range(r1 + 1, R)]
        for (s1, r1), (s2, r2) in conds:
            rep = pair_keys(labels[s1, r1], labels[s2, r2], I, J, K, keep=kp)
            ok = (rep == np.arange(P)) & (test_rep[s1, r1] >= 0) & (test_rep[s2, r2] >= 0)
            pp = np.flatnonzero(ok)
            t1.append((s1 * R + r1) * P + test_rep[s1, r1, pp])
            t2.append((s2 * R + r2) * P + test_rep[s2, r2, pp])
            p1.append((s1 * R + r1) * P + pp)
            p2.append((s2 * R + r2) * P + pp)
            pid.append(pp)
            high.append(np.full(pp.size, bool(high_r[r1] or high_r[r2])))
            hasbg.append(np.full(pp.size, s1 in bg or s2 in bg))
        cat = (lambda xs, dt=np.int64: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
        out[kind] = {"t1": cat(t1), "t2": cat(t2), "p1": cat(p1), "p2": cat(p2), "pid": cat(pid),
                     "high": cat(high, bool), "bg": cat(hasbg, bool)}
    both = {k: np.concatenate([out["cross_source"][k], out["cross_region"][k]]) for k in out["cross_source"]}
    both["cross_region"] = np.concatenate([np.zeros(out["cross_source"]["t1"].size, bool),
                                           np.ones(out["cross_region"]["t1"].size, bool)])
    return {"both": both, "distinct": test_rep == np.arange(P)[None, None, :]}


def _prepare_comparisons(med: np.ndarray, made: np.ndarray, comp: dict, thrs: np.ndarray) -> dict:
    """What a metric's comparisons are, whatever the test: the comparisons made (both sides
    tested), their opposite signs and threshold index, per resample (row 0 = point)."""
    c = comp["both"]
    keep = made[c["p1"]] & made[c["p2"]]
    m1, m2 = med[:, c["p1"][keep]], med[:, c["p2"][keep]]
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(m1) & np.isfinite(m2)
        opp = ok & (m1 * m2 < 0)
        Mn = np.where(opp, np.minimum(np.abs(m1), np.abs(m2)), -np.inf)
    ti = np.zeros(Mn.shape, dtype=np.int64)
    for th in thrs:
        ti += Mn >= th                                        # reversal at every threshold index < ti (0: none)
    cr = c["cross_region"][keep]
    return {"keep": keep, "ok": ok, "opp": opp, "ti": ti, "cr": cr, "t1": c["t1"][keep], "t2": c["t2"][keep],
            "pid": c["pid"][keep], "high": c["high"][keep], "bg": c["bg"][keep], "T": len(thrs)}


def _count_reversals(q: np.ndarray, pre: dict, levels: np.ndarray) -> dict:
    """Reversals of one metric under every (level, threshold), per resample (row 0 = point), with
    the interval of the share and the point reversals' rule parts, for cross-source comparisons
    (``cs``) and for cross-source and cross-region together (``all``).

    q: (B+1, S*R*P) q-values; `pre` from `_prepare_comparisons`. A comparison is a reversal at
    level l and threshold t when its medians have opposite signs, the larger q <= l and the
    smaller |median| >= t.
    """
    B1 = q.shape[0]
    L, T = len(levels), pre["T"]
    ok, opp, ti, cr = pre["ok"], pre["opp"], pre["ti"], pre["cr"]
    with np.errstate(invalid="ignore"):
        Q = np.where(opp, np.fmax(q[:, pre["t1"]], q[:, pre["t2"]]), np.inf)
    li = np.zeros(Q.shape, dtype=np.int64)
    for lv in levels:
        li += Q > lv                                          # reversal at every level index >= li (L: none)
    code = ((np.arange(B1)[:, None] * 2 + cr[None, :]) * (L + 1) + li) * (T + 1) + ti
    h = np.bincount(code.ravel(), minlength=B1 * 2 * (L + 1) * (T + 1)).reshape(B1, 2, L + 1, T + 1)
    h = np.cumsum(h[:, :, :L], axis=2)                        # level index <= l
    h = np.cumsum(h[:, :, :, ::-1], axis=3)[:, :, :, ::-1][:, :, :, 1:]   # threshold index >= t
    n_cs = h[:, 0]
    n_all = h[:, 0] + h[:, 1]
    c_cs = (ok & ~cr[None, :]).sum(1)
    c_all = ok.sum(1)
    out = {}
    for kind, nr, nc, sel in (("cs", n_cs, c_cs, ~cr), ("all", n_all, c_all, np.ones(cr.shape, bool))):
        sel = sel & opp[0]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(nc[1:, None, None] > 0, nr[1:] / np.maximum(nc[1:, None, None], 1), np.nan)
        lo, hi = percentile_ci(share)
        out[kind] = {"n_rev": nr[0], "n_comp": int(nc[0]), "lo": lo, "hi": hi,
                     "li": li[0][sel], "ti": ti[0][sel], "pid": pre["pid"][sel], "high_rev": pre["high"][sel],
                     "bg": pre["bg"][sel], "n_high": int((pre["high"] & ok[0] & (~cr if kind == "cs" else True)).sum())}
    return out


def reversal_protocols(st: Study, rev: ReversalTests, labels: np.ndarray, axes: dict, msets: dict,
                        keeps: dict) -> dict:
    """The reversal claim for every combination of its axes: {protocol tuple: `ProtocolVerdict`,
    whose ``per_metric`` holds each metric's (metric, share, n_comparisons)}."""
    levels = np.array(sorted(axes["bh_level"]), dtype=np.float64)
    rels = np.array(sorted(axes["rel_threshold"]), dtype=np.float64)
    abss = np.array(sorted(axes["abs_threshold"]), dtype=np.float64)
    S, R, P = len(st.sources), len(st.regions), rev.P
    bg_any = any(builtin_source(s) in ("burstgpt", MODELED_ADAPTER) for s in st.sources)
    out = {}
    for sset in axes["scheduler_set"]:
        comp = _comparisons(st, labels, keeps[sset], rev.I, rev.J)
        dmask = comp["distinct"].reshape(-1)
        prepared = {}
        for m in sorted({m for ms in msets.values() for m in ms}):
            thrs = abss if metric_is_bounded(st.metrics[m]) else rels
            prepared[m] = _prepare_comparisons(rev.med[m].reshape(rev.med[m].shape[0], -1), rev.made[m].reshape(-1),
                                               comp, thrs)
        for test in axes["test"]:
            for fam in axes["bh_family"]:
                groups = ([(m, (m,)) for m in sorted({m for ms in msets.values() for m in ms})] if fam == "per_metric"
                          else [(k, tuple(ms)) for k, ms in msets.items() if k in axes["metric_set"]])
                counted = {}
                for gk, gms in groups:
                    flat = []
                    for m in gms:
                        made = (rev.made[m].reshape(-1) & dmask)
                        flat.append((m, made))
                    pcat = np.concatenate([rev.p[test][m].reshape(rev.p[test][m].shape[0], -1)[:, mk]
                                           for m, mk in flat], 1)
                    qcat = bh_rows(pcat)
                    off = 0
                    for m, mk in flat:
                        n = int(mk.sum())
                        q = np.full((pcat.shape[0], S * R * P), np.nan)
                        q[:, mk] = qcat[:, off:off + n]
                        off += n
                        counted[(gk, m)] = (_count_reversals(q, prepared[m], levels), metric_is_bounded(st.metrics[m]),
                                            st.metrics[m])
                for mset in axes["metric_set"]:
                    ms = msets[mset]
                    per = [counted[(m if fam == "per_metric" else mset, m)] for m in ms]
                    for li, lv in enumerate(levels):
                        for ri, rel in enumerate(rels):
                            for ai, ab in enumerate(abss):
                                for cmp_ in axes["comparison"]:
                                    kind = "cs" if cmp_ == "cross_source" else "all"
                                    out[(sset, test, fam, mset, float(lv), float(rel), float(ab), cmp_)] = \
                                        _reversal_verdict(st, per, li, ri, ai, kind, bg_any)
    return out


def _reversal_verdict(st: Study, per: list, li: int, ri: int, ai: int, kind: str, bg_any: bool) -> ProtocolVerdict:
    """The study form's reversal rule on every metric of the set; the pooled share is the value."""
    tot_rev = tot_comp = 0
    n_hold = 0
    per_metric = []
    for res, bounded, name in per:
        t = ai if bounded else ri
        d = res[kind]
        nr, nc = int(d["n_rev"][li, t]), d["n_comp"]
        tot_rev += nr
        tot_comp += nc
        per_metric.append((name, nr / nc if nc else None, nc))
        if nr == 0:
            continue
        lo, hi = d["lo"][li, t], d["hi"][li, t]
        inside = bool(np.isfinite(lo) and lo <= STUDY_SHARE <= hi)
        mask = (d["li"] <= li) & (d["ti"] > t)
        hr, hc = int((mask & d["high_rev"]).sum()), d["n_high"]
        one_pair = np.unique(d["pid"][mask]).size == 1
        all_bg = bool(d["bg"][mask].all())
        lr, lc = nr - hr, nc - hc
        rate_hi = hr / hc if hc else None
        rate_lo = lr / lc if lc else None
        clustered = rate_hi is not None and (rate_lo is None or (rate_lo == 0 and rate_hi > 0)
                                             or (rate_lo and rate_hi >= CLUSTER_FACTOR * rate_lo))
        if inside and clustered and one_pair and bg_any and all_bg:
            n_hold += 1
    value = tot_rev / tot_comp if tot_comp else None
    if not per or value is None:
        return ProtocolVerdict(None, "not comparable", tot_comp, tuple(per_metric))
    verdict = "holds" if n_hold == len(per) else ("does not hold" if n_hold == 0 else "partly holds")
    return ProtocolVerdict(value, verdict, tot_comp, tuple(per_metric))
