"""The portability report: one self-contained HTML file rendered from ``portability.json``.

`build_html(res)` turns the dict returned by `schedport.analysis.portability.compute_portability` into a
page; `write_report(res, path)` writes it. Given a ``validation.json`` dict (``schedport
validate``, read with `schedport.analysis.validation_stats.load_validation`), both add its
simulator-vs-real-engine section (`schedport.report.validation`); given explanations
(``res["explain"]``, ``schedport analyze --explain``), the "Why it flips" section
(`schedport.report.explain`). Nothing is recomputed here: every number on the page
is read from the dict, so the report and ``portability.json`` cannot disagree. The numbers of
the first screen (the headline findings) carry ``data-key`` (their path in the JSON) and
``data-fmt`` attributes, so a test can check each against the file.

Figures are drawn with matplotlib's Agg backend and embedded as base64 PNG (no network,
no scripts, no external files; `schedport.report.figures`). Palettes are colour-blind safe: cividis
for concordance, viridis for counts, Okabe-Ito (with distinct markers and line styles) for
categories (`schedport.report.style`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from schedport.common.atomic import atomic_write_text
from schedport.common.formatting import fmt, pct  # noqa: F401  (the report's number style)
from schedport.report.answer import own_card, render_html as render_answer
from schedport.report.explain import render_section
from schedport.report.modeled import modeled_check_html
from schedport.report.numbers import FORMATTERS as _FORMATTERS, Nums as _Nums, resolve_key  # noqa: F401  (tests read them here)
from schedport.report.robustness import robustness_card, verdict_across_text
from schedport.report.simulator import claim_survival, simulator_card
from schedport.report.deployments import deployments_section
from schedport.report.figures import (fig_headline_tau, fig_metric_matrix, fig_rank_trajectories,  # noqa: F401
                                      fig_reversal_map, fig_tau_heatmap, fig_workload)
from schedport.report.style import CSS, OKABE_ITO, img_tag  # noqa: F401  (OKABE_ITO: part of this module's API)
from schedport.report.style import escape_html as esc
from schedport.report.validation import render_validation_section

__all__ = ["build_html", "write_report", "fmt", "pct", "resolve_key", "OKABE_ITO"]

ROW_CAP = 200  # rows of long lists shown in the page (the JSON has all)


# --------------------------------------------------------------------------- formatting


# --------------------------------------------------------------------------- page


VERDICT_CLASS = {"holds": "v-holds", "does not hold": "v-not", "partly holds": "v-part", "inconclusive": "v-part",
                 "not comparable": "v-nc"}


def _find_ix(items: list, **match) -> Optional[int]:
    for i, d in enumerate(items):
        if all(d.get(k) == v for k, v in match.items()):
            return i
    return None


def _claims_card(res: dict, n: _Nums) -> str:
    """The study's five findings beside this run's figures, with verdicts (all from study_form.claims)."""
    cl = res["study_form"]["claims"]
    rob = res.get("robustness") or {}
    rob_ix = {c["id"]: i for i, c in enumerate(rob.get("claims") or [])}
    rows = []
    for i, c in enumerate(cl):
        cls = VERDICT_CLASS.get(c["verdict"], "")
        j = rob_ix.get(c["id"])
        across = ""
        if j is not None:
            rc = rob["claims"][j]
            text = verdict_across_text(rc, c["verdict"], n(f"robustness.claims.{j}.share_holds", "pct"),
                                       rob["n_protocols"])
            across = f"<br><span class='sub'>{text} (<a href='#robustness'>how robust</a>)</span>"
        across += claim_survival(res, c["id"])
        rows.append(f"<tr><td class='l'>{esc(c['study'])}</td><td class='l'>{n(f'study_form.claims.{i}.here', 'str')}"
                    f"</td><td class='l {cls}'><b>{n(f'study_form.claims.{i}.verdict', 'str')}</b>{across}</td>"
                    f"<td class='l sub'>{esc(c.get('rule', ''))}</td></tr>")
    return ("<div class='card' id='card-claims'><h3>The study's findings, claim by claim</h3>"
            "<p class='sub'>Each finding of the original study beside this run's figure in the same form, with its "
            "95% interval; the verdict is computed from the numbers by the rule shown (generated from "
            "portability.json).</p><div class='scroll'><table><tr><th class='l'>study</th><th class='l'>this run</th>"
            "<th class='l'>verdict</th><th class='l'>rule</th></tr>" + "".join(rows) + "</table></div></div>")


def _tau_card(res: dict, n: _Nums) -> str:
    """Cross-source tau per source pair and main metric, with split-half ceilings beside it."""
    h = res["headline"]
    cs = h["cross_source"]
    sf = res["study_form"]
    regions = [r["name"] for r in res["parameters"]["regions"]]
    main = sf["main_metrics"]
    c = ['<div class="card" id="card-sources"><h3>Do rankings carry over across sources?</h3>']
    if not cs["by_pair"]:
        c.append("<p>Only one source in the store: no cross-source comparison.</p></div>")
        return "".join(c)
    c.append("<p class='sub'>Kendall tau-b between two sources' mean-rank vectors, per main metric (mean over "
             "regions) and averaged over the main metrics; 95% basic bootstrap interval over windows "
             "(reverse percentile; sampling noise pulls tau of estimated ranks towards 0, so an interval can lie "
             "above its estimate). &dagger;: in that many regions a mean-rank vector has 3 or fewer distinct "
             "values (tau of near-constant vectors). Ceiling-adjusted: tau at half the windows divided by "
             "sqrt(split-half reliability of each source), 1 = the sources agree as well as each agrees with "
             "itself.</p>")
    c.append("<div class='scroll'><table><tr><th class='l'>source pair</th>"
             + "".join(f"<th>{esc(m)}</th>" for m in main)
             + "<th>main metrics</th><th>ceiling-adjusted</th></tr>")
    ct = sf["cross_source_tau"]
    half = sf["cross_source_half"]["by_pair"]
    for pi, d in enumerate(cs["by_pair"]):
        row = [f"<td class='l'>{esc(d['source_a'])} vs {esc(d['source_b'])}</td>"]
        for m in main:
            ix = _find_ix(ct, source_a=d["source_a"], source_b=d["source_b"], metric=m)
            if ix is None:
                row.append("<td>&ndash;</td>")
                continue
            tied = ct[ix].get("n_tied_regions") or 0
            mark = f"<sup title='{tied} region(s) with a tied vector'>&dagger;{tied}</sup>" if tied else ""
            jx = _find_ix(sf["cross_source_half"]["by_pair_metric"], source_a=d["source_a"], source_b=d["source_b"],
                          metric=m)
            adj = (f"<br><span class='sub'>adjusted {n(f'study_form.cross_source_half.by_pair_metric.{jx}.adjusted')}"
                   "</span>" if jx is not None else "")
            row.append(f"<td>{n.ci(f'study_form.cross_source_tau.{ix}')}{mark}{adj}</td>")
        row.append(f"<td><b>{n.ci(f'headline.cross_source.by_pair.{pi}')}</b></td>")
        hx = _find_ix(half, source_a=d["source_a"], source_b=d["source_b"])
        row.append(f"<td>{n(f'study_form.cross_source_half.by_pair.{hx}.adjusted')}</td>" if hx is not None
                   else "<td>n/a</td>")
        c.append("<tr>" + "".join(row) + "</tr>")
    c.append("</table></div>")
    mp = cs["min_pair"]
    if mp:
        pi = _find_ix(cs["by_pair"], source_a=mp["source_a"], source_b=mp["source_b"])
        c.append(f"<p>Lowest pair: <b>{esc(mp['source_a'])} vs {esc(mp['source_b'])}</b>, tau = "
                 f"<span class='big'>{n('headline.cross_source.min_pair.value')}</span> (interval as in the "
                 f"table).</p>")
    # per region, with the noise ceiling of both sources beside each tau
    sh = sf["split_half"]
    pr = sf["cross_source_half"]["by_pair_region"]
    c.append("<div class='scroll'><table><tr><th class='l'>source pair, per region</th>"
             + "".join(f"<th>{esc(r)}</th>" for r in regions) + "</tr>")
    for d in cs["by_pair"]:
        row = [f"<td class='l'>{esc(d['source_a'])} vs {esc(d['source_b'])}<br><span class='sub'>tau / "
               "ceiling-adjusted</span></td>"]
        for r in regions:
            ix = _find_ix(cs["by_pair_region"], source_a=d["source_a"], source_b=d["source_b"], region=r)
            jx = _find_ix(pr, source_a=d["source_a"], source_b=d["source_b"], region=r)
            cell = n(f"headline.cross_source.by_pair_region.{ix}.value") if ix is not None else "n/a"
            if jx is not None:
                cell += f" / {n(f'study_form.cross_source_half.by_pair_region.{jx}.adjusted')}"
            row.append(f"<td>{cell}</td>")
        c.append("<tr>" + "".join(row) + "</tr>")
    for s in res["parameters"]["sources"]:
        row = [f"<td class='l'>split-half reliability: {esc(s)}</td>"]
        for r in regions:
            ix = _find_ix(sh, source=s, region=r)
            row.append(f"<td>{n.ci(f'study_form.split_half.{ix}')}</td>" if ix is not None else "<td>n/a</td>")
        c.append("<tr class='ceiling'>" + "".join(row) + "</tr>")
    info = sf["split_half_info"]
    c.append("</table></div>")
    c.append(f"<p class='sub'>Split-half reliability: {esc(info['definition'])}; {info['n_splits']} random "
             f"splits; range: {esc(info['ci_method'])}. Adjusted: {esc(info['adjusted_definition'])}.</p>")
    c.append("<div>" + img_tag(fig_headline_tau(res), "cross-source tau per region", "small") + "</div>")
    c.append("</div>")
    return "".join(c)


def _study_reversals_card(res: dict, n: _Nums) -> str:
    """Cross-source reversals per main metric in the study's form."""
    sf = res["study_form"]
    p = res["parameters"]
    c = ['<div class="card" id="card-reversals"><h3>How often do pairwise rankings flip across sources?</h3>']
    c.append(f"<p class='sub'>Per main metric: scheduler pairs whose median per-window effect has opposite signs "
             f"in two sources at the same region, both Benjamini-Hochberg significant at q = {esc(p['q'])} within "
             f"that metric's tests, both |effect| at or beyond the threshold ({esc(p['threshold_rule'])}). "
             "Duplicate schedulers count once. Interval: 95% percentile bootstrap over windows, with the tests, BH "
             "and reversals redone on every resample.</p>")
    head = ("<tr><th class='l'>metric</th><th>comparisons</th><th>reversals</th><th>share [95% CI]</th>"
            "<th class='l'>top region</th><th class='l'>top source pair</th><th class='l'>top scheduler pair</th>"
            "<th>one pair</th><th class='l'>source on every one</th></tr>")
    rows = []
    for i, e in enumerate(sf["reversals"]):
        k = f"study_form.reversals.{i}"

        def _top(field):
            d = e[field]
            if not e["n_reversals"] or not d:
                return "&ndash;"
            key = max(d, key=lambda x: (d[x]["n_reversals"] if isinstance(d[x], dict) else d[x], x))
            v = d[key]["n_reversals"] if isinstance(d[key], dict) else d[key]
            sub = (f"{k}.{field}.{key}.n_reversals" if isinstance(d[key], dict) else f"{k}.{field}.{key}")
            return f"{esc(key)} ({n(sub, 'int')})" if "." not in key else f"{esc(key)} ({v})"

        one = "&ndash;" if e["one_scheduler_pair"] is None else ("yes" if e["one_scheduler_pair"] else "no")
        src = "&ndash;" if e["sources_on_every_reversal"] is None else (
            esc(", ".join(e["sources_on_every_reversal"])) or "none")
        rows.append(f"<tr><td class='l'>{esc(e['metric'])}</td><td>{n(k + '.n_comparisons', 'int')}</td>"
                    f"<td>{n(k + '.n_reversals', 'int')}</td><td><b>{n(k + '.share', 'pct')}</b> <span class='ci'>"
                    f"[{n(k + '.ci_low', 'pct')}, {n(k + '.ci_high', 'pct')}]</span></td><td class='l'>"
                    f"{_top('by_region')}</td><td class='l'>{_top('by_source_pair')}</td><td class='l'>"
                    f"{_top('by_scheduler_pair')}</td><td>{one}</td><td class='l'>{src}</td></tr>")
    c.append(f"<div class='scroll'><table>{head}{''.join(rows)}</table></div>")
    c.append("<p class='sub'>Pooled over all metrics and kinds of comparison (secondary): see "
             "<a href='#pooled'>Pooled reversals</a>.</p></div>")
    return "".join(c)


