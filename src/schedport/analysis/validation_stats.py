"""How well does the simulator predict a real engine? The comparison layer of ``schedport validate``.

For each (window, region, scheduler) the same scaled trace is simulated with a calibrated
engine and replayed against a real vLLM server. The comparison has three levels, each in a
module of its own and all re-exported here:

- per request and per run, and over repeated replays (`schedport.analysis.validation_errors`:
  `request_errors`, `run_errors`, `median_summary`, `median_request_table`, `repeat_spread`,
  `runs_frame`);
- rankings: do the simulated scheduler rankings, and the flips between conditions, hold on the
  real engine? (`schedport.analysis.validation_ranks`: `rank_agreement`).

This module reads a ``validation.json`` (`load_validation`) and summarises its runs: the
distribution over runs of each run metric's error (`run_error_table`), of the per-request
errors (`request_error_table`), the totals of matched and mismatched requests, and whether the
machine's speed explains the error (`speed_error_correlation`). `validation_overview` gathers
what the report's validation section shows beyond the file's own fields; `load_validation`
adds it to the dict under ``overview`` (the report renders it, `schedport.report.validation`,
and computes nothing). `summary_table_lines` gives the terminal summary. Each run dict carries
``window``, ``region``, ``scheduler``, ``load``, the summaries under ``sim`` and ``real``
(``sim_summary`` / ``real_summary`` are also read), ``request_errors``, ``run_errors`` and
``client_lag_ok``. Every dict returned is JSON-safe (NaN and infinities become None).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import numpy as np
from scipy import stats

from schedport.errors import SchedportError
from schedport.common.formatting import as_float, fmt, pct, signed_pct
from schedport.common.values import json_safe
from schedport.engine.core.metrics import percentiles
from schedport.analysis.validation_errors import REQUEST_ERROR_METRICS, RUN_METRICS, relative_error, run_side
from schedport.analysis.validation_errors import (median_request_table, median_summary,  # noqa: F401 (re-exported)
                                                  repeat_spread, request_errors, run_errors, runs_frame)
from schedport.analysis.validation_ranks import DEFAULT_THRESHOLD
from schedport.analysis.validation_ranks import HIGHER_IS_BETTER, rank_agreement  # noqa: F401 (re-exported)

__all__ = [
    "RUN_METRICS",
    "REQUEST_ERROR_METRICS",
    "HIGHER_IS_BETTER",
    "DEFAULT_THRESHOLD",
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
    "validation_totals",
    "speed_text",
    "validation_overview",
    "summary_table_lines",
    "fmt_x",
]


# --------------------------------------------------------------------------- input


def load_validation(source) -> dict:
    """A validation dict from a ``validation.json`` path (or a dict), with its ``overview`` added.

    Refuses, with a one-line `SchedportError`, a file that is missing, not JSON, or not a
    validation result (an object with a ``runs`` list or an ``agreement`` object), so that
    ``schedport analyze --validation`` fails before writing anything. Returns a new dict: the
    file's (or the given dict's) keys and ``overview``, the summaries over runs the report's
    validation section shows (`validation_overview`); the report renders that dict and computes
    nothing. A given dict is not modified.
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
    return {**data, "overview": validation_overview(data)}



