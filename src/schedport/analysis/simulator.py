"""The simulator as an axis: which of the study's findings survive a plausible simulator error.

A store run with ``schedport run --variants SET`` holds the study once per engine variant (the
default engine and its perturbations, `schedport.study.variants`). The study's own steps
(`schedport.analysis.portability.core_steps`: the same rankings, tests, multiple-testing control,
thresholds and claim rules) run on each variant's runs, and `simulator_axis` compares them:

``reversals``
    Every cross-source reversal of the default variant's study form (one main metric, a scheduler
    pair, a region, two sources), with its ``survival``: the share of the V other variants in which
    the same flip is still a reversal under the same rules (same metric, region and sources, the
    same two schedulers on the same sides, the same direction), ``n_survived`` of ``n_variants``,
    ``fails_under`` (the variants where it is not) and ``class``: ``robust`` (survives every
    variant), ``fragile`` (fewer than half) or ``partial``. Duplicate schedulers are matched by
    their members, so a flip is the same when a variant joins or splits a class of twins.
``distribution``
    How many reversals survive all variants, at least 75% of them, fewer than half, and the count
    per number of variants survived; ``new_by_variant``: reversals a variant has that the default
    has not.
``claims``
    Per claim of the study form: the default's verdict, each variant's (``by_variant``),
    ``share_holds`` (the share of variants under which the verdict is "holds") and ``n_same`` /
    ``share_same`` (under which it is the default's verdict: "survives the simulator").
``rank_tau``
    Per pair of variants: Kendall's tau-b between the two variants' mean-rank vectors of each
    (source, region, main metric) condition, with its median, mean, minimum and per-metric
    medians: how far a ranking carries over across simulator error.
``stable``
    Rankings that hold everywhere in the default: a scheduler pair, a main metric and a region
    where the pair's median effect is significant, large and of one sign in every source; each
    with its survival (still so in a variant) and ``strength`` (the smallest |effect| over the
    sources).
``predicted``
    The study's real-engine check, predicted: the strongest reversal and the most stable ranking
    of the default, each with its survival (docs/validation.md says how to read them).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Any, Optional

import numpy as np

from schedport.analysis.results import Result, VariantSetInfo
from schedport.analysis.stats import kendall_tau_b
from schedport.analysis.steps import CoreSteps
from schedport.errors import SchedportError
from schedport.study.variants import SHIPPED, load_variant_set

__all__ = ["variant_findings", "simulator_axis", "stable_rankings", "variant_set_info", "SimulatorAxis", "ROBUST",
           "FRAGILE_BELOW"]

#: A reversal that survives every variant.
ROBUST = 1.0
#: A reversal that survives fewer than this share of the variants is fragile.
FRAGILE_BELOW = 0.5


@dataclass(frozen=True)
class SimulatorAxis(Result):
    """portability.json's ``simulator`` block (the module docstring names its parts): the variant
    set, the default variant's name, the variants, ``n_variants`` (beside the default), each
    reversal with its survival, their ``distribution``, ``new_by_variant``, each claim across the
    variants, ``rank_tau`` (and its summary against the default), the stable rankings, the
    ``predicted`` real-engine check, the variants whose selection differs with a ``note``, the
    ``definitions`` and the wall time (``elapsed_s``, None until the step has timed itself)."""

    set: VariantSetInfo
    default: str
    variants: list
    n_variants: int
    reversals: list
    distribution: dict
    new_by_variant: dict
    claims: list
    rank_tau: list
    rank_tau_vs_default: dict
    stable: list
    n_stable: int
    predicted: dict
    selection_differs: list
    note: str
    definitions: dict
    elapsed_s: Optional[float] = None


def variant_set_info(record: dict) -> VariantSetInfo:
    """The store's variant-set record (``variants/set.json``) as the analysis names the set: a
    set counts as shipped only when it was loaded by a shipped name and its digest is that of the
    set this schedport ships under the name."""
    name, source, digest = record.get("name"), record.get("source"), record.get("digest")
    shipped = False
    if isinstance(name, str) and name in SHIPPED and source == f"shipped:{name}":
        try:
            shipped = load_variant_set(name).digest() == digest
        except SchedportError:
            shipped = False
    return VariantSetInfo(name, record.get("version"), record.get("description"), source, digest, shipped)


def stable_rankings(core: CoreSteps, q: float) -> list[dict]:
    """The default variant's stable rankings (see the module docstring), strongest first, from
    `core_steps`' results."""
    st, raw, labels = core.study, core.reversals.tests, core.duplicates["labels"]
    I, J = raw.I, raw.J
    out = []
    for m in core.main_index:
        m = int(m)
        made, med, qm = raw.made[:, :, m], raw.med[:, :, m], raw.q_metric[:, :, m]
        sig = made & (qm <= q) & (np.abs(med) >= float(raw.thr_m[m]))
        for r, region in enumerate(st.regions):
            sign = np.sign(med[:, r])                        # (S, P)
            one_way = sig[:, r].all(axis=0) & ((sign == sign[0]).all(axis=0))
            for p in np.flatnonzero(one_way):
                a, b = int(I[p]), int(J[p])
                if any(labels[s][r][a] == labels[s][r][b] for s in range(len(st.sources))):
                    continue                                   # twins somewhere: no ranking between them
                eff = {s: float(med[si, r, p]) for si, s in enumerate(st.sources)}
                win, lose = (a, b) if sign[0, p] > 0 else (b, a)
                out.append({"metric": st.metrics[m], "scheduler_pair": f"{st.schedulers[a]} vs {st.schedulers[b]}",
                            "scheduler_a": st.schedulers[a], "scheduler_b": st.schedulers[b], "region": region,
                            "winner": st.schedulers[win], "loser": st.schedulers[lose], "effects": eff,
                            "strength": min(abs(v) for v in eff.values())})
    out.sort(key=lambda d: (-d["strength"], d["metric"], d["region"], d["scheduler_pair"]))
    return out


