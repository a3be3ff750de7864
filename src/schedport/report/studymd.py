"""The study's figures as a Markdown page (docs/study.md), written from a store's
``portability.json`` by `schedport report --study-md`, so that the figures a reader finds in the
docs are those of a named store and never go stale by hand.

`study_markdown(res, stamp)` renders the page: the store it came from (`stamp`: the digest of its
cells and of the portability.json read), the answer (`schedport.report.answer`, the same
sentences as the report's first screen), then one section per question with the numbers and
their 95% intervals. Like the HTML report it recomputes nothing.
"""

from __future__ import annotations

from typing import Optional

from schedport.common.formatting import fmt, pct
from schedport.report.answer import CLAIM_NAMES, STUDY_CITATION, render_markdown
from schedport.report.robustness import claim_standing
from schedport.report.variantset import set_origin

__all__ = ["study_markdown"]


def _ci(d: Optional[dict], f=fmt, v: str = "value") -> str:
    if not d or d.get(v) is None:
        return "n/a"
    return f"{f(d[v])} [{f(d.get('ci_low'))}, {f(d.get('ci_high'))}]"


def _table(head: list[str], rows: list[list[str]], numeric: bool = True) -> str:
    """A Markdown table; the first column left-aligned, the others right-aligned when `numeric`."""
    align = ["---"] + [("--:" if numeric else "---")] * (len(head) - 1)

    def cell(c) -> str:
        return str(c).replace("|", "\\|")
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _provenance(res: dict, stamp: dict) -> str:
    pv, p, sel = res["provenance"], res["parameters"], res.get("selection") or {}
    wins = ", ".join(f"{s} {n}" for s, n in (sel.get("windows_per_source") or {}).items())
    regions = ", ".join(f"{r['name']} ({fmt(r['rho'], 2)})" for r in p["regions"])
    rows = [["results store", f"{stamp['n_cells']:,} cells, sha256 `{stamp['cells_sha256']}`"],
            ["portability.json", f"sha256 `{stamp['portability_sha256']}`"],
            ["corpus", f"sha256 `{pv.get('corpus_sha256')}`"],
            ["engine", f"config hash `{pv.get('engine_hash')}`"],
            ["schedport", f"{pv.get('package_version')} at commit `{pv.get('git_commit') or 'n/a'}`"],
            ["schedulers", f"{len(p['schedulers'])}: {', '.join(p['schedulers'])}"],
            ["windows per source", wins or "n/a"],
            ["load regions (rho)", f"{regions}; {p.get('region_def_description') or p.get('region_def')}"],
            ["statistics", f"B = {p['n_boot']} bootstrap resamples of windows, seed {p['seed']}; BH q = {p['q']}; "
                           f"{p.get('threshold_rule', '')}"]]
    return _table(["store", "identity"], rows, numeric=False)


def _claims(res: dict) -> str:
    rob = {c["id"]: c for c in (res.get("robustness") or {}).get("claims") or []}
    sim = {c["id"]: c for c in (res.get("simulator") or {}).get("claims") or []}
    rows = []
    for c in res["study_form"]["claims"]:
        r = rob.get(c["id"])
        st = None if r is None else claim_standing(r, c["verdict"])
        across = ("n/a" if r is None else "not comparable under any protocol" if st == "not comparable" else
                  f"{pct(r['share_holds'])} hold"
                  + ("" if r["robust"] else f"; depends on {', '.join(r['depends_on'][:2])}")
                  + ("; the default protocol is in the minority" if st == "minority" else ""))
        s = sim.get(c["id"])
        surv = "not run" if s is None else f"{s['n_same']} of {s['n_variants']}"
        rows.append([CLAIM_NAMES.get(c["id"], c["id"]), c["here"], f"**{c['verdict']}**", across, surv])
    return _table(["study's claim", "this run", "verdict", "across analysis protocols",
                   "same verdict under engine variants"], rows, numeric=False)


