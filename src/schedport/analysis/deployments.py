"""Deployment as a comparison kind: does a scheduler ranking carry over to another GPU or model?

A store run with ``schedport run --variants deployments`` (or ``deployments-scaled``, or a user's
set of deployments) holds the study once per deployment (`schedport.engine.core.deployments`): the
default engine (the one the study ran on, named from its config) and other models on other GPUs, each with its capacity
measured on its own engine so that a region means the same load. This module compares them the
way the study compares sources: per traffic source, the deployments take the place of the sources
in the study's own steps (`core_steps`: the same rankings, the same bootstrap over windows, the
same per-test Wilcoxon signed-rank tests, Benjamini-Hochberg per metric and practical thresholds),
so that

``concordance``
    is Kendall's tau-b between two deployments' mean-rank vectors per (source, region, main
    metric), with its basic bootstrap CI over windows (`source_concordance`);
``tau_by_metric``
    summarises it per deployment pair and main metric: the median, minimum and mean over the
    (source, region) conditions and how many CIs exclude 1 (the ranking moved beyond noise);
``reversals``
    are the cross-deployment reversals: a scheduler pair, a main metric, a region and a source
    where the pair's median effect is significant and at least the practical threshold on two
    deployments, with opposite signs (the study form's rule, `studyform`), strongest first;
    ``by_metric`` and ``by_pair`` count them.

``slo`` says how the SLO thresholds were held across deployments (the variant set's choice:
``absolute`` or ``scaled`` to each deployment's unloaded latency), since that choice decides
whether the SLO metrics' rankings carry over. Each deployment's thresholds are listed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pandas as pd

from schedport.analysis.results import Result, VariantSetInfo
from schedport.analysis.simulator import variant_set_info
from schedport.analysis.steps import CoreSteps
from schedport.engine.core.config import engine_config_from_dict
from schedport.engine.core.latency import make_latency_model
from schedport.errors import SchedportError

__all__ = ["is_deployment_set", "deployment_axis", "engine_label", "DeploymentAxis", "SLO_LABELS"]

#: How the report names each SLO choice.
SLO_LABELS = {
    "absolute": "absolute SLO thresholds: every deployment is held to the study's TTFT and TPOT targets",
    "scaled": "scaled SLO thresholds: each deployment's targets are the study's times its unloaded prefill "
              "and decode-step latency over the default deployment's",
}


@dataclass(frozen=True)
class DeploymentAxis(Result):
    """portability.json's ``deployments`` block (the module docstring names its parts): the
    variant set, its SLO choice, the default deployment's name, each deployment with what it is
    and its SLO thresholds, the traffic sources, the concordance rows and their per-metric
    summary, the cross-deployment reversals and their counts, the ``definitions`` and the wall
    time (``elapsed_s``, None until the step has timed itself)."""

    set: VariantSetInfo
    slo: str
    slo_label: str
    slo_reference_tokens: Optional[int]
    default: str
    deployments: list
    sources: list
    concordance: list
    tau_by_metric: list
    reversals: list
    n_reversals: int
    by_metric: dict
    by_pair: dict
    definitions: dict
    elapsed_s: Optional[float] = None


def engine_label(manifest: dict) -> str:
    """What the engine a store was run on is, in words, from the engine config its manifest
    records (the ``--engine`` the run was given): the model and hardware its latency model
    describes, and the config's hash, so the default deployment is never named by assumption."""
    ec = manifest.get("engine_config")
    digest = str(manifest.get("engine_hash") or "")[:12]
    tag = f" (engine {digest})" if digest else ""
    try:
        desc = make_latency_model(engine_config_from_dict(ec, source="the store's manifest")).describe()
    except (SchedportError, ValueError, TypeError, AttributeError, KeyError):
        return f"the study's engine{tag}"
    if desc.get("llm") and desc.get("hardware"):
        return f"the study's engine: {desc['llm']} on {desc['hardware']}{tag}"
    return f"the study's engine: a {desc.get('model', 'custom')} latency model{tag}"


def is_deployment_set(set_record: dict) -> bool:
    """Whether a store's variant set varies the deployment (a variant's overlay names
    ``[latency] deployment`` or a TP degree): the sets this comparison is for."""
    for v in set_record.get("variants", []):
        ov = v.get("overlay", {})
        if "deployment" in ov.get("latency", {}) or "tensor_parallel_size" in ov.get("engine", {}):
            return True
    return False