def _metrics_card(res: dict, n: _Nums) -> str:
    h = res["headline"]
    sf = res["study_form"]
    b = sf["best_changes_with_metric"]
    p = res["parameters"]
    c = ['<div class="card" id="card-metrics"><h3>Does the ranking depend on the metric?</h3>']
    c.append(f"<p>Mean pairwise tau between the main metrics: <span class='big'>"
             f"{n('headline.metrics.mean_pairwise_tau.value')}</span> <span class='ci'>["
             f"{n('headline.metrics.mean_pairwise_tau.ci_low')}, {n('headline.metrics.mean_pairwise_tau.ci_high')}"
             f"]</span> (95% basic bootstrap interval; all {len(p['metrics'])} distinct metrics: "
             f"{n.ci('headline.metrics.mean_pairwise_tau_all_metrics')}).</p>")
    c.append(f"<p>The single best scheduler changes with the metric in <span class='big'>"
             f"{n('study_form.best_changes_with_metric.share', 'pct')}</span> <span class='ci'>["
             f"{n('study_form.best_changes_with_metric.ci_low', 'pct')}, "
             f"{n('study_form.best_changes_with_metric.ci_high', 'pct')}]</span> of "
             f"{n('study_form.best_changes_with_metric.n_conditions', 'int')} window x region cells; pairwise: "
             f"{n('study_form.best_changes_with_metric.pairwise.share', 'pct')} <span class='ci'>["
             f"{n('study_form.best_changes_with_metric.pairwise.ci_low', 'pct')}, "
             f"{n('study_form.best_changes_with_metric.pairwise.ci_high', 'pct')}]</span> of (cell, metric pair).</p>")
    c.append(f"<p class='sub'>{esc(b['definition'])}; pairwise: {esc(b['pairwise']['definition'])}; 95% "
             "percentile bootstrap over windows.</p>")
    for i, f in enumerate(b.get("forced_by") or []):
        k = f"study_form.best_changes_with_metric.forced_by.{i}"
        c.append(f"<div class='note'>By construction: {esc(f['scheduler'])} is the sole best on {esc(f['metric'])} "
                 "in every window and never best on all the other main metrics, so every cell counts as changed. "
                 f"Without {esc(f['metric'])}: {n(k + '.share_without', 'pct')} <span class='ci'>["
                 f"{n(k + '.share_without_ci_low', 'pct')}, {n(k + '.share_without_ci_high', 'pct')}]</span>.</div>")
    c.append(img_tag(fig_metric_matrix(res, only=h["main_metrics"], title="Main-metric rank agreement"),
                  "metric concordance (main metrics)", "small"))
    c.append("</div>")
    return "".join(c)


