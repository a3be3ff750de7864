"""How well does the simulator predict a real engine? The comparison layer of ``schedport validate``.

For each (window, region, scheduler) the same scaled trace is simulated with a calibrated
engine and replayed against a real vLLM server; both give a per-request table (columns of
`schedport.engine.metrics.REQUEST_COLUMNS`) and a run summary (`schedport.engine.metrics.summarize`). This
module compares them at three levels, all pure functions of their inputs, and renders the
result as a report section. Every dict returned is JSON-safe: NaN and infinities become None
(the rule of `schedport.engine.metrics`), so ``json.dumps(x, allow_nan=False)`` succeeds.

Per request (`request_errors`)
    Requests are matched by ``request_id``. Over requests completed on both sides, the
    absolute relative error |sim - real| / real of TTFT and E2E latency, summarised by its
    median (p50) and 90th percentile (p90), plus the signed median (sim - real) / real, whose
    sign says whether the simulator is optimistic (negative) or pessimistic. Errors are
    fractions: 0.0909 means 9.09%. A request whose real value is not positive carries no
    relative error and is left out. ``n_status_mismatch`` counts requests present in both
    tables whose status differs (e.g. completed in the simulation, rejected or failed on the
    server); their latencies cannot be compared, so the count is reported beside the errors.

Per run (`run_errors`)
    Signed relative error (sim - real) / real of each run metric of `RUN_METRICS`; None where
    either value is missing or the real value is 0.

Repeated replays (`median_summary`, `median_request_table`, `repeat_spread`)
    A replay on a shared or virtualised machine varies from run to run. When a run is
    replayed several times, the real side of every comparison is the median over repeats (per
    metric; per request, completed only if every repeat completed it), and the repeats'
    leave-one-out spread is kept as the real engine's own run-to-run error: the floor below
    which a simulator's error cannot be told from noise on that machine.

Rankings (`rank_agreement`)
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

Report
    `render_validation_section` renders a ``validation.json`` dict (top-level ``runs``,
    ``agreement``, ``engine``, ``server``, ``created``) as a self-contained HTML fragment;
    `write_validation_html` writes it as a page of its own; `summary_table_lines` gives the
    terminal summary. Each run dict carries ``window``, ``region``, ``scheduler``, ``load``,
    the summaries under ``sim`` and ``real`` (``sim_summary`` / ``real_summary`` are also
    read), ``request_errors``, ``run_errors`` and ``client_lag_ok``.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd
from scipy import stats

from schedport.errors import SchedportError
from schedport.engine.metrics import json_scalar, percentiles

__all__ = [
    "RUN_METRICS",
    "REQUEST_ERROR_METRICS",
    "request_errors",
    "run_errors",
    "runs_frame",
    "median_summary",
    "median_request_table",
    "repeat_spread",
    "speed_error_correlation",
    "rank_agreement",
    "load_validation",
    "run_error_table",
    "request_error_table",
    "render_validation_section",
    "write_validation_html",
    "summary_table_lines",
]

#: Run metrics compared between the simulation and the real engine.
RUN_METRICS: tuple[str, ...] = (
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_mean_s",
    "e2e_mean_s",
    "e2e_p99_s",
    "throughput_rps",
)

#: Per-request columns compared by `request_errors`, with the key prefix of their statistics.
REQUEST_ERROR_METRICS: tuple[tuple[str, str], ...] = (("ttft_s", "ttft"), ("e2e_s", "e2e"))

#: Metrics of `RUN_METRICS` where a higher value is better (the default of `rank_agreement`).
HIGHER_IS_BETTER: frozenset[str] = frozenset({"throughput_rps"})

DEFAULT_THRESHOLD = 0.05
ROW_CAP = 200  # prediction rows shown in the page (validation.json has all)


def _js(v: Any) -> Any:
    """JSON-safe copy of `v`: scalars by the house rule of `metrics.json_scalar`, containers walked."""
    if isinstance(v, dict):
        return {str(k): _js(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_js(x) for x in v]
    if isinstance(v, np.ndarray):
        return _js(v.tolist())
    return json_scalar(v)


def _num(v: Any) -> float:
    """A float, NaN for None / missing / non-numeric."""
    if v is None:
        return math.nan
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


# --------------------------------------------------------------------------- per request


def _check_columns(df: pd.DataFrame, cols: Iterable[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: missing column(s) {', '.join(missing)}")


def request_errors(sim: pd.DataFrame, real: pd.DataFrame) -> dict:
    """Per-request errors of the simulation against the real engine (see module docstring).

    Keys: ``n_sim``, ``n_real`` (rows), ``n_both`` (request ids in both tables),
    ``n_matched`` (completed in both), ``n_status_mismatch`` (in both, status differs),
    ``n_completed_sim_only`` / ``n_completed_real_only`` (in both, completed on one side
    only), and for p in (ttft, e2e): ``p_n`` (requests with a relative error),
    ``p_abs_pct_err_p50``, ``p_abs_pct_err_p90`` (of |sim - real| / real, as fractions) and
    ``p_pct_err_p50`` (median of the signed (sim - real) / real). None where no request
    qualifies.
    """
    cols = ["request_id", "status"] + [c for c, _ in REQUEST_ERROR_METRICS]
    _check_columns(sim, cols, "simulated request table")
    _check_columns(real, cols, "real request table")
    for name, df in (("simulated", sim), ("real", real)):
        if df["request_id"].duplicated().any():
            raise ValueError(f"{name} request table: duplicate request_id")
    m = sim[cols].merge(real[cols], on="request_id", how="inner", suffixes=("_sim", "_real"))
    st_s = m["status_sim"].astype(str).to_numpy()
    st_r = m["status_real"].astype(str).to_numpy()
    done_s = st_s == "completed"
    done_r = st_r == "completed"
    both = done_s & done_r
    out: dict = {
        "n_sim": len(sim),
        "n_real": len(real),
        "n_both": len(m),
        "n_matched": int(np.count_nonzero(both)),
        "n_status_mismatch": int(np.count_nonzero(st_s != st_r)),
        "n_completed_sim_only": int(np.count_nonzero(done_s & ~done_r)),
        "n_completed_real_only": int(np.count_nonzero(done_r & ~done_s)),
    }
    for col, key in REQUEST_ERROR_METRICS:
        s = m[f"{col}_sim"].to_numpy(dtype=np.float64)[both]
        r = m[f"{col}_real"].to_numpy(dtype=np.float64)[both]
        ok = np.isfinite(s) & np.isfinite(r) & (r > 0)
        rel = (s[ok] - r[ok]) / r[ok]
        p50, p90 = percentiles(np.abs(rel), (50.0, 90.0))
        (signed,) = percentiles(rel, (50.0,))
        out[f"{key}_n"] = int(ok.sum())
        out[f"{key}_abs_pct_err_p50"] = p50
        out[f"{key}_abs_pct_err_p90"] = p90
        out[f"{key}_pct_err_p50"] = signed
    return _js(out)


# --------------------------------------------------------------------------- repeated replays


def median_summary(summaries: Sequence[dict], keys: Sequence[str]) -> dict:
    """The median over repeated replays of each of `keys` (missing or NaN values left out; None
    when no repeat has the key): one real run per cell, robust to a repeat a pause spoiled."""
    out = {}
    for k in keys:
        v = np.array([_num(s.get(k)) for s in summaries], dtype=np.float64)
        v = v[np.isfinite(v)]
        out[k] = float(np.median(v)) if v.size else None
    return out


def repeat_spread(summaries: Sequence[dict], metrics: Sequence[str] = RUN_METRICS) -> dict:
    """The real engine's own run-to-run error per metric: over repeats i, the median of
    |x_i / median(x_others) - 1|.

    It is the yardstick of the simulator's run error: the same replay, rerun, misses its own
    median by this much, so a simulator error of that size is within the engine's noise.
    None with fewer than two finite values (or a zero median of the others).
    """
    out: dict = {}
    for m in metrics:
        v = np.array([_num(s.get(m)) for s in summaries], dtype=np.float64)
        v = v[np.isfinite(v)]
        d = []
        for i in range(v.size):
            others = np.median(np.delete(v, i)) if v.size > 1 else math.nan
            if math.isfinite(others) and others != 0:
                d.append(abs(v[i] / others - 1.0))
        out[m] = float(np.median(d)) if d else None
    return out


def median_request_table(tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """One per-request table for repeated replays of the same trace: per request the median
    TTFT and E2E over repeats; ``completed`` only when every repeat completed it, else the
    first other status, with no latencies. One table is returned as it is."""
    if len(tables) == 1:
        return tables[0]
    ids = tables[0]["request_id"].to_numpy()
    for t in tables[1:]:
        if len(t) != len(ids) or not np.array_equal(t["request_id"].to_numpy(), ids):
            raise ValueError("repeated replays must hold the same requests in the same order")
    out = tables[0].copy()
    st = np.stack([t["status"].astype(str).to_numpy() for t in tables])
    done = (st == "completed").all(axis=0)
    status = np.where(done, "completed", st[0])
    for i in np.flatnonzero(~done):
        status[i] = next(x for x in st[:, i] if x != "completed")
    out["status"] = status
    for col, _ in REQUEST_ERROR_METRICS:
        v = np.stack([t[col].to_numpy(dtype=np.float64) for t in tables])
        out[col] = np.where(done, np.median(v, axis=0), np.nan)
    return out


# --------------------------------------------------------------------------- per run


def _rel(sim_v: Any, real_v: Any) -> Optional[float]:
    """(sim - real) / real, None when undefined (missing value, zero or non-finite real)."""
    s, r = _num(sim_v), _num(real_v)
    if not (math.isfinite(s) and math.isfinite(r)) or r == 0:
        return None
    return json_scalar((s - r) / r)


def run_errors(sim_summary: dict, real_summary: dict, metrics: Sequence[str] = RUN_METRICS) -> dict:
    """Signed relative error (sim - real) / real per run metric: {metric: float or None}.

    None where either summary lacks the metric, a value is None/NaN, or the real value is 0
    (e.g. both runs completed nothing: no relative error is defined).
    """
    return {m: _rel(sim_summary.get(m), real_summary.get(m)) for m in metrics}


def runs_frame(runs: Sequence[dict], metrics: Sequence[str] = RUN_METRICS) -> pd.DataFrame:
    """The input table of `rank_agreement` built from ``validation.json``-style run dicts.

    One row per run: ``window``, ``region``, ``scheduler`` and ``sim_<m>`` / ``real_<m>`` for
    each metric, read from the run's ``sim`` / ``real`` summaries (NaN where absent).
    """
    rows = []
    for run in runs:
        sim, real = _side(run, "sim"), _side(run, "real")
        row = {"window": run.get("window"), "region": run.get("region"), "scheduler": run.get("scheduler")}
        for m in metrics:
            row[f"sim_{m}"] = _num(sim.get(m))
            row[f"real_{m}"] = _num(real.get(m))
        rows.append(row)
    cols = ["window", "region", "scheduler"] + [f"{p}_{m}" for m in metrics for p in ("sim", "real")]
    return pd.DataFrame(rows, columns=cols)


def _side(run: dict, side: str) -> dict:
    """The run's summary subset for `side` ("sim" or "real"), {} when absent."""
    for key in (side, f"{side}_summary"):
        v = run.get(key)
        if isinstance(v, dict):
            return v
    return {}