def _sources(res: dict) -> str:
    sf = res["study_form"]
    main = sf["main_metrics"]
    half = {(d["source_a"], d["source_b"]): d for d in sf["cross_source_half"]["by_pair"]}
    ct = {(d["source_a"], d["source_b"], d["metric"]): d for d in sf["cross_source_tau"]}
    rows = []
    for d in res["headline"]["cross_source"]["by_pair"]:
        key = (d["source_a"], d["source_b"])
        rows.append([f"{key[0]} vs {key[1]}", *[_ci(ct.get((*key, m))) for m in main], f"**{_ci(d)}**",
                     fmt((half.get(key) or {}).get("adjusted"))])
    if not rows:
        return "Only one source: nothing to compare."
    return ("Kendall tau-b between two sources' mean-rank vectors per main metric (mean over regions), the mean "
            "over the main metrics, and that mean divided by the sources' split-half reliability "
            "(ceiling-adjusted: 1 = the sources agree as well as each agrees with itself).\n\n"
            + _table(["source pair", *main, "main metrics", "ceiling-adjusted"], rows))


def _regions(res: dict) -> str:
    cr = res["headline"].get("cross_region") or {}
    if cr.get("adjacent") is None:
        return "Only one region: nothing to compare."
    rows = [[d["source"], fmt(d["adjacent"]), fmt(d["extremes"])] for d in cr["by_source"]]
    rows.append(["**mean**", f"**{fmt(cr['adjacent'])}**", f"**{fmt(cr['extremes'])}**"])
    return (f"{cr['definition']}.\n\n"
            + _table(["source", "neighbouring regions", f"{cr['region_light']} vs {cr['region_heavy']}"], rows))


def _flips(res: dict) -> str:
    rows = []
    for e in res["study_form"]["reversals"]:
        def top(field):
            d = e.get(field) or {}
            if not e["n_reversals"] or not d:
                return "n/a"
            k = max(d, key=lambda x: ((d[x]["n_reversals"] if isinstance(d[x], dict) else d[x]), x))
            return f"{k} ({d[k]['n_reversals'] if isinstance(d[k], dict) else d[k]})"
        rows.append([e["metric"], f"{e['n_comparisons']:,}", str(e["n_reversals"]),
                     f"{pct(e['share'])} [{pct(e['ci_low'])}, {pct(e['ci_high'])}]", top("by_region"),
                     top("by_source_pair"), top("by_scheduler_pair")])
    f = res["headline"].get("flips") or {}
    p = res["parameters"]
    return (f"A flip: a scheduler pair whose median per-window effect has opposite signs in two sources at the same "
            f"region, both Benjamini-Hochberg significant at q = {p['q']} within the metric, both beyond the "
            f"practical threshold ({p.get('threshold_rule', '')}). In all: {f.get('n_reversals', 0)} of "
            f"{f.get('n_comparisons', 0):,} comparisons, over {f.get('n_scheduler_pairs', 0)} scheduler pairs.\n\n"
            + _table(["main metric", "comparisons", "flips", "share [95% CI]", "top region", "top source pair",
                      "top scheduler pair"], rows))


def _metrics(res: dict) -> str:
    m = res["headline"]["metrics"]
    bc = res["study_form"]["best_changes_with_metric"]
    out = [f"- Mean Kendall tau between the main metrics: {_ci(m['mean_pairwise_tau'])}; over all "
           f"{len(res['parameters']['metrics'])} distinct metrics: {_ci(m['mean_pairwise_tau_all_metrics'])}.",
           f"- The single best scheduler changes with the metric in {pct(bc['share'])} [{pct(bc['ci_low'])}, "
           f"{pct(bc['ci_high'])}] of {bc['n_conditions']:,} window x region cells; pairwise: "
           f"{pct(bc['pairwise']['share'])} of (cell, metric pair)."]
    for f in bc.get("forced_by") or []:
        out.append(f"- By construction: {f['scheduler']} is the sole best on {f['metric']} in every window; "
                   f"without {f['metric']}, {pct(f['share_without'])}.")
    return "\n".join(out)


