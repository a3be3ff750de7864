"""Do the simulated scheduler rankings hold on a real engine? The rank agreement of ``schedport validate``.

A *condition* is a (window, region). For each condition and metric, the schedulers are
compared across the two engines:

- Kendall's tau-b between the simulated and the real values (``scipy.stats.kendalltau``).
  A scheduler whose metric is NaN (e.g. no completed request, so no latency) ranks worst,
  tied with the other NaNs of its side, as in `schedport.analysis.portability`: a scheduler that
  completes nothing must not look good. tau is None with fewer than two schedulers or
  when either side is constant (all tied).
- Top-1 agreement: the set of schedulers tied for the best simulated value intersects
  the set tied for the best real value (ties are exact equality; the definition of
  `schedport.analysis.portability`). None when every value of a side is NaN. Top-1 agreement
  *within noise* widens each set to the schedulers the data cannot tell from the best:
  within t of it, or on the real side with repeats overlapping the best's.

For every scheduler pair (a, b), a before b alphabetically, and metric, per condition:
the relative differences d_sim = (sim_a - sim_b) / sim_b and d_real likewise (None when a
value is missing or the denominator is 0). The raw sign is recorded, not an orientation:
for latencies d < 0 means a is better, for higher-is-better metrics d > 0 does. With
threshold t (default 5%):

- ``real_tie``: |d_real| < t (or exactly 0, so that t = 0 is usable), a difference
  within measurement noise; it neither holds nor contradicts the simulation and is
  counted apart. With repeated replays (``real_lo_<m>`` / ``real_hi_<m>`` given) a
  difference whose two schedulers' repeats overlap is a real tie as well.
- ``held``: sign(d_sim) == sign(d_real), defined only when both are defined and the real
  difference is not a tie. A simulated near-tie still states an order, so it is judged.
- ``sim_tie``: |d_sim| < t (or exactly 0), recorded for reading.

Across conditions, the simulation's prediction for a pair and metric, ignoring conditions
where |d_sim| < t, is:

- ``stable``: d_sim has one sign wherever it is beyond t. It *held* on the real engine
  when d_real has that sign in every condition where |d_real| >= t; it is *not held* if
  any such condition has the other sign; when no real difference is beyond t it is a
  *real tie* (None): the real engine does not separate the pair.
- ``flip``: d_sim >= t in some condition and <= -t in another: the simulation predicts
  the order reverses between conditions. It *reproduced* when the real engine shows the
  same flip: some condition with d_sim >= t has d_real >= t, and some condition with
  d_sim <= -t has d_real <= -t. The flip's size is min(max d_sim, -min d_sim), the
  smaller side of its most extreme pair of conditions (recorded in ``flip``); the "most
  dramatic" flip is the one of largest size.
- ``tie``: no condition has |d_sim| >= t; ``undefined``: no condition has a d_sim.

Summaries per metric and overall: mean, median and minimum tau over conditions (undefined
ones skipped and counted), top-1 agreement rate, the share of per-condition pairwise
predictions held (real ties and undefined ones excluded), and the counts of stable and
flip predictions with how many held or reproduced.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Optional

import numpy as np
import pandas as pd
from scipy import stats

from schedport.analysis.validation_errors import check_columns, relative_error
from schedport.common.values import json_safe

__all__ = ["HIGHER_IS_BETTER", "DEFAULT_THRESHOLD", "rank_agreement"]

#: Metrics where a higher value is better (the default of `rank_agreement`).
HIGHER_IS_BETTER: frozenset[str] = frozenset({"throughput_rps"})

#: A relative difference smaller than this is a tie (5%).
DEFAULT_THRESHOLD = 0.05


def _sign(v: Optional[float]) -> Optional[int]:
    if v is None:
        return None
    return int(np.sign(v))


def _best_set(oriented: np.ndarray) -> Optional[set]:
    """Indices tied for the lowest oriented value (NaN already +inf); None if all are +inf."""
    if oriented.size == 0 or not np.isfinite(oriented).any():
        return None
    return set(np.flatnonzero(oriented == oriented.min()).tolist())


def _near_best_set(oriented: np.ndarray, thr: float, lo: Optional[np.ndarray] = None,
                   hi: Optional[np.ndarray] = None) -> Optional[set]:
    """Indices the data cannot separate from the best: within relative `thr` of the best value,
    or (with repeat ranges `lo`/`hi`, oriented like the values) overlapping the best's range."""
    best = _best_set(oriented)
    if best is None:
        return None
    b = min(best)
    v0 = oriented[b]
    out = set(best)
    for i, v in enumerate(oriented):
        if not np.isfinite(v):
            continue
        if v0 != 0 and abs(v - v0) / abs(v0) < thr:
            out.add(i)
        elif lo is not None and hi is not None and all(np.isfinite(x) for x in (lo[i], hi[i], lo[b], hi[b])):
            if not (hi[b] < lo[i] or hi[i] < lo[b]):
                out.add(i)
    return out