def variant_findings(core: CoreSteps, q: float) -> dict:
    """What the simulator axis compares of one variant's analysis (`core_steps`' results): its
    reversal items, claim verdicts, mean ranks per condition and stable rankings."""
    sform, st, rk = core.study_form, core.study, core.rankings
    items = [{**dict(it.json_fields()), "metric": r.metric} for r in sform.reversals for it in r.items]
    ranks = {}
    for s in st.sources:
        for ri, region in enumerate(st.regions):
            for mi in core.main_index:
                ranks[(s, region, st.metrics[int(mi)])] = rk.point[s][ri, int(mi)]
    selection = {"schedulers": list(st.schedulers), "regions": {r: st.rho[r] for r in st.regions},
                 "windows": {s: len(st.windows[s]) for s in st.sources}}
    return {"items": items, "claims": {c.id: c.verdict for c in sform.claims},
            "schedulers": list(st.schedulers), "ranks": ranks, "stable": stable_rankings(core, q),
            "selection": selection}


def _sides(item: dict) -> tuple[set, set]:
    a, b = item["scheduler_pair"].split(" vs ")
    return set(a.split(" = ")), set(b.split(" = "))


def _same_flip(x: dict, y: dict) -> bool:
    """The same reversal: metric, region, sources, the schedulers on the same sides, one direction."""
    if (x["metric"], x["region"], x["source_a"], x["source_b"]) != (y["metric"], y["region"], y["source_a"],
                                                                     y["source_b"]):
        return False
    (xa, xb), (ya, yb) = _sides(x), _sides(y)
    if xa & ya and xb & yb:
        return np.sign(x["effect_a"]) == np.sign(y["effect_a"])
    if xa & yb and xb & ya:
        return np.sign(x["effect_a"]) == -np.sign(y["effect_a"])
    return False


def _ranking_key(x: dict) -> tuple:
    return x["metric"], x["region"], x["winner"], x["loser"]


def _class(survival: Optional[float]) -> str:
    if survival is None:
        return "unknown"
    return "robust" if survival >= ROBUST else "fragile" if survival < FRAGILE_BELOW else "partial"


def _survive(items: list[dict], findings: dict, others: list[str], key: str, same=None, ident=None) -> list[dict]:
    """Each item with its survival in the `others` variants' `key` lists: matched by `same` (a
    predicate) or, faster, by `ident` (a key function)."""
    out = []
    V = len(others)
    index = {v: {ident(o) for o in findings[v][key]} for v in others} if ident else None
    for it in items:
        if ident:
            fails = [v for v in others if ident(it) not in index[v]]
        else:
            fails = [v for v in others if not any(same(it, o) for o in findings[v][key])]
        surv = (V - len(fails)) / V if V else None
        out.append({**it, "survival": surv, "n_survived": V - len(fails), "n_variants": V, "fails_under": fails,
                    "class": _class(surv)})
    return out


