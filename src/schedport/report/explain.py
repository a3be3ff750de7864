"""The report's "Why it flips" section, rendered from ``portability.json``'s ``explain`` block.

`schedport analyze --explain K` stores its explanations under ``res["explain"]``
(`schedport.analysis.explain.add_explanations`); this module draws them: per reversal the verdict
sentence, a figure of the effect under each variant, and each feature's share of the gap. Every
number is read from the block.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from schedport.common.formatting import whole_pct
from schedport.report.figures import plt, png_data_uri
from schedport.report.style import escape_html as esc
from schedport.report.style import img_tag

__all__ = ["fig_effects", "render_section"]


def fig_effects(d: dict) -> Optional[str]:
    """A small figure: the effect under each variant with its interval (both sources' windows)."""
    eff = [e for e in d["effects"] if e["median_effect"] is not None]
    if not eff:
        return None
    x = d["reversal"]["condition_a"]["source"]
    fig, ax = plt.subplots(figsize=(6.2, 0.28 * len(eff) + 0.9))
    ys = np.arange(len(eff))[::-1]
    for yy, e in zip(ys, eff):
        col = "#1f77b4" if e["base"] == x else "#d62728"
        lo = e["ci_low"] if e["ci_low"] is not None else e["median_effect"]
        hi = e["ci_high"] if e["ci_high"] is not None else e["median_effect"]
        ax.plot([lo, hi], [yy, yy], color=col, lw=1.5)
        ax.plot([e["median_effect"]], [yy], "o", color=col, ms=4 if e["feature"] else 6)
    ax.axvline(0, color="#444", lw=0.8)
    for e in eff:  # the two original conditions, as guides
        if e["feature"] is None:
            ax.axvline(e["median_effect"], color="#1f77b4" if e["base"] == x else "#d62728", lw=0.6, ls="--")
    ax.set_yticks(ys)
    ax.set_yticklabels([e["variant"] for e in eff], fontsize=7)
    r = d["reversal"]
    ax.set_xlabel(f"median effect of {r['scheduler_a']} over {r['scheduler_b']} on {r['metric']} "
                  f"({r['effect_scale']}; > 0: {r['scheduler_a']} better)", fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    return png_data_uri(fig)


def render_section(res: dict) -> str:
    """The report's "Why it flips" section from ``res["explain"]`` (empty when there is none)."""
    block = res.get("explain")
    if not block:
        return ""
    parts = ["<h2 id='why'>Why it flips</h2>",
             f"<p class='sub'>{_which(block, res)} of the study form's {block['n_reversals']} "
             f"cross-source reversals ({_order(res)}), each run on hybrid windows that take one traffic "
             "feature from the other "
             "source (arrival pattern, input or output lengths, client ids) or remove one (Poisson arrivals, "
             "decoupled lengths). A feature's share is the part of the effect gap between the two sources that its "
             "transplant closes (95% window-bootstrap interval); see docs/explain.md.</p>"]
    ids = block.get("ids") or []
    skipped = [i for i in range(1, max(ids, default=0)) if i not in set(ids)]
    if skipped:
        parts.append(f"<p class='note'>Stronger reversals not explained in this report: "
                     f"{esc(', '.join(f'#{i}' for i in skipped))} (selected with <code>--explain "
                     f"{esc(block.get('selection', ''))}</code>).</p>")
    if not block["explained"]:
        parts.append(f"<p>{esc(block.get('note', 'nothing to explain'))}</p>")
    for d in block["explained"]:
        r = d["reversal"]
        rows = "".join(f"<tr><td>{esc(f)}</td><td>{esc(a['kind'])}</td><td>{whole_pct(a['share'])}</td>"
                       f"<td>[{whole_pct(a['ci_low'])}, {whole_pct(a['ci_high'])}]</td></tr>"
                       for f, a in d["attribution"].items())
        ri = d["run_info"]
        parts.append(
            f"<h3>#{esc(r.get('id', ''))} {esc(r['scheduler_a'])} vs {esc(r['scheduler_b'])} on "
            f"{esc(r['metric'])} at {esc(r['region'])}: {esc(r['condition_a']['source'])} vs "
            f"{esc(r['condition_b']['source'])}</h3>"
            f"<p><b>{esc(d['verdict']['sentence'])}</b></p>"
            + (img_tag(fig_effects(d), "effects under each variant") or "")
            + ("<p class='note'>Shares not shown: the interval of the gap between the two effects contains 0.</p>"
               if d["verdict"]["kind"] == "no gap" else
               "<table><tr><th>feature</th><th>kind</th><th>share of the gap</th><th>95% interval</th></tr>"
               + rows + "</table>")
            + f"<p class='sub'>{ri['runs']} runs and {ri['capacities']} capacity measurements "
              f"({ri['cached_runs']} runs from the cache) in {ri['wall_s']:.0f} s.</p>")
    return "\n".join(parts)


def _order(res: dict) -> str:
    sim = res.get("simulator") or {}
    if sim.get("reversals"):
        return (f"numbered robust first: by how many of the {sim['n_variants']} engine variants they survive, "
                "then strongest first, so that the flips explained are not artefacts of a simulator error")
    return "numbered strongest first"


def _which(block: dict, res: dict) -> str:
    ids = block.get("ids") or list(range(1, len(block["explained"]) + 1))
    if ids == list(range(1, len(ids) + 1)):
        return f"The {len(ids)} {'most robust' if (res.get('simulator') or {}).get('reversals') else 'strongest'}"
    return "Reversals " + ", ".join(f"#{i}" for i in ids)

