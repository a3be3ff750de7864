"""`schedport analyze`: analyse a results store into ``portability.json`` and ``report.html``.

The command parses its options, runs the analysis and renders the report through
`schedport.api.analyze` (which checks every option and the output folder first; with
``--explain``, the explained reversals go into both), and prints the headline in a few lines
(`summary_lines`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from schedport.analysis.defaults import ABS_THRESHOLD, N_BOOT, PRACTICAL_THRESHOLD, Q, SPLITS
from schedport.cli.params import out_path_parser
from schedport.common.formatting import fmt, pct


def analyze_command(
    results: Path = typer.Option(..., "--results", metavar="DIR",
                                 parser=out_path_parser, help="Results store written by `schedport run`."),
    out: Optional[Path] = typer.Option(None, "--out", metavar="DIR", parser=out_path_parser,
                                       help="Where to write portability.json and report.html "
                                                          "(default: the results directory)."),
    corpus: Optional[Path] = typer.Option(None, "--corpus", metavar="DIR",
                                          help="Corpus directory (its manifest.json) for the "
                                                                 "workload-characterization figure."),
    threshold: float = typer.Option(PRACTICAL_THRESHOLD, "--threshold", metavar="NUMBER",
                                    help="Practical threshold on |relative effect| "
                                                                             "(unbounded metrics)."),
    abs_threshold: float = typer.Option(ABS_THRESHOLD, "--abs-threshold", metavar="NUMBER",
                                        help="Practical threshold on |absolute difference| for bounded metrics "
                                             "(attainment, Jain indices, shares): 0.02 = 2 percentage points."),
    n_splits: int = typer.Option(SPLITS, "--splits", metavar="N", help="Random splits for the split-half reliability."),
    compare: Optional[Path] = typer.Option(None, "--compare", metavar="PATH",
                                           help="portability.json (or its directory) of the "
                                                                  "same study under the other region definition: "
                                                                  "show both headlines side by side."),
    q: float = typer.Option(Q, "--q", metavar="NUMBER", help="Benjamini-Hochberg false discovery rate."),
    n_boot: int = typer.Option(N_BOOT, "--boot", "--n-boot", metavar="N",
                               help="Bootstrap replicates (>= 1000 for reporting)."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Bootstrap seed."),
    robustness: bool = typer.Option(True, "--robustness/--no-robustness",
                                    help="Recompute the study's five claims under every protocol of the "
                                         "multiverse (portability.json's robustness; about a minute on 2 cores "
                                         "for the default study)."),
    robustness_boot: int = typer.Option(200, "--robustness-boot", metavar="N",
                                        help="Resamples of windows behind each protocol's verdict (intervals "
                                             "not shown)."),
    metrics: Optional[str] = typer.Option(None, "--metrics", metavar="LIST",
                                          help="Comma-separated metrics (default: all)."),
    expect_corpus: Optional[str] = typer.Option(None, "--expect-corpus", metavar="TEXT",
                                                help="Refuse a store from another corpus."),
    validation: Optional[Path] = typer.Option(None, "--validation", metavar="FILE",
                                              help="validation.json from `schedport "
                                                                         "validate`: add its section to the report."),
    explain: Optional[str] = typer.Option(None, "--explain", metavar="TEXT",
                                          help="K: explain the K strongest study-form reversals "
                                          "(`schedport explain`, cached in RESULTS/explain) and add a 'Why it flips' "
                                          "section to the report; or N1,N2,...: those reversals (numbers as in "
                                          "`schedport explain --list`)."),
) -> None:
    """Rank schedulers per source, region and metric; map where rankings hold and where they flip."""
    from schedport import api   # numpy, pandas, scipy (~3 s): loaded on use, not at every command's start
    from schedport.analysis.explain import explanation_lines

    mlist = [m.strip() for m in metrics.split(",") if m.strip()] if metrics is not None else None
    res = api.analyze(results, out, practical_threshold=threshold, q=q, n_boot=n_boot, seed=seed, metrics=mlist,
                      corpus_dir=corpus, expect_corpus=expect_corpus, validation=validation,
                      abs_threshold=abs_threshold, n_splits=n_splits, compare=compare, explain=explain,
                      robustness=robustness, robustness_boot=robustness_boot)
    pj = res.portability
    if explain:
        for line in explanation_lines(pj):
            typer.echo(line)
    for line in summary_lines(pj):
        typer.echo(line)
    wl = pj.get("workload") or {}
    if not wl.get("available"):
        typer.echo(f"workload figure left out of the report: {wl.get('note', 'no corpus')}")
    typer.echo(f"wrote {res.portability_json}")
    if validation is not None:
        typer.echo(f"report includes the validation section from {validation}")
    typer.echo(f"report: {res.report_html}")


def summary_lines(res: dict) -> list[str]:
    """A few plain-text lines with the headline numbers in the study's form (for the terminal)."""
    from schedport.analysis.studyform import adjusted_text   # loads scipy: on use, as the analysis

    h = res["headline"]
    sf = res["study_form"]
    lines = []
    if res.get("subset", {}).get("is_subset"):
        lines.append("subset run: " + ", ".join(res["subset"]["reasons"]))
    cs = h["cross_source"]
    half = {(d["source_a"], d["source_b"]): d for d in sf["cross_source_half"]["by_pair"]}
    for d in cs["by_pair"]:
        adj = half.get((d["source_a"], d["source_b"]), {}).get("adjusted")
        lines.append(f"tau {d['source_a']} vs {d['source_b']}: {fmt(d['value'])} "
                     f"[{fmt(d['ci_low'])}, {fmt(d['ci_high'])}] (main metrics, all regions; ceiling-adjusted "
                     f"{adjusted_text(adj)})")
    for e in sf["reversals"]:
        lines.append(f"reversals on {e['metric']}: {e['n_reversals']} of {e['n_comparisons']} cross-source "
                     f"comparisons ({pct(e['share'])} [{pct(e['ci_low'])}, {pct(e['ci_high'])}])")
    bc = sf["best_changes_with_metric"]
    lines.append(f"best scheduler changes with the metric in {pct(bc['share'])} [{pct(bc['ci_low'])}, "
                 f"{pct(bc['ci_high'])}] of {bc['n_conditions']} window x region cells"
                 + ("; forced by " + ", ".join(f"{f['scheduler']} on {f['metric']}" for f in bc["forced_by"])
                    if bc.get("forced_by") else ""))
    lines.append(f"mean metric tau {fmt(h['metrics']['mean_pairwise_tau']['value'])}")
    if sf["split_half"]:
        vals = [d["value"] for d in sf["split_half"] if d["value"] is not None]
        lines.append(f"split-half reliability {fmt(min(vals))}-{fmt(max(vals))} over source x region")
    rv = h["reversals"]
    lines.append(f"pooled reversals (all metrics, cross-source and cross-region): {rv['n_significant_practical']} "
                 f"of {rv['n_comparisons']} comparisons ({pct(rv['share'])})")
    rob = {c["id"]: c for c in (res.get("robustness") or {}).get("claims", [])}
    for c in sf["claims"]:
        r = rob.get(c["id"])
        across = (f"; across {res['robustness']['n_protocols']:,} protocols: {r['summary']}" if r else "")
        lines.append(f"claim '{c['study'][:60]}': {c['verdict']}{across}")
    if res.get("missing_cells"):
        lines.append(f"{len(res['missing_cells'])} missing cell(s): analysed on complete blocks")
    rg = res.get("regimes") or {}
    for f in rg.get("flagged", []):
        lines.append(f"warning (regimes): at {f['region']} the sources' median {rg['scheduler']} backlog at the last "
                     f"arrival spans {fmt(f['low'], 2)}-{fmt(f['high'], 2)}: not one regime")
    rc = res.get("region_comparison") or {}
    if rc.get("selection_differs"):
        lines.append(f"warning (--compare): {rc['selection_note']}")
    return lines + simulator_lines(res) + deployment_lines(res)