def _regimes(res: dict) -> str:
    rg = res.get("regimes") or {}
    if not rg.get("available"):
        return rg.get("note") or "No regime check in this analysis."
    sources = res["parameters"]["sources"]
    look = {(r["region"], r["source"]): r for r in rg["rows"]}
    rows = []
    for reg in res["parameters"]["regions"]:
        cells = [fmt((look.get((reg["name"], s)) or {}).get("backlog_median"), 2) for s in sources]
        fluid = next((look[(reg["name"], s)]["fluid_backlog"] for s in sources if (reg["name"], s) in look), None)
        rows.append([reg["name"], fmt(reg["rho"], 2), fmt(fluid, 2), *cells])
    flagged = ", ".join(f["region"] for f in rg.get("flagged") or []) or "none"
    return (f"{rg['scheduler']}'s median backlog at the last arrival (share of accepted requests still queued) per "
            f"source, beside a fluid queue's max(0, 1 - 1/rho); regions whose sources differ by more than "
            f"{fmt(rg['spread_limit'], 2)} are flagged: {flagged}.\n\n"
            + _table(["region", "rho", "fluid", *sources], rows))


def _robustness(res: dict) -> str:
    rob = res.get("robustness") or {}
    if not rob.get("claims"):
        return "Not computed (`--no-robustness`)."
    lines = [f"Each claim recomputed with the same rules under {rob['n_protocols']:,} analysis protocols "
             "(rank aggregation, practical ties, thresholds, test, BH level and family, metric set, scheduler set, "
             "comparison kind).", ""]
    lines += [f"- **{CLAIM_NAMES.get(c['id'], c['id'])}**: {c['summary']}" for c in rob["claims"]]
    return "\n".join(lines)


def _simulator(res: dict) -> str:
    sim = res.get("simulator") or {}
    dist = sim.get("distribution") or {}
    if not dist:
        return ("Not measured in this store: `schedport run --variants uncertainty` reruns the study on engine "
                "variants moved within the simulator's known error, and the analysis gives each flip its survival.")
    s = sim.get("set") or {}
    rt = sim.get("rank_tau_vs_default") or {}
    return (f"The study rerun on the {sim['n_variants']} engine variants of {set_origin(s)} "
            f"(docs/engine.md §3.6). Of the {dist['n_reversals']} flips, "
            f"{dist['all']} survive every variant, {dist['at_least_75']} at least 75% of them, {dist['under_50']} "
            f"fewer than half and {dist['none']} none. Rankings themselves hold: median Kendall tau of mean ranks "
            f"between the default engine and a variant {fmt(rt.get('median'))} per condition (lowest "
            f"{fmt(rt.get('min'))}). Verdicts unchanged under every variant: "
            f"{sum(c['n_same'] == c['n_variants'] for c in sim.get('claims') or [])} of "
            f"{len(sim.get('claims') or [])}.")


def study_markdown(res: dict, stamp: dict) -> str:
    """The study page for `res` (a portability dict); `stamp` names the store it came from:
    ``cells_sha256``, ``n_cells``, ``portability_sha256`` and the ``command`` that wrote the page."""
    pooled = res["reversals"]
    sections = [
        ("The answer", render_markdown(res)),
        ("The study's claims, claim by claim", _claims(res)),
        ("Across sources", _sources(res)),
        ("Across load levels", _regions(res)),
        ("Where rankings flip", _flips(res)),
        ("Across metrics", _metrics(res)),
        ("Is a region one load in every source?", _regimes(res)),
        ("How robust is each verdict?", _robustness(res)),
        ("Which flips survive the simulator?", _simulator(res)),
        ("Pooled reversals (secondary)",
         f"Over all {len(res['parameters']['metrics'])} distinct metrics and both kinds of comparison: "
         f"{pooled['n_significant_practical']:,} of {pooled['n_comparisons']:,} ({pct(pooled['share'])}), "
         f"{pooled['cross_source']['n_reversals']:,} cross-source and {pooled['cross_region']['n_reversals']:,} "
         "cross-region."),
    ]
    body = "\n\n".join(f"## {t}\n\n{b}" for t, b in sections)
    return (f"# The study's figures\n\n"
            f"<!-- Written by `{stamp['command']}`: do not edit by hand; regenerate it. -->\n\n"
            f"Every number below is read from the `portability.json` of the store named in the table, the same "
            f"numbers the report (`report.html`) shows. The claims are those of the study {STUDY_CITATION}.\n\n"
            f"{_provenance(res, stamp)}\n\n{body}\n")