def _tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall tau-b of two equal-length vectors (+inf allowed, as worst); NaN if undefined."""
    if a.size < 2:
        return math.nan
    ra, rb = stats.rankdata(a), stats.rankdata(b)
    if np.ptp(ra) == 0 or np.ptp(rb) == 0:
        return math.nan
    return float(stats.kendalltau(ra, rb).statistic)


def _stats_of(values: list) -> tuple[Optional[float], Optional[float], Optional[float], int]:
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return None, None, None, 0
    return float(v.mean()), float(np.median(v)), float(v.min()), int(v.size)


def _share(k: int, n: int) -> Optional[float]:
    return k / n if n else None


def rank_agreement(runs: pd.DataFrame, metrics: Sequence[str], threshold: float = DEFAULT_THRESHOLD,
                   higher_is_better: Optional[Iterable[str]] = None) -> dict:
    """Do the simulated scheduler rankings hold on the real engine? (see module docstring)

    ``runs``: one row per (window, region, scheduler) with ``sim_<m>`` and ``real_<m>`` for
    each metric m, and optionally ``real_lo_<m>`` / ``real_hi_<m>``, the smallest and largest
    real value over repeated replays: a real difference then also needs the two schedulers'
    ranges apart (with 3 repeats each, a one-sided permutation test at p = 0.05).
    ``higher_is_better``: metrics where higher is better (default
    `HIGHER_IS_BETTER`); it orients only top-1 agreement and the "a better" reading of a
    stable prediction, the signs themselves are raw. Returns ``{"conditions": [...],
    "pairs": [...], "summary": {...}}``:

    - conditions: one dict per (window, region, metric): ``window``, ``region``, ``metric``,
      ``n_schedulers``, ``n_nan_sim``, ``n_nan_real``, ``tau``, ``top1_agree``, ``best_sim``,
      ``best_real`` (scheduler names tied for best).
    - pairs: one dict per (scheduler_a, scheduler_b, metric): ``verdict`` ("stable", "flip",
      "tie", "undefined"), ``sim_sign``, ``a_better`` (stable only), ``n_conditions``,
      ``n_sim_beyond``, ``n_real_beyond``, ``n_real_agree``, ``n_real_contradict`` (real
      conditions beyond the threshold with the simulated stable sign / the other one),
      ``held`` (stable: True, False or None for a real tie), ``reproduced`` (flip: bool),
      ``flip`` (flip: ``magnitude``, ``condition_pos`` / ``condition_neg`` as {window,
      region}, ``sim_diff_pos``, ``sim_diff_neg``, ``real_diff_pos``, ``real_diff_neg``) and
      ``conditions``: per condition ``window``, ``region``, ``sim_diff``, ``real_diff``,
      ``sim_sign``, ``real_sign``, ``sim_tie``, ``real_tie``, ``held``.
    - summary: ``threshold``, ``higher_is_better``, ``schedulers``, ``n_conditions``,
      ``by_metric`` (one dict per metric, keys below), ``overall`` (the same keys over all
      metrics), ``most_dramatic_flip`` and ``definitions``. Per-metric keys: ``metric``,
      ``direction``, ``n_conditions``, ``n_tau``, ``tau_mean``, ``tau_median``, ``tau_min``,
      ``n_top1``, ``top1_agreement``, ``n_pair_predictions``, ``n_pair_held``,
      ``pair_held_share``, ``n_pair_real_tie``, ``n_pair_undefined``, ``n_stable``,
      ``n_stable_held``, ``n_stable_not_held``, ``n_stable_real_tie``, ``stable_held_share``,
      ``n_flip``, ``n_flip_reproduced``, ``n_tie``, ``n_undefined``, ``most_dramatic_flip``.
    """
    thr = float(threshold)
    if not (math.isfinite(thr) and thr >= 0):
        raise ValueError(f"threshold must be finite and >= 0, got {threshold!r}")
    metrics = list(metrics)
    hib = set(HIGHER_IS_BETTER if higher_is_better is None else higher_is_better)
    check_columns(runs, ["window", "region", "scheduler"]
                  + [f"{p}_{m}" for m in metrics for p in ("sim", "real")], "runs")
    if runs.duplicated(["window", "region", "scheduler"]).any():
        raise ValueError("runs: more than one row for a (window, region, scheduler)")

    scheds = sorted({str(s) for s in runs["scheduler"]})
    sidx = {s: k for k, s in enumerate(scheds)}
    conds = list(dict.fromkeys(zip(runs["window"].tolist(), runs["region"].tolist())))
    cidx = {c: i for i, c in enumerate(conds)}
    C, K = len(conds), len(scheds)
    present = np.zeros((C, K), dtype=bool)
    ci = np.array([cidx[c] for c in zip(runs["window"].tolist(), runs["region"].tolist())], dtype=np.int64)
    ki = np.array([sidx[str(s)] for s in runs["scheduler"]], dtype=np.int64)
    present[ci, ki] = True

    conditions: list[dict] = []
    pairs: list[dict] = []
    by_metric: list[dict] = []
    for m in metrics:
        sim = np.full((C, K), np.nan)
        real = np.full((C, K), np.nan)
        sim[ci, ki] = pd.to_numeric(runs[f"sim_{m}"], errors="coerce").to_numpy(dtype=np.float64)
        real[ci, ki] = pd.to_numeric(runs[f"real_{m}"], errors="coerce").to_numpy(dtype=np.float64)
        lo = np.full((C, K), np.nan)
        hi = np.full((C, K), np.nan)
        if f"real_lo_{m}" in runs.columns and f"real_hi_{m}" in runs.columns:
            lo[ci, ki] = pd.to_numeric(runs[f"real_lo_{m}"], errors="coerce").to_numpy(dtype=np.float64)
            hi[ci, ki] = pd.to_numeric(runs[f"real_hi_{m}"], errors="coerce").to_numpy(dtype=np.float64)
        d = 1.0 if m in hib else -1.0  # +1: higher is better

        # ---- per condition: tau and top-1 across schedulers
        recs, taus, top1, top1_noise = _conditions(m, d, conds, present, scheds, sim, real, lo, hi, thr)
        conditions += recs

        # ---- per pair: per-condition signs, then the cross-condition verdict
        cnt = {"pred": 0, "held": 0, "real_tie": 0, "undef": 0}
        mpairs = []
        for a in range(K):
            for b in range(a + 1, K):
                rec = _pair(scheds[a], scheds[b], m, d, conds, present[:, a] & present[:, b],
                            sim[:, a], sim[:, b], real[:, a], real[:, b], thr, cnt,
                            (lo[:, a], hi[:, a], lo[:, b], hi[:, b]))
                mpairs.append(rec)
        pairs += mpairs
        by_metric.append(_metric_summary(m, d, taus, top1, cnt, mpairs, top1_noise))

    overall = _overall(by_metric, conditions, pairs)
    flips = [p for p in pairs if p["verdict"] == "flip"]
    summary = {
        "threshold": thr,
        "higher_is_better": sorted(m for m in metrics if m in hib),
        "schedulers": scheds,
        "n_conditions": C,
        "by_metric": by_metric,
        "overall": overall,
        "most_dramatic_flip": _dramatic(flips),
        "definitions": _definitions(thr),
    }
    return json_safe({"conditions": conditions, "pairs": pairs, "summary": summary})


def _conditions(m: str, d: float, conds: list, present: np.ndarray, scheds: list, sim: np.ndarray,
                real: np.ndarray, lo: np.ndarray, hi: np.ndarray, thr: float) -> tuple[list, list, list, list]:
    """Per condition of one metric: tau and top-1 agreement (exact and within noise) across schedulers.

    `d` orients the metric (+1: higher is better); `sim`, `real`, `lo`, `hi` are (condition,
    scheduler) matrices. Returns the condition records and the lists of taus, top-1 and top-1
    within noise (the defined ones) that the metric's summary averages.
    """
    conditions: list[dict] = []
    taus, top1, top1_noise = [], [], []
    for c, (w, r) in enumerate(conds):
        pk = np.flatnonzero(present[c])
        s, rv = sim[c, pk], real[c, pk]
        os_ = np.where(np.isnan(s), np.inf, -d * s)  # oriented: lower is better, NaN worst
        or_ = np.where(np.isnan(rv), np.inf, -d * rv)
        tau = _tau(os_, or_)
        bs, br = _best_set(os_), _best_set(or_)
        agree = None if bs is None or br is None else bool(bs & br)
        lo_o, hi_o = (-d * lo[c, pk], -d * hi[c, pk]) if d < 0 else (-d * hi[c, pk], -d * lo[c, pk])
        ns, nr = _near_best_set(os_, thr), _near_best_set(or_, thr, lo_o, hi_o)
        agree_noise = None if ns is None or nr is None else bool(ns & nr)
        taus.append(tau)
        if agree is not None:
            top1.append(agree)
        if agree_noise is not None:
            top1_noise.append(agree_noise)
        conditions.append({
            "window": w, "region": r, "metric": m, "n_schedulers": int(pk.size),
            "n_nan_sim": int(np.isnan(s).sum()), "n_nan_real": int(np.isnan(rv).sum()),
            "tau": tau, "top1_agree": agree,
            "best_sim": [scheds[pk[i]] for i in sorted(bs)] if bs is not None else [],
            "best_real": [scheds[pk[i]] for i in sorted(br)] if br is not None else [],
            "top1_agree_within_noise": agree_noise,
            "near_best_sim": [scheds[pk[i]] for i in sorted(ns)] if ns is not None else [],
            "near_best_real": [scheds[pk[i]] for i in sorted(nr)] if nr is not None else [],
        })
    return conditions, taus, top1, top1_noise


def _definitions(thr: float) -> dict:
    """The summary's definitions, in words, at threshold `thr`."""
    return {
        "relative_difference": "d = (x_a - x_b) / x_b per engine, raw sign (for latencies d < 0 means a is "
                               "better)",
        "real_tie": f"|d_real| < {thr:g}, or (with repeated replays) the two schedulers' repeats overlap: "
                    "a difference within noise, counted apart",
        "held": "the simulated and real d have the same sign (real ties excluded)",
        "stable": f"the simulated sign is the same in every condition where |d_sim| >= {thr:g}; held when "
                  "the real sign agrees wherever |d_real| >= the threshold",
        "flip": f"d_sim >= {thr:g} in one condition and <= -{thr:g} in another; reproduced when the real "
                "engine shows the same flip beyond the threshold on both sides",
        "top1": "the sets of schedulers tied for best (simulated, real) intersect",
        "top1_within_noise": f"the sets of schedulers the data cannot separate from the best intersect: "
                             f"within {thr:g} of the best (simulated), or within {thr:g} or with repeats "
                             "overlapping the best's (real)",
        "nan": "a scheduler with a NaN metric (e.g. nothing completed) ranks worst in tau and top-1; "
               "relative differences involving it are undefined",
    }


