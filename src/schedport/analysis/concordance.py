"""Concordance: do two rankings agree? Between sources, regions and metrics, with the headlines.

Between the mean-rank vectors of two sources (same region and metric), two regions (same
source and metric) and two metrics (same source and region): Kendall's tau-b, Spearman's rho
and top-1 agreement, each with its basic bootstrap interval from the replicates of the
ranking step (`schedport.analysis.ranks.Rankings`). Then the headline aggregates: the
cross-source tau per pair and region over the main metrics with its minimum, the mean
pairwise metric tau, the share of conditions whose best scheduler changes with the metric,
and the metric x metric matrix of the figure. The method is in `schedport.analysis.portability`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schedport.analysis.ranks import Rankings
from schedport.analysis.results import BestChanges, CrossSourceHeadline, Estimate, bootstrap_estimate
from schedport.analysis.stats import basic_ci, kendall_tau_b, nanmean, nanmin, spearman_rho
from schedport.common.values import json_safe
from schedport.analysis.store_loading import Study

#: A mean-rank vector with this many distinct values or fewer is flagged as tied.
TIED_DISTINCT = 3


def feature_dot(a: tuple, b: tuple) -> np.ndarray:
    """tau-b (or rho) of two batches of (features, defined) pairs: their dot product, NaN where
    either side is undefined (`schedport.analysis.stats.tau_features`)."""
    fa, da = a
    fb, db = b
    v = (fa * fb).sum(axis=-1, dtype=np.float64)
    return np.where(da & db, np.clip(v, -1, 1), np.nan)


def mean_ci(pt: np.ndarray, bt: np.ndarray, axes_pt, axes_bt, lo_b: float = -1.0) -> Estimate:
    """The mean of `pt` over `axes_pt` with the basic interval of the replicates' means (`bt`)."""
    return bootstrap_estimate(nanmean(pt, axes_pt), nanmean(bt, axes_bt), lo_b, 1.0)


@dataclass
class SourceConcordance:
    """Concordance between sources: ``entries`` (``concordance.sources`` rows), the source
    ``pairs`` (a, b), tau-b and top-1 agreement per (pair, region, metric) as point values
    (``tau_pt``, ``top_pt``: (P, R, M)) and replicates (``tau_bt``, ``top_bt``: (B, P, R, M))."""

    entries: list
    pairs: list
    tau_pt: np.ndarray
    tau_bt: np.ndarray
    top_pt: np.ndarray
    top_bt: np.ndarray


@dataclass
class MetricConcordance:
    """Concordance between metrics: ``entries`` (``concordance.metrics`` rows), the metric index
    ``pairs`` (i < j) as arrays ``pi_i``/``pi_j``, which of them are pairs of main metrics
    (``main_pair_ix``), and tau-b per (source, region, pair) (``tau_pt``) with its replicates
    (``tau_bt``)."""

    entries: list
    pairs: list
    main_pair_ix: list
    pi_i: np.ndarray
    pi_j: np.ndarray
    tau_pt: np.ndarray
    tau_bt: np.ndarray