def _artifacts_card(res: dict) -> str:
    """Metric families and duplicate schedulers found in the results."""
    fam = res["metric_families"]["groups"]
    dup = res["duplicates"]
    li = []
    for g in fam:
        li.append(f"<li>metrics <b>{esc(' = '.join(g))}</b>: identical rankings in every window; "
                  f"only {esc(g[0])} is analysed</li>")
    for s, groups in dup["by_source"].items():
        for g in groups:
            li.append(f"<li>{esc(s)}: <b>{esc(' = '.join(g))}</b> identical in every window and region "
                      "(one row in its rankings, counted once in reversals)</li>")
    for s, regs in dup["by_condition"].items():
        for r, groups in regs.items():
            li.append(f"<li>{esc(s)} @ {esc(r)}: {esc('; '.join(' = '.join(g) for g in groups))}</li>")
    if not li:
        li.append("<li>no duplicate metric and no duplicate scheduler</li>")
    return ("<div class='card' id='card-artifacts'><h3>Duplicates found in the results</h3><ul>" + "".join(li)
            + "</ul></div>")


def _region_card(res: dict, n: _Nums) -> str:
    """This run's headline beside the same study's under the other region definition (``--compare``)."""
    rc = res.get("region_comparison")
    if not rc:
        return ""
    a, b = rc["this"], rc["other"]
    rows = []
    warn = (f"<p class='warn'><b>Not one study:</b> {esc(rc['selection_note'])}.</p>"
            if rc.get("selection_differs") else "")

    def _row(label: str, ka: Optional[str], kb: Optional[str], kind: str = "num", ci: bool = False) -> None:
        def cell(k):
            if k is None:
                return "n/a"
            if ci:
                return (f"{n(k + '.value' if kind == 'num' else k + '.share', kind)} <span class='ci'>["
                        f"{n(k + '.ci_low', kind)}, {n(k + '.ci_high', kind)}]</span>")
            return n(k, kind)
        rows.append(f"<tr><td class='l'>{esc(label)}</td><td>{cell(ka)}</td><td>{cell(kb)}</td></tr>")

    for i, d in enumerate(a["cross_source_tau"]):
        j = _find_ix(b["cross_source_tau"], source_a=d["source_a"], source_b=d["source_b"])
        _row(f"tau {d['source_a']} vs {d['source_b']}", f"region_comparison.this.cross_source_tau.{i}",
             None if j is None else f"region_comparison.other.cross_source_tau.{j}", ci=True)
        _row("  ceiling-adjusted", f"region_comparison.this.cross_source_tau.{i}.adjusted",
             None if j is None else f"region_comparison.other.cross_source_tau.{j}.adjusted")
    for i, e in enumerate(a["reversals"]):
        j = _find_ix(b["reversals"], metric=e["metric"])
        _row(f"reversals on {e['metric']}", f"region_comparison.this.reversals.{i}",
             None if j is None else f"region_comparison.other.reversals.{j}", kind="pct", ci=True)
    _row("best changes (window x region)", "region_comparison.this.best_changes",
         "region_comparison.other.best_changes", kind="pct", ci=True)
    _row("mean tau between main metrics", "region_comparison.this.metric_tau", "region_comparison.other.metric_tau",
         ci=True)
    _row("split-half reliability, lowest", "region_comparison.this.split_half_min",
         "region_comparison.other.split_half_min")
    _row("split-half reliability, highest", "region_comparison.this.split_half_max",
         "region_comparison.other.split_half_max")
    def _flagged(d):
        f = d.get("regimes_flagged")
        return "n/a" if f is None else (esc(", ".join(f)) or "none")

    rows.append(f"<tr><td class='l'>regions not one regime across sources</td><td>{_flagged(a)}</td>"
                f"<td>{_flagged(b)}</td></tr>")
    for cid in a["claims"]:
        _row(f"claim {cid}", f"region_comparison.this.claims.{cid}",
             f"region_comparison.other.claims.{cid}" if cid in b["claims"] else None, kind="str")
    note = f"<p class='note'>{esc(rc['note'])}</p>" if rc.get("note") else ""
    return ("<div class='card' id='card-regiondefs'><h3>The headline under both region definitions</h3>"
            f"<p class='sub'>This run: {esc(a['region_def_description'])}. Other: "
            f"{esc(b['region_def_description'])} (from {esc(rc['other_path'])}). Intervals as in each run's own "
            "report.</p>" + warn + note
            + f"<div class='scroll'><table><tr><th class='l'>figure</th><th>{esc(a['region_def'])} (this run)</th>"
            f"<th>{esc(b['region_def'])}</th></tr>" + "".join(rows) + "</table></div></div>")


