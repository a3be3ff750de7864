"""The report's simulator-vs-real-engine section, rendered from a validation dict.

`render_validation_section` draws a ``validation.json`` dict (``schedport validate``) read with
`schedport.analysis.validation_stats.load_validation`, which adds the summaries over runs that
the section shows (``overview``: run and request error tables, totals, the machine-speed sentence,
the threshold); `write_validation_html` writes the section as a page of its own. Nothing is
computed here: every number is read from the dict, so the section and ``validation.json`` cannot
disagree. The figure is an embedded PNG, nothing is fetched.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from schedport.errors import SchedportError
from schedport.common.atomic import atomic_write_text
from schedport.common.formatting import as_float, fmt, pct, signed_pct
from schedport.report.figures import plt, png_data_uri
from schedport.report.style import CSS, MARKERS, OKABE_ITO, img_tag
from schedport.report.style import escape_html as esc

__all__ = ["render_validation_section", "write_validation_html", "fig_sim_vs_real"]

ROW_CAP = 200  # prediction rows shown in the page (validation.json has all)


def _runs(validation: dict) -> list[dict]:
    return [r for r in (validation.get("runs") or []) if isinstance(r, dict)]


def _side(run: dict, side: str) -> dict:
    """The run's summary subset for `side` ("sim" or "real"), {} when absent."""
    for key in (side, f"{side}_summary"):
        v = run.get(key)
        if isinstance(v, dict):
            return v
    return {}


def _overview(validation: dict) -> dict:
    """The summaries over runs the section shows, added by the analysis when it read the file."""
    ov = validation.get("overview")
    if not isinstance(ov, dict):
        raise SchedportError("the validation dict has no 'overview' (the summaries over runs the report shows): "
                             "read validation.json with schedport.analysis.validation_stats.load_validation, which "
                             "adds it")
    return ov


# --------------------------------------------------------------------------- figure


def fig_sim_vs_real(validation: dict, metrics: Sequence[str] = ("ttft_mean_s", "e2e_mean_s")) -> Optional[str]:
    """Simulated (y) against measured (x) run means, log-log, one colour and marker per scheduler.

    Points above the y = x line are runs the simulation makes slower than the real engine.
    None when no run has both values positive.
    """
    runs = _runs(validation)
    scheds = sorted({str(r.get("scheduler")) for r in runs})
    pts = {m: [] for m in metrics}
    for r in runs:
        sim, real = _side(r, "sim"), _side(r, "real")
        for m in metrics:
            x, y = as_float(real.get(m)), as_float(sim.get(m))
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
    return png_data_uri(fig)


# --------------------------------------------------------------------------- HTML


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
        pair = f"{esc(p['scheduler_a'])} vs {esc(p['scheduler_b'])}"
        if p["verdict"] == "flip":
            f = p.get("flip") or {}
            says = (f"flip: {esc(_better_word(p, 1))} better at {esc(_cond(f.get('condition_pos')))} "
                    f"({signed_pct(f.get('sim_diff_pos'))}), {esc(_better_word(p, -1))} better at "
                    f"{esc(_cond(f.get('condition_neg')))} ({signed_pct(f.get('sim_diff_neg'))})")
            real = f"{signed_pct(f.get('real_diff_pos'))} / {signed_pct(f.get('real_diff_neg'))}"
            result = "reproduced" if p.get("reproduced") else "not reproduced"
        else:
            says = (f"stable: {esc(_better_word(p, p.get('sim_sign')))} better "
                    f"({p.get('n_sim_beyond')} of {p.get('n_conditions')} conditions beyond the threshold)")
            real = (f"agrees in {p.get('n_real_agree')}, contradicts in {p.get('n_real_contradict')} of "
                    f"{p.get('n_real_beyond')} conditions with a real difference")
            result = {True: "held", False: "not held", None: "no real difference"}[p.get("held")]
        colour = {"held": "#006d4f", "reproduced": "#006d4f", "not held": "#a33a00",
                  "not reproduced": "#a33a00"}.get(result, "#555")
        out.append(f"<tr><td class='l'>{esc(p['metric'])}</td><td class='l'>{pair}</td>"
                   f"<td class='l'>{says}</td><td class='l'>{real}</td>"
                   f"<td class='l' style='color:{colour}'><b>{esc(result)}</b></td></tr>")
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
                f"<td class='l'>{esc(r.get('window'))}</td><td class='l'>{esc(r.get('region'))}</td>",
                f"<td class='l'>{esc(r.get('scheduler'))}</td><td>{_fmt(r.get('load'), 2)}</td>",
                f"<td>{_fmt(sim.get('ttft_mean_s'))}</td><td>{_fmt(real.get('ttft_mean_s'))}</td>",
                f"<td>{signed_pct(er.get('ttft_mean_s'))}</td>",
                f"<td>{_fmt(sim.get('e2e_mean_s'))}</td><td>{_fmt(real.get('e2e_mean_s'))}</td>",
                f"<td>{signed_pct(er.get('e2e_mean_s'))}</td>",
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
    return esc(fmt(v, digits))