def source_concordance(st: Study, rk: Rankings) -> SourceConcordance:
    """tau-b, rho and top-1 agreement between every two sources' mean ranks, per region and metric."""
    R, M, B = len(st.regions), len(st.metrics), rk.n_boot
    tauF, spF, tops, point_mr, boot_mr, point_top = (rk.tau_features, rk.spearman_features, rk.boot_top,
                                                     rk.point, rk.boot, rk.point_top)
    conc_sources = []
    src_pairs = [(a, b) for ia, a in enumerate(st.sources) for b in st.sources[ia + 1:]]
    src_tau_pt = np.full((len(src_pairs), R, M), np.nan)
    src_tau_bt = np.full((B, len(src_pairs), R, M), np.nan)
    src_top_pt = np.full((len(src_pairs), R, M), np.nan)
    src_top_bt = np.full((B, len(src_pairs), R, M), np.nan)
    for pi, (a, b) in enumerate(src_pairs):
        tb = feature_dot(tauF[a], tauF[b])  # (B, R, M)
        sb = feature_dot(spF[a], spF[b])
        top_b = (tops[a] & tops[b]).any(axis=-1).astype(np.float64)
        defined_b = np.isfinite(boot_mr[a]).all(-1) & np.isfinite(boot_mr[b]).all(-1)
        top_b = np.where(defined_b, top_b, np.nan)
        src_tau_bt[:, pi] = tb
        src_top_bt[:, pi] = top_b
        tau_pt = kendall_tau_b(point_mr[a], point_mr[b])  # (R, M)
        sp_pt = spearman_rho(point_mr[a], point_mr[b])
        tlo, thi = basic_ci(tau_pt, tb)
        slo, shi = basic_ci(sp_pt, sb)
        for r in range(R):
            for m in range(M):
                x, y = point_mr[a][r, m], point_mr[b][r, m]
                if not (np.isfinite(x).all() and np.isfinite(y).all()):
                    continue
                t, sp = tau_pt[r, m], sp_pt[r, m]
                top1 = float((point_top[a][r, m] & point_top[b][r, m]).any())
                src_tau_pt[pi, r, m] = t
                src_top_pt[pi, r, m] = top1
                nda, ndb = len(np.unique(x)), len(np.unique(y))
                conc_sources.append({
                    "metric": st.metrics[m], "region": st.regions[r], "source_a": a, "source_b": b,
                    "tau": t, "ci_low": tlo[r, m], "ci_high": thi[r, m],
                    "n_distinct_a": nda, "n_distinct_b": ndb, "tied": min(nda, ndb) <= TIED_DISTINCT,
                    "spearman": sp, "spearman_ci_low": slo[r, m], "spearman_ci_high": shi[r, m],
                    "top1": top1, "top1_support": nanmean(top_b[:, r, m], 0)})
    return SourceConcordance(conc_sources, src_pairs, src_tau_pt, src_tau_bt, src_top_pt, src_top_bt)


def region_concordance(st: Study, rk: Rankings) -> list:
    """tau-b, rho and top-1 agreement between every two regions of a source, per metric
    (the ``concordance.regions`` rows); the replicates come from Gram matrices over regions."""
    R, M = len(st.regions), len(st.metrics)
    tauF, spF, tops, point_mr, boot_mr, point_top = (rk.tau_features, rk.spearman_features, rk.boot_top,
                                                     rk.point, rk.boot, rk.point_top)
    conc_regions = []
    reg_pairs = [(i, j) for i in range(R) for j in range(i + 1, R)]
    for s in st.sources:
        f, dfn = tauF[s]
        g, dg = spF[s]
        # (B, R, M, P) -> (B, M, R, P): Gram over regions
        ft = np.ascontiguousarray(f.transpose(0, 2, 1, 3))
        gt = np.ascontiguousarray(g.transpose(0, 2, 1, 3))
        tg = ft @ ft.transpose(0, 1, 3, 2)  # (B, M, R, R)
        sg = gt @ gt.transpose(0, 1, 3, 2)
        tp = tops[s].transpose(0, 2, 1, 3).astype(np.float32)
        topg = (tp @ tp.transpose(0, 1, 3, 2)) > 0
        dd = dfn.transpose(0, 2, 1)  # (B, M, R)
        ds = dg.transpose(0, 2, 1)
        defined = np.isfinite(boot_mr[s]).all(-1).transpose(0, 2, 1)
        for (i, j) in reg_pairs:
            tb = np.where(dd[:, :, i] & dd[:, :, j], np.clip(tg[:, :, i, j], -1, 1), np.nan)
            sb = np.where(ds[:, :, i] & ds[:, :, j], np.clip(sg[:, :, i, j], -1, 1), np.nan)
            top_b = np.where(defined[:, :, i] & defined[:, :, j], topg[:, :, i, j].astype(float), np.nan)
            tau_pt = kendall_tau_b(point_mr[s][i], point_mr[s][j])  # (M,)
            sp_pt = spearman_rho(point_mr[s][i], point_mr[s][j])
            tlo, thi = basic_ci(tau_pt, tb)
            slo, shi = basic_ci(sp_pt, sb)
            for m in range(M):
                x, y = point_mr[s][i, m], point_mr[s][j, m]
                if not (np.isfinite(x).all() and np.isfinite(y).all()):
                    continue
                t, sp = tau_pt[m], sp_pt[m]
                nda, ndb = len(np.unique(x)), len(np.unique(y))
                conc_regions.append({
                    "metric": st.metrics[m], "source": s, "region_a": st.regions[i], "region_b": st.regions[j],
                    "tau": t, "ci_low": tlo[m], "ci_high": thi[m],
                    "n_distinct_a": nda, "n_distinct_b": ndb, "tied": min(nda, ndb) <= TIED_DISTINCT,
                    "spearman": sp, "spearman_ci_low": slo[m], "spearman_ci_high": shi[m],
                    "top1": float((point_top[s][i, m] & point_top[s][j, m]).any()),
                    "top1_support": nanmean(top_b[:, m], 0)})
    return conc_regions


