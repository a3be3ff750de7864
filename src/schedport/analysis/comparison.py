"""Two analyses of one study side by side (``schedport analyze --compare``).

`headline_digest` reduces a portability dict to its study-form headline; `load_comparison`
reads another analysis's ``portability.json`` (the same study under the other region
definition) and puts both digests together, refusing one from another corpus or engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from schedport.analysis.reader import read_portability
from schedport.analysis.results import Result
from schedport.errors import SchedportError

__all__ = ["RegionComparison", "headline_digest", "load_comparison"]


@dataclass(frozen=True)
class RegionComparison(Result):
    """portability.json's ``region_comparison`` block: this analysis's and the other's
    `headline_digest` (``this``, ``other``), the other file's path, a ``note`` when both use one
    region definition, and whether (``selection_differs``) and why (``selection_note``) the two
    cover different selections."""

    this: dict
    other: dict
    other_path: str
    note: str
    selection_differs: bool
    selection_note: str


def headline_digest(res: dict) -> dict:
    """The study-form headline of a portability dict in a few numbers (for comparing two runs).

    Cross-source tau per source pair with its interval and ceiling-adjusted value, reversal
    share per main metric with its interval, best-changes share per window x region, the
    split-half range, and the region definition it was run under.
    """
    sf = res["study_form"]
    half = {(d["source_a"], d["source_b"]): d.get("adjusted") for d in sf["cross_source_half"]["by_pair"]}
    sh = [d["value"] for d in sf["split_half"] if d.get("value") is not None]
    return {
        "region_def": res["parameters"].get("region_def", "throughput"),
        "region_def_description": res["parameters"].get("region_def_description"),
        "corpus_sha256": res["provenance"].get("corpus_sha256"),
        "engine_hash": res["provenance"].get("engine_hash"),
        "cross_source_tau": [{"source_a": d["source_a"], "source_b": d["source_b"], "value": d["value"],
                              "ci_low": d["ci_low"], "ci_high": d["ci_high"],
                              "adjusted": half.get((d["source_a"], d["source_b"]))}
                             for d in res["headline"]["cross_source"]["by_pair"]],
        "reversals": [{"metric": e["metric"], "n_reversals": e["n_reversals"], "n_comparisons": e["n_comparisons"],
                       "share": e["share"], "ci_low": e["ci_low"], "ci_high": e["ci_high"]} for e in sf["reversals"]],
        "best_changes": {k: sf["best_changes_with_metric"].get(k) for k in ("share", "ci_low", "ci_high",
                                                                              "n_conditions")},
        "metric_tau": {k: res["headline"]["metrics"]["mean_pairwise_tau"].get(k) for k in ("value", "ci_low",
                                                                                            "ci_high")},
        "split_half_min": min(sh) if sh else None,
        "split_half_max": max(sh) if sh else None,
        "claims": {c["id"]: c["verdict"] for c in sf["claims"]},
        "selection": res.get("selection"),
        "regions": _region_loads(res),
        "regimes_flagged": [f["region"] for f in (res.get("regimes") or {}).get("flagged", [])],
    }


def _region_loads(res: dict) -> Optional[dict]:
    """{region name: rho} of an analysis (its ``parameters.regions``), None when not recorded."""
    regs = (res.get("parameters") or {}).get("regions")
    if not isinstance(regs, list):
        return None
    return {str(r.get("name")): r.get("rho") for r in regs if isinstance(r, dict)}


def _rho_differences(here: Optional[dict], other: Optional[dict]) -> list[str]:
    """The regions both analyses name at different loads ("moderate at rho 0.6 here, 1.5 there")."""
    if not here or not other:
        return []
    return [f"{name} is rho {here[name]:g} here and {other[name]:g} in the other"
            for name in here if name in other and here[name] != other[name]
            and here[name] is not None and other[name] is not None]


def _selection_text(sel: Optional[dict]) -> str:
    if not isinstance(sel, dict):
        return "an unrecorded selection"
    w = sel.get("windows_per_source") or {}
    return (f"{len(sel.get('schedulers', []))} schedulers x {sum(w.values())} windows ("
            + ", ".join(f"{k} {v}" for k, v in w.items()) + f") x {len(sel.get('regions', []))} regions")


def load_comparison(path, res: dict) -> RegionComparison:
    """The headline of another analysis (its ``portability.json``, or a directory holding one) beside this one.

    Meant for the same study under the other region definition: a file from another corpus or
    engine config is refused (one line), one under the same region definition is noted, and one
    of another selection (schedulers, sources, windows, region names) or with a region of the
    same name at another rho is marked ``selection_differs`` with the reason in ``selection_note``.
    """
    pth = Path(path)
    f = pth / "portability.json" if pth.is_dir() else pth
    if not f.is_file():
        raise SchedportError(f"{f}: not found (--compare takes another analysis' portability.json or its directory)")
    other = read_portability(f)
    try:
        dig = headline_digest(other)
    except (KeyError, TypeError, AttributeError):
        raise SchedportError(f"{f}: not a portability.json of this schedport version (no study_form)") from None
    here = headline_digest(res)
    for k in ("corpus_sha256", "engine_hash"):
        if here[k] and dig[k] and here[k] != dig[k]:
            raise SchedportError(f"{f}: {k} {dig[k]} differs from this store's {here[k]}; compare runs of one study")
    note = ("" if dig["region_def"] != here["region_def"] else
            f"both analyses use region definition {here['region_def']}")
    # a region is its name and its load: one redefined at another rho is another region
    rho_diff = _rho_differences(here.get("regions"), dig.get("regions"))
    names_differ = dig.get("selection") != here.get("selection")
    differs = names_differ or bool(rho_diff)
    reasons = []
    if names_differ:
        reasons.append(f"different selections (this: {_selection_text(here.get('selection'))}; "
                       f"the other: {_selection_text(dig.get('selection'))})")
    if rho_diff:
        reasons.append("regions of one name at different loads (" + "; ".join(rho_diff) + ")")
    sel_note = (f"the two analyses cover {' and '.join(reasons)}: their numbers are not of one study"
                if differs else "")
    return RegionComparison(this=here, other=dig, other_path=str(f), note=note, selection_differs=differs,
                            selection_note=sel_note)