def simulator_lines(res: dict) -> list[str]:
    """The simulator axis in a few lines (a store run with --variants): how many reversals survive
    every engine variant, and the predicted real-engine check with each one's survival."""
    sim = res.get("simulator")
    if not sim:
        return []
    d, V = sim["distribution"], sim["n_variants"]
    lines = [f"simulator: {d['all']} of {d['n_reversals']} reversals survive all {V} engine variants of "
             f"{sim['set']['name']}, {d['at_least_75']} at least 75% of them, {d['under_50']} fewer than half; "
             f"rank tau vs the default {fmt((sim.get('rank_tau_vs_default') or {}).get('median'))} (median)"]
    if sim.get("note"):
        lines.append(f"warning (variants): {sim['note']}")
    pr = sim.get("predicted") or {}
    s, m = pr.get("strongest_reversal"), pr.get("most_stable_ranking")
    if s:
        lines.append(f"strongest reversal: {s['scheduler_pair']} on {s['metric']} at {s['region']}, {s['source_a']} vs "
                     f"{s['source_b']}: survives {s['n_survived']} of {V} variants ({s['class']})")
    if m:
        lines.append(f"most stable ranking: {m['winner']} ahead of {m['loser']} on {m['metric']} at {m['region']} in "
                     f"every source: survives {m['n_survived']} of {V} (test both: schedport validate --predicted)")
    return lines


def deployment_lines(res: dict) -> list[str]:
    """The deployment axis in a few lines (a store run with a deployment variant set): the SLO
    choice, the cross-deployment reversals and the lowest rank agreement between two deployments."""
    dep = res.get("deployments")
    if not dep:
        return []
    lines = [f"deployments: {len(dep['deployments'])} ({dep['set'].get('name')}, {dep['slo']} SLO thresholds), "
             f"{dep['n_reversals']} cross-deployment reversals"]
    if dep["reversals"]:
        r = dep["reversals"][0]
        lines.append(f"strongest: {r['scheduler_pair']} on {r['metric']} at {r['region']} ({r['source']}), "
                     f"{r['deployment_a']} {fmt(r['effect_a'])} vs {r['deployment_b']} {fmt(r['effect_b'])}")
    low = min(dep["tau_by_metric"], key=lambda t: t["median"], default=None)
    if low:
        lines.append(f"lowest rank agreement: {low['deployment_a']} vs {low['deployment_b']} on {low['metric']}, "
                     f"median tau {fmt(low['median'])}")
    return lines


def report_command(
    results: Path = typer.Option(..., "--results", metavar="DIR", parser=out_path_parser,
                                 help="Results store whose portability.json `schedport analyze` wrote."),
    html: bool = typer.Option(True, "--html/--no-html", help="Write report.html again beside portability.json."),
    study_md: Optional[Path] = typer.Option(None, "--study-md", metavar="FILE", parser=out_path_parser,
                                            help="Also write the study's figures as Markdown (docs/study.md), "
                                                 "stamped with the store's digest."),
) -> None:
    """Write the report and the study's figures page from a store's portability.json, recomputing nothing."""
    from schedport import api

    command = f"schedport report --results {results}" + (f" --study-md {study_md}" if study_md is not None else "")
    out = api.report(results, html=html, study_md=study_md, command=command)
    if out.study_md is not None:
        typer.echo(f"study page: {out.study_md}")
    if out.html is not None:
        typer.echo(f"report: {out.html}")
