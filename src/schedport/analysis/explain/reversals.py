"""Which reversals `schedport explain` can explain: the study form's cross-source reversals, read from
the store's ``portability.json`` and numbered strongest first, and a selection of them (``--explain``)."""

from __future__ import annotations

from schedport.analysis.reader import read_portability
from schedport.errors import SchedportError

__all__ = ["read_portability", "ranked_reversals", "parse_selection"]


def ranked_reversals(res: dict) -> list[dict]:
    """The study form's cross-source reversals (every main metric), strongest first, numbered from 1.

    Strength is the smaller |median effect| of the two conditions over the metric's practical
    threshold (the pooled table's order). Each entry: ``id``, ``metric``, ``scheduler_a``,
    ``scheduler_b`` (the first name of each side of a duplicate class), ``pair``, ``region``,
    ``source_a``, ``source_b``, ``effect_a``, ``effect_b``, ``strength``.

    When the store was run with engine variants (``simulator`` in the analysis), each entry also
    carries its ``survival`` and ``class``, and the order is robust reversals first (by survival,
    then strength): a flip that a plausible simulator error erases is the last one worth
    explaining (docs/explain.md).
    """
    sf = res.get("study_form")
    if not isinstance(sf, dict) or "reversals" not in sf:
        raise SchedportError("portability.json has no study_form reversals (rerun `schedport analyze` with this "
                             "version)")
    out = []
    for e in sf["reversals"]:
        thr = e.get("practical_threshold") or 1e-12
        for it in e.get("items", []):
            left, _, right = it["scheduler_pair"].partition(" vs ")
            out.append({"metric": e["metric"], "scheduler_a": left.split(" = ")[0].strip(),
                        "scheduler_b": right.split(" = ")[0].strip(), "pair": it["scheduler_pair"],
                        "region": it["region"], "source_a": it["source_a"], "source_b": it["source_b"],
                        "effect_a": it["effect_a"], "effect_b": it["effect_b"],
                        "strength": min(abs(it["effect_a"]), abs(it["effect_b"])) / thr})
    surv = {(r["metric"], r["scheduler_pair"], r["region"], r["source_a"], r["source_b"]): r
            for r in ((res.get("simulator") or {}).get("reversals") or [])}
    for d in out:
        r = surv.get((d["metric"], d["pair"], d["region"], d["source_a"], d["source_b"]))
        if r is not None:
            d.update(survival=r["survival"], n_survived=r["n_survived"], n_variants=r["n_variants"],
                     **{"class": r["class"]})
    by_survival = bool(surv)
    out.sort(key=lambda d: (-(d.get("survival") or 0.0) if by_survival else 0.0, -d["strength"], d["metric"],
                            d["pair"], d["region"], d["source_a"]))
    for i, d in enumerate(out, 1):
        d["id"] = i
    return out


def parse_selection(spec, n_reversals: int) -> list[int]:
    """Reversal numbers from ``--explain``: ``K`` (the K strongest, capped at how many there are) or ``N1,N2,...``."""
    text = str(spec).strip()
    try:
        if "," not in text:
            k = int(text)
            if k < 1:
                raise SchedportError(f"--explain must be at least 1, got {k}")
            return list(range(1, min(k, n_reversals) + 1))
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SchedportError(f"--explain: expected K or a comma list of reversal numbers, got {text!r}") from None
    bad = [i for i in ids if not 1 <= i <= n_reversals]
    if bad or not ids or len(set(ids)) != len(ids):
        raise SchedportError(f"--explain: {text!r}: numbers must be distinct and between 1 and {n_reversals} (the "
                             "study form's reversals, `schedport explain --list`)")
    return ids