def _rank_tables(res: dict) -> str:
    p = res["parameters"]
    regions = [r["name"] for r in p["regions"]]
    sources = p["sources"]
    look = {(d["metric"], d["source"], d["region"], d["scheduler"]): d for d in res["rankings"]}
    dups = (res.get("duplicates") or {}).get("by_source", {})
    K = len(p["schedulers"])
    out = []
    for mi, m in enumerate(res["headline"]["main_metrics"]):
        tables = []
        for s in sources:
            merged = {x: g for g in dups.get(s, []) for x in g}
            rows, seen = [], set()
            for sc in p["schedulers"]:
                if sc in seen:
                    continue
                group = merged.get(sc, [sc])
                seen.update(group)
                cells = [f"<td class='l'>{esc(' = '.join(group))}</td>"]
                for r in regions:
                    d = look.get((m, s, r, sc))
                    if d is None:
                        cells.append("<td>&ndash;</td>")
                        continue
                    v = d["mean_rank"]
                    shade = int(255 - 90 * (1 - (v - 1) / max(K - 1, 1)))
                    cells.append(f"<td style='background:rgb({shade},{shade},255)' title='95% percentile CI "
                                 f"[{fmt(d['ci_low'], 2)}, {fmt(d['ci_high'], 2)}], {d['n_windows']} windows'>"
                                 f"{fmt(v, 2)}</td>")
                rows.append("<tr>" + "".join(cells) + "</tr>")
            head = (f"<tr><th class='l'>{esc(s)}</th>" + "".join(f"<th>{esc(r)}</th>" for r in regions) + "</tr>")
            tables.append(f"<div class='scroll'><table>{head}{''.join(rows)}</table></div>")
        direction = p["directions"].get(m, "?")
        out.append(f"<details{' open' if mi == 0 else ''}><summary>{esc(m)} ({direction} is better)</summary>"
                   "<div style='display:flex;gap:12px;flex-wrap:wrap'>" + "".join(tables) + "</div></details>")
    return ("<p class='sub'>Mean within-window rank (1 = best) per source and region; darker = better; hover "
            "for the 95% percentile bootstrap CI. Schedulers with identical results in every window of a source "
            "share one row there. All metrics are in portability.json.</p>" + "".join(out))


def _reversal_table(res: dict) -> str:
    items = res["reversals"]["items"]
    if not items:
        return "<p>No significant practical reversal.</p>"
    rows = []
    for d in items[:ROW_CAP]:
        rows.append(
            "<tr>" + "".join([
                f"<td class='l'>{esc(d.get('pair') or (d['scheduler_a'] + ' vs ' + d['scheduler_b']))}</td>",
                f"<td class='l'>{esc(d['metric'])}</td>",
                f"<td class='l'>{esc(d['source_a'])} @ {esc(d['region_a'])}</td>",
                f"<td>{fmt(d['effect_a'])}</td><td>{fmt(d['q_a'], 4)}</td>",
                f"<td class='l'>{esc(d['source_b'])} @ {esc(d['region_b'])}</td>",
                f"<td>{fmt(d['effect_b'])}</td><td>{fmt(d['q_b'], 4)}</td>",
            ]) + "</tr>")
    more = (f"<p class='sub'>{len(items) - ROW_CAP} more in portability.json.</p>" if len(items) > ROW_CAP else "")
    return ("<p class='sub'>Effect: median per-window effect of the first scheduler over the second (positive = "
            "first better; relative difference, or absolute difference for bounded metrics); q: Benjamini-Hochberg "
            "adjusted p-value over all tests.</p>"
            "<table><tr><th class='l'>pair</th><th class='l'>metric</th><th class='l'>condition 1</th><th>effect</th>"
            "<th>q</th><th class='l'>condition 2</th><th>effect</th><th>q</th></tr>"
            + "".join(rows) + "</table>" + more)


def _breakdowns(res: dict) -> str:
    rv = res["reversals"]
    parts = []

    def _tab(label: str, d: dict, denom: str) -> str:
        rows = "".join(f"<tr><td class='l'>{esc(k)}</td><td>{v['n_reversals']}</td><td>{v['n_comparisons']}</td>"
                       f"<td>{pct(v['rate'], 2)}</td><td>{pct(v['share_of_reversals'])}</td></tr>"
                       for k, v in list(d.items())[:30])
        return (f"<div><table><tr><th class='l'>{esc(label)}</th><th>reversals</th><th>comparisons</th>"
                f"<th>rate</th><th>share of {denom}</th></tr>{rows}</table></div>")

    cs, cr = rv["cross_source"], rv["cross_region"]
    parts.append(_tab("region (cross-source)", cs["by_region"], f"the {cs['n_reversals']} cross-source"))
    parts.append(_tab("source pair (cross-source)", cs["by_source_pair"], f"the {cs['n_reversals']} cross-source"))
    parts.append(_tab("region pair (cross-region)", cr["by_region_pair"], f"the {cr['n_reversals']} cross-region"))
    parts.append(_tab("source (cross-region)", cr["by_source"], f"the {cr['n_reversals']} cross-region"))
    for key, label in (("by_scheduler_pair", "scheduler pair"), ("by_metric", "metric")):
        d = rv.get(key) or {}
        if d:
            rows = "".join(f"<tr><td class='l'>{esc(k)}</td><td>{v}</td></tr>" for k, v in list(d.items())[:30])
            parts.append(f"<div><table><tr><th class='l'>{esc(label)}</th><th>reversals (of "
                         f"{rv['n_significant_practical']})</th></tr>{rows}</table></div>")
    return (f"<p>{rv['n_significant_practical']} reversals of {rv['n_comparisons']} comparisons "
            f"({pct(rv['share'])}, Wilson interval [{pct(rv['share_ci_low'])}, {pct(rv['share_ci_high'])}], which "
            f"treats comparisons as independent and so understates the uncertainty): "
            f"{cs['n_reversals']} of {cs['n_comparisons']} cross-source, {cr['n_reversals']} of "
            f"{cr['n_comparisons']} cross-region, over {len(res['parameters']['metrics'])} distinct metrics, BH over "
            f"all {rv['n_tests']} tests.</p>"
            "<div style='display:flex;gap:16px;flex-wrap:wrap'>" + "".join(parts) + "</div>"
            f"<p class='sub'>{esc(rv['counting'])}.</p>")


