"""The linear latency model's rows for each kind of probe, and its fit (`fit_linear`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from schedport.errors import SchedportError

#: The linear model's parameters in fit order (request_overhead_s first; f last, as `fit_linear`
#: fits it in a second stage).
PARAMS = ("request_overhead_s", "a", "b", "c", "d", "e", "f")

#: A mixed probe is implausible, and left out of the fit, when the prefill it measured inside a
#: decode step took more than this many times the model's time for the same prompt alone
#: (measured: 1.0x to 2x).
MIXED_PLAUSIBLE = 4.0


@dataclass
class Observation:
    """One probe: what was sent, the time measured, and its row of the linear model."""

    kind: str                 # "prefill", "decode" or "mixed" (a chunk's cost inside a decode step)
    label: str
    seconds: float
    features: tuple[float, ...]   # aligned with PARAMS


def prefill_features(prompt: int, budget: int) -> tuple[float, ...]:
    """Model row of a lone prompt of `prompt` tokens: overhead + its chunked prefill steps."""
    steps, p, kv, pairs, done = 0, 0, 0, 0, 0
    while done < prompt:
        c = min(budget, prompt - done)
        steps += 1
        p += c
        kv += done + c
        pairs += c * done + c * (c + 1) // 2
        done += c
    return (1.0, float(steps), float(p), 0.0, float(kv), float(pairs), 0.0)


def decode_features(batch: int, kv_tokens: float) -> tuple[float, ...]:
    """Model row of one decode step of `batch` sequences reading `kv_tokens` in all."""
    return (0.0, 1.0, 0.0, float(batch), float(kv_tokens), 0.0, 0.0)


def mixed_delta_features(prompt: int) -> tuple[float, ...]:
    """Model row of what one fresh `prompt`-token chunk adds to a step that also decodes.

    The difference between a mixed step (the chunk plus a decode batch) and the same decode
    step alone: the chunk's tokens, its attention reads (itself) and pairs, and its tokens again
    for the mixed-step surcharge ``f``; no fixed step cost.
    """
    p = float(prompt)
    return (0.0, 0.0, p, 0.0, p, float(prompt * (prompt + 1) // 2), p)


@dataclass
class Fit:
    """The fitted coefficients with their quality on the probes."""

    coef: dict[str, float]
    r2: float
    max_abs_rel_err: float
    median_abs_rel_err: float
    predicted: np.ndarray
    excluded: list[str] = field(default_factory=list)   # labels of probes left out as implausible


def fit_linear(obs: list[Observation]) -> Fit:
    """Non-negative least squares on relative errors: every coefficient >= 0, `a` > 0.

    In two stages. The lone prefills and pure decodes give every coefficient but `f`; the mixed
    probes then give `f` alone, from what they measured beyond that model (never below 0). A
    mixed probe that a noisy moment made too short could otherwise pull `b` and `e` down and
    spoil the prefill model that everything else rests on. A mixed probe that measured more
    than `MIXED_PLAUSIBLE` times the model's time for its prompt prefilled alone is left out
    (`Fit.excluded`) and not scored: a pause of the machine lands in its span whole (seen: a
    128-token prompt "adding" 298 ms to a decode step where 15-35 ms is usual).
    """
    from scipy.optimize import nnls

    base = [o for o in obs if o.kind != "mixed"]
    mixed = [o for o in obs if o.kind == "mixed"]
    n_base = len(PARAMS) - 1                       # every coefficient but f
    if len(base) < n_base:
        raise SchedportError(f"calibration needs at least {n_base} prefill and decode probes, got {len(base)}")
    A = np.array([o.features for o in obs], dtype=np.float64)
    y = np.array([o.seconds for o in obs], dtype=np.float64)
    if not (np.isfinite(y).all() and (y > 0).all()):
        raise SchedportError("calibration: a probe returned no usable time (see the server log)")
    is_base = np.array([o.kind != "mixed" for o in obs])
    Ab, yb = A[is_base][:, :n_base], y[is_base]
    scale = Ab.max(axis=0)
    scale[scale == 0] = 1.0
    xb, _ = nnls((Ab / scale) / yb[:, None], np.ones_like(yb), maxiter=10_000)
    x = np.append(xb / scale, 0.0)
    used = is_base.copy()
    excluded = []
    for i, o in enumerate(obs):
        if o.kind == "mixed":
            lone = x[1] + float(A[i, 2:n_base] @ x[2:n_base])      # a + b*P + d*P + e*pairs
            if y[i] <= MIXED_PLAUSIBLE * lone:
                used[i] = True
            else:
                excluded.append(o.label)
    fit_mixed = used & ~is_base
    if fit_mixed.any():
        # relative least squares for f alone on the mixed rows' excess over the base model
        Am, ym = A[fit_mixed], y[fit_mixed]
        excess = (ym - Am[:, :n_base] @ x[:n_base]) / ym
        u = Am[:, n_base] / ym
        x[n_base] = max(0.0, float(u @ excess) / float(u @ u)) if float(u @ u) > 0 else 0.0
    pred = A @ x
    rel = np.abs(pred[used] - y[used]) / y[used]
    ss_res = float(((pred[used] - y[used]) ** 2).sum())
    ss_tot = float(((y[used] - y[used].mean()) ** 2).sum())
    coef = dict(zip(PARAMS, (float(v) for v in x)))
    if not coef["a"] > 0:
        # The simulator needs a positive per-step time; the smallest decode step bounds it.
        coef["a"] = float(min(o.seconds for o in obs if o.kind == "decode") if any(
            o.kind == "decode" for o in obs) else y.min()) * 0.5
    return Fit(coef, 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan, float(rel.max()),
               float(np.median(rel)), pred, excluded)