def metric_concordance(st: Study, rk: Rankings, mi: np.ndarray) -> MetricConcordance:
    """tau-b, rho and top-1 agreement between every two metrics of a (source, region) condition;
    `mi` (the main metrics' indices) marks the pairs of main metrics."""
    S, R, M, B = len(st.sources), len(st.regions), len(st.metrics), rk.n_boot
    tauF, spF, tops, point_mr, boot_mr, point_top = (rk.tau_features, rk.spearman_features, rk.boot_top,
                                                     rk.point, rk.boot, rk.point_top)
    conc_metrics = []
    met_pairs = [(i, j) for i in range(M) for j in range(i + 1, M)]
    main_set = set(mi.tolist())
    main_pair_ix = [n for n, (i, j) in enumerate(met_pairs) if i in main_set and j in main_set]
    met_tau_pt = np.full((S, R, len(met_pairs)), np.nan)
    met_tau_bt = np.full((B, S, R, len(met_pairs)), np.nan)
    pi_i = np.array([i for i, _ in met_pairs], dtype=np.int64)
    pi_j = np.array([j for _, j in met_pairs], dtype=np.int64)
    for si, s in enumerate(st.sources):
        f, dfn = tauF[s]
        g, dg = spF[s]
        tg = f @ f.transpose(0, 1, 3, 2)  # (B, R, M, M)
        sg = g @ g.transpose(0, 1, 3, 2)
        tp = tops[s].astype(np.float32)
        topg = (tp @ tp.transpose(0, 1, 3, 2)) > 0
        defined = np.isfinite(boot_mr[s]).all(-1)  # (B, R, M)
        if not met_pairs:
            continue
        tb = np.where(dfn[:, :, pi_i] & dfn[:, :, pi_j], np.clip(tg[:, :, pi_i, pi_j], -1, 1), np.nan)
        sb = np.where(dg[:, :, pi_i] & dg[:, :, pi_j], np.clip(sg[:, :, pi_i, pi_j], -1, 1), np.nan)
        top_b = np.where(defined[:, :, pi_i] & defined[:, :, pi_j], topg[:, :, pi_i, pi_j].astype(float), np.nan)
        met_tau_bt[:, si] = tb
        tsup = nanmean(top_b, 0)
        tau_pt = kendall_tau_b(point_mr[s][:, pi_i], point_mr[s][:, pi_j])  # (R, pairs)
        sp_pt = spearman_rho(point_mr[s][:, pi_i], point_mr[s][:, pi_j])
        tlo, thi = basic_ci(tau_pt, tb)
        slo, shi = basic_ci(sp_pt, sb)
        for r in range(R):
            for n, (i, j) in enumerate(met_pairs):
                x, y = point_mr[s][r, i], point_mr[s][r, j]
                if not (np.isfinite(x).all() and np.isfinite(y).all()):
                    continue
                t, sp = tau_pt[r, n], sp_pt[r, n]
                met_tau_pt[si, r, n] = t
                nda, ndb = len(np.unique(x)), len(np.unique(y))
                conc_metrics.append({
                    "source": s, "region": st.regions[r], "metric_a": st.metrics[i], "metric_b": st.metrics[j],
                    "tau": t, "ci_low": tlo[r, n], "ci_high": thi[r, n],
                    "n_distinct_a": nda, "n_distinct_b": ndb, "tied": min(nda, ndb) <= TIED_DISTINCT,
                    "spearman": sp, "spearman_ci_low": slo[r, n], "spearman_ci_high": shi[r, n],
                    "top1": float((point_top[s][r, i] & point_top[s][r, j]).any()),
                    "top1_support": tsup[r, n]})
    return MetricConcordance(conc_metrics, met_pairs, main_pair_ix, pi_i, pi_j, met_tau_pt, met_tau_bt)


