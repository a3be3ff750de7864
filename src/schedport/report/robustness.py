"""The report's "How robust is each verdict" card, from ``portability.json``'s ``robustness``.

One sentence per claim (its share of protocols, what moves it, the protocol closest to the
study), one specification curve per claim (`schedport.report.figures.fig_spec_curve`), and the
table of shares per axis value. Nothing is recomputed here.
"""

from __future__ import annotations

from typing import Optional

from schedport.common.formatting import fmt, pct
from schedport.report.figures import fig_spec_curve
from schedport.report.style import escape_html as esc
from schedport.report.style import img_tag

__all__ = ["robustness_card", "claim_standing", "verdict_across_text"]


def claim_standing(rc: dict, verdict: str) -> str:
    """Where a claim's verdict under the default protocol stands among all protocols: "not
    comparable" (no protocol can judge it in this run, so it is not counted as robust), "robust"
    (one verdict under every protocol), "minority" (the default's holds / does not hold is the
    rarer outcome) or "depends"."""
    verdicts = rc.get("verdicts") or {}
    if verdict == "not comparable" or set(verdicts) == {"not comparable"}:
        return "not comparable"
    if rc.get("robust"):
        return "robust"
    share = rc.get("share_holds")
    if share is not None and ((verdict == "holds" and share < 0.5) or (verdict != "holds" and share > 0.5)):
        return "minority"
    return "depends"


def verdict_across_text(rc: dict, verdict: str, share_html: str, n_protocols: int) -> str:
    """The claim's standing across protocols in words, beside its verdict (HTML-escaped text
    around `share_html`, the tagged share of protocols under which the claim holds)."""
    st = claim_standing(rc, verdict)
    n = f"{n_protocols:,} protocols"
    if st == "not comparable":
        return f"not comparable under any of the {n}: this run cannot judge it, so it counts as neither robust nor not"
    if st == "robust":
        return f"robust: {esc(verdict)} under all {n}"
    dep = esc(", ".join(rc.get("depends_on", [])[:2]))
    text = f"depends on {dep} (holds under {share_html} of {n})"
    if st == "minority":
        text += (f"; the default protocol, which gives &ldquo;{esc(verdict)}&rdquo;, is in the minority of "
                 "protocols here")
    return text


def _protocol_text(proto: dict, default: dict) -> str:
    """A protocol as the axes where it leaves the default ("the default" when it does not)."""
    diff = [f"{k} = {v}" for k, v in proto.items() if default.get(k) != v]
    return "; ".join(diff) if diff else "the default (the study form's)"


def _one_metric_text(om: Optional[dict], default: dict) -> str:
    """The reversal claim's closest single metric, as a clause ("" when there is none)."""
    if not om:
        return ""
    return (f"; one metric alone comes closest with {esc(om['metric'])}: {esc(pct(om['value']))} of "
            f"{om['n_comparisons']:,} comparisons ({esc(_protocol_text(om['protocol'], default))})")


def robustness_card(res: dict, n) -> str:
    """How robust is each verdict: the claims under every protocol of the multiverse
    (``robustness``): one sentence each, a specification curve each, the axis table. `n` writes a
    number tagged with its path in the JSON (`schedport.report.html`'s first-screen numbers)."""
    rob = res.get("robustness") or {}
    if not rob.get("claims"):
        return (f"<div class='card' id='robustness'><h3>How robust is each verdict</h3><p class='sub'>"
                f"{esc(rob.get('note', 'not computed'))}</p></div>")
    claims, axes, default = rob["claims"], rob["axes"], rob["default_protocol"]
    sentences = []
    for j, c in enumerate(claims):
        cl = c["closest"]
        val = (pct(cl["value"]) if c["id"] in ("reversals", "best_changes") else fmt(cl["value"]))
        sentences.append(
            f"<li><b>{esc(c['id'])}</b>: holds under {n(f'robustness.claims.{j}.share_holds', 'pct')} of the "
            f"protocols; {esc(c['summary'])}. Closest to the study ({esc(c['distance'])}): "
            f"{esc(_protocol_text(cl['protocol'], default))}, giving {esc(val)}"
            + (f" of {cl['n_comparisons']:,} comparisons" if c["id"] == "reversals" else "")
            + f" ({esc(cl['verdict'])})" + _one_metric_text(cl.get("one_metric"), default) + ".</li>")
    figs = "".join(img_tag(fig_spec_curve(c), f"specification curve of {c['id']}", "small") for c in claims)
    head = "".join(f"<th>{esc(c['id'])}</th>" for c in claims)
    rows = []
    for ax, values in axes.items():
        for v in values:
            cells = []
            for c in claims:
                sh = c["by_axis"][ax][str(v)]
                moved = ax in c["axes"] and len(set(c["by_axis"][ax].values())) > 1
                cells.append(f"<td class='{'v-part' if moved else ''}'>{esc(pct(sh, 0))}</td>")
            mark = " (default)" if default.get(ax) == v else ""
            rows.append(f"<tr><td class='l'>{esc(ax)}</td><td class='l'>{esc(v)}{mark}</td>{''.join(cells)}</tr>")
    return ("<div class='card' id='robustness'><h3>How robust is each verdict</h3>"
            f"<p class='sub'>Each claim recomputed under every analysis protocol: {rob['n_protocols']:,} "
            "combinations of the choices below (rank aggregation, practical ties, thresholds, test, "
            "Benjamini-Hochberg level and family, metric set, scheduler set, comparison kind), with the study "
            "form's rules. The default study has 31,104; a store leaves out a metric or scheduler set it cannot "
            "tell apart from another (a set without a scheduler it never ran) and, with one source, the "
            f"cross-source comparison, so a smaller study has fewer. {esc(rob['note'])}</p><ul>"
            + "".join(sentences) + "</ul>"
            "<div style='display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:6px'>"
            + figs + "</div><p class='sub'>Specification curves: one point per distinct protocol of a claim, sorted "
            "by its value, marked by its verdict; the dashed line (band) is the study's number. Below, the share "
            "of protocols under which each claim holds, per value of each axis (shaded where the axis moves the "
            "claim).</p><div class='scroll'><table><tr><th class='l'>axis</th><th class='l'>value</th>" + head
            + "</tr>" + "".join(rows) + "</table></div></div>")
