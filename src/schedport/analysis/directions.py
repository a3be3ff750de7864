"""Which store columns are metrics, which way each one is better, and which are bounded shares.

Every results-store column named in `DIRECTIONS` (or matching one of `DIRECTION_PATTERNS`) is
a metric the analysis ranks on; the direction orients it so that rank 1 and a positive effect
always mean "better". `MAIN_METRICS` (one per family) are those of the headline tables;
`BOUNDED_PATTERNS` name the metrics in [0, 1] whose effects are absolute differences judged
against `schedport.analysis.defaults.ABS_THRESHOLD` (see the method in
`schedport.analysis.portability`).
"""

from __future__ import annotations

import re
from typing import Optional

#: +1: higher is better; -1: lower is better.
DIRECTIONS: dict[str, int] = {
    "ttft_mean_s": -1,
    "ttft_p50_s": -1,
    "ttft_p90_s": -1,
    "ttft_p99_s": -1,
    "tpot_mean_s": -1,
    "tpot_p50_s": -1,
    "tpot_p99_s": -1,
    "e2e_mean_s": -1,
    "e2e_p99_s": -1,
    "norm_latency_mean_s": -1,
    "slowdown_mean": -1,
    "n_rejected": -1,
    "preemptions": -1,
    "throughput_rps": 1,
    "output_tokens_per_s": 1,
    "slowdown_jain": 1,
    "client_jain": 1,
    "completed_within_horizon": 1,
}
#: Per-SLO-profile metrics (any profile name), both higher-is-better.
#: The survivor-only variants (``*_completed``: statistics over completed requests alone, kept
#: beside the every-offered-request metrics) point the same way as their counterparts.
DIRECTION_PATTERNS: tuple[tuple[re.Pattern, int], ...] = (
    (re.compile(r"slo_attainment_[a-z0-9_]+"), 1),
    (re.compile(r"goodput_[a-z0-9_]+_rps"), 1),
    (re.compile(r"[a-z0-9_]+_completed_s"), -1),
    (re.compile(r"slowdown_mean_completed"), -1),
    (re.compile(r"[a-z0-9_]*_jain_completed"), 1),
)
#: One metric per family (tail TTFT, tail TPOT, mean E2E, standard-SLO attainment, slowdown
#: fairness). ``goodput_standard_rps`` is not among them: it is attainment x n_requests / horizon,
#: a function of ``slo_attainment_standard`` within every window (see `metric_families`).
MAIN_METRICS: tuple[str, ...] = (
    "ttft_p99_s",
    "tpot_p99_s",
    "e2e_mean_s",
    "slo_attainment_standard",
    "slowdown_jain",
)
#: Metrics bounded in [0, 1] (shares and indices): their effects are absolute differences and
#: their practical threshold is absolute (`schedport.analysis.defaults.ABS_THRESHOLD`), since a
#: relative difference of two small shares is large for a negligible change (0.001 vs 0 is a
#: relative effect of 2).
BOUNDED_PATTERNS: tuple[re.Pattern, ...] = (
    re.compile(r"slo_attainment_[a-z0-9_]+"),
    re.compile(r"[a-z0-9_]*_jain"),
    re.compile(r"[a-z0-9_]*_jain_completed"),
    re.compile(r"[a-z0-9_]*_share"),
)
#: The survivor-only variants of the latency and fairness metrics (``ttft_p99_completed_s``, ...).
SURVIVOR_ONLY = re.compile(r"[a-z0-9_]+_completed(_s)?")


def metric_direction(name: str) -> Optional[int]:
    """+1 if higher is better, -1 if lower is better, None if `name` is not a known metric.

    Used to orient every metric so that rank 1 and a positive effect always mean "better".
    """
    if name in DIRECTIONS:
        return DIRECTIONS[name]
    for pat, d in DIRECTION_PATTERNS:
        if pat.fullmatch(name):
            return d
    return None


def metric_is_bounded(name: str) -> bool:
    """True for metrics bounded in [0, 1] (SLO attainment, Jain indices, shares).

    Their reversal effects are absolute differences judged against an absolute threshold
    (2 percentage points by default) instead of relative differences.
    """
    return any(p.fullmatch(name) for p in BOUNDED_PATTERNS)
