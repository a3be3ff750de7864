"""Where the numbers come from: the data sources' licences and citations, the store's and the
package's provenance, and whether the store is a subset of the study.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

from schedport.__about__ import __version__
from schedport.analysis.store_loading import Study
from schedport.engine.policies.schedulers import REGISTRY
from schedport.study.regions import REGIONS
from schedport.workload.corpus_manifest import BUILTIN_SOURCES, builtin_source

SOURCE_INFO = (
    ("burstgpt-modeled", {
        "name": "BurstGPT (modeled, not the real trace)",
        "license": "CC-BY 4.0 (the characterization it is modeled from)",
        "citation": "Wang et al., 'BurstGPT: A Real-World Workload Dataset to Optimize LLM Serving Systems', "
                    "KDD 2025; github.com/HPMLL/BurstGPT",
        "modeled": True,
        "note": "Windows generated from the authors' published characterization (Gamma inter-arrivals, Zipf "
                "lengths); the trace itself was not available. Conclusions about 'burstgpt-modeled' are about "
                "this model, not about BurstGPT's traffic.",
    }),
    ("burstgpt", {
        "name": "BurstGPT", "license": "CC-BY 4.0",
        "citation": "Wang et al., 'BurstGPT: A Real-World Workload Dataset to Optimize LLM Serving Systems', "
                    "KDD 2025; github.com/HPMLL/BurstGPT",
        "modeled": False, "note": "",
    }),
    ("azure", {
        "name": "Azure LLM inference trace 2023", "license": "CC-BY 4.0",
        "citation": "Patel et al., 'Splitwise: Efficient generative LLM inference using phase splitting', "
                    "ISCA 2024; github.com/Azure/AzurePublicDataset",
        "modeled": False, "note": "",
    }),
    ("bailian", {
        "name": "Alibaba Bailian (Qwen) client data from ServeGen", "license": "Apache-2.0",
        "citation": "'ServeGen: Workload Characterization and Generation of Large Language Model Serving in "
                    "Production', arXiv 2505.09999; github.com/alibaba/ServeGen",
        "modeled": False, "note": "Arrivals generated from ServeGen's per-client fitted distributions.",
    }),
)


def source_info(label: str, corpus_sources: Optional[dict] = None) -> dict:
    """License, citation and modeled/real flag for a source label.

    A built-in source is known by its exact name (`builtin_source`: ``my-burstgpt`` is not
    BurstGPT). Any other source is a user's: it keeps the ``cite`` its corpus spec gave it when
    the corpus manifest is at hand (`corpus_sources`, from `load_workload`), and so does a
    source the corpus built under a built-in name with another adapter (a corpus built before
    such names were reserved).
    """
    rec = (corpus_sources or {}).get(label)
    rec = rec if isinstance(rec, dict) else {}
    key = builtin_source(label)
    if key is not None and rec.get("adapter") in (None, BUILTIN_SOURCES[key]):
        return _with_prefix({"source": label, **dict(SOURCE_INFO)[key]}, rec)
    cite = rec.get("cite") if isinstance(rec.get("cite"), str) and rec.get("cite") else None
    return _with_prefix({"source": label, "name": label, "license": "unknown (see the citation)" if cite else "unknown",
                         "citation": cite or "not known to schedport", "modeled": bool(rec.get("modeled")),
                         "note": "a source of the corpus's own spec, cited as the spec cites it" if cite else "",
                         "user": True}, rec)


_PREFIX_KEYS = ("derived_from", "assumed", "block_tokens", "requests", "contradicting", "contradicting_share")


def _with_prefix(info: dict, rec: dict) -> dict:
    """`info` labelled with the corpus's record of a prefix identity derived from sessions (an
    assumption, with the share of requests that contradict it), when the source has one."""
    p = rec.get("prefix")
    if not isinstance(p, dict) or p.get("derived_from") != "sessions" or not all(k in p for k in _PREFIX_KEYS):
        return info
    info["prefix"] = {k: p[k] for k in _PREFIX_KEYS}
    line = (f"Prefix identity derived from sessions (assumed: {p.get('assumption', 'see the corpus manifest')}; "
            f"{p['contradicting']} of {p['requests']} requests, {100 * float(p['contradicting_share']):.1f}%, "
            "contradict it).")
    note = str(info.get("note") or "")
    info["note"] = f"{note}{'' if not note or note.endswith('.') else '.'} {line}".strip()
    return info


def provenance(manifest: dict, sources: list[str], results_dir: Optional[str],
               corpus_sources: Optional[dict] = None) -> dict:
    """The ``provenance`` block: the manifest's identity fields (corpus hash, engine config and
    hash, package version, git commit, selection, ...), its other keys' names, the results
    directory, this package's version and each source's licence and citation (`source_info`,
    a user's source with its own ``cite`` from `corpus_sources` when the corpus is at hand)."""
    keys = ("corpus_sha256", "engine_hash", "engine_config", "package_version", "git_commit", "selectors",
            "started", "finished", "ended", "status", "corpus_dir", "cells_done", "kind", "store_schema")
    prov = {k: manifest.get(k) for k in keys}
    prov["manifest_extra_keys"] = sorted(k for k in manifest if k not in keys and k != "policies")
    prov["user_policies"] = user_policies(manifest)
    prov["results_dir"] = results_dir
    prov["analysis_version"] = __version__
    prov["data_sources"] = [source_info(s, corpus_sources) for s in sources]
    return prov



def user_policies(manifest: dict) -> dict:
    """The store's schedulers that came from a user's file, module or installed package: {name:
    {kind, spec, path, sha256[, distribution]}} (the manifest's ``policies`` less the source text)."""
    recs = manifest.get("policies") if isinstance(manifest.get("policies"), dict) else {}
    return {name: {k: v for k, v in rec.items() if k != "text"} for name, rec in sorted(recs.items())
            if isinstance(rec, dict)}


def _windows_taken(st: Study) -> str:
    """Which windows a subset took per source, by part where a source has several ("azure: conv 2,
    code 2; bailian 4"): window ids are ``<source>-<part>-NN`` or ``<source>-NN``."""
    out = []
    for s in st.sources:
        parts = Counter()
        for wid in st.windows[s]:
            rest = str(wid)[len(s) + 1:] if str(wid).startswith(s + "-") else str(wid)
            parts[rest.rsplit("-", 1)[0] if "-" in rest else ""] += 1
        if len(parts) > 1 or "" not in parts:
            out.append(f"{s}: " + ", ".join(f"{p} {k}" for p, k in parts.items()))
        else:
            out.append(f"{s} {parts['']}")
    return "; ".join(out)


def subset_info(manifest: dict, st: Study, workload: Optional[dict]) -> dict:
    """Whether the store holds a subset of the study (``--quick``, fewer schedulers, windows or regions).

    Compared with the scheduler registry, the default regions and, when the corpus manifest is
    at hand, the corpus's windows per source. The report's title says so for a subset.
    """
    sel = manifest.get("selectors") if isinstance(manifest.get("selectors"), dict) else {}
    reasons = []
    if sel.get("quick"):
        reasons.append("the --quick selection")
    n_known = len(REGISTRY)
    n_builtin = sum(1 for s in st.schedulers if s in REGISTRY)    # a user's own schedulers are extra
    if n_known and n_builtin < n_known:
        reasons.append(f"{n_builtin} of {n_known} built-in schedulers")
    if set(st.regions) < set(REGIONS):
        reasons.append(f"{len(st.regions)} of {len(REGIONS)} regions")
    n_win = sum(len(v) for v in st.windows.values())
    if workload and workload.get("available"):
        corpus_n = Counter(str(w.get("source")) for w in workload.get("windows", []))
        total = sum(corpus_n.get(s, 0) for s in st.sources)
        if total and n_win < total:
            reasons.append(f"{n_win} of {total} windows ({_windows_taken(st)})")
    elif sel.get("quick"):
        reasons.append(f"{n_win} windows ({_windows_taken(st)})")
    return {"is_subset": bool(reasons), "reasons": reasons,
            "n_schedulers": len(st.schedulers), "n_windows": n_win, "n_regions": len(st.regions)}