_FLAG = " class='flag'"


def _regime_warning(res: dict) -> str:
    """The first screen's regime flag: regions where the sources' queues differ (empty if none)."""
    rg = res.get("regimes") or {}
    if not rg.get("flagged"):
        return ""
    parts = [f"{esc(f['region'])} (backlog {fmt(f['low'], 2)}&ndash;{fmt(f['high'], 2)})" for f in rg["flagged"]]
    return (f"<p class='warn' id='regime-warning'><b>Not the same regime in every source:</b> at "
            f"{', '.join(parts)} the sources' median {esc(rg['scheduler'])} "
            f"backlog at the last arrival differs by more than {fmt(rg['spread_limit'], 2)}, so a comparison "
            f"across sources there compares different loads (<a href='#regimes'>regime check</a>).</p>")


def _regime_table(res: dict) -> str:
    """The regime check: per source and region, the reference scheduler's queue beside the fluid value."""
    rg = res.get("regimes") or {}
    if not rg.get("available"):
        return f"<p class='note'>{esc(rg.get('note') or 'no regime check in this analysis')}.</p>"
    flagged = {f["region"] for f in rg.get("flagged", [])}
    rows = "".join(
        f"<tr{_FLAG if r['region'] in flagged else ''}><td class='l'>{esc(r['region'])}"
        f"</td><td class='l'>{esc(r['source'])}</td><td>{fmt(r['rho'], 2)}</td><td>{r['n_windows']}</td>"
        f"<td>{fmt(r['backlog_median'], 2)}</td><td>{fmt(r['fluid_backlog'], 2)}</td>"
        f"<td>{fmt(r.get('ttft_p50_s_median'), 3)}</td><td>{fmt(r.get('slo_attainment_standard_median'), 3)}</td></tr>"
        for r in sorted(rg["rows"], key=lambda r: (r["rho"], r["source"])))
    return (f"<p class='sub'>{esc(rg['scheduler'])} in every source and region: median over windows of the share of "
            "accepted requests still queued when the last request arrives, beside a fluid queue's max(0, 1 - 1/rho); "
            f"regions whose sources differ by more than {fmt(rg['spread_limit'], 2)} are flagged.</p>"
            "<div class='scroll'><table><tr><th class='l'>region</th><th class='l'>source</th><th>rho</th>"
            "<th>windows</th><th>backlog</th><th>fluid</th><th>TTFT p50 (s)</th><th>standard attainment</th></tr>"
            + rows + "</table></div>")