def _beyond(v: Optional[float], thr: float, sign: int = 0) -> bool:
    """|v| >= thr and v != 0 (an exact zero is a tie even at threshold 0), with `sign` if given."""
    if v is None or v == 0 or abs(v) < thr:
        return False
    return sign == 0 or (v > 0) == (sign > 0)


def _pair(a: str, b: str, metric: str, d: float, conds: list, both: np.ndarray, sa: np.ndarray,
          sb: np.ndarray, ra: np.ndarray, rb: np.ndarray, thr: float, cnt: dict, ranges=None) -> dict:
    """One scheduler pair on one metric: per-condition records and the cross-condition verdict.

    `ranges` = (lo_a, hi_a, lo_b, hi_b): per condition the smallest and largest real value
    over repeated replays (NaN without repeats). Where both are known, a real difference
    also needs the two ranges apart: every replay of one scheduler beyond every replay of
    the other."""
    recs = []
    for c, (w, r) in enumerate(conds):
        if not both[c]:
            continue
        ds, dr = relative_error(sa[c], sb[c]), relative_error(ra[c], rb[c])
        sim_tie = None if ds is None else not _beyond(ds, thr)
        real_tie = None if dr is None else not _beyond(dr, thr)
        if real_tie is False and ranges is not None:
            la, ha, lb, hb = (x[c] for x in ranges)
            if all(math.isfinite(v) for v in (la, ha, lb, hb)) and not (ha < lb or hb < la):
                real_tie = True            # the repeats overlap: within the engine's own noise
        held = None
        if ds is None or dr is None:
            cnt["undef"] += 1
        elif real_tie:
            cnt["real_tie"] += 1
        else:
            held = _sign(ds) == _sign(dr)
            cnt["pred"] += 1
            cnt["held"] += held
        recs.append({"window": w, "region": r, "sim_diff": ds, "real_diff": dr, "sim_sign": _sign(ds),
                     "real_sign": _sign(dr), "sim_tie": sim_tie, "real_tie": real_tie, "held": held})

    defined = [x for x in recs if x["sim_diff"] is not None]
    pos = [x for x in defined if _beyond(x["sim_diff"], thr, 1)]
    neg = [x for x in defined if _beyond(x["sim_diff"], thr, -1)]
    real_beyond = [x for x in defined if x["real_tie"] is False]
    out = {"scheduler_a": a, "scheduler_b": b, "metric": metric, "verdict": None, "sim_sign": None,
           "a_better": None, "n_conditions": len(recs), "n_sim_beyond": len(pos) + len(neg),
           "n_real_beyond": len(real_beyond), "n_real_agree": None, "n_real_contradict": None,
           "held": None, "reproduced": None, "flip": None}
    if not defined:
        out["verdict"] = "undefined"
    elif not pos and not neg:
        out["verdict"] = "tie"
    elif pos and neg:
        out["verdict"] = "flip"
        out["reproduced"] = (any(x["real_tie"] is False and x["real_sign"] == 1 for x in pos)
                             and any(x["real_tie"] is False and x["real_sign"] == -1 for x in neg))
        p = max(pos, key=lambda x: x["sim_diff"])
        q = min(neg, key=lambda x: x["sim_diff"])
        out["flip"] = {"magnitude": min(p["sim_diff"], -q["sim_diff"]),
                       "condition_pos": {"window": p["window"], "region": p["region"]},
                       "condition_neg": {"window": q["window"], "region": q["region"]},
                       "sim_diff_pos": p["sim_diff"], "sim_diff_neg": q["sim_diff"],
                       "real_diff_pos": p["real_diff"], "real_diff_neg": q["real_diff"]}
    else:
        s = 1 if pos else -1
        agree = sum(1 for x in real_beyond if _sign(x["real_diff"]) == s)
        out.update(verdict="stable", sim_sign=s, a_better=bool(s * d > 0), n_real_agree=agree,
                   n_real_contradict=len(real_beyond) - agree,
                   held=None if not real_beyond else agree == len(real_beyond))
    out["conditions"] = recs
    return out


