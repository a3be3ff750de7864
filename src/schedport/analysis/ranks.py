"""Rankings: within-window ranks, mean ranks over a condition's windows, and their bootstrap.

Within each window schedulers are ranked 1..K per metric (1 = best, ties averaged, NaN worst);
a scheduler's score in a (source, region) condition is its mean rank over the windows, and
its interval the percentile bootstrap over windows (one resample of window ids per source,
shared by every region and metric). `rank_schedulers` is the analysis's ranking step; the
concordance, best-changes and study-form steps all read its `Rankings`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from schedport.analysis.stats import percentile_ci, spearman_features, tau_features
from schedport.analysis.defaults import MIN_WINDOWS
from schedport.analysis.store_loading import Study


def within_window_ranks(vals: np.ndarray, direction: np.ndarray, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Within-window ranks (R, M, W, K), 0 where invalid, and the validity mask (R, M, W)."""
    orient = -direction[None, :, None, None]  # lower oriented value = better
    ov = vals * orient
    ov = np.where(np.isfinite(ov), ov, np.inf)
    r = stats.rankdata(ov, axis=-1)
    valid = block[:, None, :] & np.isfinite(vals).any(axis=-1)
    return np.where(valid[..., None], r, 0.0), valid


def mean_ranks(counts: np.ndarray, ranks: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Weighted mean ranks: counts (B, W) window weights -> (B, R, M, K); NaN where no weight."""
    R, M, W, K = ranks.shape
    num = counts @ ranks.transpose(2, 0, 1, 3).reshape(W, R * M * K)
    den = counts @ valid.transpose(2, 0, 1).reshape(W, R * M).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mr = num.reshape(-1, R, M, K) / den.reshape(-1, R, M, 1)
    return np.where(den.reshape(-1, R, M, 1) > 0, mr, np.nan)


def top_sets(mr: np.ndarray) -> np.ndarray:
    """Boolean mask of the schedulers tied for the best (lowest) mean rank; all False if NaN."""
    finite = np.isfinite(mr).all(axis=-1, keepdims=True)
    best = np.min(np.where(np.isfinite(mr), mr, np.inf), axis=-1, keepdims=True)
    return (mr == best) & finite


@dataclass
class Rankings:
    """The ranking step's result, per source: the arrays every later step reads.

    ``ranks``/``valid``: within-window ranks (R, M, W, K) and where a window ranks (R, M, W);
    ``counts``: the bootstrap's window weights (B, W); ``point``/``boot``: mean ranks (R, M, K)
    and their replicates (B, R, M, K), NaN where a condition has too few windows;
    ``point_top``/``boot_top``: the schedulers tied-best; ``tau_features``/``spearman_features``:
    the replicates' normalised pair-sign and centred-rank vectors with where they are defined
    (dot products of two give tau-b and rho); ``table``: the rows of ``rankings`` in
    portability.json.
    """

    n_boot: int
    ranks: dict
    valid: dict
    counts: dict
    point: dict
    boot: dict
    point_top: dict
    boot_top: dict
    tau_features: dict
    spearman_features: dict
    table: list


def rank_schedulers(st: Study, n_boot: int, rng: np.random.Generator, notes: list[str]) -> Rankings:
    """The ranking step: mean ranks per (source, region, metric) and their bootstrap over windows.

    Draws each source's B resamples of its windows from `rng`, in source order (the study form
    and `schedport explain` rely on that order). A condition with fewer than `MIN_WINDOWS`
    windows with a value is undefined there, and windows where every scheduler is NaN are left
    out; both are said in `notes`.
    """
    R, M, K = len(st.regions), len(st.metrics), len(st.schedulers)
    B = int(n_boot)
    point_mr, boot_mr, tauF, spF, tops = {}, {}, {}, {}, {}
    ranks_of, valid_of, counts_of = {}, {}, {}
    rankings = []
    for s in st.sources:
        ranks, valid = within_window_ranks(st.values[s], st.direction, st.block[s])
        ranks_of[s], valid_of[s] = ranks, valid
        W = ranks.shape[2]
        n_valid = valid.sum(axis=-1)  # (R, M)
        allnan = (st.block[s][:, None, :] & ~valid).sum(axis=-1)
        for r, m in zip(*np.nonzero(allnan)):
            if n_valid[r, m] >= 1:
                notes.append(f"{s} @ {st.regions[r]}, {st.metrics[m]}: {allnan[r, m]} window(s) where every "
                             "scheduler is NaN left out.")
        pm = mean_ranks(np.ones((1, W)), ranks, valid)[0]
        counts = rng.multinomial(W, np.full(W, 1.0 / W), size=B).astype(np.float64)
        counts_of[s] = counts
        bm = mean_ranks(counts, ranks, valid)
        # conditions without enough valid windows are undefined
        too_few = n_valid < MIN_WINDOWS
        pm[too_few] = np.nan
        bm[:, too_few] = np.nan
        for r, m in zip(*np.nonzero(too_few & st.block[s].any(axis=-1)[:, None])):
            notes.append(f"{s} @ {st.regions[r]}: metric {st.metrics[m]} has < {MIN_WINDOWS} windows with a "
                         "value; left out there.")
        point_mr[s], boot_mr[s] = pm, bm
        # float32 keeps order and ties: distinct mean ranks differ by >= 1/(2W), far above its precision
        f, dfn = tau_features(bm.astype(np.float32))
        tauF[s] = (f.astype(np.float32, copy=False), dfn)
        g, dg = spearman_features(bm)
        spF[s] = (g.astype(np.float32), dg)
        tops[s] = top_sets(bm)
        lo, hi = percentile_ci(bm)
        for r in range(R):
            for m in range(M):
                if not np.isfinite(pm[r, m]).all():
                    continue
                for k in range(K):
                    rankings.append({"metric": st.metrics[m], "region": st.regions[r], "source": s,
                                     "scheduler": st.schedulers[k], "mean_rank": pm[r, m, k],
                                     "ci_low": lo[r, m, k], "ci_high": hi[r, m, k],
                                     "n_windows": int(n_valid[r, m])})
    point_top = {s: top_sets(point_mr[s]) for s in st.sources}
    return Rankings(n_boot=B, ranks=ranks_of, valid=valid_of, counts=counts_of, point=point_mr, boot=boot_mr,
                    point_top=point_top, boot_top=tops, tau_features=tauF, spearman_features=spF, table=rankings)
