"""The variants of `schedport explain`: a corpus window with one traffic feature taken from another
source's window (a transplant) or its own structure removed (a control).

Variants (`FEATURES`; a variant is a recipe (feature, base window, donor window, seed) with a
sha256, built by `build_variant`, deterministic):

``arrival``     the donor's inter-arrival gaps (consecutive, from its first request, tiled when the
                donor is shorter), rescaled so the base window keeps its own span and so its own
                mean rate, carrying the base window's requests in their order.
``input``       input lengths resampled from the donor's marginal, rank for rank (the base
``output``      request with the q-th smallest length gets the donor's q-quantile), so the base
                window's input/output coupling and arrival order are kept. Requests of equal
                length are ranked among themselves at random, seeded by the recipe: the base
                window says nothing about their order, and ranking them by position would lay
                the donor's quantiles out in arrival order -- a trend no source has (a window of
                constant outputs would get lengths growing with time, on which sjf is FCFS).
``coupling``    (control) the base window's input and output lengths, each independently permuted:
                marginals kept, coupling removed.
``burstiness``  (control) the base window's requests with Poisson arrivals at its own rate
                (exponential gaps, normalised to the base span).
``clients``     the donor's client ids (in order, tiled), only for a client-aware pair (vtc).
``clients_removed``  (control) no client ids, only for a client-aware pair.

Pure functions of their inputs: nothing here runs a simulation or reads a store.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Optional

import numpy as np

from schedport.errors import SchedportError
from schedport.workload.trace import Trace

__all__ = ["FEATURES", "CLIENT_AWARE", "RECIPE_VERSION", "Variant", "build_variant", "transplant_arrivals",
           "poisson_arrivals", "resample_marginal", "decouple_lengths", "variant_name"]

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
#: How a control variant is named ("azure with Poisson arrivals").
_CONTROL_NAMES = {"burstiness": "Poisson arrivals", "coupling": "decoupled lengths", "clients_removed": "no client ids"}
#: Schedulers whose decisions read client ids (their pairs get the client variants).
CLIENT_AWARE = frozenset({"vtc"})
#: Version of the recipe format (part of every variant's identity). 2: ties of a transplanted
#: length are ranked at random (seeded by the recipe), not by position.
RECIPE_VERSION = 2


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


def resample_marginal(values: np.ndarray, donor_values: np.ndarray,
                      rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """`values` replaced rank for rank by quantiles of `donor_values`' marginal.

    The i-th smallest of n values becomes the donor's empirical quantile at (i + 1/2) / n, so the
    ordering of `values` -- and with it their coupling to any other column -- is kept while the
    distribution becomes the donor's. Equal values are ranked among themselves by a random
    permutation from `rng` (the variant's, seeded by its recipe), since their order carries no
    information; without `rng`, by position (which turns a run of ties into a trend in time).
    """
    v = np.asarray(values)
    d = np.sort(np.asarray(donor_values))
    n, m = len(v), len(d)
    ranks = np.empty(n, dtype=np.int64)
    if rng is None:
        ranks[np.argsort(v, kind="stable")] = np.arange(n)
    else:
        ranks[np.lexsort((rng.permutation(n), v))] = np.arange(n)
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

    def tie_rng(self) -> np.random.Generator:
        """The generator that ranks a transplant's tied lengths, seeded by the whole recipe."""
        return np.random.default_rng(int(self.recipe_sha256()[:16], 16))

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
    warm = next((t for t in (base, donor) if t is not None and t.warmup), None)
    if warm is not None:   # a variant would lose the warm-up (and the prefix identity) it needs
        raise SchedportError(f"window {warm.name} has a warm-up (a prefix-bearing source, docs/corpus.md \"Warm "
                             f"caches\"): its variants are not built yet; explain a reversal of windows "
                             f"without one")
    if f == "arrival":
        arr = transplant_arrivals(base, donor)
    elif f == "burstiness":
        arr = poisson_arrivals(base, variant.rng())
    elif f == "input":
        ins = resample_marginal(base.input_tokens, donor.input_tokens, variant.tie_rng())
    elif f == "output":
        outs = resample_marginal(base.output_tokens, donor.output_tokens, variant.tie_rng())
    elif f == "coupling":
        ins, outs = decouple_lengths(base, variant.rng())
    elif f == "clients":
        cl = _tiled_clients(base, donor)
    elif f == "clients_removed":
        cl = None
    return Trace.from_arrays(arr, ins, outs, cl, name=name, source=name)


def variant_name(source: str, feature: str, other: str) -> str:
    """How a variant of `source`'s windows reads in the explanation ("azure with burstgpt's arrival")."""
    if feature == "original":
        return source
    if FEATURES[feature][0] == "transplant":
        return f"{source} with {other}'s {feature}"
    return f"{source} with {_CONTROL_NAMES[feature]}"