def _dramatic(flips: list) -> Optional[dict]:
    """The flip of largest magnitude (ties: first in pair order), flattened for reading."""
    if not flips:
        return None
    p = max(flips, key=lambda x: x["flip"]["magnitude"])
    return {"scheduler_a": p["scheduler_a"], "scheduler_b": p["scheduler_b"], "metric": p["metric"],
            "reproduced": p["reproduced"], **p["flip"]}


def _metric_summary(m: str, d: float, taus: list, top1: list, cnt: dict, mpairs: list,
                    top1_noise: Sequence[bool] = ()) -> dict:
    tau_mean, tau_median, tau_min, n_tau = _stats_of(taus)
    v = _verdict_counts(mpairs)
    return {
        "metric": m,
        "direction": "higher" if d > 0 else "lower",
        "n_conditions": len(taus),
        "n_tau": n_tau,
        "tau_mean": tau_mean,
        "tau_median": tau_median,
        "tau_min": tau_min,
        "n_top1": len(top1),
        "top1_agreement": _share(sum(top1), len(top1)),
        "top1_agreement_within_noise": _share(sum(top1_noise), len(top1_noise)),
        "n_pair_predictions": cnt["pred"],
        "n_pair_held": cnt["held"],
        "pair_held_share": _share(cnt["held"], cnt["pred"]),
        "n_pair_real_tie": cnt["real_tie"],
        "n_pair_undefined": cnt["undef"],
        **v,
        "most_dramatic_flip": _dramatic([p for p in mpairs if p["verdict"] == "flip"]),
    }