def _methodology(res: dict) -> str:
    p = res["parameters"]
    regions = ", ".join(f"{r['name']} (rho {fmt(r['rho'], 2)})" for r in p["regions"])
    wins = ", ".join(f"{s}: {n}" for s, n in p["windows_per_source"].items())
    dirs_hi = [m for m, d in p["directions"].items() if d == "higher"]
    dirs_lo = [m for m, d in p["directions"].items() if d == "lower"]
    li = [
        f"Data: {len(p['schedulers'])} schedulers ({esc(', '.join(p['schedulers']))}); sources and windows: "
        f"{esc(wins)}; regions: {esc(regions)}; seeds per cell: {p['seeds_per_cell']['min']}"
        f"&ndash;{p['seeds_per_cell']['max']}, averaged within each window first. The window is the unit of "
        "replication.",
        f"Metrics ({len(p['metrics'])}): lower is better for {esc(', '.join(dirs_lo))}; higher is better for "
        f"{esc(', '.join(dirs_hi))}. Each SLO profile's attainment and goodput is a metric of its own unless "
        f"they rank identically (metric families, below). Main metrics (one per family; tables, headline "
        f"averages and the study form): {esc(', '.join(p['main_metrics']))}.",
        f"Ranks: {esc(p['rank_method'])}. A condition (source x region) uses its complete block: the windows in "
        f"which every scheduler has a result (at least {p['min_windows']}).",
        f"Uncertainty: {esc(p['ci_method'])}; B = {p['n_boot']} replicates, seed {p['seed']}, "
        f"{int(100 * p['ci_level'])}% intervals. Every concordance, average, minimum and share is recomputed on "
        "each replicate. Why basic intervals for concordance: tau between estimated mean-rank vectors is biased "
        "towards 0 by sampling noise and a resample adds that noise again, so the replicates sit below the "
        "estimate; the basic interval [2t - q97.5, 2t - q2.5] reflects that shift around the estimate, which "
        "is itself left uncorrected (each headline's boot_bias in portability.json gives the shift's size).",
        "Concordance: Kendall's tau-b (the statistic of scipy.stats.kendalltau, computed vectorised and checked "
        "against scipy in the test suite) between mean-rank vectors of two sources (same "
        "region and metric), two regions (same source and metric) and two metrics (same source and region), plus "
        "Spearman's rho and top-1 agreement (the sets of tied-best schedulers intersect). tau is undefined when "
        "all schedulers tie; averages skip undefined values.",
        f"Best-changes share (pooled, per source x region): "
        f"{esc(res['headline']['metrics']['best_changes_with_metric']['definition'])}.",
        "Regime check (<code>regimes</code>): per source and region, the reference scheduler's (vllm-fcfs) median "
        "over windows of backlog_at_last_arrival, the share of accepted requests without a first token when the "
        "last request arrives, beside the fluid value max(0, 1 - 1/rho) of a queue started empty, with the median "
        "TTFT p50 and standard-SLO attainment; a region whose sources' backlogs differ by more than "
        f"{fmt((res.get('regimes') or {}).get('spread_limit'), 2)} is flagged on the first screen. A batch engine "
        "admits its first max_num_seqs requests at once, so its queue can sit below the fluid value by up to that "
        "share of the window.",
        "Metric families: two metrics whose within-window ranks agree in every window of every condition measure "
        "one ranking twice (e.g. goodput = attainment x n_requests / horizon); only the first of each group is "
        "analysed (a main metric first) and the others are dropped from every statistic "
        "(portability.json <code>metric_families</code>).",
        "Duplicate schedulers: schedulers whose every metric is bit-identical in every window of a condition are "
        "one scheduler there (<code>duplicates</code>, per source and per condition). Their tests and comparisons "
        "count once: a comparison between two conditions is one per pair of schedulers that are distinct in the "
        "conditions compared, and a reversal between a duplicate and a third scheduler counts once.",
        f"Bounded metrics ({esc(', '.join(p.get('bounded_metrics', [])))}): per-window effect = absolute "
        f"difference, practical threshold {esc(pct(p.get('abs_threshold'), 0))} (percentage points); other "
        f"metrics: relative difference, threshold {esc(pct(p['practical_threshold'], 0))}.",
        "Study form (first screen, <code>study_form</code>): per main metric, cross-source reversals only, BH "
        "within that metric's tests; n_comparisons = distinct scheduler pairs x source pairs x regions tested in "
        "both sources; the share's 95% interval is the percentile bootstrap over windows with medians, Wilcoxon "
        "p-values (normal approximation with tie correction, as scipy uses for tied data), BH and the reversal "
        "count redone on each of the B resamples (<code>boot_mean</code> gives the replicates' mean: resamples "
        "repeat windows, which makes their tests slightly more significant). Concentration: by region, source "
        "pair and scheduler pair, each adding up to the metric's reversals; whether all share one scheduler pair "
        "and a source. Best changes: per window x region cell (definition beside the figure) and per cell x "
        "metric pair; <code>forced_by</code> names a metric whose sole best scheduler in every cell never wins "
        "all the others (100% by construction), with the share without it. Cross-source tau per source pair and "
        "main metric: mean over regions, basic bootstrap interval.",
        f"Noise ceiling: split-half reliability per source and region = Kendall tau-b between the mean-rank "
        f"vectors of two random disjoint halves of the source's windows, averaged over main metrics and "
        f"{p.get('n_splits')} random splits; range = 2.5-97.5 percentiles over splits. Ceiling-adjusted "
        "portability = tau between two sources at the same half window count / sqrt(rel_a x rel_b): near 1, the "
        "sources agree as well as each agrees with itself (rankings noisy, not different); well below 1, "
        "rankings do not carry over.",
        "Claims: each finding of the original study is set beside this run's figure in the same form; the "
        "verdict is computed by the rule printed beside it (holds / does not hold / partly holds / inconclusive "
        "when the interval straddles the criterion / not comparable), from <code>study_form.claims</code>.",
        "Robustness (<code>robustness</code>, the card &ldquo;How robust is each verdict&rdquo;): the five claims "
        "recomputed with the same rules under every protocol, one value per axis: rank aggregation (mean "
        "within-window rank per condition; ranking of the median values per condition; mean rank pooled over a "
        "source's regions), practical ties (off; on: values closer than the threshold tie, rank = 1 + clearly "
        "better + ties / 2), the relative and absolute thresholds, the test (Wilcoxon signed-rank; exact sign test; "
        "paired bootstrap of the lower median with its exact bootstrap distribution), the Benjamini-Hochberg level "
        "and family (per metric; all metrics of the set), the metric set (main; survivor-only latencies; goodput "
        "for attainment; without tail TPOT), the scheduler set (all; without static, fastserve or slo-admission, "
        "where present), the comparison kind (cross-source; with cross-region) and, when --compare names another "
        "store of the study, the region definition. Each claim is computed once per "
        "combination of the axes that can move it; shares are over the full product. Fields: axes, n_protocols, "
        "default_protocol, n_boot, claims[id, share_holds, verdicts, by_axis, axes, n_distinct, robust, "
        "depends_on, summary, default, closest[protocol, value, verdict, n_comparisons, distance], distance, "
        "curve]; the analysis module's docstring defines each.",
        "Tied vectors: a concordance whose mean-rank vector has 3 or fewer distinct values is flagged "
        "(<code>tied</code>; &dagger; and * in the report): its tau rests on a near-constant ranking.",
        "Fields of <code>study_form</code>: reversals[metric, effect_scale, practical_threshold, n_tests, "
        "n_comparisons, n_reversals, share, ci_low, ci_high, boot_mean, by_region, by_source_pair, "
        "by_scheduler_pair, one_scheduler_pair, sources_on_every_reversal, one_source, high_load, items]; "
        "best_changes_with_metric[condition, n_conditions, n_changed, share, ci_low, ci_high, pairwise, "
        "forced_by, by_source, definition]; cross_source_tau[source_a, source_b, metric, value, ci_low, "
        "ci_high, n_tied_regions, by_region]; duplicates {source: [[names]]}; split_half[source, region, value, "
        "ci_low, ci_high]; cross_source_half[by_pair, by_pair_region, by_pair_metric]; claims[study, here, "
        "verdict, rule]; the analysis module's docstring defines each.",
        f"Pooled reversals (secondary): effect = {esc(p['effect'])} (absolute difference for bounded metrics). "
        f"Test: {esc(p['test'])}. Multiplicity: {esc(p['multiplicity'])}, at q = {p['q']}. Rule: "
        f"{esc(p['reversal_rule'])}, {esc(p.get('threshold_rule', ''))}. n_comparisons counts (scheduler pair, "
        "metric, condition pair) cases where both conditions were tested; breakdowns of cross-source reversals "
        "divide by the cross-source count, of cross-region ones by the cross-region count.",
        "NaN metrics (e.g. no completed request): rank worst in their window; windows where every scheduler is "
        "NaN carry no ordering and are left out for that metric; effects leave out windows where either "
        "scheduler is NaN.",
    ]
    notes = res.get("notes") or []
    note_html = ""
    if notes:
        shown = "".join(f"<li>{esc(x)}</li>" for x in notes[:60])
        extra = f"<li>... {len(notes) - 60} more in portability.json</li>" if len(notes) > 60 else ""
        note_html = f"<h3>Notes from this analysis</h3><ul>{shown}{extra}</ul>"
    ri = res.get("run_info", {})
    return ("<ul>" + "".join(f"<li>{x}</li>" for x in li) + "</ul>" + note_html
            + f"<p class='sub'>Statistics computed in {fmt(ri.get('elapsed_s'), 1)} s.</p>")


