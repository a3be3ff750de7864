"""The report's first screen: the answer to its title, "do scheduler rankings carry over?", in a
few sentences generated from ``portability.json``, and a card for a user's own scheduler or source.

`answer_points(res)` writes five points (across sources, across load levels, across metrics,
where the flips concentrate, how firm that is). Each is a list of parts: text, `Bold` text and
`Num` (a path in the JSON with its format), so the very same sentences render as HTML with every
number tagged (`render_html`) and as Markdown for docs/study.md (`render_markdown`). The words
("largely", "only in part", ...) follow fixed thresholds stated in `WORDS`, so a reader can check
them against the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from schedport.report.numbers import Nums, plain, resolve_key
from schedport.report.robustness import claim_standing
from schedport.report.style import escape_html as esc
from schedport.report.variantset import set_is_shipped

__all__ = ["STUDY_TITLE", "STUDY_CITATION", "WORDS", "Num", "Bold", "answer_points", "render_html",
           "render_markdown", "own_card"]

STUDY_TITLE = ("How Portable Are LLM-Serving Scheduler Rankings Across Workloads, Operating Regions, and "
               "Metrics?")
STUDY_CITATION = (f"\u201c{STUDY_TITLE}\u201d (LLM-Serving Scheduler Portability Benchmark, New Jersey "
                  "Institute of Technology)")

#: The words of the answer and the thresholds that choose them (a value at or above the bound).
WORDS = {
    "sources": [(0.9, "almost fully"), (0.7, "largely, not fully"), (0.5, "only in part"), (-1.0, "hardly")],
    "regions": [(0.8, "hold"), (0.5, "drift"), (-1.0, "change a lot")],
    "metrics": [(0.7, "carry over"), (0.3, "carry over only moderately"), (-1.0, "do not carry over")],
}

#: Short names of the study's five claims.
CLAIM_NAMES = {"azure_bailian": "Azure vs Bailian near-perfect", "burstgpt_low": "BurstGPT pairs as low as 0.55",
               "reversals": "3.6% reversals at high load", "metric_agreement": "moderate agreement across metrics",
               "best_changes": "best scheduler changes in 68.1%"}


@dataclass(frozen=True)
class Num:
    """A number of the answer: its path in portability.json and its format (num, pct, int)."""
    key: str
    kind: str = "num"


@dataclass(frozen=True)
class Bold:
    """Emphasised text (a point's lead)."""
    text: str


Part = Union[str, Num, Bold]


def _word(kind: str, value: Optional[float]) -> str:
    if value is None:
        return "cannot be told"
    return next(w for bound, w in WORDS[kind] if value >= bound)


def _ix_extreme(items: list, key, pick=min) -> Optional[int]:
    ok = [i for i, d in enumerate(items) if key(d) is not None]
    return pick(ok, key=lambda i: key(items[i])) if ok else None


def _dups(res: dict) -> list[str]:
    """The groups of schedulers with identical results in some source ("a = b"), sorted."""
    dup = res.get("study_form", {}).get("duplicates") or {}
    return sorted({" = ".join(g) for groups in dup.values() for g in groups})


def _tie_reason(res: dict) -> str:
    """Why a tau is undefined everywhere: duplicate schedulers, or too few of them."""
    names = _dups(res)
    k = len(res["parameters"]["schedulers"])
    if names:
        return (f"{'; '.join(names)} gave identical results, so they tie in every ranking "
                f"(the run has {k} schedulers)")
    if k < 3:
        return (f"with {k} scheduler{'s' if k != 1 else ''} a ranking holds at most one pair, which tied "
                "wherever it was measured")
    return "at least one side ties all schedulers wherever the two were measured"


#: Said beside a tau whose basic bootstrap interval sits above (or nearly above) its estimate.
EDGE_NOTE = ("; a basic bootstrap interval, which corrects for the estimator's bias towards 0, so it can lie "
             "above the estimate")


def _edge_note(d: dict) -> str:
    """`EDGE_NOTE` when the estimate lies in the lowest tenth of its interval or below it, else ""."""
    v, lo, hi = d.get("value"), d.get("ci_low"), d.get("ci_high")
    if v is None or lo is None or hi is None or hi <= lo:
        return ""
    return EDGE_NOTE if v < lo + 0.1 * (hi - lo) else ""


def _sources_point(res: dict) -> list[Part]:
    pairs = res["headline"]["cross_source"]["by_pair"]
    lead = Bold("Across traffic sources")
    if not pairs:
        return [lead, ": only one source in this run, so nothing to compare."]
    lo = _ix_extreme(pairs, lambda d: d["value"])
    hi = _ix_extreme(pairs, lambda d: d["value"], max)
    if lo is None:
        return [lead, ": cannot be told in this run. The Kendall tau between two sources' rankings is undefined "
                "for every pair, region and main metric: a tau needs each side to rank the schedulers without a "
                "full tie, and here " + _tie_reason(res) + "."]
    half = res["study_form"]["cross_source_half"]["by_pair"]
    alo = _ix_extreme(half, lambda d: d.get("adjusted"))
    ahi = _ix_extreme(half, lambda d: d.get("adjusted"), max)
    k = "headline.cross_source.by_pair"
    a = pairs[lo]
    out: list[Part] = [lead, ", rankings carry over ",
                       _word("sources", None if alo is None else half[alo]["adjusted"]),
                       ": Kendall tau of mean ranks between two sources "
                       + ("ranges from " if hi != lo else "is "), Num(f"{k}.{lo}.value"),
                       f" ({a['source_a']} vs {a['source_b']}, 95% interval ", Num(f"{k}.{lo}.ci_low"), " to ",
                       Num(f"{k}.{lo}.ci_high"), _edge_note(a) + ")"]
    if hi != lo:
        b = pairs[hi]
        out += [" to ", Num(f"{k}.{hi}.value"), f" ({b['source_a']} vs {b['source_b']})"]
    out.append(" on the main metrics.")
    if len(res["parameters"]["schedulers"]) == 2:
        out.append(" With two schedulers a tau can only be +1 (the same winner), -1 (the other wins) or undefined "
                   "(a tie), so the flips below say more.")
    if alo is not None:
        h = "study_form.cross_source_half.by_pair"
        out += [" Measured against how well each source agrees with itself (split-half reliability, the noise "
                "ceiling), that is ", Num(f"{h}.{alo}.adjusted")]
        if ahi != alo:
            out += [" to ", Num(f"{h}.{ahi}.adjusted")]
        out.append(" of the ceiling: the sources differ in substance, not only in noise."
                   if half[alo]["adjusted"] < 0.9 else " of the ceiling: what differs is mostly noise.")
    return out


def _regions_point(res: dict) -> list[Part]:
    cr = res["headline"].get("cross_region") or {}
    lead = Bold("Across load levels")
    if len(res["parameters"]["regions"]) < 2:
        return [lead, ": only one region in this run, so nothing to compare."]
    if cr.get("adjacent") is None:
        return [lead, ": cannot be told in this run. The Kendall tau between two regions' rankings is undefined "
                "for every source and main metric, because " + _tie_reason(res) + "."]
    k = "headline.cross_region"
    ext = cr.get("extremes")
    out: list[Part] = [lead, ", rankings ", _word("regions", ext if ext is not None else cr["adjacent"]),
                       ": neighbouring regions agree with mean tau ", Num(f"{k}.adjacent")]
    if ext is not None:
        less = ext < cr["adjacent"]
        out += [", but the lightest region (" if less else ", and the lightest region (", cr["region_light"],
                ") against the heaviest (", cr["region_heavy"], ") only " if less else ") ", Num(f"{k}.extremes")]
    out.append(" (main metrics, mean over sources).")
    return out


def _metrics_point(res: dict) -> list[Part]:
    mt = res["headline"]["metrics"]["mean_pairwise_tau"]
    bc = res["study_form"]["best_changes_with_metric"]
    k = "headline.metrics.mean_pairwise_tau"
    n_main = len(res["headline"]["main_metrics"])
    if mt.get("value") is None:
        return [Bold("Across metrics"), f": cannot be told in this run. The Kendall tau between two of the {n_main} "
                "main metrics' rankings is undefined in every condition, because " + _tie_reason(res) +
                "; the single best scheduler changes with the metric in ",
                Num("study_form.best_changes_with_metric.share", "pct"), " of window \u00d7 region cells."]
    out: list[Part] = [Bold("Across metrics"), ", rankings ", _word("metrics", mt.get("value")),
                       f": the mean tau between the {n_main} main metrics is ", Num(f"{k}.value"),
                       " (95% interval ", Num(f"{k}.ci_low"), " to ", Num(f"{k}.ci_high"),
                       _edge_note(mt) + "), and the single best scheduler changes with the metric in ",
                       Num("study_form.best_changes_with_metric.share", "pct"), " of window \u00d7 region cells"]
    forced = bc.get("forced_by") or []
    if forced:
        out += [f" ({forced[0]['metric']} alone forces that by construction; without it, ",
                Num("study_form.best_changes_with_metric.forced_by.0.share_without", "pct"), ")"]
    out.append(".")
    return out


def _flips_point(res: dict) -> list[Part]:
    f = res["headline"].get("flips") or {}
    lead = Bold("Where rankings flip")
    if not f.get("n_comparisons"):
        if len(res["parameters"]["sources"]) < 2:
            return [lead, ": only one source in this run, so no flip across sources can be counted."]
        return [lead, ": no scheduler pair was tested in two sources at the same region, so no flip across "
                "sources can be counted; " + ("here " + _tie_reason(res) if _dups(res) else
                                              "each pair lacks complete windows in one of the sources") + "."]
    k = "headline.flips"
    if not f["n_reversals"]:
        return [lead, ": nowhere on the main metrics; none of ", Num(f"{k}.n_comparisons", "count"),
                " cross-source comparisons reverses significantly and by a practical margin."]
    out: list[Part] = [lead, ": ", Num(f"{k}.n_reversals", "int"), " of ", Num(f"{k}.n_comparisons", "count"),
                       " cross-source comparisons on the main metrics (", Num(f"{k}.share", "pct"),
                       ") reverse significantly and by a practical margin, spread over ",
                       Num(f"{k}.n_scheduler_pairs", "int"),
                       f" scheduler pair{'' if f['n_scheduler_pairs'] == 1 else 's'}. Most are at ",
                       f["top_region"]["key"], " (", Num(f"{k}.top_region.count", "int"), "), between ",
                       f["top_source_pair"]["key"].replace(" vs ", " and "), " (",
                       Num(f"{k}.top_source_pair.count", "int"), ") and on ",
                       f["top_metric"]["key"], " (", Num(f"{k}.top_metric.count", "int"), ")."]
    modeled = [d["source"] for d in res["provenance"]["data_sources"] if d.get("modeled")]
    if modeled and f.get("n_with_modeled_source"):
        out += [" ", Num(f"{k}.n_with_modeled_source", "int"), f" of them have the modeled source "
                f"{', '.join(modeled)} on one side."]
    return out


def _firm_point(res: dict) -> list[Part]:
    lead = Bold("How firm this is")
    rob = res.get("robustness") or {}
    out: list[Part] = [lead, ": "]
    if rob.get("claims"):
        verdict = {c["id"]: c["verdict"] for c in res["study_form"]["claims"]}
        st = {c["id"]: claim_standing(c, verdict.get(c["id"], "")) for c in rob["claims"]}
        nc = [CLAIM_NAMES.get(i, i) for i, v in st.items() if v == "not comparable"]
        robust = [i for i, v in st.items() if v == "robust"]
        soft = [CLAIM_NAMES.get(i, i) for i, v in st.items() if v in ("depends", "minority")]
        minority = [CLAIM_NAMES.get(i, i) for i, v in st.items() if v == "minority"]
        n_ok = len(robust) + len(soft)
        out.append(f"of the study's {len(rob['claims'])} verdicts, ")
        if nc:
            out.append(f"{len(nc)} cannot be judged in this run under any protocol ({'; '.join(nc)}), so they "
                       "count as neither robust nor not; of the other " if n_ok else
                       f"{len(nc)} cannot be judged in this run under any protocol ({'; '.join(nc)}).")
        if n_ok:
            out += [f"{n_ok}, " if nc else "",
                    f"{len(robust)} come{'s' if len(robust) == 1 else ''} out the same under all ",
                    Num("robustness.n_protocols", "count"), " analysis protocols"]
            out.append(f"; the other {len(soft)} ({'; '.join(soft)}) depend on analysis choices" if soft else "")
            if minority:
                out.append(f", and for {'; '.join(minority)} the default protocol's verdict is the minority one")
            out.append(".")
    else:
        out.append("the verdicts were not recomputed under other analysis protocols (--no-robustness).")
    sim = res.get("simulator") or {}
    dist = sim.get("distribution") or {}
    if dist.get("n_reversals"):
        k = "simulator.distribution"
        vset = sim.get("set") or {}
        # only the shipped uncertainty set moves the simulator within its known error; any other set says what it is
        how = ("the simulator moved within its known error" if vset.get("name") == "uncertainty"
               and set_is_shipped(vset) else "a variant set of the user's own, not the simulator's known error")
        out += [" Of the ", Num(f"{k}.n_reversals", "int"), " flips, ", Num(f"{k}.all", "int"), " survive all ",
                Num("simulator.n_variants", "int"), f" engine variants ({how}) and ", Num(f"{k}.under_50", "int"),
                " survive fewer than half of them."]
    elif sim.get("n_variants"):
        out += [" The study was also run on ", Num("simulator.n_variants", "int"), " engine variants, but the "
                "default engine shows no flip across sources on the main metrics, so there is no flip for them "
                "to confirm (their verdicts per claim are in the findings below)."]
    else:
        out.append(" Which flips survive the simulator's own error is not measured in this run "
                   "(schedport run --variants uncertainty).")
    return out


def answer_points(res: dict) -> list[list[Part]]:
    """The five points of the answer, each a list of parts (text, `Bold`, `Num`)."""
    return [_sources_point(res), _regions_point(res), _metrics_point(res), _flips_point(res), _firm_point(res)]


def _html(parts: list[Part], n: Nums) -> str:
    return "".join(n(p.key, p.kind) if isinstance(p, Num) else f"<b>{esc(p.text)}</b>" if isinstance(p, Bold)
                   else esc(p) for p in parts)


def _md(parts: list[Part], res: dict) -> str:
    return "".join(plain(res, p.key, p.kind) if isinstance(p, Num) else f"**{p.text}**" if isinstance(p, Bold)
                   else p for p in parts)


def render_html(res: dict) -> str:
    """The answer as the report's first section: the points, then where the claims come from."""
    n = Nums(res)
    items = "".join(f"<li>{_html(p, n)}</li>" for p in answer_points(res))
    return ("<section id='answer' aria-label='the answer'><ul class='answer'>" + items + "</ul>"
            f"<p class='sub'>The claims below are those of the study {esc(STUDY_CITATION)}, each set beside this "
            "run's figure in the same form. Every number here is read from portability.json; the words follow "
            "fixed thresholds (schedport.report.answer.WORDS).</p></section>")


def render_markdown(res: dict) -> str:
    """The answer as a Markdown bullet list (docs/study.md)."""
    return "\n".join(f"- {_md(p, res)}" for p in answer_points(res))


def own_card(res: dict) -> str:
    """A card for a user's own schedulers and sources: where each stands among the built-ins
    (empty when the run has neither)."""
    own = res["headline"].get("own") or []
    users = [d for d in res["provenance"].get("data_sources", []) if d.get("user")]
    if not own and not users:
        return ""
    n = Nums(res)
    regions = [r["name"] for r in res["parameters"]["regions"]]
    sources = res["parameters"]["sources"]
    parts = ["<div class='card own' id='card-own'><h3>Your own schedulers and sources</h3>"]
    for i, o in enumerate(own):
        k = f"headline.own.{i}"
        rows = []
        for m, d in o["by_metric"].items():
            cells = "".join(f"<td>{n(f'{k}.by_metric.{m}.by_source.{s}')}</td>" for s in sources)
            cells += "".join(f"<td>{n(f'{k}.by_metric.{m}.by_region.{r}')}</td>" for r in regions)
            rows.append(f"<tr><td class='l'>{esc(m)}</td><td><b>{n(f'{k}.by_metric.{m}.mean_rank')}</b></td>{cells}"
                        "</tr>")
        head = ("<tr><th class='l'>main metric</th><th>mean rank</th>" + "".join(f"<th>{esc(s)}</th>" for s in sources)
                + "".join(f"<th>{esc(r)}</th>" for r in regions) + "</tr>")
        beats = ", ".join(o["beats"]) or "none"
        loses = ", ".join(o["loses_to"]) or "none"
        parts.append(f"<p><b>{esc(o['scheduler'])}</b>: mean rank among {len(res['parameters']['schedulers'])} "
                     "schedulers (1 = best), per source (mean over regions) and per region (mean over sources). It "
                     f"out-ranks <b>{esc(beats)}</b> in at least two thirds of the (source, region, main metric) "
                     f"conditions, and <b>{esc(loses)}</b> out-rank it in at least two thirds.</p>"
                     f"<div class='scroll'><table>{head}{''.join(rows)}</table></div>")
    pairs = res["headline"]["cross_source"]["by_pair"]
    flips = (res["headline"].get("flips") or {}).get("by_source") or {}
    for d in users:
        s = d["source"]
        taus = [f"{esc(p['source_b'] if p['source_a'] == s else p['source_a'])} "
                f"{n(f'headline.cross_source.by_pair.{j}.value')}" for j, p in enumerate(pairs)
                if s in (p["source_a"], p["source_b"])]
        nf = n(f"headline.flips.by_source.{s}", "int") if s in flips else "0"
        parts.append(f"<p><b>{esc(s)}</b> (your trace): Kendall tau of mean ranks against "
                     f"{', '.join(taus) or 'no other source'} (main metrics); on one side of {nf} of the "
                     "flips across sources. It is in none of the study's claims.</p>")
    parts.append("</div>")
    return "".join(parts)