def _header_html(validation: dict, ov: dict) -> list[str]:
    """The section's heading, what it compares, and its notes (client lag, machine speed, status)."""
    thr = ov["threshold"]
    tot = ov["totals"]
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
           f"{esc(pct(thr, 0))} is treated as a tie within measurement noise and counted apart.</p>",
           f"<p class='sub'>{tot['n_runs']} runs &middot; {len(windows)} window(s) &middot; regions "
           f"{esc(', '.join(regions))} &middot; {len(scheds)} scheduler(s) &middot; server model "
           f"<code>{esc(server.get('model', 'n/a'))}</code> &middot; created {esc(validation.get('created', 'n/a'))}"
           "</p>"]
    if tot["n_lag_bad"]:
        out.append(f"<div class='note'>In {tot['n_lag_bad']} run(s) the client fell behind its send schedule "
                   "(99th-percentile send lag over the bound): their real latencies include client delay.</div>")
    if ov.get("speed"):
        out.append(f"<p class='sub'>{esc(ov['speed'])}.</p>")
    if tot["n_status_mismatch"]:
        out.append(f"<div class='note'>{tot['n_status_mismatch']} request(s) ended differently in the simulation "
                   "and on the server (e.g. completed in one, rejected or failed in the other); latency errors "
                   "are over the requests completed in both.</div>")
    return out


def _errors_html(ov: dict) -> list[str]:
    """The run-metric and per-request error tables (from the overview's tables)."""
    tot = ov["totals"]
    rows = "".join(f"<tr><td class='l'>{esc(d['metric'])}</td><td>{d['n_runs']}</td><td>{esc(pct(d['abs_err_p50']))}"
                   f"</td><td>{esc(pct(d['abs_err_p90']))}</td><td>{esc(signed_pct(d['err_p50']))}</td>"
                   f"<td>{esc(pct(d.get('noise_p50')))}</td></tr>"
                   for d in ov["run_errors"])
    out = ["<h3>Run metrics: simulated vs measured</h3>"
           "<p class='sub'>Relative error (sim &minus; real) / real of each run's metric; median and 90th "
           "percentile of its magnitude over runs, and the median signed error (negative: the simulation "
           "is lower than the real engine). Real noise: when each run was replayed more than once, the "
           "median over runs of how far one replay lands from the median of its repeats (the real "
           "engine's own run-to-run error, the floor any simulator is held to); the real value compared "
           "is then the median of the repeats.</p>"
           "<table><tr><th class='l'>metric</th><th>runs</th><th>median |error|</th><th>p90 |error|</th>"
           f"<th>median error</th><th>real noise</th></tr>{rows}</table>"]
    rows = "".join(f"<tr><td class='l'>{esc(d['metric'])}</td><td>{d['n_runs']}</td><td>{d['n_requests']}</td>"
                   f"<td>{esc(pct(d['abs_pct_err_p50']))}</td><td>{esc(pct(d['abs_pct_err_p90']))}</td>"
                   f"<td>{esc(signed_pct(d['pct_err_p50']))}</td></tr>" for d in ov["request_errors"])
    out.append("<h3>Per-request latency</h3>"
               f"<p class='sub'>Requests matched by id and completed on both sides ({tot['n_matched']} of "
               f"{tot['n_both']}); per run, the median and 90th percentile of |sim &minus; real| / real and the "
               "median signed error; the table gives the median of each over runs.</p>"
               "<table><tr><th class='l'>latency</th><th>runs</th><th>requests</th><th>median of p50 |error|</th>"
               f"<th>median of p90 |error|</th><th>median signed error</th></tr>{rows}</table>")
    return out


def _agreement_row(d: dict, label: str) -> str:
    """One row of the rank-agreement table (a metric's, or all metrics')."""
    return (f"<tr><td class='l'>{label}</td><td>{esc(fmt(d.get('tau_mean')))}</td>"
            f"<td>{esc(fmt(d.get('tau_median')))}</td><td>{esc(fmt(d.get('tau_min')))}</td>"
            f"<td>{esc(pct(d.get('top1_agreement')))}</td>"
            f"<td>{esc(pct(d.get('top1_agreement_within_noise')))}</td>"
            f"<td>{d.get('n_pair_held')} / {d.get('n_pair_predictions')} "
            f"({esc(pct(d.get('pair_held_share')))})</td><td>{d.get('n_pair_real_tie')}</td>"
            f"<td>{d.get('n_stable_held')} / {d.get('n_stable')}</td>"
            f"<td>{d.get('n_stable_not_held')}</td><td>{d.get('n_stable_real_tie')}</td>"
            f"<td>{d.get('n_flip_reproduced')} / {d.get('n_flip')}</td></tr>")


