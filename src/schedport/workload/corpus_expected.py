"""The frozen corpus's expected hashes: does a build on this machine reproduce the study's windows?

``schedport/workload/data/corpus-expected.json`` holds the window hashes of the study as frozen
(`expected_from_manifest` makes it, `schedport.workload.corpus.write_expected` writes it);
`compare_expected` says, source by source, whether a build matches them.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import numpy as np

from schedport.workload.corpus_manifest import EXPECTED_KIND, MODELED_ADAPTER, canonical_json


def expected_path():
    """Where the packaged expected hashes are (``schedport/workload/data/corpus-expected.json``)."""
    return resources.files("schedport.workload") / "data" / "corpus-expected.json"


def _definition_sha(source_spec: dict) -> str:
    return hashlib.sha256(canonical_json({k: v for k, v in source_spec.items() if k != "cite"})).hexdigest()


def load_expected() -> dict:
    """The shipped expected hashes (``schedport/workload/data/corpus-expected.json``); {} if absent."""
    try:
        return json.loads(expected_path().read_text(encoding="utf-8"))
    except (OSError, FileNotFoundError, json.JSONDecodeError):
        return {}


def compare_expected(manifest: dict, expected: dict | None = None) -> dict:
    """Compare a built manifest with the frozen corpus's expected hashes, source by source.

    A source is compared when the expected file has a source of the same name and the same
    definition (its spec entry, citation aside); otherwise it is reported as custom or, for
    the real BurstGPT, as having no expected hashes (they could not be computed where the
    corpus was frozen). Returns ``{"status", "message", "sources": {...}}`` with status
    ``exact`` (every window and the corpus hash match), ``differs``, ``partial`` (what
    could be compared matched, something could not be) or ``none`` (nothing comparable).
    """
    exp = load_expected() if expected is None else expected
    exp_src = exp.get("sources", {}) if isinstance(exp, dict) else {}
    by_source: dict[str, list[dict]] = {}
    for e in manifest["windows"]:
        by_source.setdefault(e["source"], []).append(e)
    spec_by_name = {s["name"]: s for s in manifest["spec"]["sources"]}
    report: dict = {}
    differ_all: list[str] = []
    compared = uncomparable = 0
    for name, ents in by_source.items():
        x = exp_src.get(name)
        if x is None:
            report[name] = {"status": "custom", "message": f"{name}: not part of the frozen "
                            "corpus (a custom source); no expected hashes to compare"}
            uncomparable += 1
            continue
        if x.get("windows") is None:
            report[name] = {"status": "absent", "message": f"{name}: no expected hashes shipped "
                            f"({x.get('absent_reason', 'not computed')}); these "
                            f"{len(ents)} windows cannot be confirmed"}
            uncomparable += 1
            continue
        if x.get("definition_sha256") != _definition_sha(spec_by_name[name]):
            report[name] = {"status": "custom", "message": f"{name}: defined differently from the "
                            "frozen corpus's source of that name; not compared"}
            uncomparable += 1
            continue
        differ = [e["window_id"] for e in ents if x["windows"].get(e["window_id"]) != e["sha256"]]
        missing = [w for w in x["windows"] if w not in {e["window_id"] for e in ents}]
        compared += 1
        differ_all += differ
        ok = len(ents) - len(differ)
        st = "exact" if not differ and not missing else "differs"
        msg = f"{name}: {ok}/{len(x['windows'])} windows match the frozen corpus"
        if differ:
            msg += f"; differ: {_short_list(differ)}"
        if missing:
            msg += f"; not built: {_short_list(missing)}"
        report[name] = {"status": st, "message": msg, "differ": differ, "missing": missing}
    corp = exp.get("corpora", {}) if isinstance(exp, dict) else {}
    variant = next((v for v, c in corp.items() if c.get("corpus_sha256") == manifest["corpus_sha256"]),
                   None)
    if variant is not None:
        status = "exact"
        message = (f"reproduced the frozen corpus exactly (variant {variant}, corpus_sha256 "
                   f"{manifest['corpus_sha256'][:16]}...)")
    elif differ_all or any(r["status"] == "differs" for r in report.values()):
        status = "differs"
        message = (f"this machine's data did NOT reproduce the frozen corpus: "
                   f"{len(differ_all)} window(s) differ ({_short_list(differ_all)})")
    elif compared and uncomparable:
        status = "partial"
        message = (f"{compared} source(s) reproduced the frozen windows exactly; "
                   f"{uncomparable} source(s) have no expected hashes to compare")
    elif compared:
        status = "exact"
        message = "every window matches the frozen corpus"
    else:
        status = "none"
        message = "no expected hashes apply to this corpus (custom spec)"
    return {"status": status, "message": message, "sources": report}


def _short_list(items: list[str], n: int = 6) -> str:
    return ", ".join(items[:n]) + (f", ... ({len(items)} in all)" if len(items) > n else "")


def expected_from_manifest(manifest: dict, absent: dict | None = None) -> dict:
    """The expected-hashes document for a built manifest (to freeze a corpus definition).

    `absent` maps source names whose hashes cannot be computed here to the reason (the
    real BurstGPT); they are recorded with ``windows: null``.
    """
    import platform

    srcs = {}
    spec_by_name = {s["name"]: s for s in manifest["spec"]["sources"]}
    for e in manifest["windows"]:
        s = srcs.setdefault(e["source"], {"definition_sha256": _definition_sha(spec_by_name[e["source"]]),
                                          "windows": {}})
        s["windows"][e["window_id"]] = e["sha256"]
    variant = next((n for n in srcs if n.startswith(MODELED_ADAPTER)),
                   "burstgpt" if "burstgpt" in srcs else "custom")
    corpora = {variant: {"corpus_sha256": manifest["corpus_sha256"]}}
    for name, reason in (absent or {}).items():
        srcs[name] = {"definition_sha256": None, "windows": None, "absent_reason": reason}
        corpora[name] = {"corpus_sha256": None, "absent_reason": reason}
    return {"schema": 1, "kind": EXPECTED_KIND, "spec_name": manifest["spec"]["name"],
            "code_version": manifest["code_version"],
            "frozen_with": {"python": platform.python_version(), "numpy": np.__version__},
            "sources": srcs, "corpora": corpora}