# --------------------------------------------------------------------------- summaries over runs


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
        v = np.array([as_float((r.get("run_errors") or {}).get(m)) for r in runs], dtype=np.float64)
        v = v[np.isfinite(v)]
        p50, p90 = percentiles(np.abs(v), (50.0, 90.0))
        (signed,) = percentiles(v, (50.0,))
        nz = np.array([as_float((r.get("real_spread") or {}).get(m)) for r in runs], dtype=np.float64)
        nz = nz[np.isfinite(nz)]
        (noise,) = percentiles(nz, (50.0,))
        out.append({"metric": m, "n_runs": int(v.size), "abs_err_p50": p50, "abs_err_p90": p90,
                    "err_p50": signed, "noise_p50": noise, "n_noise_runs": int(nz.size)})
    return json_safe(out)


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
            v = np.array([as_float(e.get(f"{key}_{stat}")) for e in errs], dtype=np.float64)
            v = v[np.isfinite(v)]
            (row[stat],) = percentiles(v, (50.0,))
            row.setdefault("n_runs", int(v.size))
        n = np.array([as_float(e.get(f"{key}_n")) for e in errs], dtype=np.float64)
        row["n_requests"] = int(n[np.isfinite(n)].sum())
        out.append(row)
    return json_safe(out)


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
        sim_v = run_side(r, "sim").get(metric)
        reps = r.get("real_repeats") or [run_side(r, "real")]
        for rep in reps:
            idx, err = as_float(rep.get("speed_index")), relative_error(sim_v, rep.get(metric))
            if math.isfinite(idx) and err is not None:
                xs.append(idx)
                ys.append(err)
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    res = stats.spearmanr(xs, ys)
    return json_safe({"metric": metric, "n": len(xs), "spearman_rho": float(res.statistic),
                      "pvalue": float(res.pvalue)})


def validation_totals(validation: dict) -> dict:
    """Counts over the runs: ``n_runs``, ``n_matched``, ``n_both`` and ``n_status_mismatch`` (requests,
    summed over runs' ``request_errors``) and ``n_lag_bad`` (runs whose client fell behind its
    send schedule)."""
    runs = _runs(validation)

    def tot(key: str) -> int:
        return int(sum(v for v in (as_float((r.get("request_errors") or {}).get(key)) for r in runs)
                       if math.isfinite(v)))

    lag_bad = [r for r in runs if r.get("client_lag_ok") is False]
    return {"n_runs": len(runs), "n_matched": tot("n_matched"), "n_status_mismatch": tot("n_status_mismatch"),
            "n_both": tot("n_both"), "n_lag_bad": len(lag_bad)}


# --------------------------------------------------------------------------- figure


def speed_text(validation: dict) -> str:
    """The machine's speed in one sentence: the speed index over replays (``speed_index``) and, when
    there are enough replays, its Spearman correlation with the mean E2E error."""
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
    x = as_float(v)
    return f"{x:.2f}x" if math.isfinite(x) else "n/a"


def validation_overview(validation: dict) -> dict:
    """What the report's validation section shows beyond the file's own fields, computed from it.

    Keys: ``run_errors`` (`run_error_table`), ``request_errors`` (`request_error_table`),
    ``totals`` (`validation_totals`), ``speed`` (`speed_text`, None when the replays were not
    probed) and ``threshold`` (the rank agreement's, `DEFAULT_THRESHOLD` when it records none).
    """
    summ = (validation.get("agreement") or {}).get("summary") or {}
    return {"run_errors": run_error_table(validation), "request_errors": request_error_table(validation),
            "totals": validation_totals(validation),
            "speed": speed_text(validation) if validation.get("speed_index") else None,
            "threshold": summ.get("threshold", DEFAULT_THRESHOLD)}


# --------------------------------------------------------------------------- terminal


def _cond(c: Optional[dict]) -> str:
    if not c:
        return "n/a"
    return f"window {c.get('window')}, {c.get('region')}"


def summary_table_lines(validation: dict) -> list[str]:
    """A short plain-text summary for the terminal: one line per metric, then the verdicts."""
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
                     f"(sim {signed_pct(md.get('sim_diff_pos'))} at {_cond(md.get('condition_pos'))}, "
                     f"{signed_pct(md.get('sim_diff_neg'))} at {_cond(md.get('condition_neg'))}; real "
                     f"{signed_pct(md.get('real_diff_pos'))} / {signed_pct(md.get('real_diff_neg'))}): "
                     f"{'reproduced' if md.get('reproduced') else 'not reproduced'}")
    if validation.get("speed_index"):
        lines.append(speed_text(validation))
    tot = validation_totals(validation)
    if tot["n_status_mismatch"]:
        lines.append(f"{tot['n_status_mismatch']} request(s) ended differently in the simulation and on the server")
    if tot["n_lag_bad"]:
        lines.append(f"{tot['n_lag_bad']} run(s) where the client fell behind its send schedule")
    return lines
