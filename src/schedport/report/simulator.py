"""The report's "How much does the simulator decide?" card, from ``portability.json``'s ``simulator``.

A store run with engine variants (``schedport run --variants``) says, for every cross-source
reversal of the study form, in how many of the variants the same flip is still a reversal. The
card states the survival distribution and the rank agreement between variants in a few
sentences, maps the reversals by survival (robust ones marked), lists them (folded), names the
predicted real-engine check and lists the variants. `survival_marker` is the one marker every
other place uses (the claims table, explain's picks). Nothing is recomputed here.
"""

from __future__ import annotations

from typing import Optional

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from schedport.common.formatting import fmt, pct  # noqa: E402
from schedport.report.figures import png_data_uri  # noqa: E402
from schedport.report.style import escape_html as esc  # noqa: E402
from schedport.report.style import img_tag  # noqa: E402
from schedport.report.variantset import set_is_shipped, set_origin  # noqa: E402

__all__ = ["simulator_card", "survival_marker", "claim_survival", "fig_survival_map"]

#: Marker per survival class: filled = robust (every variant), half = partial, open = fragile.
MARKERS = {"robust": "&#9679;", "partial": "&#9680;", "fragile": "&#9675;", "unknown": "?"}
_ROWS = 25


def survival_marker(item: dict) -> str:
    """The marker and "k/V" of a reversal with survival fields, for tables."""
    cls = item.get("class", "unknown")
    return (f"<span class='surv {cls}' title='{cls}: still a reversal in {item.get('n_survived')} of "
            f"{item.get('n_variants')} engine variants'>{MARKERS.get(cls, '?')} {item.get('n_survived')}/"
            f"{item.get('n_variants')}</span>")


def claim_survival(res: dict, claim_id: str) -> str:
    """"k of V" for the claims table: under how many engine variants the claim's verdict is the
    default's ("" when the store has no variants)."""
    sim = res.get("simulator") or {}
    for c in sim.get("claims") or []:
        if c["id"] == claim_id:
            return (f"<br><span class='sub'>survives the simulator: <b>{c['n_same']} of {c['n_variants']}</b> "
                    f"<a href='#simulator'>engine variants</a></span>")
    return ""


def fig_survival_map(sim: dict, regions: list[str]) -> Optional[str]:
    """Study-form reversals per scheduler pair and region, each cell's count with how many are
    robust; rows marked with a filled circle hold only robust flips."""
    revs = sim.get("reversals") or []
    if not revs:
        return None
    count: dict = {}
    robust: dict = {}
    for r in revs:
        k = (r["scheduler_pair"], r["region"])
        count[k] = count.get(k, 0) + 1
        robust[k] = robust.get(k, 0) + (r["class"] == "robust")
    totals: dict = {}
    for (p, _), v in count.items():
        totals[p] = totals.get(p, 0) + v
    pairs = sorted(totals, key=lambda p: (-totals[p], p))[:_ROWS]
    mat = np.zeros((len(pairs), len(regions)))
    for (p, reg), v in count.items():
        if p in pairs and reg in regions:
            mat[pairs.index(p), regions.index(reg)] = v
    fig, ax = plt.subplots(figsize=(2.6 + 0.9 * len(regions), 1.4 + 0.32 * len(pairs)))
    im = ax.imshow(mat, cmap="viridis", aspect="auto", vmin=0)
    for (i, j), v in np.ndenumerate(mat):
        if v:
            rb = robust[(pairs[i], regions[j])]
            ax.text(j, i, f"{int(v)} ({rb}\u25cf)" if rb else f"{int(v)}", ha="center", va="center", fontsize=8,
                    color="black" if v > 0.6 * mat.max() else "white")
    labels = []
    for p in pairs:
        all_robust = all(robust[k] == count[k] for k in count if k[0] == p)
        labels.append(("\u25cf " if all_robust else "") + p)
    ax.set_xticks(range(len(regions)), regions, rotation=30, ha="right", fontsize=9)
    ax.set_yticks(range(len(pairs)), labels, fontsize=8)
    ax.set_xlabel("operating region", fontsize=9)
    cb = fig.colorbar(im, ax=ax, label="cross-source reversals (main metrics)")
    cb.locator = matplotlib.ticker.MaxNLocator(integer=True)
    cb.update_ticks()
    shown = f", top {len(pairs)} of {len(totals)} pairs" if len(totals) > len(pairs) else ""
    ax.set_title(f"Study-form reversals; (k\u25cf) = k survive all {sim['n_variants']} engine variants{shown}",
                 fontsize=9)
    return png_data_uri(fig)


def _sentences(sim: dict) -> str:
    d = sim["distribution"]
    n, V = d["n_reversals"], sim["n_variants"]
    if not n:
        return (f"<p>The default engine shows no cross-source reversal on the main metrics, so there is no flip "
                f"for the {V} engine variants to confirm.</p>")
    tv = sim.get("rank_tau_vs_default") or {}
    worst = max(sim["new_by_variant"].items(), key=lambda kv: kv[1], default=(None, 0))
    return (f"<p><b>Of the default engine's {n} cross-source reversals on the main metrics, {d['all']} "
            f"({pct(d['all'] / n)}) survive all {V} engine variants</b>, {d['at_least_75']} survive at least 75% "
            f"of them, and {d['under_50']} ({pct(d['under_50'] / n)}) survive fewer than half: those are decided "
            f"by an error the simulator is known to have. {d['none']} survive none. The variants find new "
            f"reversals too (up to {worst[1]}, under {esc(str(worst[0]))}). Rankings themselves move little: the "
            f"median Kendall tau of mean ranks between the default and a variant is {fmt(tv.get('median'))} per "
            f"condition (lowest {fmt(tv.get('min'))}).</p>")


