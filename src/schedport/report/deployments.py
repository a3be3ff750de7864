"""The report's "Across deployments" section, from ``portability.json``'s ``deployments``.

A store run with a deployment variant set (``schedport run --variants deployments`` or
``deployments-scaled``) holds the study once per deployment: another model, another GPU, a TP
degree (`schedport.analysis.deployments`). The section names the SLO choice the set made (absolute
or scaled thresholds, the choice that decides the SLO metrics' portability), lists the deployments
with their thresholds, gives the rank agreement (Kendall tau of mean ranks) per deployment pair and
main metric and the cross-deployment reversals, strongest first. The claims table is not touched:
the study's claims are about one deployment. Nothing is recomputed here.
"""

from __future__ import annotations

from schedport.common.formatting import fmt
from schedport.report.style import escape_html as esc
from schedport.report.variantset import set_origin

__all__ = ["deployments_section"]

_ROWS = 20


def _deployments_table(dep: dict) -> str:
    rows = []
    for d in dep["deployments"]:
        slo = d.get("slo") or {}
        thr = "; ".join(f"{esc(n)} {fmt(v.get('ttft_s'))} s / {fmt(v.get('tpot_s'))} s" for n, v in slo.items())
        rows.append(f"<tr><td>{esc(d['name'])}</td><td>{esc(d['why'])}</td><td>{thr or 'n/a'}</td></tr>")
    return ("<table><tr><th>deployment</th><th>what it is</th><th>SLO thresholds (TTFT / TPOT)</th></tr>"
            + "".join(rows) + "</table>")


def _tau_table(dep: dict) -> str:
    metrics = list(dict.fromkeys(t["metric"] for t in dep["tau_by_metric"]))
    if not metrics:
        return ""
    cells: dict = {}
    for t in dep["tau_by_metric"]:
        cells.setdefault((t["deployment_a"], t["deployment_b"]), {})[t["metric"]] = t
    head = "".join(f"<th>{esc(m)}</th>" for m in metrics)
    rows = []
    for (a, b), by in cells.items():
        tds = "".join(f"<td title='{by[m]['n_conditions']} conditions, {by[m]['n_ci_below_1']} with a CI below 1'>"
                      f"{fmt(by[m]['median'], 2)} <span class='sub'>(min {fmt(by[m]['min'], 2)})</span></td>"
                      if m in by else "<td>n/a</td>" for m in metrics)
        rows.append(f"<tr><td>{esc(a)} vs {esc(b)}</td>{tds}</tr>")
    return ("<p class='sub'>Kendall tau-b between two deployments' mean ranks, median over (source, region), "
            "minimum in brackets; the per-condition values with bootstrap CIs over windows are in "
            "portability.json (<code>deployments.concordance</code>).</p>"
            f"<table><tr><th>deployments</th>{head}</tr>{''.join(rows)}</table>")


def _reversals(dep: dict) -> str:
    revs = dep["reversals"]
    by_metric = "; ".join(f"{esc(m)} {v['n_reversals']} of {v['n_comparisons']} comparisons"
                          for m, v in dep["by_metric"].items())
    top_pairs = ", ".join(f"{esc(p)} ({n})" for p, n in list(dep["by_pair"].items())[:5])
    out = [f"<p><b>{dep['n_reversals']}</b> cross-deployment reversals (a scheduler pair that wins significantly "
           "and by at least the practical threshold on one deployment and loses so on another, at one source and "
           f"region){': ' + by_metric if by_metric else ''}."
           + (f" Most between {top_pairs}." if top_pairs else "") + "</p>"]
    if revs:
        rows = "".join(f"<tr><td>{esc(r['scheduler_pair'])}</td><td>{esc(r['metric'])}</td><td>{esc(r['source'])}"
                       f"</td><td>{esc(r['region'])}</td><td>{esc(r['deployment_a'])}: {fmt(r['effect_a'], 3)}</td>"
                       f"<td>{esc(r['deployment_b'])}: {fmt(r['effect_b'], 3)}</td></tr>" for r in revs[:_ROWS])
        out.append(f"<details><summary>The {min(_ROWS, len(revs))} strongest</summary><table><tr><th>pair</th>"
                   "<th>metric</th><th>source</th><th>region</th><th>effect on one</th><th>on the other</th></tr>"
                   f"{rows}</table></details>")
    return "".join(out)


def deployments_section(res: dict) -> str:
    """The "Across deployments" card (an HTML fragment), empty when the store has no deployment
    variants."""
    dep = res.get("deployments")
    if not dep:
        return ""
    return ("<div class='card' id='deployments'><h3>Across deployments</h3>"
            f"<p class='sub'>The study was also run on {len(dep['deployments']) - 1} other deployments "
            f"({esc(set_origin(dep['set']))}), each with its capacity measured on its own engine, so a region is "
            "the same load everywhere; the deployments are compared as the study compares sources. The claims above "
            "are about the study's one deployment and do not change.</p>"
            f"<p><b>SLO choice:</b> {esc(dep['slo_label'])}.</p>"
            + _deployments_table(dep) + _tau_table(dep) + _reversals(dep) + "</div>")
