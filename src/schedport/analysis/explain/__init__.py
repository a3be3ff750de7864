"""Why does a ranking flip? Counterfactual (hybrid) windows that name the traffic feature behind a reversal.

A cross-source reversal says: at region R, on metric M, scheduler A beats B on source X's windows
and loses to it on source Y's (or the other way). `explain_reversal` builds *variants* of X's
windows that take exactly one feature from Y and keep everything else, brings each to R's load by
the same capacity scaling as every corpus window, runs A and B on them, and measures how much of
the X-to-Y effect difference each transplant closes. The mirror variants (Y's windows with X's
feature) are run too, so each share is estimated from both ends.

The parts, one module each:

- `schedport.analysis.explain.variants`: the variants (`FEATURES`, `Variant`, `build_variant`),
  pure and deterministic;
- `schedport.analysis.explain.effects`: effects computed exactly as the analysis does, each
  feature's share of the gap (`attribute`) and the verdict sentence (`verdict`);
- `schedport.analysis.explain.reversals`: the study form's reversals, numbered strongest first
  (`ranked_reversals`), and a ``--explain`` selection of them;
- `schedport.analysis.explain.runner`: `Explainer`, which opens a store, runs the variants
  through the sweep's executors with a cache of finished runs, and explains one reversal.

This module holds the entry points: `explain` (one reversal; `schedport explain`),
`explain_top` and `add_explanations` (the K strongest, stored in ``portability.json`` for the
report's "Why it flips" section; `schedport analyze --explain K`). They return data and print
nothing: the command line (`schedport.cli.explain`) says what they did. Method and limits:
docs/explain.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

from schedport.errors import SchedportError
from schedport.common.guard import WHAT, dir_kind
from schedport.analysis.portability import write_portability
from schedport.analysis.explain.effects import DRIVER_SHARE, GROUPS, attribute, paired_effects, verdict
from schedport.analysis.explain.reversals import parse_selection, ranked_reversals, read_portability
from schedport.analysis.explain.runner import DEFAULT_BOOT, Explainer
from schedport.analysis.explain.variants import (CLIENT_AWARE, FEATURES, RECIPE_VERSION, Variant, build_variant,
                                                 decouple_lengths, poisson_arrivals, resample_marginal,
                                                 transplant_arrivals)

__all__ = ["FEATURES", "GROUPS", "CLIENT_AWARE", "DRIVER_SHARE", "RECIPE_VERSION", "DEFAULT_BOOT", "Variant",
           "build_variant", "transplant_arrivals", "poisson_arrivals", "resample_marginal", "decouple_lengths",
           "paired_effects", "attribute", "verdict", "read_portability", "ranked_reversals", "parse_selection",
           "Explainer", "explain", "explain_top", "add_explanations", "explanation_lines", "check_results_dir"]


def explain(results_dir, *, reversal: Optional[int] = None, pair: Optional[str] = None, metric: Optional[str] = None,
            region: Optional[str] = None, sources: Optional[str] = None, corpus_dir=None, cache_dir=None,
            features: Optional[Sequence[str]] = None, executor: str = "local", workers: Optional[int] = None,
            ray_address: Optional[str] = None, n_boot: int = DEFAULT_BOOT, seed: int = 0,
            progress: bool = True, console=None) -> dict:
    """Explain one reversal of a results store (by its study-form number or named); return the JSON dict."""
    _check_request(reversal, pair, metric, region, sources, features)
    ex = Explainer(results_dir, corpus_dir=corpus_dir, cache_dir=cache_dir, executor=executor, workers=workers,
                   ray_address=ray_address, n_boot=n_boot, seed=seed, progress=progress, console=console)
    ok = False
    try:
        rev = ex.resolve(reversal=reversal, pair=pair, metric=metric, region=region, sources=sources)
        out = ex.explain_reversal(rev, features)
        ok = True
        return out
    finally:
        ex.close(cancel=not ok)


def _check_request(reversal, pair, metric, region, sources, features) -> None:
    """Refuse a malformed request before the store is read: one reversal, named one way, known features."""
    named = [v is not None for v in (pair, metric, region, sources)]
    if reversal is not None and any(named):
        raise SchedportError("give either --reversal or --pair/--metric/--region/--sources, not both")
    if reversal is None:
        missing = [n for n, v in (("--pair", pair), ("--metric", metric), ("--region", region),
                                  ("--sources", sources)) if not v]
        if missing:
            raise SchedportError(f"give --reversal ID, or all of --pair A,B --metric M --region R --sources X,Y "
                                 f"(missing {', '.join(missing)})")
    if features is not None:
        bad = [f for f in features if f not in FEATURES]
        if bad:
            raise SchedportError(f"--features: unknown {', '.join(bad)} (known: {', '.join(FEATURES)})")


def check_results_dir(results) -> None:
    """A `--results` that is missing, a file, or not a results store: one line saying which."""
    p = Path(results)
    if not p.exists():
        raise SchedportError(f"{p}: no such directory (--results takes the folder `schedport run --out` wrote)")
    if not p.is_dir():
        raise SchedportError(f"{p}: is a file; --results takes the folder `schedport run --out` wrote")
    kind = dir_kind(p)
    if kind != "results":
        what = "nothing" if kind == "empty" else WHAT.get(kind, "other files")
        raise SchedportError(f"{p}: not a results store (no manifest.json of kind schedport-results; it holds "
                             f"{what}); --results takes the folder `schedport run --out` wrote")


def explain_top(res: dict, results_dir, k, *, corpus_dir=None, cache_dir=None, executor: str = "local",
                workers: Optional[int] = None, ray_address: Optional[str] = None, progress: bool = True,
                console=None) -> dict:
    """Explain the `k` strongest study-form reversals of `res` (a portability dict), or the reversals
    numbered in `k` ("3,6,10"); the report's block.

    Uses the analysis's bootstrap size and seed (``res["parameters"]``), one executor and one
    cache for all of them (reversals over the same windows share their variant runs).
    """
    items = ranked_reversals(res)
    ids = parse_selection(k, len(items)) if items else []
    par = res.get("parameters", {})
    t0 = time.perf_counter()
    out = {"k": len(ids), "selection": str(k), "ids": ids, "n_reversals": len(items), "explained": []}
    if not items:
        out["note"] = "the study form has no reversal to explain"
        return out
    ex = Explainer(results_dir, corpus_dir=corpus_dir, cache_dir=cache_dir, executor=executor, workers=workers,
                   ray_address=ray_address, n_boot=int(par.get("n_boot", DEFAULT_BOOT)), seed=int(par.get("seed", 0)),
                   progress=progress, console=console)
    ok = False
    try:
        for i in ids:
            rev = ex.resolve(reversal=i, portability=res)
            d = ex.explain_reversal(rev)
            d.pop("variants", None)  # the per-window recipes stay in the explain cache, not the report
            out["explained"].append(d)
        ok = True
    finally:
        ex.close(cancel=not ok)
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    return out



def add_explanations(res: dict, results_dir, out_dir, k, *, corpus_dir=None, validation=None,
                     executor: str = "local", workers: Optional[int] = None, progress: bool = True) -> dict:
    """`schedport analyze --explain K` (or ``N1,N2,...``): explain those reversals and store them in the analysis.

    Sets ``res["explain"]`` to the block of `explain_top` (K, the selection, the reversal numbers
    and one explanation per reversal, without the per-window variant recipes), rewrites
    ``portability.json`` in `out_dir` with it (atomically, by `write_portability`), and
    returns `res`, the same dict, updated. It renders nothing: the report's "Why it flips"
    section is drawn from the returned dict by whoever renders the report
    (`schedport.api.render_report`), and `explanation_lines` gives the lines the command line
    prints. `validation` is accepted for the callers of 0.1, which passed it for the report, and
    is not used.
    """
    res["explain"] = explain_top(res, results_dir, k, corpus_dir=corpus_dir, executor=executor, workers=workers,
                                 progress=progress)
    write_portability(res, out_dir)
    return res


def explanation_lines(res: dict) -> list[str]:
    """One line per explained reversal of ``res["explain"]``: "why #ID: <verdict sentence>" (none
    when nothing was explained): what `schedport analyze --explain` prints."""
    block = res.get("explain") or {}
    return [f"why #{d['reversal'].get('id')}: {d['verdict']['sentence']}" for d in block.get("explained", [])]