def _variants_table(sim: dict) -> str:
    rows = []
    for v in sim["variants"]:
        ov = "; ".join(f"[{sec}] " + ", ".join(f"{k} = {val}" for k, val in keys.items())
                       for sec, keys in v["overlay"].items())
        rows.append(f"<tr><td class='l'>{esc(v['name'])}</td><td class='l'><code>{esc(ov)}</code></td>"
                    f"<td>{sim['new_by_variant'].get(v['name'], 0)}</td><td class='l sub'>{esc(v['why'])}</td></tr>")
    s = sim["set"]
    return (f"<details><summary>The {len(sim['variants'])} variants of set <b>{esc(s.get('name'))}</b> v"
            f"{esc(s.get('version'))}: {esc(s.get('description') or '')}</summary><table><tr><th class='l'>variant</th>"
            "<th class='l'>overlay of the engine config</th><th>new reversals</th><th class='l'>why</th></tr>"
            + "".join(rows) + "</table></details>")


def _reversal_list(sim: dict) -> str:
    rows = []
    for r in sim["reversals"]:
        fails = ", ".join(r["fails_under"][:4]) + (f" +{len(r['fails_under']) - 4}" if len(r["fails_under"]) > 4
                                                    else "")
        rows.append(f"<tr><td>{survival_marker(r)}</td><td class='l'>{esc(r['scheduler_pair'])}</td>"
                    f"<td class='l'>{esc(r['metric'])}</td><td class='l'>{esc(r['region'])}</td>"
                    f"<td class='l'>{esc(r['source_a'])} vs {esc(r['source_b'])}</td><td>{fmt(r['effect_a'])}</td>"
                    f"<td>{fmt(r['effect_b'])}</td><td class='l sub'>{esc(fails) or '&ndash;'}</td></tr>")
    return (f"<details><summary>Every reversal with its survival ({len(rows)}, strongest first; "
            f"{MARKERS['robust']} robust, {MARKERS['partial']} partial, {MARKERS['fragile']} fragile)</summary>"
            "<table><tr><th>survives</th><th class='l'>pair</th><th class='l'>metric</th><th class='l'>region</th>"
            "<th class='l'>sources</th><th>effect 1</th><th>effect 2</th><th class='l'>fails under</th></tr>"
            + "".join(rows) + "</table></details>")


def _predicted(sim: dict) -> str:
    pr = sim.get("predicted") or {}
    out = []
    s = pr.get("strongest_reversal")
    if s:
        out.append(f"<li>the strongest reversal: <b>{esc(s['scheduler_pair'])}</b> on {esc(s['metric'])} at "
                   f"{esc(s['region'])}, {esc(s['source_a'])} vs {esc(s['source_b'])} (effects {fmt(s['effect_a'])} "
                   f"and {fmt(s['effect_b'])}): {survival_marker(s)}</li>")
    m = pr.get("most_stable_ranking")
    if m:
        out.append(f"<li>the most stable ranking: <b>{esc(m['winner'])} ahead of {esc(m['loser'])}</b> on "
                   f"{esc(m['metric'])} at {esc(m['region'])} in every source (smallest effect "
                   f"{fmt(m['strength'])}): {survival_marker(m)}</li>")
    if not out:
        return ""
    return ("<p>The study's real-engine check, predicted (test it with <code>schedport validate --predicted "
            "portability.json</code>, docs/validation.md):</p><ul>" + "".join(out) + "</ul>")


def _variants_described(res: dict, sim: dict) -> str:
    """What the variants are: the shipped uncertainty set by what it perturbs; any other set by
    its own description and its origin (never as the shipped set)."""
    s = sim["set"]
    if set_is_shipped(s) and s.get("name") == "uncertainty":
        return ("the same engine with its latency model, CPU overhead or KV budget moved within the calibration's "
                "fit errors and published simulator errors (docs/engine.md §3.6)")
    if set_is_shipped(s) and res.get("deployments") and s.get("description"):
        return esc(s["description"]) + f" (variant set {esc(str(s.get('name')))}, docs/engine.md §3.7)"
    what = esc(s["description"]) if s.get("description") else "variants of the study's engine"
    return f"{what} ({esc(set_origin(s))}; docs/engine.md §3.6)"


def simulator_card(res: dict) -> str:
    """How much does the simulator decide: the survival of each reversal across engine variants
    (``simulator``); empty when the store was run without variants."""
    sim = res.get("simulator")
    if not sim:
        return ""
    regions = [r["name"] for r in res["parameters"]["regions"]]
    fig = fig_survival_map(sim, regions)
    return ("<div class='card' id='simulator'><h3>How much does the simulator decide?</h3>"
            f"<p class='sub'>The study was also run on {sim['n_variants']} engine variants: "
            + _variants_described(res, sim)
            + ". A reversal's survival is the share of variants in which the same flip is still a reversal under the "
            "same rules.</p>"
            + (f"<p class='warn'>{esc(sim['note'])}</p>" if sim.get("note") else "") + _sentences(sim)
            + (img_tag(fig, "reversals by survival") if fig else "") + _predicted(sim) + _reversal_list(sim)
            + _variants_table(sim) + "</div>")