def _dramatic_html(md: Optional[dict], bm: list) -> str:
    """The most dramatic simulated flip in one sentence, and how the real engine answered."""
    if not md:
        return "<p>The simulation predicts no flip beyond the threshold.</p>"
    p = {"scheduler_a": md["scheduler_a"], "scheduler_b": md["scheduler_b"],
         "direction": next((d.get("direction") for d in bm if d["metric"] == md["metric"]), "lower")}
    return (f"<p>Most dramatic simulated flip: <b>{esc(md['scheduler_a'])} vs {esc(md['scheduler_b'])}</b> on "
            f"{esc(md['metric'])}: {esc(_better_word(p, 1))} better by {esc(signed_pct(md.get('sim_diff_pos')))} "
            f"at {esc(_cond(md.get('condition_pos')))}, {esc(_better_word(p, -1))} better by "
            f"{esc(signed_pct(md.get('sim_diff_neg')))} at {esc(_cond(md.get('condition_neg')))}. On the real "
            f"engine: {esc(signed_pct(md.get('real_diff_pos')))} and {esc(signed_pct(md.get('real_diff_neg')))}, "
            f"<b>{'reproduced' if md.get('reproduced') else 'not reproduced'}</b>.</p>")


def _agreement_html(ag: dict, thr: float) -> list[str]:
    """Do the rankings hold? Per metric tau, top-1 and pairwise predictions, the most dramatic flip
    and the table of stable and flip predictions (from ``agreement``)."""
    summ = ag.get("summary") or {}
    bm = summ.get("by_metric") or []
    if not bm:
        return ["<p>No rank agreement in this validation (no agreement summary).</p>"]
    rows = "".join(_agreement_row(d, f"{esc(d['metric'])} ({esc(d.get('direction', '?'))} is better)") for d in bm)
    if summ.get("overall") and len(bm) > 1:
        rows += _agreement_row(summ["overall"], "<b>all metrics</b>")
    out = ["<h3>Do the rankings hold?</h3>"
           f"<p class='sub'>Per condition (window &times; region, {summ.get('n_conditions', 0)} in all) and "
           "metric: Kendall's tau-b between simulated and real values across schedulers (1 = same order; "
           "a scheduler that completed nothing ranks last), and top-1 agreement (the best scheduler is "
           "the same; tied bests count when they overlap); within noise, the schedulers that cannot be "
           f"told from the best (within {esc(pct(thr, 0))}, or, on the real engine, with repeats "
           "overlapping the best's) count as tied. Pairs held: per condition and scheduler pair, "
           "the simulated and real differences have the same sign, over pairs where the real difference "
           f"is at least {esc(pct(thr, 0))}; real ties are the others. Across conditions the simulation "
           "predicts a <i>stable</i> order for a pair (same sign wherever the simulated difference is "
           "beyond the threshold) or a <i>flip</i> (the order reverses between conditions).</p>"
           "<div class='scroll'><table><tr><th class='l'>metric</th><th>tau mean</th><th>tau median</th>"
           "<th>tau min</th><th>top-1 agreement</th><th>top-1 within noise</th><th>pairs held</th><th>real ties</th>"
           "<th>stable held</th><th>stable not held</th><th>stable, no real difference</th>"
           f"<th>flips reproduced</th></tr>{rows}</table></div>",
           _dramatic_html(summ.get("most_dramatic_flip"), bm),
           "<p class='sub'>d = (x<sub>a</sub> &minus; x<sub>b</sub>) / x<sub>b</sub> on each engine; for "
           "latencies a negative d means the first scheduler is faster.</p>",
           _prediction_html(ag)]
    return out


def render_validation_section(validation: dict) -> str:
    """The validation section (``<section id="validation">``) rendered from a validation dict alone.

    `validation` is a ``validation.json`` dict as `schedport.analysis.validation_stats.load_validation`
    returns it (with its ``overview``; a dict without one is refused with a one-line
    `SchedportError`). Self-contained: the figure is an embedded PNG, nothing is fetched. Every
    number is read from the dict, so the section and ``validation.json`` cannot disagree.
    """
    ov = _overview(validation)
    server = validation.get("server") or {}
    out = _header_html(validation, ov)
    out += _errors_html(ov)
    out += _agreement_html(validation.get("agreement") or {}, ov["threshold"])
    fig = fig_sim_vs_real(validation)
    out.append("<h3>Simulated vs measured per run</h3>"
               + (img_tag(fig, "simulated vs measured mean TTFT and E2E per run") if fig
                  else "<p>No run with both a simulated and a measured mean latency.</p>"))
    out.append(_run_rows_html(validation))
    eng = validation.get("engine")
    if eng or server:
        out.append("<details><summary>engine and server</summary><pre>"
                   f"{esc(json.dumps({'engine': eng, 'server': server}, indent=1, sort_keys=True, default=str))}"
                   "</pre></details>")
    out.append("</section>")
    return "\n".join(out)


def write_validation_html(validation: dict, path) -> Path:
    """Write the validation section as a standalone, self-contained page (atomically).

    `validation` as for `render_validation_section` (read with `load_validation`)."""
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
    return atomic_write_text(path, text)