# --------------------------------------------------------------------------- rank agreement


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
    _check_columns(runs, ["window", "region", "scheduler"]
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
        "definitions": {
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
        },
    }
    return _js({"conditions": conditions, "pairs": pairs, "summary": summary})


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
        ds, dr = _rel(sa[c], sb[c]), _rel(ra[c], rb[c])
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


# --------------------------------------------------------------------------- input


def load_validation(source) -> dict:
    """A validation dict from a ``validation.json`` path (or a dict, returned as is).

    Refuses, with a one-line `SchedportError`, a file that is missing, not JSON, or not a
    validation result (an object with a ``runs`` list or an ``agreement`` object), so that
    ``schedport analyze --validation`` fails before writing anything.
    """
    if isinstance(source, dict):
        data, where = source, "validation"
    else:
        path = Path(source)
        where = str(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SchedportError(f"{where}: no such validation file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SchedportError(f"{where}: not a readable validation.json ({e})") from None
    if not isinstance(data, dict):
        raise SchedportError(f"{where}: expected a JSON object with 'runs' and 'agreement'")
    runs, ag = data.get("runs"), data.get("agreement")
    if not (isinstance(runs, list) or isinstance(ag, dict)):
        raise SchedportError(f"{where}: not a validation result (no 'runs' list or 'agreement' object)")
    if runs is not None and not isinstance(runs, list):
        raise SchedportError(f"{where}: 'runs' must be a list")
    if ag is not None and not isinstance(ag, dict):
        raise SchedportError(f"{where}: 'agreement' must be an object")
    return data


# --------------------------------------------------------------------------- tables for the report


def _runs(validation: dict) -> list[dict]:
    return [r for r in (validation.get("runs") or []) if isinstance(r, dict)]


def run_error_table(validation: dict) -> list[dict]:
    """Per run metric, the distribution over runs of its run error (from ``runs[].run_errors``).

    One dict per metric (`RUN_METRICS` first, then any other metric the runs carry):
    ``metric``, ``n_runs`` (runs where the error is defined), ``abs_err_p50`` and
    ``abs_err_p90`` (median and 90th percentile of |error|), ``err_p50`` (median signed
    error: negative means the simulation is lower than the real engine), and, when runs were
    replayed more than once, ``noise_p50``: the median over runs of the real engine's own
    run-to-run error (`repeat_spread`, ``runs[].real_spread``), with ``n_noise_runs``. Fractions.
    """
    runs = _runs(validation)
    names = list(RUN_METRICS)
    for r in runs:
        names += [m for m in (r.get("run_errors") or {}) if m not in names]
    out = []
    for m in names:
        v = np.array([_num((r.get("run_errors") or {}).get(m)) for r in runs], dtype=np.float64)
        v = v[np.isfinite(v)]
        p50, p90 = percentiles(np.abs(v), (50.0, 90.0))
        (signed,) = percentiles(v, (50.0,))
        nz = np.array([_num((r.get("real_spread") or {}).get(m)) for r in runs], dtype=np.float64)
        nz = nz[np.isfinite(nz)]
        (noise,) = percentiles(nz, (50.0,))
        out.append({"metric": m, "n_runs": int(v.size), "abs_err_p50": p50, "abs_err_p90": p90,
                    "err_p50": signed, "noise_p50": noise, "n_noise_runs": int(nz.size)})
    return _js(out)


def request_error_table(validation: dict) -> list[dict]:
    """Per-request errors over runs: for ttft and e2e, the median over runs of each run's
    ``<p>_abs_pct_err_p50``, ``<p>_abs_pct_err_p90`` and ``<p>_pct_err_p50`` (keys
    ``abs_pct_err_p50``, ``abs_pct_err_p90``, ``pct_err_p50``), with ``n_runs`` (runs with
    a value) and ``n_requests`` (requests compared, summed over runs)."""
    runs = _runs(validation)
    out = []
    for _, key in REQUEST_ERROR_METRICS:
        errs = [r.get("request_errors") or {} for r in runs]
        row: dict = {"metric": key}
        for stat in ("abs_pct_err_p50", "abs_pct_err_p90", "pct_err_p50"):
            v = np.array([_num(e.get(f"{key}_{stat}")) for e in errs], dtype=np.float64)
            v = v[np.isfinite(v)]
            (row[stat],) = percentiles(v, (50.0,))
            row.setdefault("n_runs", int(v.size))
        n = np.array([_num(e.get(f"{key}_n")) for e in errs], dtype=np.float64)
        row["n_requests"] = int(n[np.isfinite(n)].sum())
        out.append(row)
    return _js(out)


def speed_error_correlation(validation: dict, metric: str = "e2e_mean_s") -> Optional[dict]:
    """Does the machine's speed explain the simulator's error? Spearman's rank correlation, over
    every replay with a speed index, between the index and the run error of `metric` for that
    replay ((sim - real) / real). A strong negative rho says the error follows the machine's
    drift (slower moments, larger real latencies), not the schedulers or the load.

    Keys ``metric``, ``n``, ``spearman_rho``, ``pvalue`` (``scipy.stats.spearmanr``); None
    with fewer than 3 replays or when either side is constant.
    """
    xs, ys = [], []
    for r in _runs(validation):
        sim_v = _side(r, "sim").get(metric)
        reps = r.get("real_repeats") or [_side(r, "real")]
        for rep in reps:
            idx, err = _num(rep.get("speed_index")), _rel(sim_v, rep.get(metric))
            if math.isfinite(idx) and err is not None:
                xs.append(idx)
                ys.append(err)
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    res = stats.spearmanr(xs, ys)
    return _js({"metric": metric, "n": len(xs), "spearman_rho": float(res.statistic), "pvalue": float(res.pvalue)})


def _totals(validation: dict) -> dict:
    runs = _runs(validation)

    def tot(key: str) -> int:
        return int(sum(v for v in (_num((r.get("request_errors") or {}).get(key)) for r in runs)
                       if math.isfinite(v)))

    lag_bad = [r for r in runs if r.get("client_lag_ok") is False]
    return {"n_runs": len(runs), "n_matched": tot("n_matched"), "n_status_mismatch": tot("n_status_mismatch"),
            "n_both": tot("n_both"), "n_lag_bad": len(lag_bad)}


# --------------------------------------------------------------------------- figure


def fig_sim_vs_real(validation: dict, metrics: Sequence[str] = ("ttft_mean_s", "e2e_mean_s")) -> Optional[str]:
    """Simulated (y) against measured (x) run means, log-log, one colour and marker per scheduler.

    Points above the y = x line are runs the simulation makes slower than the real engine.
    None when no run has both values positive.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from schedport.report.html import MARKERS, OKABE_ITO, _png, plt

    runs = _runs(validation)
    scheds = sorted({str(r.get("scheduler")) for r in runs})
    pts = {m: [] for m in metrics}
    for r in runs:
        sim, real = _side(r, "sim"), _side(r, "real")
        for m in metrics:
            x, y = _num(real.get(m)), _num(sim.get(m))
            if math.isfinite(x) and math.isfinite(y) and x > 0 and y > 0:
                pts[m].append((str(r.get("scheduler")), x, y))
    if not any(pts.values()):
        return None
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics) + 1.6, 3.9), squeeze=False)
    labels = {"ttft_mean_s": "mean TTFT (s)", "e2e_mean_s": "mean E2E latency (s)"}
    for ax, m in zip(axes[0], metrics):
        data = pts[m]
        for k, sc in enumerate(scheds):
            xs = [x for s, x, _ in data if s == sc]
            ys = [y for s, _, y in data if s == sc]
            if xs:
                ax.scatter(xs, ys, color=OKABE_ITO[k % len(OKABE_ITO)], marker=MARKERS[k % len(MARKERS)],
                           s=26, edgecolors="black", linewidths=0.3, label=sc, zorder=3)
        if data:
            lo = min(min(x, y) for _, x, y in data) / 1.5
            hi = max(max(x, y) for _, x, y in data) * 1.5
            ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="y = x", zorder=2)
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):  # plain labels at 1-2-5 steps, none on the minor ticks
                axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                axis.set_minor_formatter(NullFormatter())
        name = labels.get(m, m)
        ax.set_xlabel(f"real engine: {name}", fontsize=8)
        ax.set_ylabel(f"simulation: {name}", fontsize=8)
        ax.set_title(f"{name}, one point per run", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.25, which="both")
    h, lab = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        for hh, ll in zip(*ax.get_legend_handles_labels()):
            if ll not in lab:
                h.append(hh)
                lab.append(ll)
    fig.legend(h, lab, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, title="scheduler")
    fig.suptitle("Simulated vs measured, per run (above the line: simulation slower)", fontsize=10)
    fig.tight_layout()
    return _png(fig)


# --------------------------------------------------------------------------- HTML


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _spct(v: Any, digits: int = 1) -> str:
    """A signed share as a percentage (+9.1%), "n/a" when undefined."""
    f = _num(v)
    if not math.isfinite(f):
        return "n/a"
    return f"{100 * f:+.{digits}f}%"


def _cond(c: Optional[dict]) -> str:
    if not c:
        return "n/a"
    return f"window {c.get('window')}, {c.get('region')}"


def _better_word(p: dict, sign: Optional[int]) -> str:
    """Which scheduler the raw sign of d = (a - b) / b favours, for this metric's direction."""
    if sign is None or sign == 0:
        return "tie"
    higher = p.get("direction") == "higher"
    a_wins = (sign > 0) == higher
    return p["scheduler_a"] if a_wins else p["scheduler_b"]


def _prediction_rows(agreement: dict) -> tuple[list[dict], int]:
    """Stable and flip predictions for the table, most telling first: flips (largest first),
    stable ones not held, stable with no real difference, stable held."""
    summ = agreement.get("summary") or {}
    direction = {b["metric"]: b.get("direction") for b in summ.get("by_metric") or []}
    rows = []
    for p in agreement.get("pairs") or []:
        if p.get("verdict") not in ("stable", "flip"):
            continue
        q = dict(p, direction=direction.get(p["metric"], "lower"))
        if p["verdict"] == "flip":
            key = (0, -(p.get("flip") or {}).get("magnitude", 0.0) or 0.0)
        else:
            key = ({False: 1, None: 2, True: 3}[p.get("held")], 0.0)
        rows.append((key, q))
    rows.sort(key=lambda t: t[0])
    return [q for _, q in rows], len(rows)


def _prediction_html(agreement: dict) -> str:
    rows, n = _prediction_rows(agreement)
    if not rows:
        return "<p>The simulation makes no stable or flipping prediction beyond the threshold.</p>"
    out = []
    for p in rows[:ROW_CAP]:
        pair = f"{_esc(p['scheduler_a'])} vs {_esc(p['scheduler_b'])}"
        if p["verdict"] == "flip":
            f = p.get("flip") or {}
            says = (f"flip: {_esc(_better_word(p, 1))} better at {_esc(_cond(f.get('condition_pos')))} "
                    f"({_spct(f.get('sim_diff_pos'))}), {_esc(_better_word(p, -1))} better at "
                    f"{_esc(_cond(f.get('condition_neg')))} ({_spct(f.get('sim_diff_neg'))})")
            real = f"{_spct(f.get('real_diff_pos'))} / {_spct(f.get('real_diff_neg'))}"
            result = "reproduced" if p.get("reproduced") else "not reproduced"
        else:
            says = (f"stable: {_esc(_better_word(p, p.get('sim_sign')))} better "
                    f"({p.get('n_sim_beyond')} of {p.get('n_conditions')} conditions beyond the threshold)")
            real = (f"agrees in {p.get('n_real_agree')}, contradicts in {p.get('n_real_contradict')} of "
                    f"{p.get('n_real_beyond')} conditions with a real difference")
            result = {True: "held", False: "not held", None: "no real difference"}[p.get("held")]
        colour = {"held": "#006d4f", "reproduced": "#006d4f", "not held": "#a33a00",
                  "not reproduced": "#a33a00"}.get(result, "#555")
        out.append(f"<tr><td class='l'>{_esc(p['metric'])}</td><td class='l'>{pair}</td>"
                   f"<td class='l'>{says}</td><td class='l'>{real}</td>"
                   f"<td class='l' style='color:{colour}'><b>{_esc(result)}</b></td></tr>")
    more = (f"<p class='sub'>{n - ROW_CAP} more in validation.json.</p>" if n > ROW_CAP else "")
    return ("<details open><summary>Stable and flip predictions</summary><div class='scroll'><table>"
            "<tr><th class='l'>metric</th><th class='l'>pair</th><th class='l'>the simulation predicts</th>"
            "<th class='l'>real engine (d at the same conditions)</th><th class='l'>result</th></tr>"
            + "".join(out) + f"</table></div>{more}</details>")


def _run_rows_html(validation: dict) -> str:
    runs = _runs(validation)
    if not runs:
        return ""
    rows = []
    for r in runs[:ROW_CAP]:
        sim, real = _side(r, "sim"), _side(r, "real")
        re_ = r.get("request_errors") or {}
        er = r.get("run_errors") or {}
        lag = r.get("client_lag_ok")
        rows.append(
            "<tr>" + "".join([
                f"<td class='l'>{_esc(r.get('window'))}</td><td class='l'>{_esc(r.get('region'))}</td>",
                f"<td class='l'>{_esc(r.get('scheduler'))}</td><td>{_fmt(r.get('load'), 2)}</td>",
                f"<td>{_fmt(sim.get('ttft_mean_s'))}</td><td>{_fmt(real.get('ttft_mean_s'))}</td>",
                f"<td>{_spct(er.get('ttft_mean_s'))}</td>",
                f"<td>{_fmt(sim.get('e2e_mean_s'))}</td><td>{_fmt(real.get('e2e_mean_s'))}</td>",
                f"<td>{_spct(er.get('e2e_mean_s'))}</td>",
                f"<td>{_fmt(re_.get('n_matched'))}</td><td>{_fmt(re_.get('n_status_mismatch'))}</td>",
                f"<td>{_fmt(lag) if lag is not None else 'n/a'}</td>",
            ]) + "</tr>")
    more = (f"<p class='sub'>{len(runs) - ROW_CAP} more in validation.json.</p>" if len(runs) > ROW_CAP else "")
    return ("<details><summary>Per-run values</summary><div class='scroll'><table><tr><th class='l'>window</th>"
            "<th class='l'>region</th><th class='l'>scheduler</th><th>load</th><th>sim TTFT mean (s)</th>"
            "<th>real TTFT mean (s)</th><th>error</th><th>sim E2E mean (s)</th><th>real E2E mean (s)</th>"
            "<th>error</th><th>requests matched</th><th>status mismatches</th><th>client on schedule</th></tr>"
            + "".join(rows) + f"</table></div>{more}</details>")


def _fmt(v: Any, digits: int = 3) -> str:
    from schedport.common.formatting import fmt

    return _esc(fmt(v, digits))


def render_validation_section(validation: dict) -> str:
    """The validation section (``<section id="validation">``) rendered from a validation dict alone.

    Self-contained: the figure is an embedded PNG, nothing is fetched. Every number is read
    from the dict (per-run errors are summarised over its ``runs``), so the section and
    ``validation.json`` cannot disagree.
    """
    from schedport.common.formatting import fmt, pct

    ag = validation.get("agreement") or {}
    summ = ag.get("summary") or {}
    thr = summ.get("threshold", DEFAULT_THRESHOLD)
    tot = _totals(validation)
    runs = _runs(validation)
    windows = list(dict.fromkeys(str(r.get("window")) for r in runs))
    regions = list(dict.fromkeys(str(r.get("region")) for r in runs))
    scheds = list(dict.fromkeys(str(r.get("scheduler")) for r in runs))
    server = validation.get("server") or {}
    out = ['<section id="validation" aria-label="simulator validation">',
           "<h2>Does the simulator predict a real engine?</h2>",
           "<p>Each run below was simulated with the calibrated engine and replayed, with the same scaled "
           "arrivals and lengths, against a real vLLM server. The first tables say how far the simulated "
           "latencies are from the measured ones; the rest asks the question the study depends on: when the "
           "simulation says one scheduler beats another, or that the order flips between workloads or loads, "
           "does the real engine agree? A real difference smaller than "
           f"{_esc(pct(thr, 0))} is treated as a tie within measurement noise and counted apart.</p>",
           f"<p class='sub'>{tot['n_runs']} runs &middot; {len(windows)} window(s) &middot; regions "
           f"{_esc(', '.join(regions))} &middot; {len(scheds)} scheduler(s) &middot; server model "
           f"<code>{_esc(server.get('model', 'n/a'))}</code> &middot; created {_esc(validation.get('created', 'n/a'))}"
           "</p>"]
    if tot["n_lag_bad"]:
        out.append(f"<div class='note'>In {tot['n_lag_bad']} run(s) the client fell behind its send schedule "
                   "(99th-percentile send lag over the bound): their real latencies include client delay.</div>")
    if validation.get("speed_index"):
        out.append(f"<p class='sub'>{_esc(_speed_text(validation))}.</p>")
    if tot["n_status_mismatch"]:
        out.append(f"<div class='note'>{tot['n_status_mismatch']} request(s) ended differently in the simulation "
                   "and on the server (e.g. completed in one, rejected or failed in the other); latency errors "
                   "are over the requests completed in both.</div>")

    # run metrics
    rows = "".join(f"<tr><td class='l'>{_esc(d['metric'])}</td><td>{d['n_runs']}</td><td>{_esc(pct(d['abs_err_p50']))}"
                   f"</td><td>{_esc(pct(d['abs_err_p90']))}</td><td>{_esc(_spct(d['err_p50']))}</td>"
                   f"<td>{_esc(pct(d.get('noise_p50')))}</td></tr>"
                   for d in run_error_table(validation))
    out.append("<h3>Run metrics: simulated vs measured</h3>"
               "<p class='sub'>Relative error (sim &minus; real) / real of each run's metric; median and 90th "
               "percentile of its magnitude over runs, and the median signed error (negative: the simulation "
               "is lower than the real engine). Real noise: when each run was replayed more than once, the "
               "median over runs of how far one replay lands from the median of its repeats (the real "
               "engine's own run-to-run error, the floor any simulator is held to); the real value compared "
               "is then the median of the repeats.</p>"
               "<table><tr><th class='l'>metric</th><th>runs</th><th>median |error|</th><th>p90 |error|</th>"
               f"<th>median error</th><th>real noise</th></tr>{rows}</table>")

    # per request
    rows = "".join(f"<tr><td class='l'>{_esc(d['metric'])}</td><td>{d['n_runs']}</td><td>{d['n_requests']}</td>"
                   f"<td>{_esc(pct(d['abs_pct_err_p50']))}</td><td>{_esc(pct(d['abs_pct_err_p90']))}</td>"
                   f"<td>{_esc(_spct(d['pct_err_p50']))}</td></tr>" for d in request_error_table(validation))
    out.append("<h3>Per-request latency</h3>"
               f"<p class='sub'>Requests matched by id and completed on both sides ({tot['n_matched']} of "
               f"{tot['n_both']}); per run, the median and 90th percentile of |sim &minus; real| / real and the "
               "median signed error; the table gives the median of each over runs.</p>"
               "<table><tr><th class='l'>latency</th><th>runs</th><th>requests</th><th>median of p50 |error|</th>"
               f"<th>median of p90 |error|</th><th>median signed error</th></tr>{rows}</table>")

    # rank agreement
    bm = summ.get("by_metric") or []
    if bm:
        def row(d: dict, label: str) -> str:
            return (f"<tr><td class='l'>{label}</td><td>{_esc(fmt(d.get('tau_mean')))}</td>"
                    f"<td>{_esc(fmt(d.get('tau_median')))}</td><td>{_esc(fmt(d.get('tau_min')))}</td>"
                    f"<td>{_esc(pct(d.get('top1_agreement')))}</td>"
                    f"<td>{_esc(pct(d.get('top1_agreement_within_noise')))}</td>"
                    f"<td>{d.get('n_pair_held')} / {d.get('n_pair_predictions')} "
                    f"({_esc(pct(d.get('pair_held_share')))})</td><td>{d.get('n_pair_real_tie')}</td>"
                    f"<td>{d.get('n_stable_held')} / {d.get('n_stable')}</td>"
                    f"<td>{d.get('n_stable_not_held')}</td><td>{d.get('n_stable_real_tie')}</td>"
                    f"<td>{d.get('n_flip_reproduced')} / {d.get('n_flip')}</td></tr>")

        rows = "".join(row(d, f"{_esc(d['metric'])} ({_esc(d.get('direction', '?'))} is better)") for d in bm)
        if summ.get("overall") and len(bm) > 1:
            rows += row(summ["overall"], "<b>all metrics</b>")
        out.append("<h3>Do the rankings hold?</h3>"
                   f"<p class='sub'>Per condition (window &times; region, {summ.get('n_conditions', 0)} in all) and "
                   "metric: Kendall's tau-b between simulated and real values across schedulers (1 = same order; "
                   "a scheduler that completed nothing ranks last), and top-1 agreement (the best scheduler is "
                   "the same; tied bests count when they overlap); within noise, the schedulers that cannot be "
                   f"told from the best (within {_esc(pct(thr, 0))}, or, on the real engine, with repeats "
                   "overlapping the best's) count as tied. Pairs held: per condition and scheduler pair, "
                   "the simulated and real differences have the same sign, over pairs where the real difference "
                   f"is at least {_esc(pct(thr, 0))}; real ties are the others. Across conditions the simulation "
                   "predicts a <i>stable</i> order for a pair (same sign wherever the simulated difference is "
                   "beyond the threshold) or a <i>flip</i> (the order reverses between conditions).</p>"
                   "<div class='scroll'><table><tr><th class='l'>metric</th><th>tau mean</th><th>tau median</th>"
                   "<th>tau min</th><th>top-1 agreement</th><th>top-1 within noise</th><th>pairs held</th><th>real ties</th>"
                   "<th>stable held</th><th>stable not held</th><th>stable, no real difference</th>"
                   f"<th>flips reproduced</th></tr>{rows}</table></div>")
        md = summ.get("most_dramatic_flip")
        if md:
            p = {"scheduler_a": md["scheduler_a"], "scheduler_b": md["scheduler_b"],
                 "direction": next((d.get("direction") for d in bm if d["metric"] == md["metric"]), "lower")}
            out.append(
                f"<p>Most dramatic simulated flip: <b>{_esc(md['scheduler_a'])} vs {_esc(md['scheduler_b'])}</b> on "
                f"{_esc(md['metric'])}: {_esc(_better_word(p, 1))} better by {_esc(_spct(md.get('sim_diff_pos')))} "
                f"at {_esc(_cond(md.get('condition_pos')))}, {_esc(_better_word(p, -1))} better by "
                f"{_esc(_spct(md.get('sim_diff_neg')))} at {_esc(_cond(md.get('condition_neg')))}. On the real "
                f"engine: {_esc(_spct(md.get('real_diff_pos')))} and {_esc(_spct(md.get('real_diff_neg')))}, "
                f"<b>{'reproduced' if md.get('reproduced') else 'not reproduced'}</b>.</p>")
        else:
            out.append("<p>The simulation predicts no flip beyond the threshold.</p>")
        out.append("<p class='sub'>d = (x<sub>a</sub> &minus; x<sub>b</sub>) / x<sub>b</sub> on each engine; for "
                   "latencies a negative d means the first scheduler is faster.</p>")
        out.append(_prediction_html(ag))
    else:
        out.append("<p>No rank agreement in this validation (no agreement summary).</p>")

    # figure
    from schedport.report.html import _img

    fig = fig_sim_vs_real(validation)
    out.append("<h3>Simulated vs measured per run</h3>"
               + (_img(fig, "simulated vs measured mean TTFT and E2E per run") if fig
                  else "<p>No run with both a simulated and a measured mean latency.</p>"))
    out.append(_run_rows_html(validation))
    eng = validation.get("engine")
    if eng or server:
        out.append("<details><summary>engine and server</summary><pre>"
                   f"{_esc(json.dumps({'engine': eng, 'server': server}, indent=1, sort_keys=True, default=str))}"
                   "</pre></details>")
    out.append("</section>")
    return "\n".join(out)


def write_validation_html(validation: dict, path) -> Path:
    """Write the validation section as a standalone, self-contained page (atomically)."""
    from schedport.report.html import CSS

    path = Path(path)
    text = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>schedport validation: simulator vs real engine</title>
<style>{CSS}</style></head>
<body><main>
{render_validation_section(validation)}
</main></body></html>
"""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


# --------------------------------------------------------------------------- terminal


def _speed_text(validation: dict) -> str:
    si = validation.get("speed_index") or {}
    text = (f"machine speed index (measured / modelled time of a lone prompt, taken before each of "
            f"{si.get('n')} replays): median {fmt_x(si.get('median'))}, range {fmt_x(si.get('min'))} to "
            f"{fmt_x(si.get('max'))}; above 1 the machine ran slower than when calibrated")
    c = speed_error_correlation(validation)
    if c:
        text += (f"; Spearman rho between the index and the replay's mean E2E error {c['spearman_rho']:+.2f} "
                 f"(p = {c['pvalue']:.2g}, {c['n']} replays)")
    return text


def fmt_x(v: Any) -> str:
    """A ratio as '1.23x', 'n/a' when missing."""
    x = _num(v)
    return f"{x:.2f}x" if math.isfinite(x) else "n/a"


def summary_table_lines(validation: dict) -> list[str]:
    """A short plain-text summary for the terminal: one line per metric, then the verdicts."""
    from schedport.common.formatting import fmt, pct

    errs = {d["metric"]: d for d in run_error_table(validation)}
    summ = (validation.get("agreement") or {}).get("summary") or {}
    bm = {d["metric"]: d for d in summ.get("by_metric") or []}
    names = list(errs) + [m for m in bm if m not in errs]
    names = [m for m in names if errs.get(m, {}).get("n_runs") or m in bm]
    head = (f"{'metric':<16} {'|err| p50':>9} {'|err| p90':>9} {'real noise':>10} {'tau mean':>8} {'top-1':>7} "
            f"{'top-1~':>7} {'pairs held':>10}")
    lines = [head]
    for m in names:
        e, a = errs.get(m, {}), bm.get(m, {})
        held = (f"{a['n_pair_held']}/{a['n_pair_predictions']}" if a else "n/a")
        lines.append(f"{m:<16} {pct(e.get('abs_err_p50')):>9} {pct(e.get('abs_err_p90')):>9} "
                     f"{pct(e.get('noise_p50')):>10} {fmt(a.get('tau_mean')):>8} {pct(a.get('top1_agreement')):>7} "
                     f"{pct(a.get('top1_agreement_within_noise')):>7} {held:>10}")
    ov = summ.get("overall")
    if ov:
        lines.append(f"stable predictions: {ov['n_stable']}, held {ov['n_stable_held']}, not held "
                     f"{ov['n_stable_not_held']}, no real difference {ov['n_stable_real_tie']}")
        lines.append(f"flip predictions: {ov['n_flip']}, reproduced {ov['n_flip_reproduced']}")
    md = summ.get("most_dramatic_flip")
    if md:
        lines.append(f"most dramatic flip: {md['scheduler_a']} vs {md['scheduler_b']} on {md['metric']} "
                     f"(sim {_spct(md.get('sim_diff_pos'))} at {_cond(md.get('condition_pos'))}, "
                     f"{_spct(md.get('sim_diff_neg'))} at {_cond(md.get('condition_neg'))}; real "
                     f"{_spct(md.get('real_diff_pos'))} / {_spct(md.get('real_diff_neg'))}): "
                     f"{'reproduced' if md.get('reproduced') else 'not reproduced'}")
    if validation.get("speed_index"):
        lines.append(_speed_text(validation))
    tot = _totals(validation)
    if tot["n_status_mismatch"]:
        lines.append(f"{tot['n_status_mismatch']} request(s) ended differently in the simulation and on the server")
    if tot["n_lag_bad"]:
        lines.append(f"{tot['n_lag_bad']} run(s) where the client fell behind its send schedule")
    return lines
