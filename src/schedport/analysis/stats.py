"""The statistics the portability analysis is made of, vectorised over conditions and replicates.

Benjamini-Hochberg q-values, Kendall's tau-b and Spearman's rho along the last axis of any
batch of vectors (the dot product of normalised pairwise-sign or centred-rank vectors), the
per-window relative effect, batched Wilcoxon signed-rank p-values, percentile and basic
bootstrap intervals, Wilson's score interval, and the JSON-safe form of their results. Each
is checked against its scipy counterpart in the tests; where a hand-written version is kept
instead of the scipy call, the reason (bytes or speed) is measured in a comment.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import numpy as np
from scipy import stats

from schedport.analysis.defaults import CI_LEVEL


def bh_adjust(pvalues) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values) of a 1-d array; NaN entries stay NaN.

    q_(i) = min over k >= i of p_(k) * m / k, capped at 1, with m the number of non-NaN
    p-values. Rejecting q <= alpha is the BH step-up procedure at FDR level alpha, over the
    family of every test made; checked against scipy in the tests.
    """
    # Not `scipy.stats.false_discovery_control(p[ok], method="bh")` (NaN kept out around it):
    # scipy scales p_(k) * (m / k), this p_(k) * m / k, which rounds differently in the last
    # bit. Measured on the frozen default study (9,360 runs): 554 of the 2,022 q-values written
    # to portability.json differ by exactly 1 ulp (largest relative difference 2.2e-16), no
    # verdict changes; on random p-values 0 of 122,570 differ once the product is taken in
    # scipy's order. The old bytes of portability.json are kept, so this stays.
    p = np.asarray(pvalues, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError("bh_adjust expects a 1-d array")
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    m = int(ok.sum())
    if m == 0:
        return out
    pv = p[ok]
    order = np.argsort(pv, kind="stable")
    scaled = pv[order] * m / np.arange(1, m + 1)
    q = np.minimum.accumulate(scaled[::-1])[::-1]
    q = np.clip(q, 0.0, 1.0)
    res = np.empty(m)
    res[order] = q
    out[ok] = res
    return out


def pair_index(k: int) -> tuple[np.ndarray, np.ndarray]:
    """The scheduler pairs (i < j) of K schedulers, as two index arrays in row-major order."""
    return np.triu_indices(k, 1)


def tau_features(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Normalised pairwise-sign vectors of `x` along its last axis, and where they are defined.

    For vectors x, y: tau_b(x, y) = sum_p s_p(x) s_p(y) / sqrt(#untied(x) #untied(y)), with
    s_p the sign of the difference of pair p; so tau_b is the dot product of these unit
    vectors. Undefined (all tied, or NaN present) -> zero vector and False.
    """
    i, j = pair_index(x.shape[-1])
    s = np.sign(x[..., i] - x[..., j])
    finite = np.isfinite(s).all(axis=-1)
    s = np.where(np.isfinite(s), s, 0.0)
    nn = np.count_nonzero(s, axis=-1)
    defined = finite & (nn > 0)
    scale = np.where(defined, 1.0 / np.sqrt(np.maximum(nn, 1)), 0.0)
    return s * scale[..., None], defined


def spearman_features(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Centred, normalised ranks of `x` along its last axis (dot product = Spearman's rho)."""
    finite = np.isfinite(x).all(axis=-1)
    r = stats.rankdata(np.where(np.isfinite(x), x, 0.0), axis=-1)
    c = r - r.mean(axis=-1, keepdims=True)
    norm = np.sqrt((c * c).sum(axis=-1))
    defined = finite & (norm > 1e-12)
    scale = np.where(defined, 1.0 / np.where(norm > 0, norm, 1.0), 0.0)
    return c * scale[..., None], defined


def kendall_tau_b(x, y) -> np.ndarray:
    """Kendall's tau-b between x and y along the last axis, for any leading (batch) shape.

    Equal to ``scipy.stats.kendalltau(x, y).statistic`` (variant b) per vector; NaN where
    either vector is constant or holds NaN. Vectorised so that B = 1000 bootstrap replicates
    of thousands of conditions take a few array operations instead of millions of calls.
    """
    # Speed: for 6 x 21 pairs of 13-vectors, scipy.stats.kendalltau in a loop takes ~600 us a
    # pair, this ~3.4 us a pair (2-core machine; values equal within 3.3e-16).
    fx, dx = tau_features(np.asarray(x, dtype=np.float64))
    fy, dy = tau_features(np.asarray(y, dtype=np.float64))
    t = (fx * fy).sum(axis=-1)
    return np.where(dx & dy, np.clip(t, -1.0, 1.0), np.nan)


def spearman_rho(x, y) -> np.ndarray:
    """Spearman's rho between x and y along the last axis (Pearson correlation of average ranks).

    Equal to ``scipy.stats.spearmanr(x, y).statistic`` per vector; NaN where either vector is
    constant or holds NaN. Vectorised like `kendall_tau_b`.
    """
    # Speed: scipy.stats.spearmanr in a loop ~480 us a pair, this ~4.4 us (as measured above).
    fx, dx = spearman_features(np.asarray(x, dtype=np.float64))
    fy, dy = spearman_features(np.asarray(y, dtype=np.float64))
    r = (fx * fy).sum(axis=-1)
    return np.where(dx & dy, np.clip(r, -1.0, 1.0), np.nan)


def relative_effect(a, b, direction: int) -> np.ndarray:
    """Per-window relative effect of A over B: direction * (A - B) / ((|A| + |B|) / 2).

    Positive means A is better whatever the metric's direction; scale-free, so windows of
    different size weigh alike; bounded in [-2, 2]; 0 when A = B = 0; NaN if either is NaN.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    den = (np.abs(a) + np.abs(b)) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        e = direction * (a - b) / den
    e = np.where(den == 0, 0.0, e)
    return np.where(np.isfinite(a) & np.isfinite(b), e, np.nan)


def wilcoxon_pvalues(effects) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided Wilcoxon signed-rank p-values of each row of `effects` against zero.

    NaN entries are missing windows. Zero effects are dropped (Wilcoxon's zero method); the
    exact null distribution is used when a row's nonzero |effects| are untied and n <= 50,
    the normal approximation with tie correction otherwise; p = 1 when no nonzero effect is
    left. Rows are batched by (n, ties) so scipy runs vectorised. Returns (p, n_used) where
    n_used counts the finite entries (NaN p where a row has none).
    """
    e = np.asarray(effects, dtype=np.float64)
    if e.ndim != 2:
        raise ValueError("wilcoxon_pvalues expects a 2-d array (tests x windows)")
    finite = np.isfinite(e)
    n_used = finite.sum(axis=1)
    nz = finite & (e != 0)
    n_nz = nz.sum(axis=1)
    p = np.where(n_used > 0, 1.0, np.nan)
    a = np.sort(np.where(nz, np.abs(e), np.nan), axis=1)
    ties = (a[:, 1:] == a[:, :-1]).any(axis=1) if e.shape[1] > 1 else np.zeros(len(e), bool)
    for n in np.unique(n_nz[n_nz > 0]):
        for tied in (False, True):
            rows = np.flatnonzero((n_nz == n) & (ties == tied))
            if rows.size == 0:
                continue
            vals = e[rows][nz[rows]].reshape(rows.size, int(n))
            method = "exact" if (not tied and n <= 50) else "asymptotic"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                res = stats.wilcoxon(vals, axis=1, method=method, zero_method="wilcox")
            p[rows] = np.clip(np.asarray(res.pvalue, dtype=np.float64), 0.0, 1.0)
    return p, n_used


def percentile_ci(boot: np.ndarray, level: float = CI_LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Percentile CI along axis 0, skipping NaN replicates (linear interpolation, like numpy)."""
    # Not np.nanpercentile(boot, [2.5, 97.5], axis=0): on one source's mean-rank replicates
    # (1000 x 6 x 21 x 13) this takes 31 ms, numpy's 337 ms (10x, and it runs for every
    # concordance statistic); numpy also interpolates from the upper neighbour when the
    # fraction is >= 0.5, which changes 1,498 of 3,276 bounds in the last bit (<= 1.5e-16).
    boot = np.asarray(boot, dtype=np.float64)
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2
    s = np.sort(boot, axis=0)  # NaN last
    n = np.isfinite(s).sum(axis=0)
    out = []
    for qq in (lo_q, hi_q):
        h = (np.maximum(n, 1) - 1) * qq
        lo = np.floor(h).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
        g = h - lo
        a = np.take_along_axis(s, lo[None, ...], axis=0)[0]
        b = np.take_along_axis(s, hi[None, ...], axis=0)[0]
        v = a + (b - a) * g
        out.append(np.where(n > 0, v, np.nan))
    return out[0], out[1]


def basic_ci(point, boot: np.ndarray, lo_bound: float = -1.0, hi_bound: float = 1.0,
             level: float = CI_LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Basic (reverse-percentile) bootstrap interval [2t - q_hi, 2t - q_lo], clipped to the range.

    Used for concordance statistics and shares: tau between *estimated* mean-rank vectors is
    pulled towards 0 by sampling noise, and a resample adds that noise again, so the replicates
    sit below the estimate and a plain percentile interval can exclude both the estimate and
    the truth (e.g. true tau = 1). The basic interval corrects for that shift.
    """
    q_lo, q_hi = percentile_ci(boot, level)
    t = np.asarray(point, dtype=np.float64)
    lo = np.clip(2 * t - q_hi, lo_bound, hi_bound)
    hi = np.clip(2 * t - q_lo, lo_bound, hi_bound)
    return lo, hi


def nanmean(x: np.ndarray, axis) -> np.ndarray:
    """`numpy.nanmean` without the warning for an all-NaN slice (it is NaN: undefined, as meant)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


def nanmin(x: np.ndarray, axis) -> np.ndarray:
    """`numpy.nanmin` without the warning for an all-NaN slice (it is NaN: undefined, as meant)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmin(x, axis=axis)


def wilson_interval(k: int, n: int, level: float = CI_LEVEL) -> tuple[Optional[float], Optional[float]]:
    """Wilson's score interval of a share k / n; (None, None) when n = 0.

    The pooled reversal share's interval. It treats the n comparisons as independent, which
    they are not (they share windows), so it is labelled as understating the uncertainty.
    """
    # Not scipy.stats.binomtest(k, n).proportion_ci(method="wilson"): it agrees within
    # 2.2e-16 but differs in the last bit for 14 of 50 (k, n) tried, which would change the
    # bytes of portability.json; it is also ~3.6x slower (1.26 ms vs 0.35 ms a call).
    if n <= 0:
        return None, None
    z = stats.norm.ppf(1 - (1 - level) / 2)
    ph = k / n
    den = 1 + z * z / n
    c = (ph + z * z / (2 * n)) / den
    h = z * math.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n)) / den
    return max(0.0, c - h), min(1.0, c + h)


def bh_by_group(p: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """BH q-values computed separately within each group label (NaN p stay NaN)."""
    out = np.full(p.shape, np.nan)
    for g in np.unique(groups):
        sel = groups == g
        out[sel] = bh_adjust(p[sel])
    return out