def best_changes(st: Study, rk: Rankings, mc: MetricConcordance, mi: np.ndarray, notes: list[str]) -> BestChanges:
    """Does the best scheduler change with the metric? Per (source, region) condition: no scheduler
    tied-best on every main metric (and, pairwise, two main metrics' best sets disjoint).

    Returns the share and the pairwise share with their intervals (the share undefined, said in
    `notes`, with fewer than two main metrics) and, per condition, whether it changed and the
    best schedulers per main metric.
    """
    S, R, B = len(st.sources), len(st.regions), rk.n_boot
    point_mr, boot_mr, point_top, tops = rk.point, rk.boot, rk.point_top, rk.boot_top
    met_pairs, main_pair_ix = mc.pairs, mc.main_pair_ix
    per_condition = []
    changed_pt = np.full((S, R), np.nan)
    changed_bt = np.full((B, S, R), np.nan)
    pair_changed_pt = np.full((S, R, max(len(main_pair_ix), 1)), np.nan)
    pair_changed_bt = np.full((B, S, R, max(len(main_pair_ix), 1)), np.nan)
    mains_i = np.array([met_pairs[n][0] for n in main_pair_ix], dtype=np.int64)
    mains_j = np.array([met_pairs[n][1] for n in main_pair_ix], dtype=np.int64)
    for si, s in enumerate(st.sources):
        tp_pt = point_top[s][:, mi]  # (R, Mm, K)
        ok_pt = np.isfinite(point_mr[s][:, mi]).all(axis=(-1, -2))
        ch = ~tp_pt.all(axis=-2).any(axis=-1)
        changed_pt[si] = np.where(ok_pt, ch, np.nan)
        tb = tops[s][:, :, mi]  # (B, R, Mm, K)
        ok_b = np.isfinite(boot_mr[s][:, :, mi]).all(axis=(-1, -2))
        changed_bt[:, si] = np.where(ok_b, ~tb.all(axis=-2).any(axis=-1), np.nan)
        if len(main_pair_ix):
            pt = point_top[s]
            dis = ~(pt[:, mains_i] & pt[:, mains_j]).any(-1)
            okp = np.isfinite(point_mr[s][:, mains_i]).all(-1) & np.isfinite(point_mr[s][:, mains_j]).all(-1)
            pair_changed_pt[si] = np.where(okp, dis, np.nan)
            bt = tops[s]
            disb = ~(bt[:, :, mains_i] & bt[:, :, mains_j]).any(-1)
            okb = np.isfinite(boot_mr[s][:, :, mains_i]).all(-1) & np.isfinite(boot_mr[s][:, :, mains_j]).all(-1)
            pair_changed_bt[:, si] = np.where(okb, disb, np.nan)
        for r in range(R):
            if not ok_pt[r]:
                continue
            best = {st.metrics[m]: [st.schedulers[k] for k in np.flatnonzero(point_top[s][r, m])] for m in mi}
            per_condition.append({"source": s, "region": st.regions[r], "changed": bool(ch[r]), "best": best})
    if len(mi) >= 2 and np.isfinite(changed_pt).any():
        share = float(np.nanmean(changed_pt))
        bc = bootstrap_estimate(share, nanmean(changed_bt.reshape(B, -1), 1), 0.0, 1.0).labelled(
            n_conditions=int(np.isfinite(changed_pt).sum()), n_changed=int(np.nansum(changed_pt)))
        bcp = bootstrap_estimate(nanmean(pair_changed_pt.ravel(), 0), nanmean(pair_changed_bt.reshape(B, -1), 1),
                                 0.0, 1.0)
    else:
        bc = Estimate.undefined().labelled(n_conditions=0, n_changed=0)
        bcp = Estimate.undefined()
        notes.append("Best-changes-with-metric share undefined: needs >= 2 main metrics in an analysed condition.")
    bc = bc.labelled(definition="share of (source, region) conditions in which no scheduler is tied-best on every "
                                "main metric (the intersection over main metrics of the best-scheduler sets is empty)")
    bcp = bcp.labelled(definition="share of (condition, main-metric pair) whose best-scheduler sets are disjoint")
    return BestChanges(share=bc, pairwise=bcp, conditions=per_condition)


