"""The summaries behind the report's first screen, the answer to "do rankings carry over?":
how far rankings move between load levels (`cross_region_headline`), where the study-form
flips concentrate (`flips_headline`), and where a user's own scheduler stands (`own_standing`).

Both are plain summaries of what portability.json already holds (``concordance.regions`` and
the study form's `MetricReversals`), kept here so that the report reads every number it prints
from the file instead of recomputing one.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

import numpy as np

from schedport.analysis.results import MetricReversals

__all__ = ["cross_region_headline", "flips_headline", "own_standing"]


def _mean(values: list) -> Optional[float]:
    v = [float(x) for x in values if x is not None and np.isfinite(x)]
    return float(np.mean(v)) if v else None


def cross_region_headline(rows: Sequence[dict], regions: Sequence[str], main: Sequence[str]) -> dict:
    """Kendall tau between the mean-rank vectors of two load regions of one source, on the main
    metrics: the mean over sources and metrics for neighbouring regions (each region against the
    next heavier one) and for the lightest against the heaviest, and each source's own figures.
    None where a source has fewer than two regions."""
    pos = {r: i for i, r in enumerate(regions)}
    main = set(main)
    adj: dict = {}
    ext: dict = {}
    lightest, heaviest = (regions[0], regions[-1]) if len(regions) >= 2 else (None, None)
    for d in rows:
        if d["metric"] not in main or d.get("tau") is None:
            continue
        a, b = pos.get(d["region_a"]), pos.get(d["region_b"])
        if a is None or b is None:
            continue
        if abs(a - b) == 1:
            adj.setdefault(d["source"], []).append(d["tau"])
        if {d["region_a"], d["region_b"]} == {lightest, heaviest}:
            ext.setdefault(d["source"], []).append(d["tau"])
    sources = sorted(set(adj) | set(ext))
    return {
        "adjacent": _mean([t for s in sources for t in adj.get(s, [])]),
        "extremes": _mean([t for s in sources for t in ext.get(s, [])]),
        "region_light": lightest, "region_heavy": heaviest,
        "by_source": [{"source": s, "adjacent": _mean(adj.get(s, [])), "extremes": _mean(ext.get(s, []))}
                      for s in sources],
        "definition": "Kendall tau-b between two regions' mean-rank vectors of one source, averaged over the "
                      "main metrics and the sources: adjacent = each region against the next heavier one; "
                      "extremes = the lightest region against the heaviest",
    }


def flips_headline(reversals: Sequence[MetricReversals], sources_modeled: Sequence[str] = ()) -> dict:
    """The study form's cross-source reversals on the main metrics, pooled: how many of how many
    comparisons, and where they concentrate (region, source pair, scheduler pair, metric), with
    how many distinct scheduler pairs they spread over and how many have a modeled source on
    one side."""
    by_region: Counter = Counter()
    by_sources: Counter = Counter()
    by_pair: Counter = Counter()
    by_metric: Counter = Counter()
    by_source: Counter = Counter()
    n_modeled = 0
    modeled = set(sources_modeled)
    n_rev = n_comp = 0
    for e in reversals:
        n_comp += int(e.n_comparisons or 0)
        for it in e.items:
            n_rev += 1
            by_region[it.region] += 1
            by_sources[f"{it.source_a} vs {it.source_b}"] += 1
            by_pair[it.scheduler_pair] += 1
            by_metric[e.metric] += 1
            by_source.update({it.source_a, it.source_b})
            n_modeled += bool({it.source_a, it.source_b} & modeled)

    def top(c: Counter) -> Optional[dict]:
        if not c:
            return None
        k, v = max(c.items(), key=lambda kv: (kv[1], kv[0]))
        return {"key": k, "count": int(v), "share": v / n_rev}

    return {"n_reversals": n_rev, "n_comparisons": n_comp, "share": n_rev / n_comp if n_comp else None,
            "top_region": top(by_region), "top_source_pair": top(by_sources),
            "top_scheduler_pair": top(by_pair), "top_metric": top(by_metric),
            "n_scheduler_pairs": len(by_pair), "n_with_modeled_source": n_modeled,
            "by_source": {k: int(v) for k, v in sorted(by_source.items())},
            "definition": "the study form's cross-source reversals (per main metric, BH within the metric, "
                          "significant and beyond the practical threshold in both sources) pooled over the main "
                          "metrics; each reversal counts once"}


def own_standing(rankings: Sequence[dict], policies: Sequence[str], main: Sequence[str],
                 sources: Sequence[str], regions: Sequence[str]) -> list[dict]:
    """Where each of a user's own schedulers stands among the others, on the main metrics: its
    mean rank (1 = best) per metric overall, per source and per region, and the other schedulers
    it out-ranks in at least two thirds of the (source, region, metric) conditions (``beats``) or
    in at most a third (``loses_to``). Empty without user schedulers."""
    if not policies:
        return []
    look = {(d["metric"], d["source"], d["region"], d["scheduler"]): d["mean_rank"] for d in rankings
            if d.get("mean_rank") is not None}
    others = sorted({k[3] for k in look} - set(policies))
    out = []
    for name in policies:
        by_metric = {}
        wins: Counter = Counter()
        cells: Counter = Counter()
        for m in main:
            mine = {(s, r): look.get((m, s, r, name)) for s in sources for r in regions}
            mine = {k: v for k, v in mine.items() if v is not None}
            if not mine:
                continue
            by_metric[m] = {
                "mean_rank": _mean(list(mine.values())),
                "by_source": {s: _mean([v for (s2, _), v in mine.items() if s2 == s]) for s in sources},
                "by_region": {r: _mean([v for (_, r2), v in mine.items() if r2 == r]) for r in regions},
            }
            for (s, r), v in mine.items():
                for o in others:
                    w = look.get((m, s, r, o))
                    if w is not None:
                        cells[o] += 1
                        wins[o] += v < w
        beats = [o for o in others if cells[o] and wins[o] / cells[o] >= 2 / 3]
        loses = [o for o in others if cells[o] and wins[o] / cells[o] <= 1 / 3]
        out.append({"scheduler": name, "by_metric": by_metric, "beats": beats, "loses_to": loses,
                    "win_share": {o: wins[o] / cells[o] for o in others if cells[o]}})
    return out
