"""Why does a ranking flip? Counterfactual (hybrid) windows that name the traffic feature behind a reversal.

A cross-source reversal says: at region R, on metric M, scheduler A beats B on source X's windows
and loses to it on source Y's (or the other way). `explain_reversal` builds *variants* of X's
windows that take exactly one feature from Y and keep everything else, brings each to R's load by
the same capacity scaling as every corpus window, runs A and B on them, and measures how much of
the X-to-Y effect difference each transplant closes. The mirror variants (Y's windows with X's
feature) are run too, so each share is estimated from both ends.

Variants (`FEATURES`; a variant is a recipe (feature, base window, donor window, seed) with a
sha256, built by `build_variant`, deterministic):

``arrival``     the donor's inter-arrival gaps (consecutive, from its first request, tiled when the
                donor is shorter), rescaled so the base window keeps its own span and so its own
                mean rate, carrying the base window's requests in their order.
``input``       input lengths resampled from the donor's marginal, rank for rank (the base
``output``      request with the q-th smallest length gets the donor's q-quantile), so the base
                window's input/output coupling and arrival order are kept.
``coupling``    (control) the base window's input and output lengths, each independently permuted:
                marginals kept, coupling removed.
``burstiness``  (control) the base window's requests with Poisson arrivals at its own rate
                (exponential gaps, normalised to the base span).
``clients``     the donor's client ids (in order, tiled), only for a client-aware pair (vtc).
``clients_removed``  (control) no client ids, only for a client-aware pair.

Effects are computed exactly as the analysis does: per window the effect of A over B is
`schedport.analysis.portability.relative_effect` (or the absolute difference for a bounded metric,
`metric_is_bounded`) times the metric's direction, the condition's effect is the median over the
windows of the store's complete block, and its interval is the 2.5-97.5 percentile of the medians
over the analysis's own window resamples (`schedport.analysis.studyform.boot_wilcoxon`, drawn from the same
seeded generator in the same order as `compute_portability`, so the original conditions' resamples
are the analysis's).

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
drives it. Method and limits: docs/explain.md.

Runs go through the sweep's executors (`schedport.study.sweep.make_executor`: a local process pool or
Ray) with the sweep's own tasks (`measure_capacity`, `run_chunk`). Every finished run is one JSON
file under ``CACHE/cells/`` named by the sha256 of (variant content, scheduler, rho, seed, engine
hash, code fingerprint), written atomically, so a rerun (or another reversal over the same
windows) skips it; variant windows are kept as Parquet under ``CACHE/variants/`` with their recipe.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import typer

from schedport.errors import SchedportError, read_json
from schedport.common.guard import store_identity
from schedport.common.outputs import parse_out_path
from schedport.workload.trace import Trace

__all__ = ["FEATURES", "Variant", "build_variant", "transplant_arrivals", "poisson_arrivals",
           "resample_marginal", "decouple_lengths", "paired_effects", "attribute", "verdict",
           "ranked_reversals", "Explainer", "explain", "explain_top", "add_explanations", "explain_command",
           "render_section"]

#: feature -> (kind, description). "transplant" takes the feature from the other source, "control"
#: removes the base window's own structure (applied to both sources).
FEATURES: dict[str, tuple[str, str]] = {
    "arrival": ("transplant", "inter-arrival pattern (normalised to the base window's mean rate)"),
    "burstiness": ("control", "Poisson arrivals at the base window's own rate"),
    "input": ("transplant", "input lengths (rank-preserving resampling of the donor's marginal)"),
    "output": ("transplant", "output lengths (rank-preserving resampling of the donor's marginal)"),
    "coupling": ("control", "input and output lengths independently permuted (coupling removed)"),
    "clients": ("transplant", "client ids (the donor's, in order)"),
    "clients_removed": ("control", "client ids removed"),
}
#: What a feature is about, for the verdict sentence.
GROUPS = {"arrival": "arrival process", "burstiness": "arrival process", "input": "input lengths",
          "output": "output lengths", "coupling": "length coupling", "clients": "client structure",
          "clients_removed": "client structure"}
#: How each feature's variant reads in the verdict sentence.
_ACTIONS = {"arrival": "taking the other source's arrival pattern", "burstiness": "giving both sides Poisson arrivals",
            "input": "taking the other source's input lengths", "output": "taking the other source's output lengths",
            "coupling": "decoupling input and output lengths on both sides",
            "clients": "taking the other source's client ids", "clients_removed": "removing client ids on both sides"}
#: How a control variant is named ("azure with Poisson arrivals").
_CONTROL_NAMES = {"burstiness": "Poisson arrivals", "coupling": "decoupled lengths", "clients_removed": "no client ids"}
#: Schedulers whose decisions read client ids (their pairs get the client variants).
CLIENT_AWARE = frozenset({"vtc"})
DRIVER_SHARE = 0.5
RECIPE_VERSION = 1
DEFAULT_BOOT = 1000


# ============================================================================ variants (pure)


def transplant_arrivals(base: Trace, donor: Trace) -> np.ndarray:
    """Arrival times for `base`'s requests with `donor`'s inter-arrival pattern at `base`'s mean rate.

    The donor's consecutive gaps (tiled when it has fewer) are scaled so the result spans exactly
    `base`'s span from `base`'s first arrival: the offered rate (n - 1) / span is `base`'s, only the
    pattern (bursts, lulls, periodicity) is the donor's.
    """
    n = len(base)
    gaps = np.diff(np.asarray(donor.arrival_s, dtype=np.float64))
    if n < 2:
        return np.array(base.arrival_s, dtype=np.float64)
    if gaps.size == 0 or not gaps.sum() > 0:
        raise SchedportError(f"{donor.name}: its arrivals span no time, so it has no inter-arrival pattern "
                             f"to transplant")
    g = np.tile(gaps, -(-(n - 1) // gaps.size))[: n - 1]
    if not g.sum() > 0:
        g = np.resize(gaps[gaps > 0], n - 1)  # the first gaps all zero: use the donor's nonzero ones
    g = g * (base.span_s / g.sum())
    return _arrivals_from_gaps(float(base.arrival_s[0]), g, base.span_s)


def poisson_arrivals(base: Trace, rng: np.random.Generator) -> np.ndarray:
    """Arrival times for `base`'s requests as a Poisson process at `base`'s rate (its span kept)."""
    n = len(base)
    if n < 2:
        return np.array(base.arrival_s, dtype=np.float64)
    g = rng.exponential(1.0, n - 1)
    g = g * (base.span_s / g.sum())
    return _arrivals_from_gaps(float(base.arrival_s[0]), g, base.span_s)


def _arrivals_from_gaps(start: float, gaps: np.ndarray, span: float) -> np.ndarray:
    arr = start + np.concatenate([[0.0], np.cumsum(gaps)])
    arr[-1] = start + span  # no rounding drift: the span (and so the offered rate) is exact
    return np.maximum.accumulate(arr)


def resample_marginal(values: np.ndarray, donor_values: np.ndarray) -> np.ndarray:
    """`values` replaced rank for rank by quantiles of `donor_values`' marginal.

    The i-th smallest of n values (ties in order of position) becomes the donor's empirical
    quantile at (i + 1/2) / n, so the ordering of `values` -- and with it their coupling to any
    other column -- is kept while the distribution becomes the donor's.
    """
    v = np.asarray(values)
    d = np.sort(np.asarray(donor_values))
    n, m = len(v), len(d)
    ranks = np.empty(n, dtype=np.int64)
    ranks[np.argsort(v, kind="stable")] = np.arange(n)
    idx = np.minimum(((ranks + 0.5) / n * m).astype(np.int64), m - 1)
    return d[idx]


def decouple_lengths(base: Trace, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`base`'s input and output lengths, each shuffled by its own permutation (coupling removed)."""
    n = len(base)
    return base.input_tokens[rng.permutation(n)], base.output_tokens[rng.permutation(n)]