def cross_source_headline(st: Study, sc: SourceConcordance, mi: np.ndarray, n_boot: int,
                          notes: list[str]) -> CrossSourceHeadline:
    """The cross-source headline (``headline.cross_source``): tau-b over the main metrics per
    source pair and region, per pair (main and all metrics), the lowest pair (its own interval,
    and the interval of the minimum) and the lowest pair x region cell, and top-1 agreement."""
    R, B = len(st.regions), n_boot
    src_pairs, src_tau_pt, src_tau_bt, src_top_pt, src_top_bt = sc.pairs, sc.tau_pt, sc.tau_bt, sc.top_pt, sc.top_bt
    by_pair_region, by_pair, by_pair_all = [], [], []
    pair_vals_pt, pair_vals_bt = [], []
    cell_pt = np.full((len(src_pairs), R), np.nan)
    cell_bt = np.full((B, len(src_pairs), R), np.nan)
    for pi, (a, b) in enumerate(src_pairs):
        sub_pt = src_tau_pt[pi][:, mi]  # (R, Mm)
        sub_bt = src_tau_bt[:, pi][:, :, mi]
        for r in range(R):
            cell_pt[pi, r] = nanmean(sub_pt[r], 0)
            cell_bt[:, pi, r] = nanmean(sub_bt[:, r], 1)
            by_pair_region.append(bootstrap_estimate(cell_pt[pi, r], cell_bt[:, pi, r]).labelled(
                source_a=a, source_b=b, region=st.regions[r], n_metrics=int(np.isfinite(sub_pt[r]).sum())))
        ppt = nanmean(sub_pt.ravel(), 0)
        pbt = nanmean(sub_bt.reshape(B, -1), 1)
        pair_vals_pt.append(ppt)
        pair_vals_bt.append(pbt)
        by_pair.append(bootstrap_estimate(ppt, pbt).labelled(source_a=a, source_b=b,
                                                             n_values=int(np.isfinite(sub_pt).sum())))
        by_pair_all.append(mean_ci(src_tau_pt[pi].ravel(), src_tau_bt[:, pi].reshape(B, -1), 0, 1).labelled(
            source_a=a, source_b=b, n_values=int(np.isfinite(src_tau_pt[pi]).sum())))
    if src_pairs and np.isfinite(pair_vals_pt).any():
        pv = np.array(pair_vals_pt)
        k = int(np.nanargmin(pv))
        mlo, mhi = basic_ci(pv[k], nanmin(np.stack(pair_vals_bt, axis=1), 1))
        # the pair's own interval (one interval per number), with the interval of the minimum beside it
        min_pair = by_pair[k].labelled(min_over_pairs_ci_low=json_safe(mlo), min_over_pairs_ci_high=json_safe(mhi))
        flat = cell_pt.ravel()
        kc = int(np.nanargmin(flat))
        pc, rc = divmod(kc, R)
        min_cell = bootstrap_estimate(flat[kc], nanmin(cell_bt.reshape(B, -1), 1)).labelled(
            source_a=src_pairs[pc][0], source_b=src_pairs[pc][1], region=st.regions[rc])
        top1_src = mean_ci(src_top_pt[:, :, mi].ravel(), src_top_bt[:, :, :, mi].reshape(B, -1), 0, 1, 0.0)
    else:
        min_pair = min_cell = None
        top1_src = Estimate.undefined()
        if len(st.sources) < 2:
            notes.append("One source only: no cross-source concordance.")
    return CrossSourceHeadline(by_pair_region=by_pair_region, by_pair=by_pair, by_pair_all_metrics=by_pair_all,
                               min_pair=min_pair, min_cell=min_cell, top1_agreement=top1_src)


