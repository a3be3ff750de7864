"""How far is the simulator from a real engine, per request and per run? (``schedport validate``)

For each (window, region, scheduler) the same scaled trace is simulated with a calibrated
engine and replayed against a real vLLM server; both give a per-request table (columns of
`schedport.engine.core.metrics.REQUEST_COLUMNS`) and a run summary (`schedport.engine.core.metrics.summarize`).
This module compares them, with pure functions of their inputs. Every dict returned is JSON-safe:
NaN and infinities become None (the rule of `schedport.engine.core.metrics`), so
``json.dumps(x, allow_nan=False)`` succeeds.

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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import numpy as np
import pandas as pd

from schedport.common.formatting import as_float
from schedport.common.values import json_safe, json_scalar
from schedport.engine.core.metrics import percentiles

__all__ = ["RUN_METRICS", "REQUEST_ERROR_METRICS", "request_errors", "median_summary", "repeat_spread",
           "median_request_table", "run_errors", "runs_frame", "relative_error", "run_side", "as_float",
           "json_safe", "check_columns"]

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

# --------------------------------------------------------------------------- per request


def check_columns(df: pd.DataFrame, cols: Iterable[str], what: str) -> None:
    """Refuse (`ValueError` naming `what`) a table without every one of `cols`."""
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
    check_columns(sim, cols, "simulated request table")
    check_columns(real, cols, "real request table")
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
    return json_safe(out)


# --------------------------------------------------------------------------- repeated replays


def median_summary(summaries: Sequence[dict], keys: Sequence[str]) -> dict:
    """The median over repeated replays of each of `keys` (missing or NaN values left out; None
    when no repeat has the key): one real run per cell, robust to a repeat a pause spoiled."""
    out = {}
    for k in keys:
        v = np.array([as_float(s.get(k)) for s in summaries], dtype=np.float64)
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
        v = np.array([as_float(s.get(m)) for s in summaries], dtype=np.float64)
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


def relative_error(sim_v: Any, real_v: Any) -> Optional[float]:
    """(sim - real) / real, None when undefined (missing value, zero or non-finite real)."""
    s, r = as_float(sim_v), as_float(real_v)
    if not (math.isfinite(s) and math.isfinite(r)) or r == 0:
        return None
    return json_scalar((s - r) / r)


def run_errors(sim_summary: dict, real_summary: dict, metrics: Sequence[str] = RUN_METRICS) -> dict:
    """Signed relative error (sim - real) / real per run metric: {metric: float or None}.

    None where either summary lacks the metric, a value is None/NaN, or the real value is 0
    (e.g. both runs completed nothing: no relative error is defined).
    """
    return {m: relative_error(sim_summary.get(m), real_summary.get(m)) for m in metrics}


def runs_frame(runs: Sequence[dict], metrics: Sequence[str] = RUN_METRICS) -> pd.DataFrame:
    """The input table of `rank_agreement` built from ``validation.json``-style run dicts.

    One row per run: ``window``, ``region``, ``scheduler`` and ``sim_<m>`` / ``real_<m>`` for
    each metric, read from the run's ``sim`` / ``real`` summaries (NaN where absent).
    """
    rows = []
    for run in runs:
        sim, real = run_side(run, "sim"), run_side(run, "real")
        row = {"window": run.get("window"), "region": run.get("region"), "scheduler": run.get("scheduler")}
        for m in metrics:
            row[f"sim_{m}"] = as_float(sim.get(m))
            row[f"real_{m}"] = as_float(real.get(m))
        rows.append(row)
    cols = ["window", "region", "scheduler"] + [f"{p}_{m}" for m in metrics for p in ("sim", "real")]
    return pd.DataFrame(rows, columns=cols)


def run_side(run: dict, side: str) -> dict:
    """The run's summary subset for `side` ("sim" or "real", under that key or ``<side>_summary``),
    {} when absent."""
    for key in (side, f"{side}_summary"):
        v = run.get(key)
        if isinstance(v, dict):
            return v
    return {}
