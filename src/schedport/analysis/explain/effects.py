"""The effects and the attribution of `schedport explain`: how much of a flip each variant closes.

Effects are computed exactly as the analysis does: per window the effect of A over B is
`schedport.analysis.stats.relative_effect` (or the absolute difference for a bounded metric,
`schedport.analysis.directions.metric_is_bounded`) times the metric's direction, the condition's
effect is the median over the windows of the store's complete block, and its interval is the
2.5-97.5 percentile of the medians over the analysis's own window resamples
(`schedport.analysis.studyform.boot_wilcoxon`).

Attribution: with E_X, E_Y the original effects and gap = E_Y - E_X, a transplanted feature f has
share = ((E_X<-f - E_X) + (E_Y - E_Y<-f)) / (2 gap): the mean of the part of the gap closed by
giving X Y's f and by giving Y X's f. A control c (applied to both sources' windows) has share =
1 - (E_Y,c - E_X,c) / gap: the part of the gap that disappears when both lose that structure. The
interval of a share is the percentile interval of the same ratio over the window resamples (X's and
Y's windows resampled independently, every variant of one source with the same resample: paired).

Verdict (`verdict`): a feature *drives* the flip when its share is at least `DRIVER_SHARE` (0.5)
and its interval excludes 0; it *contributes* when its interval excludes 0 but its share is below
0.5. The sentence names the drivers (grouped: arrival process, input lengths, output lengths,
length coupling, client structure), or says "no single feature" (an interaction) when none
drives it.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from schedport.errors import SchedportError
from schedport.common.formatting import whole_pct
from schedport.analysis.explain.variants import FEATURES
from schedport.analysis.directions import metric_direction, metric_is_bounded
from schedport.analysis.stats import relative_effect
from schedport.analysis.studyform import boot_wilcoxon

__all__ = ["GROUPS", "DRIVER_SHARE", "paired_effects", "median_effects", "percentile_interval", "finite_or_none",
           "attribute", "verdict"]

GROUPS = {"arrival": "arrival process", "burstiness": "arrival process", "input": "input lengths",
          "output": "output lengths", "coupling": "length coupling", "clients": "client structure",
          "clients_removed": "client structure"}
#: How each feature's variant reads in the verdict sentence.
_ACTIONS = {"arrival": "taking the other source's arrival pattern", "burstiness": "giving both sides Poisson arrivals",
            "input": "taking the other source's input lengths", "output": "taking the other source's output lengths",
            "coupling": "decoupling input and output lengths on both sides",
            "clients": "taking the other source's client ids", "clients_removed": "removing client ids on both sides"}
#: The smallest share of the gap with which a feature drives the flip.
DRIVER_SHARE = 0.5


def paired_effects(a: np.ndarray, b: np.ndarray, metric: str) -> np.ndarray:
    """Per-window effect of A over B on `metric`, the analysis's formula (positive = A better).

    Relative effect d * (A - B) / ((|A| + |B|) / 2) (`stats.relative_effect`), or for a
    bounded metric (`directions.metric_is_bounded`) the absolute difference d * (A - B); NaN where
    either is NaN.
    """
    d = metric_direction(metric)
    if d is None:
        raise SchedportError(f"--metric: {metric!r} has no known direction (better = higher or lower?)")
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if metric_is_bounded(metric):
        return np.where(np.isfinite(a) & np.isfinite(b), d * (a - b), np.nan)
    return relative_effect(a, b, d)


def median_effects(rows: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Point medians (N,) and resampled medians (B, N) of per-window effect rows (N, W).

    `counts` (B, W) are the window resamples as multiplicities (the analysis's draws), so the
    resampled medians are the ones the analysis's intervals are built from.
    """
    rows = np.atleast_2d(np.asarray(rows, dtype=np.float64))
    point = np.array([np.nanmedian(r) if np.isfinite(r).any() else np.nan for r in rows])
    _, med_b = boot_wilcoxon(rows, counts)
    return point, med_b


def percentile_interval(boot: np.ndarray) -> tuple[Optional[float], Optional[float]]:
    """The 2.5-97.5 percentile interval of the finite resampled values; (None, None) when none is finite."""
    b = np.asarray(boot, dtype=np.float64)
    b = b[np.isfinite(b)]
    if b.size == 0:
        return None, None
    lo, hi = np.percentile(b, [2.5, 97.5])
    return float(lo), float(hi)


def finite_or_none(x) -> Optional[float]:
    """`x` as a float, None when it is NaN or infinite (the JSON files' rule)."""
    x = float(x)
    return x if math.isfinite(x) else None