def _rank_tau(findings: dict, names: list[str]) -> list[dict]:
    out = []
    for a, b in combinations(names, 2):
        fa, fb = findings[a], findings[b]
        common = [s for s in fa["schedulers"] if s in fb["schedulers"]]
        ia = [fa["schedulers"].index(s) for s in common]
        ib = [fb["schedulers"].index(s) for s in common]
        keys = [k for k in fa["ranks"] if k in fb["ranks"]]
        if not keys:
            continue
        xa = np.array([fa["ranks"][k][ia] for k in keys])
        xb = np.array([fb["ranks"][k][ib] for k in keys])
        tau = kendall_tau_b(xa, xb)
        ok = np.isfinite(tau)
        by_metric = {}
        for m in dict.fromkeys(k[2] for k in keys):
            sel = ok & np.array([k[2] == m for k in keys])
            by_metric[m] = float(np.median(tau[sel])) if sel.any() else None
        out.append({"variant_a": a, "variant_b": b, "n_conditions": int(ok.sum()),
                    "median": float(np.median(tau[ok])) if ok.any() else None,
                    "mean": float(np.mean(tau[ok])) if ok.any() else None,
                    "min": float(np.min(tau[ok])) if ok.any() else None, "by_metric": by_metric})
    return out


def simulator_axis(findings: dict, set_record: dict, default: str = "default") -> SimulatorAxis:
    """portability.json's ``simulator`` block from each variant's `variant_findings` (the default
    variant's under `default`) and the store's variant-set record (its name, version and
    variants' overlays and reasons)."""
    others = [v["name"] for v in set_record["variants"] if v["name"] in findings]
    V = len(others)
    base = findings[default]
    reversals = _survive(base["items"], findings, others, "items", _same_flip)
    stable = _survive(base["stable"], findings, others, "stable", ident=_ranking_key)
    dist = {"n_reversals": len(reversals),
            "all": sum(r["n_survived"] == V for r in reversals),
            "at_least_75": sum(r["survival"] is not None and r["survival"] >= 0.75 for r in reversals),
            "under_50": sum(r["survival"] is not None and r["survival"] < FRAGILE_BELOW for r in reversals),
            "none": sum(r["n_survived"] == 0 for r in reversals),
            "by_n_survived": {str(k): sum(r["n_survived"] == k for r in reversals) for k in range(V + 1)}}
    by_metric = {}
    for r in reversals:
        e = by_metric.setdefault(r["metric"], {"n_reversals": 0, "robust": 0, "fragile": 0})
        e["n_reversals"] += 1
        e["robust"] += r["class"] == "robust"
        e["fragile"] += r["class"] == "fragile"
    dist["by_metric"] = by_metric
    new = {v: sum(not any(_same_flip(o, it) for it in base["items"]) for o in findings[v]["items"]) for v in others}
    claims = []
    for cid, verdict in base["claims"].items():
        byv = {v: findings[v]["claims"].get(cid) for v in others}
        n_same = sum(x == verdict for x in byv.values())
        claims.append({"id": cid, "default": verdict, "by_variant": byv,
                       "share_holds": sum(x == "holds" for x in byv.values()) / V if V else None,
                       "n_same": n_same, "n_variants": V, "share_same": n_same / V if V else None})
    tau = _rank_tau(findings, [default, *others])
    differs = [v for v in others if findings[v].get("selection") != base.get("selection")]
    vs_default = [t for t in tau if t["variant_a"] == default]
    strongest = reversals[0] if reversals else None
    most_stable = max(stable, key=lambda d: (d["survival"] or 0.0, d["strength"])) if stable else None
    return SimulatorAxis(
        set=variant_set_info(set_record),
        default=default,
        variants=[{"name": v["name"], "overlay": v["overlay"], "why": v["why"]} for v in set_record["variants"]],
        n_variants=V,
        reversals=reversals,
        distribution=dist,
        new_by_variant=new,
        claims=claims,
        rank_tau=tau,
        rank_tau_vs_default={"median": _med([t["median"] for t in vs_default]),
                             "min": min((t["min"] for t in vs_default if t["min"] is not None), default=None)},
        stable=stable,
        n_stable=len(stable),
        predicted={"strongest_reversal": strongest, "most_stable_ranking": most_stable},
        selection_differs=differs,
        note=(f"variants {', '.join(differs)} cover another selection of schedulers, regions or windows than the "
              f"default (a sweep was interrupted or extended on one side): rerun `schedport run --variants "
              f"{set_record.get('name')}` with the default's selection so every variant runs the same study"
              if differs else ""),
        definitions={
            "survival": "share of the other variants in which the same flip (metric, region, sources, schedulers on "
                        "the same sides, same direction) is still a reversal under the study form's rules",
            "class": f"robust: survives every variant; fragile: survives fewer than {FRAGILE_BELOW:.0%}; else partial",
            "rank_tau": "Kendall tau-b between two variants' mean-rank vectors per (source, region, main metric)",
            "stable": "a scheduler pair, main metric and region whose median effect is significant (BH q <= q), "
                      "at least the practical threshold and of one sign in every source",
        })




def _med(xs: list) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None