def _provenance(res: dict) -> str:
    pv = res["provenance"]
    rows = []
    for k in ("corpus_sha256", "engine_hash", "package_version", "git_commit", "status", "started", "finished",
              "ended", "cells_done", "corpus_dir", "results_dir", "analysis_version"):
        if k in ("finished", "ended", "cells_done", "corpus_dir") and pv.get(k) is None:
            continue
        rows.append(f"<tr><th class='l'>{esc(k)}</th><td class='l'>{esc(pv.get(k) if pv.get(k) is not None else 'n/a')}"
                    "</td></tr>")
    for name, rec in (pv.get("user_policies") or {}).items():
        rows.append(f"<tr><th class='l'>user scheduler {esc(name)}</th><td class='l'>{esc(rec.get('kind'))} "
                    f"<code>{esc(rec.get('spec'))}</code>, sha256 <code>{esc(rec.get('sha256'))}</code></td></tr>")
    sel = pv.get("selectors")
    if isinstance(sel, dict):
        for key, val in sel.items():
            if isinstance(val, list) and key == "windows":
                per: dict = {}
                for w in val:
                    per[str(w).rsplit("-", 1)[0]] = per.get(str(w).rsplit("-", 1)[0], 0) + 1
                text = f"{len(val)}: " + ", ".join(f"{k} {v}" for k, v in per.items())
            elif isinstance(val, list):
                text = ", ".join(map(str, val))
            elif isinstance(val, dict):
                text = ", ".join(f"{k} = {v}" for k, v in val.items())
            else:
                text = "all" if val is None else str(val)
            rows.append(f"<tr><th class='l'>selected {esc(key)}</th><td class='l'>{esc(text)}</td></tr>")
    srcs = []
    for d in pv["data_sources"]:
        cls = " class='modeled'" if d.get("modeled") else ""
        flag = " <b>[MODELED: not the real trace]</b>" if d.get("modeled") else ""
        srcs.append(f"<li{cls}><b>{esc(d['source'])}</b>: {esc(d['name'])}{flag}. License: {esc(d['license'])}. "
                    f"Cite: {esc(d['citation'])}. {esc(d.get('note', ''))}</li>")
    eng = pv.get("engine_config")
    eng_rows = "".join(f"<tr><th class='l'>[{esc(sec)}] {esc(k)}</th><td class='l'>{esc(json.dumps(v))}</td></tr>"
                       for sec, body in sorted((eng or {}).items()) if isinstance(body, dict)
                       for k, v in sorted(body.items()))
    eng_html = (f"<details><summary>engine config</summary><table>{eng_rows}</table></details>" if eng
                else "<p>engine config: n/a</p>")
    return (f"<table>{''.join(rows)}</table>{eng_html}<h3>Data sources</h3><ul>{''.join(srcs)}</ul>")


def _missing(res: dict) -> str:
    cells = res.get("missing_cells") or []
    blocks = res.get("complete_blocks") or []
    partial = [b for b in blocks if b["n_complete"] < b["n_windows"] or not b["analysed"]]
    if not cells:
        return "<p>No missing cells: every (source, window, region, scheduler) has a result.</p>"
    rows = "".join(f"<tr><td class='l'>{esc(c['source'])}</td><td class='l'>{esc(c['window_id'])}</td>"
                   f"<td class='l'>{esc(c['region'])}</td><td class='l'>{esc(c['scheduler'])}</td></tr>"
                   for c in cells[:ROW_CAP])
    brows = "".join(f"<tr><td class='l'>{esc(b['source'])}</td><td class='l'>{esc(b['region'])}</td>"
                    f"<td>{b['n_complete']}</td><td>{b['n_windows']}</td><td>{'yes' if b['analysed'] else 'no'}"
                    "</td></tr>" for b in partial)
    more = f"<p class='sub'>{len(cells) - ROW_CAP} more in portability.json.</p>" if len(cells) > ROW_CAP else ""
    return (f"<div class='note'>{len(cells)} cell(s) are missing from the results store. Each condition was "
            "analysed on its complete block (windows where every scheduler has a result).</div>"
            "<table><tr><th class='l'>source</th><th class='l'>region</th><th>complete windows</th><th>windows</th>"
            f"<th>analysed</th></tr>{brows}</table>"
            "<details><summary>missing cells</summary><table><tr><th class='l'>source</th><th class='l'>window</th>"
            f"<th class='l'>region</th><th class='l'>scheduler</th></tr>{rows}</table>{more}</details>")


def build_html(res: dict, validation: Optional[dict] = None) -> str:
    """The whole report page for a portability dict (see module docstring).

    `validation` (a ``validation.json`` dict from ``schedport validate``), when given, adds
    the simulator-vs-real-engine section before the methodology; without it the page is
    unchanged.
    """
    n = _Nums(res)
    p = res["parameters"]
    pv = res["provenance"]
    modeled = [d["source"] for d in pv["data_sources"] if d.get("modeled")]
    modeled_note = (f"<div class='modeled'>Modeled source(s): <b>{esc(', '.join(modeled))}</b> &mdash; generated "
                    "from the authors' published characterization, not the real trace.</div>") if modeled else ""
    modeled_note += modeled_check_html(res)
    users = pv.get("user_policies") or {}
    user_note = ("<div class='note'>Schedulers from user files: " + "; ".join(
        f"<b>{esc(n)}</b> ({esc(r.get('kind'))} <code>{esc(r.get('spec'))}</code>, sha256 "
        f"<code>{esc(str(r.get('sha256'))[:12])}</code>)" for n, r in users.items())
        + ". The built-in policies are schedport's own.</div>") if users else ""
    user_src_note = _user_sources_note(res)
    miss_note = (f"<div class='note'>{len(res['missing_cells'])} missing cell(s): every condition is analysed on "
                 "its complete block of windows (see <a href='#missing'>Missing cells</a>).</div>"
                 if res.get("missing_cells") else "")
    corpus = pv.get("corpus_sha256") or "n/a"
    sub = res.get("subset") or {}
    subset_title = f" (subset run: {', '.join(sub['reasons'])})" if sub.get("is_subset") else ""
    subset_h1 = (f"<br><span class='subset'>Subset run: {esc(', '.join(sub['reasons']))} &mdash; not the full "
                 "study</span>" if sub.get("is_subset") else "")
    wl = res.get("workload") or {}
    wl_fig = fig_workload(res)
    if wl_fig:
        wl_html = img_tag(wl_fig, "workload characterization") + f"<p class='sub'>{esc(wl.get('note', ''))}</p>"
    elif wl.get("available"):
        wl_html = ("<p class='note'>Workload characterization skipped: the corpus manifest carries none of the "
                   "per-window length, rate or burstiness statistics it plots.</p>")
    else:
        wl_html = (f"<p class='note'>Workload characterization skipped: {esc(wl.get('note', 'no corpus given'))}. "
                   "Pass <code>--corpus DIR</code> to include it.</p>")
    validation_html = render_validation_section(validation) + "\n" if validation is not None else ""
    sim_card = simulator_card(res)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>schedport portability report{esc(subset_title)}</title>