def metric_headline(mc: MetricConcordance, n_boot: int) -> tuple[Estimate, Estimate]:
    """The mean pairwise metric tau-b with its interval: over pairs of main metrics, and over all
    pairs of analysed metrics, each over every (source, region) condition."""
    B = n_boot
    met_pairs, main_pair_ix, met_tau_pt, met_tau_bt = mc.pairs, mc.main_pair_ix, mc.tau_pt, mc.tau_bt
    if main_pair_ix:
        mpt = met_tau_pt[:, :, main_pair_ix]
        mbt = met_tau_bt[:, :, :, main_pair_ix]
        met_main = mean_ci(mpt.ravel(), mbt.reshape(B, -1), 0, 1).labelled(n_values=int(np.isfinite(mpt).sum()))
    else:
        met_main = Estimate.undefined().labelled(n_values=0)
    if met_pairs:
        met_all = mean_ci(met_tau_pt.ravel(), met_tau_bt.reshape(B, -1), 0, 1).labelled(
            n_values=int(np.isfinite(met_tau_pt).sum()))
    else:
        met_all = Estimate.undefined().labelled(n_values=0)
    met_main = met_main.labelled(
        definition="mean Kendall tau-b over all pairs of main metrics and all (source, region) conditions")
    met_all = met_all.labelled(definition="mean Kendall tau-b over all pairs of analysed metrics and all conditions")
    return met_main, met_all


def metric_matrix(st: Study, mc: MetricConcordance) -> np.ndarray:
    """The metric x metric tau-b matrix (mean over conditions; 1 on the diagonal), for the figure."""
    M = len(st.metrics)
    met_pairs, pi_i, pi_j, met_tau_pt = mc.pairs, mc.pi_i, mc.pi_j, mc.tau_pt
    mat = np.full((M, M), np.nan)
    np.fill_diagonal(mat, 1.0)
    if met_pairs:
        mm = nanmean(met_tau_pt.reshape(-1, len(met_pairs)), 0)
        mat[pi_i, pi_j] = mm
        mat[pi_j, pi_i] = mm
    return mat


def cross_source_tau_by_metric(st: Study, sc: SourceConcordance, mi: np.ndarray) -> list:
    """The study form's cross-source tau: per source pair and main metric, the mean over regions
    of tau-b with its interval, the regions where a vector is tied, and tau per region."""
    R = len(st.regions)
    conc_sources, src_pairs, src_tau_pt, src_tau_bt = sc.entries, sc.pairs, sc.tau_pt, sc.tau_bt
    tied_src = {}
    for d in conc_sources:
        key = (d["source_a"], d["source_b"], d["metric"])
        tied_src[key] = tied_src.get(key, 0) + int(d["tied"])
    cross_tau = []
    for pi, (a, b) in enumerate(src_pairs):
        for m in mi:
            pt = src_tau_pt[pi, :, m]
            if not np.isfinite(pt).any():
                continue
            cross_tau.append(bootstrap_estimate(nanmean(pt, 0), nanmean(src_tau_bt[:, pi, :, m], 1)).labelled(
                source_a=a, source_b=b, metric=st.metrics[m], n_regions=int(np.isfinite(pt).sum()),
                n_tied_regions=tied_src.get((a, b, st.metrics[m]), 0),
                by_region={st.regions[r]: json_safe(pt[r]) for r in range(R)}))
    return cross_tau