def _as_sources(per_variant: dict, source: str) -> pd.DataFrame:
    """The runs of one traffic source, each deployment's relabelled as a 'source' of its own."""
    parts = []
    for name, (df, _) in per_variant.items():
        d = df[df["source"] == source].drop(columns=["variant"], errors="ignore")
        parts.append(d.assign(source=name))
    return pd.concat(parts, ignore_index=True)


def _slo_of(manifest: dict) -> Optional[dict]:
    slo = (manifest.get("engine_config") or {}).get("slo")
    return slo if isinstance(slo, dict) else None


def deployment_axis(per_variant: dict, set_record: dict, core: Callable[[pd.DataFrame, dict], CoreSteps],
                    default: str = "default") -> DeploymentAxis:
    """portability.json's ``deployments`` block (module docstring) from each deployment's runs and
    manifest (`read_variant_runs`, the default's first) and the store's variant-set record.
    `core(df, manifest)` runs the study's steps (`core_steps` with the analysis's parameters)."""
    names = list(per_variant)
    sources = sorted(set().union(*(set(df["source"].unique()) for df, _ in per_variant.values())))
    order = {n: i for i, n in enumerate(names)}
    conc, items, comparisons = [], [], Counter()
    for s in sources:
        c = core(_as_sources(per_variant, s), per_variant[default][1])
        main = set(c.main_metrics)
        for e in c.sources.entries:
            if e["metric"] not in main:
                continue
            a, b = sorted((e["source_a"], e["source_b"]), key=order.get)
            conc.append({"source": s, "region": e["region"], "metric": e["metric"], "deployment_a": a,
                         "deployment_b": b, "tau": e["tau"], "ci_low": e["ci_low"], "ci_high": e["ci_high"],
                         "tied": e["tied"]})
        for r in c.study_form.reversals:
            comparisons[r.metric] += int(r.n_comparisons)
            for it in r.items:
                a, b = it.source_a, it.source_b
                ea, eb = it.effect_a, it.effect_b
                if order[a] > order[b]:
                    a, b, ea, eb = b, a, eb, ea
                items.append({"source": s, "metric": r.metric, "region": it.region,
                              "scheduler_pair": it.scheduler_pair, "deployment_a": a, "deployment_b": b,
                              "effect_a": ea, "effect_b": eb, "q_a": it.q_a, "q_b": it.q_b,
                              "strength": min(abs(ea), abs(eb))})
    items.sort(key=lambda d: (-d["strength"], d["metric"], d["source"], d["region"], d["scheduler_pair"]))
    tau_rows = []
    for a_i, a in enumerate(names):
        for b in names[a_i + 1:]:
            for m in dict.fromkeys(e["metric"] for e in conc):
                sel = [e for e in conc if e["deployment_a"] == a and e["deployment_b"] == b and e["metric"] == m
                       and e["tau"] is not None and np.isfinite(e["tau"])]
                if not sel:
                    continue
                t = np.array([e["tau"] for e in sel])
                moved = sum(e["ci_high"] is not None and np.isfinite(e["ci_high"]) and e["ci_high"] < 1.0
                            for e in sel)
                tau_rows.append({"deployment_a": a, "deployment_b": b, "metric": m, "n_conditions": len(sel),
                                 "median": float(np.median(t)), "min": float(t.min()), "mean": float(t.mean()),
                                 "n_ci_below_1": int(moved)})
    slo = set_record.get("slo", "absolute")
    why = {v["name"]: v["why"] for v in set_record.get("variants", [])}
    return DeploymentAxis(
        set=variant_set_info(set_record),
        slo=slo, slo_label=SLO_LABELS.get(slo, slo),
        slo_reference_tokens=set_record.get("slo_reference_tokens"),
        default=default,
        deployments=[{"name": n, "why": why.get(n) or engine_label(per_variant[n][1]),
                      "slo": _slo_of(per_variant[n][1])} for n in names],
        sources=sources,
        concordance=conc,
        tau_by_metric=tau_rows,
        reversals=items,
        n_reversals=len(items),
        by_metric={m: {"n_reversals": sum(i["metric"] == m for i in items), "n_comparisons": n}
                   for m, n in sorted(comparisons.items())},
        by_pair={f"{a} vs {b}": n for (a, b), n in sorted(Counter((i["deployment_a"], i["deployment_b"])
                                                                  for i in items).items(), key=lambda kv: -kv[1])},
        definitions={
            "concordance": "Kendall tau-b between two deployments' mean-rank vectors per (source, region, main "
                           "metric), basic bootstrap CI over windows (the study's source concordance, with "
                           "deployments in place of sources)",
            "reversal": "a scheduler pair whose median effect is significant (BH per metric, q <= q) and at least "
                        "the practical threshold on two deployments of one source and region, with opposite signs",
        })