def _verdict_counts(pairs: list) -> dict:
    """Counts of stable / flip / tie / undefined predictions and their real-engine outcomes."""
    st = [p for p in pairs if p["verdict"] == "stable"]
    fl = [p for p in pairs if p["verdict"] == "flip"]
    held = sum(1 for p in st if p["held"] is True)
    not_held = sum(1 for p in st if p["held"] is False)
    return {
        "n_stable": len(st),
        "n_stable_held": held,
        "n_stable_not_held": not_held,
        "n_stable_real_tie": sum(1 for p in st if p["held"] is None),
        "stable_held_share": _share(held, held + not_held),
        "n_flip": len(fl),
        "n_flip_reproduced": sum(1 for p in fl if p["reproduced"]),
        "n_tie": sum(1 for p in pairs if p["verdict"] == "tie"),
        "n_undefined": sum(1 for p in pairs if p["verdict"] == "undefined"),
    }


def _overall(by_metric: list, conditions: list, pairs: list) -> dict:
    tau_mean, tau_median, tau_min, n_tau = _stats_of([c["tau"] for c in conditions])
    top1 = [c["top1_agree"] for c in conditions if c["top1_agree"] is not None]
    top1_noise = [c["top1_agree_within_noise"] for c in conditions if c["top1_agree_within_noise"] is not None]
    pred = sum(b["n_pair_predictions"] for b in by_metric)
    held = sum(b["n_pair_held"] for b in by_metric)
    return {
        "n_conditions": len(conditions),
        "n_tau": n_tau,
        "tau_mean": tau_mean,
        "tau_median": tau_median,
        "tau_min": tau_min,
        "n_top1": len(top1),
        "top1_agreement": _share(sum(top1), len(top1)),
        "top1_agreement_within_noise": _share(sum(top1_noise), len(top1_noise)),
        "n_pair_predictions": pred,
        "n_pair_held": held,
        "pair_held_share": _share(held, pred),
        "n_pair_real_tie": sum(b["n_pair_real_tie"] for b in by_metric),
        "n_pair_undefined": sum(b["n_pair_undefined"] for b in by_metric),
        **_verdict_counts(pairs),
    }