def attribute(effects: dict, features: Sequence[str]) -> dict:
    """Each feature's share of the X-to-Y effect gap, with its window-bootstrap interval.

    `effects` maps a variant key -- ``("x", "original")``, ``("y", "original")``, ``("x", f)`` (X's
    windows with f: Y's feature for a transplant, X's own structure removed for a control) and
    ``("y", f)`` -- to (point median, resampled medians (B,)); X's variants share X's resamples
    and Y's share Y's. Returns {feature: {share, ci_low, ci_high, forward, mirror, kind}} (the
    formulas are in the module docstring); shares are None where the gap is 0.
    """
    ex, ex_b = effects[("x", "original")]
    ey, ey_b = effects[("y", "original")]
    gap, gap_b = ey - ex, ey_b - ex_b
    out = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for f in features:
            if ("x", f) not in effects or ("y", f) not in effects:
                continue
            xf, xf_b = effects[("x", f)]
            yf, yf_b = effects[("y", f)]
            fwd, fwd_b = (xf - ex) / gap, (xf_b - ex_b) / gap_b
            mir, mir_b = (ey - yf) / gap, (ey_b - yf_b) / gap_b
            if FEATURES[f][0] == "transplant":
                share, share_b = (fwd + mir) / 2.0, (fwd_b + mir_b) / 2.0
            else:
                share, share_b = fwd + mir, fwd_b + mir_b
            ok = gap != 0 and math.isfinite(gap)
            lo, hi = percentile_interval(share_b) if ok else (None, None)
            out[f] = {"share": finite_or_none(share) if ok else None, "ci_low": lo, "ci_high": hi,
                      "forward": finite_or_none(fwd) if ok else None, "mirror": finite_or_none(mir) if ok else None,
                      "kind": FEATURES[f][0]}
    return out


def verdict(attribution: dict, rev: dict, gap_ci: tuple = (None, None)) -> dict:
    """The verdict: whether the flip is there, which features drive it, and one sentence.

    The flip is reproduced when the two original effects (as simulated here) have opposite signs.
    When the gap's interval `gap_ci` contains 0 there is nothing to attribute (kind "no gap").
    Otherwise a feature drives the gap when its share >= 0.5 and its interval lies above 0, and
    contributes when its interval lies above 0 with a smaller share.
    """
    ea, eb = rev["condition_a"].get("median_effect"), rev["condition_b"].get("median_effect")
    flip = ea is not None and eb is not None and ea * eb < 0
    lo, hi = gap_ci
    no_gap = lo is None or hi is None or lo <= 0 <= hi
    x, y = rev["condition_a"]["source"], rev["condition_b"]["source"]
    head = (f"{rev['scheduler_a']} vs {rev['scheduler_b']} on {rev['metric']} at {rev['region']} "
            f"({x} {_sgn(ea)}, {y} {_sgn(eb)})")
    stored = [rev[c].get("store_effect") for c in ("condition_a", "condition_b")]
    store_note = (f"; the store had {x} {_sgn(stored[0])}, {y} {_sgn(stored[1])}" if None not in stored
                  and (stored[0] != ea or stored[1] != eb) else "")
    rule = (f"a feature drives the flip when its share >= {DRIVER_SHARE:g} and its 95% interval lies above 0; it "
            "contributes when the interval lies above 0 with a smaller share; no driver = no single feature (an "
            "interaction); nothing is attributed when the interval of the gap between the two effects contains 0")
    if no_gap:
        g = (f"[{lo:+.3f}, {hi:+.3f}]" if lo is not None and hi is not None else "undefined")
        return {"kind": "no gap", "flip_reproduced": bool(flip), "drivers": [], "contributors": [],
                "sentence": f"{head}: the two effects do not differ here (interval of the gap {g}), so there is "
                            f"nothing to attribute{store_note}.", "rule": rule}
    drivers = [f for f, a in attribution.items() if a["share"] is not None and a["ci_low"] is not None
               and a["share"] >= DRIVER_SHARE and a["ci_low"] > 0]
    contributors = [f for f, a in attribution.items() if f not in drivers and a["ci_low"] is not None
                    and a["share"] is not None and a["ci_low"] > 0]
    what = "the flip" if flip else "the gap (no flip here: both effects have the same sign)"

    def _ci(a):
        return f"{whole_pct(a['share'])} [{whole_pct(a['ci_low'])}, {whole_pct(a['ci_high'])}]"

    def _desc(f):
        return f"{_ACTIONS[f]} closes {_ci(attribution[f])}"

    if drivers:
        groups = list(dict.fromkeys(GROUPS[f] for f in drivers))
        kind = "single feature" if len(groups) == 1 else "several features"
        sentence = (f"{head}: {what} follows the {' and the '.join(groups)} -- "
                    + "; ".join(_desc(f) for f in sorted(drivers, key=lambda f: -attribution[f]["share"]))
                    + " of the gap")
        rest = [f for f in attribution if f not in drivers and attribution[f]["share"] is not None]
        if rest:
            sentence += " (" + ", ".join(f"{f} {whole_pct(attribution[f]['share'])}" for f in rest) + ")"
    else:
        kind = "interaction"
        known = [f for f in attribution if attribution[f]["share"] is not None]
        top = max(known, key=lambda f: attribution[f]["share"]) if known else None
        largest = f" (largest: {top} {_ci(attribution[top])})" if top and attribution[top]["ci_low"] is not None else ""
        sentence = (f"{head}: no single feature -- no transplant closes half of {what} with an interval above 0"
                    f"{largest}; it comes from an interaction of features or from what no variant changes")
    return {"kind": kind, "flip_reproduced": bool(flip), "drivers": drivers, "contributors": contributors,
            "sentence": sentence + store_note + ".", "rule": rule}


def _sgn(v) -> str:
    return "n/a" if v is None else f"{v:+.3f}"