<style>{CSS}</style></head>
<body><main>
<h1>Do scheduler rankings carry over?{subset_h1}</h1>
<p class="sub">{len(p['schedulers'])} schedulers &middot; sources {esc(', '.join(p['sources']))} &middot;
{len(p['regions'])} load regions ({esc(p.get('region_def') or 'sustainable')} capacity) &middot; {len(p['metrics'])}
distinct metrics &middot; corpus <code>{esc(str(corpus)[:16])}</code> &middot; 95% intervals from B = {p['n_boot']}
bootstrap resamples of windows (<a href="#methodology">methodology</a>, <a href="#provenance">provenance</a>)</p>
{modeled_note}{user_note}{user_src_note}{miss_note}
<section id="headline" aria-label="headline findings">
{_compare_warning(res)}{_regime_warning(res)}
{render_answer(res)}
{_claims_card(res, n)}
{own_card(res)}
</section>
<h2 id="figures">The picture</h2>
<div class="figrow">{img_tag(fig_headline_tau(res), "cross-source tau per region", "half")
 or "<p>Only one source: nothing to compare.</p>"}{img_tag(fig_reversal_map(res), "reversal map", "half")
 or "<p>No reversals to map.</p>"}</div>
<p class="sub">Left: how well two sources agree at each load (1 = the same ranking). Right: the reversal map,
where the {esc(_flip_count(res))} flips across sources on the main metrics sit, by scheduler pair and region.</p>
{img_tag(fig_rank_trajectories(res), "rank trajectories")}
{sim_card}
{deployments_section(res)}
{_why_it_flips(res)}
<h2 id="detail">In detail</h2>
{_fold("Across sources: tau per pair, metric and region, with the noise ceiling", _tau_card(res, n), "sources")}
{_fold("Flips per main metric", _study_reversals_card(res, n), "reversals")}
{_fold("Across metrics", _metrics_card(res, n), "metrics")}
{_fold("How robust is each verdict: 31,104 analysis protocols".replace("31,104", _n_protocols(res)),
       robustness_card(res, n), "robust")}
{_fold("The headline under both region definitions", _region_card(res, n), "regiondefs")}
{_fold("Duplicates found in the results", _artifacts_card(res), "artifacts")}
{_fold("Regime check: is a region the same load in every source?", _regime_table(res), "regimes",
       open_=bool((res.get("regimes") or {}).get("flagged")))}
{_fold("Cross-source agreement by region and metric (every metric)",
       img_tag(fig_tau_heatmap(res), "tau heatmap") or "<p>Only one source: nothing to compare.</p>", "heatmap")}
{_fold("Metric x metric concordance (all metrics)", img_tag(fig_metric_matrix(res), "metric matrix"), "matrix")}
{_fold("Workload characterization", wl_html, "workload")}
{_fold("Rankings per source and region (main metrics)", _rank_tables(res), "rankings")}
{_fold("Pooled reversals (secondary: every metric, cross-source and cross-region)",
       _breakdowns(res) + _reversal_table(res), "pooled")}
{_fold("Missing cells", _missing(res), "missing", open_=bool(res.get("missing_cells")))}
{validation_html}{_fold("Methodology", _methodology(res), "methodology")}
{_fold("Provenance", _provenance(res), "provenance")}
<p class="sub">Generated by schedport {esc(pv.get('analysis_version'))} from portability.json.</p>
</main></body></html>
"""


def _fold(title: str, body: str, anchor: str, open_: bool = False) -> str:
    """A folded section of the page's detail ("" when it has no body): its title is the summary."""
    if not body:
        return ""
    return (f'<details id="{anchor}" class="fold"{" open" if open_ else ""}><summary>{esc(title)}</summary>'
            f"{body}</details>")


def _n_protocols(res: dict) -> str:
    n = (res.get("robustness") or {}).get("n_protocols")
    return f"{n:,}" if isinstance(n, int) else "every"


def _flip_count(res: dict) -> str:
    f = (res["headline"].get("flips") or {}).get("n_reversals")
    return f"{f:,}" if isinstance(f, int) else ""


def _compare_warning(res: dict) -> str:
    rc = res.get("region_comparison") or {}
    if not rc.get("selection_differs"):
        return ""
    return (f"<p class='warn' id='compare-warning'><b>--compare: not one study.</b> "
            f"{esc(rc['selection_note'])}.</p>")


def _user_sources_note(res: dict) -> str:
    """A flag for sources from a user's own traces (as user policies are flagged), with a warning
    for a source whose windows are far smaller than the built-in ones (under a quarter of their
    median request count: its per-window statistics rest on few requests)."""
    users = [d for d in res["provenance"].get("data_sources", []) if d.get("user")]
    if not users:
        return ""
    sizes: dict = {}
    for w in (res.get("workload") or {}).get("windows", []) or []:
        if isinstance(w, dict) and isinstance(w.get("n_requests"), (int, float)):
            sizes.setdefault(str(w.get("source")), []).append(w["n_requests"])
    user_names = {d["source"] for d in users}
    builtin = sorted(n for s, v in sizes.items() if s not in user_names for n in v)
    ref = builtin[len(builtin) // 2] if builtin else None
    parts = []
    for d in users:
        own = sorted(sizes.get(d["source"], []))
        small = ""
        if ref and own and own[len(own) // 2] < ref / 4:
            small = (f" <b>Its windows are small</b> (median {int(own[len(own) // 2]):,} requests against "
                     f"{int(ref):,} in the built-in sources): its ranks rest on few requests each.")
        parts.append(f"<b>{esc(d['source'])}</b> (cited as: {esc(d.get('citation'))}).{small}")
    return ("<div class='note'>Sources from your own traces, not part of the study's corpus and in none of "
            "its claims: " + " ".join(parts) + "</div>")


def _why_it_flips(res: dict) -> str:
    """The "Why it flips" section (`schedport analyze --explain K`); empty when nothing was explained."""
    if not res.get("explain"):
        return ""
    return render_section(res)


def write_report(res: dict, path, validation: Optional[dict] = None) -> Path:
    """Render `res` (and the optional `validation` section) and write it to `path` (atomically)."""
    path = Path(path)
    text = build_html(res, validation)
    return atomic_write_text(path, text)