def _tiled_clients(base: Trace, donor: Trace):
    if donor.client_id is None:
        return None
    n = len(base)
    c = np.asarray(donor.client_id, dtype=object)
    return np.resize(c, n)


@dataclass(frozen=True)
class Variant:
    """A variant recipe: `feature` applied to window `base` (with `donor`'s feature for a transplant)."""

    feature: str
    base: str
    base_sha256: str
    donor: Optional[str] = None
    donor_sha256: Optional[str] = None
    seed: int = 0

    def recipe(self) -> dict:
        """The recipe as a JSON-safe dict (what `recipe_sha256` hashes)."""
        return {"version": RECIPE_VERSION, "feature": self.feature, "base": self.base,
                "base_sha256": self.base_sha256, "donor": self.donor, "donor_sha256": self.donor_sha256,
                "seed": int(self.seed)}

    def recipe_sha256(self) -> str:
        """sha256 of the canonical JSON of the recipe: the variant's identity before it is built."""
        return hashlib.sha256(json.dumps(self.recipe(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def rng(self) -> np.random.Generator:
        """The generator of a control's random draws, seeded from the recipe (stable across runs)."""
        h = hashlib.sha256(f"schedport-explain:{self.seed}:{self.feature}:{self.base_sha256}".encode())
        return np.random.default_rng(int.from_bytes(h.digest()[:8], "big"))


def build_variant(variant: Variant, base: Trace, donor: Optional[Trace] = None) -> Trace:
    """The variant window of `variant` built from the base window (and the donor for a transplant).

    ``original`` returns the base window itself. Deterministic: the same recipe and windows give
    a trace with the same content sha256.
    """
    f = variant.feature
    name = f"{base.name}+{f}" + (f"<{donor.name}" if donor is not None else "")
    arr, ins, outs, cl = base.arrival_s, base.input_tokens, base.output_tokens, base.client_id
    if f == "original":
        return base
    if f not in FEATURES:
        raise SchedportError(f"unknown variant feature {f!r} (known: {', '.join(FEATURES)})")
    if FEATURES[f][0] == "transplant" and donor is None:
        raise SchedportError(f"variant {f!r} of {base.name} needs a donor window")
    if f == "arrival":
        arr = transplant_arrivals(base, donor)
    elif f == "burstiness":
        arr = poisson_arrivals(base, variant.rng())
    elif f == "input":
        ins = resample_marginal(base.input_tokens, donor.input_tokens)
    elif f == "output":
        outs = resample_marginal(base.output_tokens, donor.output_tokens)
    elif f == "coupling":
        ins, outs = decouple_lengths(base, variant.rng())
    elif f == "clients":
        cl = _tiled_clients(base, donor)
    elif f == "clients_removed":
        cl = None
    return Trace.from_arrays(arr, ins, outs, cl, name=name, source=name)


# ============================================================================ effects (as the analysis)


def paired_effects(a: np.ndarray, b: np.ndarray, metric: str) -> np.ndarray:
    """Per-window effect of A over B on `metric`, the analysis's formula (positive = A better).

    Relative effect d * (A - B) / ((|A| + |B|) / 2) (`analysis.relative_effect`), or for a
    bounded metric (`analysis.metric_is_bounded`) the absolute difference d * (A - B); NaN where
    either is NaN.
    """
    from schedport.analysis.portability import metric_direction, metric_is_bounded, relative_effect

    d = metric_direction(metric)
    if d is None:
        raise SchedportError(f"--metric: {metric!r} has no known direction (better = higher or lower?)")
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if metric_is_bounded(metric):
        return np.where(np.isfinite(a) & np.isfinite(b), d * (a - b), np.nan)
    return relative_effect(a, b, d)


def _medians(rows: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Point medians (N,) and resampled medians (B, N) of per-window effect rows (N, W)."""
    from schedport.analysis.studyform import boot_wilcoxon

    rows = np.atleast_2d(np.asarray(rows, dtype=np.float64))
    point = np.array([np.nanmedian(r) if np.isfinite(r).any() else np.nan for r in rows])
    _, med_b = boot_wilcoxon(rows, counts)
    return point, med_b


def _interval(boot: np.ndarray) -> tuple[Optional[float], Optional[float]]:
    b = np.asarray(boot, dtype=np.float64)
    b = b[np.isfinite(b)]
    if b.size == 0:
        return None, None
    lo, hi = np.percentile(b, [2.5, 97.5])
    return float(lo), float(hi)


def _f(x) -> Optional[float]:
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
            lo, hi = _interval(share_b) if ok else (None, None)
            out[f] = {"share": _f(share) if ok else None, "ci_low": lo, "ci_high": hi,
                      "forward": _f(fwd) if ok else None, "mirror": _f(mir) if ok else None,
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
        return f"{_pc(a['share'])} [{_pc(a['ci_low'])}, {_pc(a['ci_high'])}]"

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
            sentence += " (" + ", ".join(f"{f} {_pc(attribution[f]['share'])}" for f in rest) + ")"
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


# ============================================================================ reversals of the study form


def read_portability(results: str | os.PathLike[str], hint: str = "") -> dict:
    """The analysis (`portability.json`) of a results store, which numbers its reversals; missing
    or unreadable, a one-line error saying to run `schedport analyze` (then `hint`)."""
    p = Path(results) / "portability.json"
    if not p.is_file():
        raise SchedportError(f"{p}: missing; run `schedport analyze --results {results}`{hint}")
    res = read_json(p)
    if not isinstance(res, dict):
        raise SchedportError(f"{p}: expected a JSON object (the analysis of a results store)")
    mpath = Path(results) / "manifest.json"
    if "store" in res and mpath.is_file():
        man = read_json(mpath)
        if isinstance(man, dict) and res["store"] != store_identity(man):
            raise SchedportError(f"{p}: is the analysis of another results store (created "
                                 f"{(res['store'] or {}).get('created')}, this one {man.get('created')}); "
                                 f"run `schedport analyze --results {results}`{hint}")
    return res


def ranked_reversals(res: dict) -> list[dict]:
    """The study form's cross-source reversals (every main metric), strongest first, numbered from 1.

    Strength is the smaller |median effect| of the two conditions over the metric's practical
    threshold (the pooled table's order). Each entry: ``id``, ``metric``, ``scheduler_a``,
    ``scheduler_b`` (the first name of each side of a duplicate class), ``pair``, ``region``,
    ``source_a``, ``source_b``, ``effect_a``, ``effect_b``, ``strength``.
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
    out.sort(key=lambda d: (-d["strength"], d["metric"], d["pair"], d["region"], d["source_a"]))
    for i, d in enumerate(out, 1):
        d["id"] = i
    return out


# ============================================================================ the runner


def _cell_key(content_sha: str, scheduler: str, rho: float, seed: int, anchor_hash: str, code: str) -> str:
    """The cache name of one run: `anchor_hash` is the engine hash under the region definition
    (`RegionDefinition.cache_hash`), since one rho is another time scale under another one."""
    text = json.dumps([content_sha, scheduler, repr(float(rho)), int(seed), anchor_hash, code])
    return hashlib.sha256(text.encode()).hexdigest()


def _cell_checksum(cell: dict) -> str:
    """The sha256 sealing one cached run: its identity (variant, scheduler, rho, seed, engine) and
    every number of its summary, so an edited or damaged cell is recomputed, never believed."""
    body = {k: cell.get(k) for k in ("content_sha256", "scheduler", "rho", "seed", "engine_hash", "summary")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=True, separators=(",", ":")).encode()).hexdigest()


def _read_cell(path: Path, sha: str, sched: str, rho: float, seed: int, engine_hash: str) -> dict | None:
    """The summary of a cached cell that is exactly the run asked for and passes its checksum;
    None for anything else (missing, unreadable, edited, another run's)."""
    try:
        cell = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(cell, dict) and isinstance(cell.get("summary"), dict)
            and cell.get("sha256") == _cell_checksum(cell)):
        return None
    if (cell.get("content_sha256"), cell.get("scheduler"), cell.get("rho"), cell.get("seed"),
            cell.get("engine_hash")) != (sha, sched, float(rho), int(seed), engine_hash):
        return None
    return cell["summary"]


def _write_json_atomic(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, allow_nan=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _burst_sha(trace: Trace) -> str:
    """sha256 of the trace as its capacity sees it (every request at time 0): capacity is a
    function of exactly this (`api.capacity`), so variants that only move arrivals share it."""
    return Trace(np.zeros(len(trace)), trace.input_tokens, trace.output_tokens, trace.client_id,
                 trace.name).content_sha256()


class Explainer:
    """One results store, its corpus and engine, and a cache of variant runs, ready to explain reversals.

    Opening it reads the store (`analysis.load_store`), the engine config recorded in its manifest,
    the corpus it was run on (``corpus_dir`` or the manifest's), and draws the analysis's window
    resamples. `explain_reversal` then builds, runs and attributes one reversal; `close` shuts
    the executor down.
    """

    def __init__(self, results_dir, *, corpus_dir=None, cache_dir=None, executor: str = "local",
                 workers: Optional[int] = None, ray_address: Optional[str] = None, n_boot: int = DEFAULT_BOOT,
                 seed: int = 0, progress: bool = True, console=None):
        from schedport.analysis.portability import window_key, load_store
        from schedport.engine.config import engine_config_from_dict
        from schedport.workload.corpus import load_corpus
        from schedport.study.regions import LEGACY_DRAIN, parse_region_def
        from schedport.study.sweep import code_fingerprint

        if n_boot < 1:
            raise SchedportError(f"--boot must be at least 1, got {n_boot}")
        self.results = Path(results_dir)
        df, manifest = load_store(self.results)
        self.df, self.manifest = df, manifest
        ec = manifest.get("engine_config")
        if not isinstance(ec, dict):
            raise SchedportError(f"{self.results / 'manifest.json'}: records no engine_config")
        self.cfg = engine_config_from_dict(ec, source=str(self.results / "manifest.json"))
        self.engine_hash = self.cfg.config_hash()
        cdir = corpus_dir if corpus_dir is not None else manifest.get("corpus_dir")
        if cdir is None:
            raise SchedportError(f"{self.results}: the store names no corpus; give --corpus DIR")
        cdir = Path(cdir)
        if not (cdir / "manifest.json").is_file() and not cdir.is_absolute():
            cdir = self.results / cdir
        self.corpus = load_corpus(cdir)
        if manifest.get("corpus_sha256") and self.corpus.corpus_sha256 != manifest["corpus_sha256"]:
            raise SchedportError(f"{cdir}: corpus {self.corpus.corpus_sha256[:12]} is not the store's "
                                 f"({str(manifest['corpus_sha256'])[:12]}); give the corpus it was run on")
        sel = manifest.get("selectors") if isinstance(manifest.get("selectors"), dict) else {}
        self.region_def = parse_region_def(sel.get("region_def", LEGACY_DRAIN), list(self.cfg.slo_profiles))
        self.cap_hash = self.region_def.cache_hash(self.engine_hash)
        self.code = code_fingerprint()
        self.seeds = sorted(int(s) for s in df["seed"].unique())
        rho = df.groupby("region")["rho"].median() if "rho" in df.columns else {}
        self.rho = {str(k): float(v) for k, v in dict(rho).items()}
        self.schedulers = sorted(df["scheduler"].astype(str).unique())
        self.sources = sorted(df["source"].astype(str).unique())
        self.windows = {s: sorted(df.loc[df["source"] == s, "window_id"].unique(), key=window_key)
                        for s in self.sources}
        # the analysis's window resamples: one generator, sources in sorted order
        rng = np.random.default_rng(seed)
        self.counts = {s: rng.multinomial(len(self.windows[s]), np.full(len(self.windows[s]),
                                                                      1.0 / len(self.windows[s])),
                                          size=int(n_boot)).astype(np.float64) for s in self.sources}
        self.n_boot, self.seed = int(n_boot), int(seed)
        self.cache = Path(cache_dir) if cache_dir is not None else self.results / "explain"
        self.executor, self.workers, self.ray_address = executor, workers, ray_address
        self.progress, self.console = progress, console
        self._ex = None
        self._traces: dict[str, Trace] = {}
        self._store_caps = self._read_store_capacities()
        self.timings = {"runs": 0, "capacities": 0, "cached_cells": 0, "refused_cells": 0}

    # ---------------------------------------------------------------- inputs

    def _read_store_capacities(self) -> dict:
        from schedport.study.regions import capacity_cache

        p = self.results / "capacity.json"
        if not p.is_file():
            return {}
        return dict(capacity_cache(p).entries)

    def trace(self, window_id: str) -> Trace:
        """A corpus window's trace (read once)."""
        if window_id not in self._traces:
            w = self.corpus.window(window_id)
            t = self.corpus.trace(window_id)
            if t.content_sha256() != w.sha256:
                raise SchedportError(f"{self.corpus.root}: window {window_id} does not match its manifest sha256 "
                                     "(run `schedport corpus verify`)")
            self._traces[window_id] = t
        return self._traces[window_id]

    def block(self, source: str, region: str) -> list[str]:
        """The windows of `source` in which every scheduler has a result at `region` (the analysis's block)."""
        sub = self.df[(self.df["source"] == source) & (self.df["region"] == region)]
        per = sub.groupby("window_id")["scheduler"].nunique()
        return [w for w in self.windows[source] if per.get(w, 0) == len(self.schedulers)]

    def resolve(self, *, reversal: Optional[int] = None, pair: Optional[str] = None, metric: Optional[str] = None,
                region: Optional[str] = None, sources: Optional[str] = None,
                portability: Optional[dict] = None) -> dict:
        """The reversal to explain: by its number in `ranked_reversals` or by pair, metric, region and sources."""
        if reversal is not None:
            if any(v is not None for v in (pair, metric, region, sources)):
                raise SchedportError("give either --reversal or --pair/--metric/--region/--sources, not both")
            res = portability if portability is not None else self._portability()
            items = ranked_reversals(res)
            if not items:
                raise SchedportError(f"{self.results}: the study form has no reversal to explain")
            if not (1 <= int(reversal) <= len(items)):
                raise SchedportError(f"--reversal: {reversal} is not between 1 and {len(items)} (the study form's "
                                     "reversals; `schedport explain --list` shows them)")
            it = items[int(reversal) - 1]
            out = self._reversal(it["scheduler_a"], it["scheduler_b"], it["metric"], it["region"], it["source_a"],
                                 it["source_b"])
            out.update(id=it["id"], pair_label=it["pair"])
            out["condition_a"]["store_effect"] = it["effect_a"]
            out["condition_b"]["store_effect"] = it["effect_b"]
            return out
        missing = [n for n, v in (("--pair", pair), ("--metric", metric), ("--region", region),
                                  ("--sources", sources)) if not v]
        if missing:
            raise SchedportError(f"give --reversal ID, or all of --pair A,B --metric M --region R --sources X,Y "
                                 f"(missing {', '.join(missing)})")
        ab = [s.strip() for s in pair.split(",") if s.strip()]
        xy = [s.strip() for s in sources.split(",") if s.strip()]
        if len(ab) != 2 or ab[0] == ab[1]:
            raise SchedportError(f"--pair: expected two different schedulers A,B, got {pair!r}")
        if len(xy) != 2 or xy[0] == xy[1]:
            raise SchedportError(f"--sources: expected two different sources X,Y, got {sources!r} (explain compares "
                                 "two sources at one region, as the study form's reversals do)")
        return self._reversal(ab[0], ab[1], metric.strip(), region.strip(), xy[0], xy[1])

    def _portability(self) -> dict:
        return read_portability(self.results, " first, or give --pair/--metric/--region/--sources")

    def _reversal(self, a: str, b: str, metric: str, region: str, x: str, y: str) -> dict:
        from schedport.analysis.portability import metric_direction, metric_is_bounded

        for s in (a, b):
            if s not in self.schedulers:
                raise SchedportError(f"--pair: scheduler {s!r} is not in the store (has: {', '.join(self.schedulers)})")
        for s in (x, y):
            if s not in self.sources:
                raise SchedportError(f"--sources: source {s!r} is not in the store (has: {', '.join(self.sources)})")
        if region not in self.rho:
            raise SchedportError(f"--region: {region!r} is not in the store (has: {', '.join(self.rho)})")
        if metric not in self.df.columns or metric_direction(metric) is None:
            raise SchedportError(f"--metric: {metric!r} is not a ranked metric of the store")
        return {"scheduler_a": a, "scheduler_b": b, "metric": metric, "region": region, "rho": self.rho[region],
                "effect_scale": "absolute" if metric_is_bounded(metric) else "relative",
                "condition_a": {"source": x, "region": region}, "condition_b": {"source": y, "region": region}}

    # ---------------------------------------------------------------- variants

    def features_for(self, rev: dict, features: Optional[Sequence[str]] = None) -> list[str]:
        """The features explained for a reversal: all but the client variants, which need a client-aware pair."""
        if features is not None:
            bad = [f for f in features if f not in FEATURES]
            if bad:
                raise SchedportError(f"--features: unknown {', '.join(bad)} (known: {', '.join(FEATURES)})")
            return list(features)
        aware = bool({rev["scheduler_a"], rev["scheduler_b"]} & CLIENT_AWARE)
        return [f for f in FEATURES if aware or not f.startswith("clients")]

    def variants(self, side_windows: list[str], donor_windows: list[str], feature: str) -> list[Variant]:
        """One variant per base window: window i takes its donor feature from donor window i mod n."""
        out = []
        for i, w in enumerate(side_windows):
            bw = self.corpus.window(w)
            if feature == "original":
                out.append(Variant("original", w, bw.sha256, seed=self.seed))
            elif FEATURES[feature][0] == "transplant":
                d = donor_windows[i % len(donor_windows)]
                out.append(Variant(feature, w, bw.sha256, d, self.corpus.window(d).sha256, self.seed))
            else:
                out.append(Variant(feature, w, bw.sha256, seed=self.seed))
        return out

    def variant_trace(self, v: Variant) -> tuple[Trace, dict]:
        """The variant's window (cached as Parquet under CACHE/variants/) and its record."""
        from schedport.workload.trace import load_trace, save_trace

        base = self.trace(v.base)
        if v.feature == "original":
            return base, {"recipe_sha256": v.recipe_sha256(), "content_sha256": base.content_sha256()}
        rsha = v.recipe_sha256()
        path = self.cache / "variants" / f"{rsha[:24]}.parquet"
        meta = path.with_suffix(".json")
        t = None
        if path.is_file() and meta.is_file():
            try:
                rec = json.loads(meta.read_text())
                t = load_trace(path)
                if t.content_sha256() != rec.get("content_sha256") or rec.get("recipe") != v.recipe():
                    t = None
            except (OSError, ValueError, SchedportError):
                t = None
        if t is None:
            donor = self.trace(v.donor) if v.donor else None
            t = build_variant(v, base, donor)
            path.parent.mkdir(parents=True, exist_ok=True)
            save_trace(t, path)
            _write_json_atomic(meta, {"recipe": v.recipe(), "recipe_sha256": rsha,
                                      "content_sha256": t.content_sha256()})
        return t, {"recipe_sha256": rsha, "content_sha256": t.content_sha256()}

    # ---------------------------------------------------------------- running

    def _executor(self):
        if self._ex is None:
            from schedport.study.sweep import make_executor

            w = int(self.workers) if self.workers is not None else (os.cpu_count() or 1)
            if w < 1:
                raise SchedportError(f"--workers must be at least 1, got {w}")
            self._ex = make_executor(self.executor, w, self.ray_address)
        return self._ex

    def close(self, cancel: bool = False) -> None:
        """Shut the executor down (worker processes or the local Ray instance); `cancel` stops
        running and queued runs at once (after an error or Ctrl-C: finished runs are already cached)."""
        if self._ex is not None:
            self._ex.shutdown(cancel=cancel)
            self._ex = None

    def run_cells(self, jobs: list[tuple[Trace, str, str]], rho: float, label: str = "runs") -> dict:
        """Summaries of every (trace, content sha, scheduler) at `rho` and every store seed: cached, or run.

        Capacities are taken from the store's capacity.json for corpus windows, shared by variants
        whose requests are the same (only arrivals moved), else measured (`sweep.measure_capacity`);
        runs go to `sweep.run_chunk`, one task per (window, scheduler). Each finished run is written
        at once to its own cell file. Returns {(content sha, scheduler, seed): summary}.
        """
        from schedport.study.regions import THROUGHPUT_KINDS, capacity_cache
        from schedport.study.sweep import progress_display, measure_capacity, run_chunk

        out: dict = {}
        todo: dict = {}
        for trace, sha, sched in jobs:
            for seed in self.seeds:
                key = _cell_key(sha, sched, rho, seed, self.cap_hash, self.code)
                p = self.cache / "cells" / key[:2] / f"{key}.json"
                if (sha, sched, seed) in out or seed in todo.get((sha, sched), (None, ()))[1]:
                    continue
                if p.is_file():
                    summary = _read_cell(p, sha, sched, rho, seed, self.engine_hash)
                    if summary is not None:
                        out[(sha, sched, seed)] = summary
                        self.timings["cached_cells"] += 1
                        continue
                    self.timings["refused_cells"] += 1
                todo.setdefault((sha, sched), (trace, []))[1].append(seed)
        if not todo:
            return out
        cache = capacity_cache(self.cache / "capacity.json")
        throughput = self.region_def.kind in THROUGHPUT_KINDS   # depends on the mix alone
        caps: dict = {}
        need_cap: dict = {}
        for (sha, _), (trace, _) in todo.items():
            if sha in caps or sha in need_cap:
                continue
            ck = _burst_sha(trace) if throughput else sha
            c = cache.get(ck, self.cap_hash)
            if c is None:
                c = self._store_caps.get(f"{sha}:{self.cap_hash}")
                if c is not None and throughput:
                    cache.put(ck, self.cap_hash, c)
            if c is None:
                need_cap[sha] = (trace, ck)
            else:
                caps[sha] = c
        ex = self._executor()
        cfg_ref = ex.put(self.cfg)
        with progress_display(self.progress, self.console) as bar:
            if need_cap:
                by_key: dict = {}
                for sha, (trace, ck) in need_cap.items():
                    by_key.setdefault(ck, []).append((sha, trace))
                task = bar.add_task("capacities", total=len(by_key))
                handles = {ex.submit(measure_capacity, ex.put(v[0][1]), cfg_ref, self.region_def.spec): ck
                           for ck, v in by_key.items()}
                for h, res in ex.as_completed(list(handles), tick=1.0):
                    if h is None:
                        bar.refresh()
                        continue
                    ck = handles[h]
                    cache.put(ck, self.cap_hash, res[0])
                    for sha, _ in by_key[ck]:
                        caps[sha] = res[0]
                    self.timings["capacities"] += 1
                    bar.advance(task)
                cache.save()
            task = bar.add_task(label, total=sum(len(s) for _, s in todo.values()))
            handles = {}
            for (sha, sched), (trace, seeds) in todo.items():
                cells = [("explain", float(rho), s) for s in seeds]
                h = ex.submit(run_chunk, ex.put(trace), cfg_ref, sched, ("variant", trace.name, sha, caps[sha]), cells,
                              False)
                handles[h] = (sha, sched)
            for h, res in ex.as_completed(list(handles), tick=1.0):
                if h is None:
                    bar.refresh()
                    continue
                sha, sched = handles[h]
                rows = res[0]
                for row in rows:
                    seed = int(row["seed"])
                    summary = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                    key = _cell_key(sha, sched, rho, seed, self.cap_hash, self.code)
                    cell = {"content_sha256": sha, "scheduler": sched, "rho": float(rho), "seed": seed,
                            "engine_hash": self.engine_hash, "summary": summary}
                    cell["sha256"] = _cell_checksum(cell)
                    _write_json_atomic(self.cache / "cells" / key[:2] / f"{key}.json", cell)
                    out[(sha, sched, seed)] = summary
                    self.timings["runs"] += 1
                bar.advance(task, len(rows))
        return out

    # ---------------------------------------------------------------- one reversal

    def explain_reversal(self, rev: dict, features: Optional[Sequence[str]] = None) -> dict:
        """Build the variants of one reversal, run A and B on them, and attribute the gap (the JSON contract)."""
        t0 = time.perf_counter()
        runs0, caps0, cached0, refused0 = (self.timings[k] for k in ("runs", "capacities", "cached_cells",
                                                                     "refused_cells"))
        feats = self.features_for(rev, features)
        A, B, metric, region = rev["scheduler_a"], rev["scheduler_b"], rev["metric"], rev["region"]
        x, y = rev["condition_a"]["source"], rev["condition_b"]["source"]
        full = {s: self.windows[s] for s in (x, y)}
        block = {s: self.block(s, region) for s in (x, y)}
        for s in (x, y):
            if len(block[s]) < 2:
                raise SchedportError(f"{s} @ {region}: {len(block[s])} window(s) with every scheduler's result; "
                                     "explain needs at least 2")
        other = {x: y, y: x}
        plan = []  # (side, feature, [(window position, Variant)])
        for side, s in (("x", x), ("y", y)):
            for f in ["original"] + feats:
                vs = self.variants(block[s], block[other[s]], f)
                plan.append((side, s, f, vs))
        jobs, records = [], []
        built = {}
        for side, s, f, vs in plan:
            for v in vs:
                t, rec = self.variant_trace(v)
                built[(side, f, v.base)] = rec["content_sha256"]
                for sched in (A, B):
                    jobs.append((t, rec["content_sha256"], sched))
                if f != "original":
                    records.append({"variant": _variant_name(s, f, other[s]), "window_id": v.base,
                                    "donor_window": v.donor, **rec})
        summaries = self.run_cells(jobs, rev["rho"])

        effects_out, eff = [], {}
        for side, s, f, vs in plan:
            W = len(full[s])
            pos = {w: i for i, w in enumerate(full[s])}
            a_vals, b_vals = np.full(W, np.nan), np.full(W, np.nan)
            for v in vs:
                sha = built[(side, f, v.base)]
                a_vals[pos[v.base]] = np.mean([_num(summaries[(sha, A, sd)].get(metric)) for sd in self.seeds])
                b_vals[pos[v.base]] = np.mean([_num(summaries[(sha, B, sd)].get(metric)) for sd in self.seeds])
            rows = paired_effects(a_vals, b_vals, metric)
            point, med_b = _medians(rows[None, :], self.counts[s])
            eff[(side, f)] = (float(point[0]), med_b[:, 0])
            lo, hi = _interval(med_b[:, 0])
            donor = other[s] if f != "original" and FEATURES[f][0] == "transplant" else None
            effects_out.append({"variant": _variant_name(s, f, other[s]), "base": s,
                                "feature": None if f == "original" else f, "donor": donor,
                                "median_effect": _f(point[0]), "ci_low": lo, "ci_high": hi,
                                "n_windows": int(np.isfinite(rows).sum())})
        rev = dict(rev)
        rev["condition_a"] = {**rev["condition_a"], "median_effect": _f(eff[("x", "original")][0])}
        rev["condition_b"] = {**rev["condition_b"], "median_effect": _f(eff[("y", "original")][0])}
        att = attribute(eff, feats)
        gap = eff[("y", "original")][0] - eff[("x", "original")][0]
        gap_ci = _interval(eff[("y", "original")][1] - eff[("x", "original")][1])
        ver = verdict(att, rev, gap_ci)
        wall = time.perf_counter() - t0
        return {"schema": "schedport.analysis.explain/1", "reversal": rev, "effects": effects_out, "attribution": att,
                "verdict": ver, "gap": _f(gap), "gap_ci_low": gap_ci[0], "gap_ci_high": gap_ci[1],
                "method": {"effect": "median over windows of the analysis's per-window effect "
                                     f"({rev['effect_scale']}); interval: 2.5-97.5 percentile over {self.n_boot} "
                                     "window resamples (the analysis's, seed "
                                     f"{self.seed})",
                           "share_transplant": "((E_X<-f - E_X) + (E_Y - E_Y<-f)) / (2 (E_Y - E_X))",
                           "share_control": "1 - (E_Y,c - E_X,c) / (E_Y - E_X)",
                           "pairing": "base window i takes its donor feature from donor window i mod n (store order)",
                           "features": {f: FEATURES[f][1] for f in feats}},
                "variants": records,
                "run_info": {"runs": self.timings["runs"] - runs0, "capacities": self.timings["capacities"] - caps0,
                             "cached_runs": self.timings["cached_cells"] - cached0,
                             "refused_cached_runs": self.timings["refused_cells"] - refused0, "wall_s": round(wall, 2),
                             "engine_hash": self.engine_hash, "seeds": self.seeds,
                             "note": "wall time and run counts depend on what the cache already held"}}


def _num(v) -> float:
    try:
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _variant_name(source: str, feature: str, other: str) -> str:
    if feature == "original":
        return source
    if FEATURES[feature][0] == "transplant":
        return f"{source} with {other}'s {feature}"
    return f"{source} with {_CONTROL_NAMES[feature]}"


# ============================================================================ entry points


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
    from schedport.common.guard import WHAT, dir_kind

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
    """`schedport analyze --explain K` (or ``N1,N2,...``): explain those reversals, store them under ``res["explain"]``,
    and rewrite ``portability.json`` and ``report.html`` in `out_dir` with the "Why it flips" section."""
    from schedport.report.html import write_report
    from schedport.analysis.validation_stats import load_validation

    res["explain"] = explain_top(res, results_dir, k, corpus_dir=corpus_dir, executor=executor, workers=workers,
                                 progress=progress)
    odir = Path(out_dir)
    tmp = odir / "portability.json.tmp"
    tmp.write_text(json.dumps(res, indent=1, allow_nan=False))
    tmp.replace(odir / "portability.json")
    write_report(res, odir / "report.html", load_validation(validation) if validation is not None else None)
    for d in res["explain"]["explained"]:
        typer.echo(f"why #{d['reversal'].get('id')}: {d['verdict']['sentence']}")
    return res["explain"]


def explain_command(
    results: Path = typer.Option(..., "--results", parser=parse_out_path,
                                 help="Results store written by `schedport run` (read only)."),
    reversal: Optional[int] = typer.Option(None, "--reversal", help="Number of a study-form reversal, strongest "
                                                                    "first (see --list; needs portability.json)."),
    pair: Optional[str] = typer.Option(None, "--pair", help="Scheduler pair A,B (with --metric, --region, --sources)."),
    metric: Optional[str] = typer.Option(None, "--metric", help="Metric of the comparison, e.g. ttft_p99_s."),
    region: Optional[str] = typer.Option(None, "--region", help="Region of the comparison, e.g. severe."),
    sources: Optional[str] = typer.Option(None, "--sources", help="The two sources X,Y compared."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the explanation JSON here (default: print it)."),
    list_only: bool = typer.Option(False, "--list", help="List the study form's reversals with their numbers "
                                                         "and stop."),
    corpus: Optional[Path] = typer.Option(None, "--corpus", help="Corpus directory (default: the one the store "
                                                                 "names)."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Variant windows and finished runs (default: "
                                                               "RESULTS/explain); reruns skip finished runs."),
    features: Optional[str] = typer.Option(None, "--features", help=f"Comma-separated features (default: all that "
                                                                    f"apply): {', '.join(FEATURES)}."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes or local Ray CPUs (default: "
                                                                  "all cores)."),
    executor: str = typer.Option("local", "--executor", help="local (process pool) or ray."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Existing Ray cluster (with --executor "
                                                                          "ray)."),
    n_boot: int = typer.Option(DEFAULT_BOOT, "--boot", help="Window resamples for the intervals (the analysis's "
                                                            "default)."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed (the analysis's default, so resamples match)."),
) -> None:
    """Explain why a ranking flips: run the pair on hybrid windows that each take one traffic feature from the
    other source, and name the feature whose transplant reproduces the flip."""
    from schedport.common.guard import check_file_target, claim_dir
    from schedport.common.outputs import output_file

    check_results_dir(results)
    if out is not None and out.exists() and out.is_dir():
        raise SchedportError(f"--out: {out} is a directory; give a file name (FILE.json)")
    if seed < 0:
        raise SchedportError(f"--seed must be >= 0, got {seed}")
    if n_boot < 1:
        raise SchedportError(f"--boot must be at least 1, got {n_boot}")
    if features is not None and not features.strip():
        raise SchedportError("--features: empty; give feature names, or leave the option out for all")
    if out is not None:
        check_file_target(out, inputs=[results, corpus])
        output_file(out)
    if cache is not None:
        claim_dir(cache, {"explain"}, option="--cache", allow_other=False, inputs=[corpus])
    if list_only:
        revs = ranked_reversals(read_portability(results, " first"))
        for d in revs:
            typer.echo(f"{d['id']:4d}  {d['metric']:<24} {d['pair']} @ {d['region']}: {d['source_a']} "
                       f"{d['effect_a']:+.3f}, {d['source_b']} {d['effect_b']:+.3f}")
        if not revs:
            typer.echo(f"{results}: the study form finds no cross-source reversal, so there is nothing to explain")
        return
    flist = [f.strip() for f in features.split(",") if f.strip()] if features else None
    try:
        d = explain(results, reversal=reversal, pair=pair, metric=metric, region=region, sources=sources,
                    corpus_dir=corpus, cache_dir=cache, features=flist, executor=executor, workers=workers,
                    ray_address=ray_address, n_boot=n_boot, seed=seed)
    except KeyboardInterrupt:
        typer.echo("interrupted: every finished run is kept in the explain cache; rerun the same command to "
                   "resume", err=True)
        raise
    text = json.dumps(d, indent=1, allow_nan=False)
    if out is None:
        typer.echo(text)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        try:
            tmp.write_text(text + "\n")
            tmp.replace(out)
        except OSError as e:
            from schedport.common.outputs import io_error

            raise io_error(out, e) from None
        typer.echo(d["verdict"]["sentence"])
        ri = d["run_info"]
        refused = ri.get("refused_cached_runs", 0)
        typer.echo(f"{ri['runs']} runs, {ri['capacities']} capacities, {ri['cached_runs']} cached, "
                   + (f"{refused} cached runs failed their checksum and were recomputed, " if refused else "")
                   + f"{ri['wall_s']:.1f} s; wrote {out}")


# ============================================================================ the report section


def fig_effects(d: dict) -> Optional[str]:
    """A small figure: the effect under each variant with its interval (both sources' windows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from schedport.report.html import _png

    eff = [e for e in d["effects"] if e["median_effect"] is not None]
    if not eff:
        return None
    x = d["reversal"]["condition_a"]["source"]
    fig, ax = plt.subplots(figsize=(6.2, 0.28 * len(eff) + 0.9))
    ys = np.arange(len(eff))[::-1]
    for yy, e in zip(ys, eff):
        col = "#1f77b4" if e["base"] == x else "#d62728"
        lo = e["ci_low"] if e["ci_low"] is not None else e["median_effect"]
        hi = e["ci_high"] if e["ci_high"] is not None else e["median_effect"]
        ax.plot([lo, hi], [yy, yy], color=col, lw=1.5)
        ax.plot([e["median_effect"]], [yy], "o", color=col, ms=4 if e["feature"] else 6)
    ax.axvline(0, color="#444", lw=0.8)
    for e in eff:  # the two original conditions, as guides
        if e["feature"] is None:
            ax.axvline(e["median_effect"], color="#1f77b4" if e["base"] == x else "#d62728", lw=0.6, ls="--")
    ax.set_yticks(ys)
    ax.set_yticklabels([e["variant"] for e in eff], fontsize=7)
    r = d["reversal"]
    ax.set_xlabel(f"median effect of {r['scheduler_a']} over {r['scheduler_b']} on {r['metric']} "
                  f"({r['effect_scale']}; > 0: {r['scheduler_a']} better)", fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    return _png(fig)


def render_section(res: dict) -> str:
    """The report's "Why it flips" section from ``res["explain"]`` (empty when there is none)."""
    from schedport.report.html import _esc, _img

    block = res.get("explain")
    if not block:
        return ""
    parts = ["<h2 id='why'>Why it flips</h2>",
             f"<p class='sub'>{_which(block)} of the study form's {block['n_reversals']} "
             "cross-source reversals (numbered strongest first), each run on hybrid windows that take one traffic "
             "feature from the other "
             "source (arrival pattern, input or output lengths, client ids) or remove one (Poisson arrivals, "
             "decoupled lengths). A feature's share is the part of the effect gap between the two sources that its "
             "transplant closes (95% window-bootstrap interval); see docs/explain.md.</p>"]
    ids = block.get("ids") or []
    skipped = [i for i in range(1, max(ids, default=0)) if i not in set(ids)]
    if skipped:
        parts.append(f"<p class='note'>Stronger reversals not explained in this report: "
                     f"{_esc(', '.join(f'#{i}' for i in skipped))} (selected with <code>--explain "
                     f"{_esc(block.get('selection', ''))}</code>).</p>")
    if not block["explained"]:
        parts.append(f"<p>{_esc(block.get('note', 'nothing to explain'))}</p>")
    for d in block["explained"]:
        r = d["reversal"]
        rows = "".join(f"<tr><td>{_esc(f)}</td><td>{_esc(a['kind'])}</td><td>{_pc(a['share'])}</td>"
                       f"<td>[{_pc(a['ci_low'])}, {_pc(a['ci_high'])}]</td></tr>"
                       for f, a in d["attribution"].items())
        ri = d["run_info"]
        parts.append(
            f"<h3>#{_esc(r.get('id', ''))} {_esc(r['scheduler_a'])} vs {_esc(r['scheduler_b'])} on "
            f"{_esc(r['metric'])} at {_esc(r['region'])}: {_esc(r['condition_a']['source'])} vs "
            f"{_esc(r['condition_b']['source'])}</h3>"
            f"<p><b>{_esc(d['verdict']['sentence'])}</b></p>"
            + (_img(fig_effects(d), "effects under each variant") or "")
            + ("<p class='note'>Shares not shown: the interval of the gap between the two effects contains 0.</p>"
               if d["verdict"]["kind"] == "no gap" else
               "<table><tr><th>feature</th><th>kind</th><th>share of the gap</th><th>95% interval</th></tr>"
               + rows + "</table>")
            + f"<p class='sub'>{ri['runs']} runs and {ri['capacities']} capacity measurements "
              f"({ri['cached_runs']} runs from the cache) in {ri['wall_s']:.0f} s.</p>")
    return "\n".join(parts)


def _which(block: dict) -> str:
    ids = block.get("ids") or list(range(1, len(block["explained"]) + 1))
    if ids == list(range(1, len(ids) + 1)):
        return f"The {len(ids)} strongest"
    return "Reversals " + ", ".join(f"#{i}" for i in ids)


def _pc(v) -> str:
    """A share as a whole percentage ("n/a" for None; never "-0%")."""
    if v is None:
        return "n/a"
    t = f"{100 * v:.0f}"
    return ("0" if t == "-0" else t) + "%"
