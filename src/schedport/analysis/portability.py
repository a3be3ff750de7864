"""Portability analysis: do scheduler rankings carry over across sources, regions and metrics?

Reads only the results store written by ``schedport run`` (``DIR/runs/``, a Parquet dataset
with one row per (source, window_id, region, scheduler, seed), and ``DIR/manifest.json``) and
writes ``portability.json`` (every headline number with its CI, the parameters used and the
full reversal list) and ``report.html`` (rendered from that dict by `schedport.report.html`).

Method (the report's methodology section is generated from the same parameters)
-------------------------------------------------------------------------------
Metrics and directions
    Every results-store column named in `DIRECTIONS` (or matching ``slo_attainment_<p>`` /
    ``goodput_<p>_rps`` for any SLO profile p) is a metric; each SLO profile's attainment and
    goodput count as metrics of their own. Lower is better for latencies (``ttft_*``,
    ``tpot_*``, ``e2e_*``, ``norm_latency_mean_s``, ``slowdown_mean``), ``n_rejected`` and
    ``preemptions``; higher for throughput, goodput, attainment, Jain indices and
    ``completed_within_horizon``. Bookkeeping columns (counts, makespan, horizon, iterations)
    are not ranked; any other column is ignored with a note. A metric that is NaN everywhere
    is dropped with a note. The *main metrics* (`MAIN_METRICS`: tail TTFT, tail TPOT, mean
    E2E, standard-SLO attainment, slowdown fairness: one per family) are those of the tables,
    of the headline averages and of the study's form; the redundant variants (p50/p90/mean of
    the same latency) would otherwise inflate metric agreement.

Metric families (one ranking counted once)
    Two metrics whose within-window ranks agree in every window of every condition (and are
    defined in the same windows) measure one ranking twice: goodput_p = attainment_p x
    n_requests / horizon is the case in the default store. `metric_families` finds such groups
    and only the first member is analysed (a main metric first, else the first column); the
    rest are dropped from every statistic with a note. A pair of main metrics is thus never
    used together. ``metric_families`` = {"groups": [[kept, dropped...]], "dropped": [...]}.

Duplicate schedulers (one scheduler counted once)
    Two schedulers whose every analysed metric is bit-identical in every window of a condition
    (source x region) are duplicates there; in every condition of a source, duplicates of that
    source. ``duplicates`` = {"by_source": {source: [[names...]]}, "by_condition": {source:
    {region: [[names...]]}}} (conditions listed only where they add classes). Rankings keep
    every scheduler (ties averaged) but the report shows one row "a = b" per source. A test is
    made once per class pair (a pair of twins is no test, a pair that repeats another through
    a duplicate is that test); a comparison of two conditions counts once per pair of joint
    classes (schedulers identical in both conditions compared), so a reversal between a
    duplicate and a third scheduler counts once, and so does its comparison.

Unit of replication: the window
    Seeds are averaged within (source, window, region, scheduler) first (NaN seeds skipped).
    A (source, region) *condition* is analysed on its complete block: the windows in which
    every scheduler has a result. Cells missing from the full grid are listed in
    ``missing_cells`` and the per-condition block sizes in ``complete_blocks``; a condition
    with fewer than `MIN_WINDOWS` complete windows is skipped with a note.

Regime check (``regimes``)
    Is a region the same load in every source? For each (source, region): the median over
    windows (seeds averaged first) of the reference scheduler's (`REGIME_SCHEDULER`, vllm-fcfs)
    ``backlog_at_last_arrival``, the share of its accepted requests still without a first token
    when the window's last request arrives; beside it the fluid value max(0, 1 - 1/rho) of a
    queue started empty at offered load rho, the median ``ttft_p50_s`` and the median
    ``slo_attainment_standard``. ``regimes`` = {"scheduler", "spread_limit", "rows": [{source,
    region, rho, n_windows, backlog_median, fluid_backlog, vs_fluid, ttft_p50_s_median,
    slo_attainment_standard_median}], "flagged": [{region, spread, low, high}], "available",
    "note"}. A region is flagged when its sources' median backlogs differ by more than
    `REGIME_SPREAD` (0.1): there a cross-source comparison compares different regimes. The
    report puts the flag on its first screen. A store without the reference scheduler or the
    backlog column gives no rows and says why in ``note``. A batch engine admits up to
    max_num_seqs requests at once, so its backlog can sit below the fluid value by up to that
    share of the window (docs/corpus.md, "Capacity").

Rankings
    Within each window, schedulers are ranked 1..K on each metric (1 = best; ties get the
    average rank, ``scipy.stats.rankdata``). NaN (e.g. no completed request, so no latency)
    ranks worst, tied with the other NaNs of that window: a scheduler that completes nothing
    must not look good. A window where the metric is NaN for every scheduler carries no
    ordering and is left out for that metric (noted). The mean rank over a condition's
    windows is the scheduler's score; its 95% CI is the percentile bootstrap over windows.

Bootstrap
    B resamples (``n_boot``, default 1000) of windows with replacement, drawn from one seeded
    ``numpy.random.Generator``. Sources are resampled independently (their windows are
    independent draws); within a source the *same* resample of window ids is used for every
    region and metric, because the same windows underlie every region, so region-vs-region and
    metric-vs-metric comparisons stay paired. Where a region has missing cells, a resample's
    invalid windows simply carry no weight there. Every concordance statistic, headline
    average, minimum and share is recomputed on each replicate (fully vectorised: Kendall's
    tau-b of two vectors is the dot product of their normalised pairwise-sign vectors).
    Mean ranks (a linear, unbiased statistic) get the percentile interval (2.5-97.5 percentile
    of the defined replicates). Concordance statistics and shares get the *basic* interval
    [2t - q97.5, 2t - q2.5], clipped to their range: tau between *estimated* mean-rank vectors
    is pulled towards 0 by sampling noise and each resample adds that noise again, so the
    replicates sit below the estimate. In a simulation (13 schedulers, 40 windows, close
    schedulers, true tau = 1) the percentile interval never covered the truth while the basic
    one covered it 85% of the time (88% vs 98% when true tau = 0.44). Each headline also
    carries ``boot_bias`` (mean of replicates minus estimate); a large one means the estimate is
    attenuated and the interval may lie above it.

Concordance
    Between the mean-rank vectors of two sources (same region and metric), two regions (same
    source and metric) and two metrics (same source and region): Kendall's tau-b and Spearman's
    rho, exactly the statistics of ``scipy.stats.kendalltau`` / ``spearmanr`` (computed here in
    vectorised form, `kendall_tau_b` / `spearman_rho`, and checked against scipy in the tests:
    ~6,500 scipy calls would cost ~20 s, mostly on p-values that are not used), and
    top-1 agreement (1 when the sets of schedulers tied for the best mean rank intersect,
    with ``top1_support`` the share of replicates in which they do). tau is undefined (null)
    when one vector is constant (all schedulers tied, typical at light load for counts such
    as ``n_rejected``); averages skip undefined values and count them.

Headlines
    Cross-source tau per source pair and region is the mean over the main metrics; per pair
    it is the mean over regions and main metrics; the minimum over pairs is reported with that
    pair's own interval, the minimum over pair x region cells with the bootstrap CI of the
    minimum. Metric concordance is the
    mean tau over all pairs of main metrics and all conditions. ``best_changes_with_metric_
    share`` is the share of conditions (source x region with all main metrics defined) where
    no scheduler is tied-best on every main metric, i.e. the intersection over main metrics
    of the sets of best schedulers is empty; the pairwise variant counts (condition, metric
    pair) whose best sets are disjoint. (The study's form counts it per window x region cell,
    see below: 18 conditions can only give multiples of 1/18.)

Reversals
    For scheduler pair (A, B), metric m and condition c, the per-window relative effect is
    e = d_m * (A - B) / ((|A| + |B|) / 2) with d_m = +1 if higher is better and -1 otherwise,
    so e > 0 means A is better, e is scale-free (windows differ in size) and bounded in
    [-2, 2]; e = 0 when A = B = 0, and the window is left out when either value is NaN.
    Bounded metrics (`metric_is_bounded`: SLO attainment, Jain indices, shares, all in [0, 1])
    use the absolute difference e = d_m * (A - B) instead, judged against the absolute
    threshold (``abs_threshold``, default 0.02 = 2 percentage points): a relative effect of
    two small shares is large for a negligible change (0.001 vs 0 gives 2). The
    condition's effect is the median over windows. Its p-value is the two-sided Wilcoxon
    signed-rank test of the per-window effects against 0 (``scipy.stats.wilcoxon``: paired,
    makes no normality assumption about ratios of latencies, and is exact and deterministic
    for the ~40 windows of a source): zero effects are dropped (Wilcoxon's treatment), the
    exact null distribution is used when no |effect| is tied and n <= 50, else the normal
    approximation with tie correction; p = 1 when every effect is zero. Benjamini-Hochberg
    (step-up, implemented here and tested against ``scipy.stats.false_discovery_control``)
    runs over *all* these per-condition tests at once (every pair, metric and condition with
    at least one usable window): that is the family of comparisons made. A reversal between
    two conditions (two sources at one region, or two regions at one source) is counted when
    the median effects have opposite signs, both have BH q <= q, and both |median effects| >=
    the practical threshold. ``n_comparisons`` counts the (pair, metric, condition pair)
    cases examined, i.e. where both conditions were tested; ``share`` is reversals / that.
    Its 95% interval is Wilson's score interval, which treats comparisons as independent and
    so understates the uncertainty (comparisons share windows); it is labelled as such.
    This pooled analysis (every metric, cross-source and cross-region, ``reversals``) is the
    secondary one. Its breakdowns divide by their own kind: ``cross_source`` {n_comparisons,
    n_reversals, by_region, by_source_pair} and ``cross_region`` {..., by_region_pair,
    by_source}, each entry {n_reversals, n_comparisons, share_of_reversals (of that kind's
    reversals), rate (of its comparisons)}, so every breakdown adds up to its total;
    ``by_scheduler_pair`` and ``by_metric`` count every reversal once.

The study's form (``study_form``, shown first)
    The original study's statements, computed the way it made them.
    ``main_metrics``: the main metrics analysed. ``metric_families``: as above.
    ``reversals``: one entry per main metric, cross-source comparisons only, with BH run
        within that metric's tests (every distinct scheduler pair x condition): ``metric``,
        ``effect_scale`` (relative | absolute), ``practical_threshold``, ``n_tests``,
        ``n_comparisons`` (distinct pair x source pair x region cases where both sources were
        tested: 78 x 3 x 6 = 1,404 for 13 distinct schedulers), ``n_reversals``, ``share``,
        ``ci_low``/``ci_high`` (95% percentile bootstrap over windows: on each resample the
        medians, Wilcoxon p-values, BH and reversal count are redone, `schedport.analysis.studyform`),
        ``boot_mean`` (mean of the replicates: resamples repeat windows, which makes their
        tests a little more significant, so it sits above ``share``), ``by_region``,
        ``by_source_pair`` (entries {n_reversals, n_comparisons, share_of_reversals, rate}),
        ``by_scheduler_pair`` {pair: n_reversals} (duplicates joined: "edf = vllm-fcfs vs
        orca"), ``one_scheduler_pair`` (all reversals share one pair; null without reversals),
        ``sources_on_every_reversal`` and ``one_source`` (a source on one side of every
        reversal), ``high_load`` {rho_min 0.8, regions, n_reversals, n_comparisons,
        share_of_reversals, rate, rate_elsewhere} and ``items`` (each reversal: scheduler_pair,
        scheduler_a, scheduler_b, region, source_a, source_b, effect_a, effect_b, q_a, q_b;
        strongest first).
    ``best_changes_with_metric``: ``condition`` = "window x region"; ``n_conditions`` (window
        x region cells with every main metric defined), ``n_changed``, ``share`` with
        ``ci_low``/``ci_high`` (percentile bootstrap over windows), ``by_source``,
        ``pairwise`` {n_pairs, n_disjoint, share, ci_low, ci_high, definition} (cell x
        main-metric pair whose best sets are disjoint), ``definition``, and ``forced_by``:
        [{metric, scheduler, n_cells, share_without, share_without_ci_low/high}] where one
        scheduler is the sole best on a metric in every cell and never best on all the others,
        so the share is 100% by construction (``share_without``: the share without it).
    ``cross_source_tau``: per source pair and main metric: ``value`` (mean over regions of
        tau-b between the two sources' mean-rank vectors), ``ci_low``/``ci_high`` (basic
        bootstrap), ``boot_bias``, ``n_regions``, ``n_tied_regions`` (regions where a vector
        has <= 3 distinct values, see ``tied`` below), ``by_region`` {region: tau}.
    ``duplicates`` {source: [[names]]} and ``duplicates_by_condition``: as above.
    ``split_half``: per source and region, the noise ceiling: ``value`` (mean over
        ``n_splits`` random splits of the source's windows into two disjoint halves of
        floor(W/2) windows of the tau-b between the halves' mean-rank vectors, averaged over
        the main metrics), ``ci_low``/``ci_high`` (2.5-97.5 percentiles over the splits: the
        spread of one split's estimate), ``n_windows_half``; ``split_half_by_metric`` per
        metric; ``split_half_info`` {n_splits, ci_method, definition, adjusted_definition}.
    ``cross_source_half``: cross-source tau at the same window count (mean of the four
        half-vs-half taus under independent splits) and the reliability-adjusted portability
        ``adjusted`` = tau_ab(half) / sqrt(rel_a(half) rel_b(half)) (1: the sources agree as
        well as each agrees with itself; below 1: rankings do not carry over beyond noise;
        null when a reliability is <= 0): ``by_pair`` {tau_half, adjusted, n_regions},
        ``by_pair_region`` {tau_half with its split range, rel_a, rel_b, adjusted with its
        split range}, ``by_pair_metric``.
    ``claims``: one entry per finding of the original study (`schedport.analysis.studyform.
        STUDY_FINDINGS`): ``id``, ``study`` (its statement), ``here`` (this run's figure in the
        same form, with its interval), ``verdict`` (holds | does not hold | partly holds |
        inconclusive | not comparable), ``rule`` (how the verdict follows from the numbers),
        ``value``/``ci_low``/``ci_high`` where one number decides, ``per_metric`` for the
        reversal finding. ``definitions``: the reversal and comparison definitions used.

Other fields
    ``subset`` {is_subset, reasons, n_schedulers, n_windows, n_regions}: a --quick or partial
    store (fewer schedulers than the registry, a subset of the default regions, fewer windows
    than the corpus); the report's title says so. Every concordance entry carries
    ``n_distinct_a``/``n_distinct_b`` and ``tied`` (a vector with 3 or fewer distinct values:
    its tau rests on a near-constant ranking and is flagged). ``headline.cross_source.
    min_pair`` carries the lowest pair's own interval (one interval per number) and, apart,
    ``min_over_pairs_ci_low/high``. ``parameters`` gains ``abs_threshold``, ``n_splits``,
    ``bounded_metrics`` and ``threshold_rule``.

Provenance and refusal
    ``store`` {corpus_sha256, engine_hash, created}: the identity of the store analysed
    (`guard.store_identity`); `explain` refuses a ``portability.json`` whose ``store`` is not
    its results store's. ``selection`` {schedulers, sources, regions, windows_per_source}: what
    was analysed; ``region_comparison`` (``--compare``) carries ``selection_differs`` and
    ``selection_note`` when the two analyses cover different selections (flagged on the report's
    first screen). Ceiling-adjusted values above 1 are kept as computed and marked where shown.
    The manifest's corpus hash, engine config and hash, package version and git commit are
    copied into ``provenance``. A store without a manifest, without rows, or with more than
    one corpus hash (manifest or a ``corpus_sha256`` column) is refused with a one-line
    `SchedportError`, as is one whose hash differs from ``expect_corpus`` / ``expect_engine``
    or from the corpus directory given for the workload figure.

Performance: the full default study (13 schedulers, 3 sources x 40 windows, 6 regions, 21
distinct metrics, B = 1000, ~23,000 Wilcoxon tests, the study form's 5 x 1,404 tests redone
on 1,000 resamples, 1,000 random splits) takes about 20 s for the statistics and about 40 s in
all with the report's figures on a busy 2-core machine (``run_info.elapsed_s`` records it).
"""

from __future__ import annotations

import json
import math
import re
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd
import typer
from scipy import stats

from schedport.errors import SchedportError, read_json
from schedport.common.guard import store_identity
from schedport.common.outputs import parse_out_path

__all__ = [
    "DIRECTIONS",
    "MAIN_METRICS",
    "metric_direction",
    "metric_is_bounded",
    "bh_adjust",
    "kendall_tau_b",
    "spearman_rho",
    "relative_effect",
    "wilcoxon_pvalues",
    "load_store",
    "compute_portability",
    "headline_digest",
    "load_comparison",
    "analyze",
    "analyze_command",
]

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
#: their practical threshold is absolute (`ABS_THRESHOLD`), since a relative difference of two
#: small shares is large for a negligible change (0.001 vs 0 is a relative effect of 2).
BOUNDED_PATTERNS: tuple[re.Pattern, ...] = (
    re.compile(r"slo_attainment_[a-z0-9_]+"),
    re.compile(r"[a-z0-9_]*_jain"),
    re.compile(r"[a-z0-9_]*_jain_completed"),
    re.compile(r"[a-z0-9_]*_share"),
)
ABS_THRESHOLD = 0.02
#: The survivor-only variants of the latency and fairness metrics (``ttft_p99_completed_s``, ...).
SURVIVOR_ONLY = re.compile(r"[a-z0-9_]+_completed(_s)?")
ID_COLUMNS = ("source", "window_id", "region", "scheduler", "seed")
#: Store columns that describe a run but are not scored.
BOOKKEEPING = frozenset({
    "rho", "time_scale", "n_requests", "n_completed", "n_unfinished", "makespan_s",
    "horizon_s", "iterations", "corpus_sha256", "engine_hash", "wall_s", "status", "capacity_rps",
    "window_sha256", "load_scale", "predictor_tau", "backlog_at_last_arrival",
    "host_swap_full_events", "stall_recomputes",
})
#: The regime check: the reference scheduler whose queue it reads, the metrics it reports beside
#: the backlog, and the spread of backlog between sources above which a region is flagged.
REGIME_SCHEDULER = "vllm-fcfs"
REGIME_METRICS = ("ttft_p50_s", "slo_attainment_standard")
REGIME_SPREAD = 0.1
MIN_WINDOWS = 2
CI_LEVEL = 0.95
#: Random splits for the split-half reliability (noise ceiling).
SPLITS = 1000
#: A mean-rank vector with this many distinct values or fewer is flagged as tied.
TIED_DISTINCT = 3


# --------------------------------------------------------------------------- small pieces


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


def bh_adjust(pvalues) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values) of a 1-d array; NaN entries stay NaN.

    q_(i) = min over k >= i of p_(k) * m / k, capped at 1, with m the number of non-NaN
    p-values. Rejecting q <= alpha is the BH step-up procedure at FDR level alpha; computed
    here so the family (all tests made) is explicit, and checked against scipy in the tests.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError("bh_adjust expects a 1-d array")
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    m = int(ok.sum())
    if m == 0:
        return out
    pv = p[ok]
    order = np.argsort(pv, kind="stable")
    scaled = pv[order] * m / np.arange(1, m + 1)
    q = np.minimum.accumulate(scaled[::-1])[::-1]
    q = np.clip(q, 0.0, 1.0)
    res = np.empty(m)
    res[order] = q
    out[ok] = res
    return out


def _pair_index(k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(k, 1)


def _tau_features(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Normalised pairwise-sign vectors of `x` along its last axis, and where they are defined.

    For vectors x, y: tau_b(x, y) = sum_p s_p(x) s_p(y) / sqrt(#untied(x) #untied(y)), with
    s_p the sign of the difference of pair p; so tau_b is the dot product of these unit
    vectors. Undefined (all tied, or NaN present) -> zero vector and False.
    """
    i, j = _pair_index(x.shape[-1])
    s = np.sign(x[..., i] - x[..., j])
    finite = np.isfinite(s).all(axis=-1)
    s = np.where(np.isfinite(s), s, 0.0)
    nn = np.count_nonzero(s, axis=-1)
    defined = finite & (nn > 0)
    scale = np.where(defined, 1.0 / np.sqrt(np.maximum(nn, 1)), 0.0)
    return s * scale[..., None], defined


def _spearman_features(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Centred, normalised ranks of `x` along its last axis (dot product = Spearman's rho)."""
    finite = np.isfinite(x).all(axis=-1)
    r = stats.rankdata(np.where(np.isfinite(x), x, 0.0), axis=-1)
    c = r - r.mean(axis=-1, keepdims=True)
    norm = np.sqrt((c * c).sum(axis=-1))
    defined = finite & (norm > 1e-12)
    scale = np.where(defined, 1.0 / np.where(norm > 0, norm, 1.0), 0.0)
    return c * scale[..., None], defined


def kendall_tau_b(x, y) -> np.ndarray:
    """Kendall's tau-b between x and y along the last axis, for any leading (batch) shape.

    Equal to ``scipy.stats.kendalltau(x, y).statistic`` (variant b) per vector; NaN where
    either vector is constant or holds NaN. Vectorised so that B = 1000 bootstrap replicates
    of thousands of conditions take a few array operations instead of millions of calls.
    """
    fx, dx = _tau_features(np.asarray(x, dtype=np.float64))
    fy, dy = _tau_features(np.asarray(y, dtype=np.float64))
    t = (fx * fy).sum(axis=-1)
    return np.where(dx & dy, np.clip(t, -1.0, 1.0), np.nan)


def spearman_rho(x, y) -> np.ndarray:
    """Spearman's rho between x and y along the last axis (Pearson correlation of average ranks).

    Equal to ``scipy.stats.spearmanr(x, y).statistic`` per vector; NaN where either vector is
    constant or holds NaN. Vectorised like `kendall_tau_b`.
    """
    fx, dx = _spearman_features(np.asarray(x, dtype=np.float64))
    fy, dy = _spearman_features(np.asarray(y, dtype=np.float64))
    r = (fx * fy).sum(axis=-1)
    return np.where(dx & dy, np.clip(r, -1.0, 1.0), np.nan)


def relative_effect(a, b, direction: int) -> np.ndarray:
    """Per-window relative effect of A over B: direction * (A - B) / ((|A| + |B|) / 2).

    Positive means A is better whatever the metric's direction; scale-free, so windows of
    different size weigh alike; bounded in [-2, 2]; 0 when A = B = 0; NaN if either is NaN.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    den = (np.abs(a) + np.abs(b)) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        e = direction * (a - b) / den
    e = np.where(den == 0, 0.0, e)
    return np.where(np.isfinite(a) & np.isfinite(b), e, np.nan)


def wilcoxon_pvalues(effects) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided Wilcoxon signed-rank p-values of each row of `effects` against zero.

    NaN entries are missing windows. Zero effects are dropped (Wilcoxon's zero method); the
    exact null distribution is used when a row's nonzero |effects| are untied and n <= 50,
    the normal approximation with tie correction otherwise; p = 1 when no nonzero effect is
    left. Rows are batched by (n, ties) so scipy runs vectorised. Returns (p, n_used) where
    n_used counts the finite entries (NaN p where a row has none).
    """
    e = np.asarray(effects, dtype=np.float64)
    if e.ndim != 2:
        raise ValueError("wilcoxon_pvalues expects a 2-d array (tests x windows)")
    finite = np.isfinite(e)
    n_used = finite.sum(axis=1)
    nz = finite & (e != 0)
    n_nz = nz.sum(axis=1)
    p = np.where(n_used > 0, 1.0, np.nan)
    a = np.sort(np.where(nz, np.abs(e), np.nan), axis=1)
    ties = (a[:, 1:] == a[:, :-1]).any(axis=1) if e.shape[1] > 1 else np.zeros(len(e), bool)
    for n in np.unique(n_nz[n_nz > 0]):
        for tied in (False, True):
            rows = np.flatnonzero((n_nz == n) & (ties == tied))
            if rows.size == 0:
                continue
            vals = e[rows][nz[rows]].reshape(rows.size, int(n))
            method = "exact" if (not tied and n <= 50) else "asymptotic"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                res = stats.wilcoxon(vals, axis=1, method=method, zero_method="wilcox")
            p[rows] = np.clip(np.asarray(res.pvalue, dtype=np.float64), 0.0, 1.0)
    return p, n_used


def _percentile_ci(boot: np.ndarray, level: float = CI_LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Percentile CI along axis 0, skipping NaN replicates (linear interpolation, like numpy)."""
    boot = np.asarray(boot, dtype=np.float64)
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2
    s = np.sort(boot, axis=0)  # NaN last
    n = np.isfinite(s).sum(axis=0)
    out = []
    for qq in (lo_q, hi_q):
        h = (np.maximum(n, 1) - 1) * qq
        lo = np.floor(h).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
        g = h - lo
        a = np.take_along_axis(s, lo[None, ...], axis=0)[0]
        b = np.take_along_axis(s, hi[None, ...], axis=0)[0]
        v = a + (b - a) * g
        out.append(np.where(n > 0, v, np.nan))
    return out[0], out[1]


def _basic_ci(point, boot: np.ndarray, lo_bound: float = -1.0, hi_bound: float = 1.0,
              level: float = CI_LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Basic (reverse-percentile) bootstrap interval [2t - q_hi, 2t - q_lo], clipped to the range.

    Used for concordance statistics and shares: tau between *estimated* mean-rank vectors is
    pulled towards 0 by sampling noise, and a resample adds that noise again, so the replicates
    sit below the estimate and a plain percentile interval can exclude both the estimate and
    the truth (e.g. true tau = 1). The basic interval corrects for that shift.
    """
    q_lo, q_hi = _percentile_ci(boot, level)
    t = np.asarray(point, dtype=np.float64)
    lo = np.clip(2 * t - q_hi, lo_bound, hi_bound)
    hi = np.clip(2 * t - q_lo, lo_bound, hi_bound)
    return lo, hi


def _nanmean(x: np.ndarray, axis) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


def _nanmin(x: np.ndarray, axis) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmin(x, axis=axis)


def _wilson(k: int, n: int, level: float = CI_LEVEL) -> tuple[Optional[float], Optional[float]]:
    if n <= 0:
        return None, None
    z = stats.norm.ppf(1 - (1 - level) / 2)
    ph = k / n
    den = 1 + z * z / n
    c = (ph + z * z / (2 * n)) / den
    h = z * math.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n)) / den
    return max(0.0, c - h), min(1.0, c + h)


def _py(v: Any) -> Any:
    """JSON-safe Python value: numpy scalars unwrapped, NaN/inf -> None, containers walked."""
    if isinstance(v, dict):
        return {str(k): _py(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_py(x) for x in v]
    if isinstance(v, np.ndarray):
        return _py(v.item()) if v.ndim == 0 else [_py(x) for x in v.tolist()]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, pd.Timestamp):
        return v.isoformat()
    return str(v)


def window_key(v: Any):
    """Sort key for window ids: numeric ids in numeric order, then the others as text."""
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


# --------------------------------------------------------------------------- input


def load_store(results_dir, *, expect_corpus: Optional[str] = None,
               expect_engine: Optional[str] = None) -> tuple[pd.DataFrame, dict]:
    """Read a results store: (runs table, manifest dict), refusing unusable or mixed stores.

    Every part is verified as `schedport run` verifies it (`schedport.study.store.verified_runs`:
    page checksums, the manifest's schema, and its engine hash recomputed from the stored
    engine config). A missing directory, missing/invalid ``manifest.json``, absent or empty ``runs/``, missing
    id columns, duplicated run rows, or more than one corpus hash (in the manifest or in a
    ``corpus_sha256`` column) raise a one-line `SchedportError`, as do a corpus or engine
    hash that differs from the expected one given. The analysis only ever reads this.
    """
    d = Path(results_dir)
    if not d.is_dir():
        raise SchedportError(f"{d}: results directory not found")
    mpath = d / "manifest.json"
    if not mpath.is_file():
        raise SchedportError(f"{mpath}: missing; not a schedport results store (run `schedport run` first)")
    manifest = read_json(mpath)
    if not isinstance(manifest, dict):
        raise SchedportError(f"{mpath}: expected a JSON object")
    rpath = d / "runs"
    if not rpath.exists():
        raise SchedportError(f"{rpath}: missing; the results store has no runs")
    from schedport.study.store import verified_runs

    df = verified_runs(d, manifest)  # every part as `run` verifies it: page checksums, schema, hashes
    if len(df) == 0:
        raise SchedportError(f"{rpath}: the results store holds no runs")
    missing = [c for c in ID_COLUMNS if c not in df.columns]
    if missing:
        raise SchedportError(f"{rpath}: missing column(s) {', '.join(missing)}")
    for c in ID_COLUMNS:
        if df[c].isna().any():
            i = int(np.flatnonzero(df[c].isna().to_numpy())[0])
            raise SchedportError(f"{rpath}: row {i} has no {c}")
    dup = df.duplicated(list(ID_COLUMNS))
    if dup.any():
        r = df[dup].iloc[0]
        raise SchedportError(
            f"{rpath}: duplicated run ({', '.join(f'{c}={r[c]}' for c in ID_COLUMNS)}); "
            "a store must hold one row per (source, window_id, region, scheduler, seed)")
    hashes = manifest.get("corpus_sha256")
    hset = set(hashes) if isinstance(hashes, list) else ({hashes} if hashes else set())
    if "corpus_sha256" in df.columns:
        hset |= {h for h in df["corpus_sha256"].dropna().unique()}
    if len(hset) > 1:
        raise SchedportError(f"{d}: mixes results from {len(hset)} corpora ({', '.join(sorted(map(str, hset)))}); "
                             "analyse one corpus per store")
    if expect_corpus and hset and expect_corpus not in hset:
        raise SchedportError(f"{d}: corpus {next(iter(hset))} differs from the expected {expect_corpus}")
    if expect_corpus and not hset:
        raise SchedportError(f"{mpath}: names no corpus_sha256, cannot check it is {expect_corpus}")
    if expect_engine:
        eh = manifest.get("engine_hash")
        if eh != expect_engine:
            raise SchedportError(f"{d}: engine {eh} differs from the expected {expect_engine}")
    if "engine_hash" in df.columns and df["engine_hash"].dropna().nunique() > 1:
        raise SchedportError(f"{d}: mixes results from {df['engine_hash'].nunique()} engine configs")
    return df, manifest


class _Study:
    """The store reshaped into per-source arrays (regions x metrics x windows x schedulers)."""

    def __init__(self, df: pd.DataFrame, metrics: Optional[Sequence[str]], notes: list[str]):
        df = df.copy()
        for c in ("source", "region", "scheduler"):
            df[c] = df[c].astype(str)
        numeric = [c for c in df.columns if c not in ID_COLUMNS and pd.api.types.is_numeric_dtype(df[c])]
        known = [c for c in numeric if metric_direction(c) is not None]
        other = [c for c in df.columns if c not in ID_COLUMNS and c not in BOOKKEEPING and c not in known]
        if metrics is not None:
            bad = [m for m in metrics if m not in df.columns]
            if bad:
                raise SchedportError(f"metric(s) not in the results store: {', '.join(bad)}")
            undirected = [m for m in metrics if metric_direction(m) is None]
            if undirected:
                raise SchedportError(f"metric(s) with no known direction (better = higher or lower?): "
                                     f"{', '.join(undirected)}")
            chosen = list(dict.fromkeys(metrics))
        else:
            # the survivor-only variants repeat their every-request counterparts wherever nothing
            # is refused: analysed only when asked for, so the pooled counts do not count both
            chosen = [c for c in known if not SURVIVOR_ONLY.fullmatch(c)]
            if len(chosen) < len(known):
                notes.append(f"Survivor-only metrics (*_completed, over completed requests alone) are stored "
                             f"but analysed only when named with --metrics: {len(known) - len(chosen)} column(s).")
            if other:
                notes.append(f"Ignored column(s) with no known metric direction: {', '.join(other)}.")
        empty = [m for m in chosen if df[m].isna().all()]
        if empty:
            notes.append(f"Dropped metric(s) undefined (NaN) in every run: {', '.join(empty)}.")
        self.metrics = [m for m in chosen if m not in empty]
        if not self.metrics:
            raise SchedportError("the results store has no metric column to analyse")
        self.direction = np.array([metric_direction(m) for m in self.metrics], dtype=np.float64)

        # region order from rho
        if "rho" in df.columns and df["rho"].notna().any():
            rho = df.groupby("region")["rho"].median()
            spread = df.groupby("region")["rho"].agg(lambda s: s.max() - s.min())
            if (spread > 1e-9).any():
                notes.append("Some regions hold runs at several rho values: "
                             + ", ".join(sorted(spread[spread > 1e-9].index)) + " (ordered by the median).")
            self.regions = sorted(rho.index, key=lambda r: (rho[r] if pd.notna(rho[r]) else math.inf, r))
            self.rho = {r: (float(rho[r]) if pd.notna(rho[r]) else None) for r in self.regions}
        else:
            self.regions = sorted(df["region"].unique())
            self.rho = {r: None for r in self.regions}
            notes.append("No rho column: regions are ordered by name.")
        self.sources = sorted(df["source"].unique())
        self.schedulers = sorted(df["scheduler"].unique())
        if len(self.schedulers) < 2:
            raise SchedportError(f"the results store holds one scheduler ({self.schedulers[0]}); nothing to rank")

        keys = ["source", "window_id", "region", "scheduler"]
        g = df.groupby(keys, sort=False)
        avg = g[self.metrics].mean()
        nseeds = g.size()
        if nseeds.nunique() > 1:
            notes.append(f"Seeds per cell vary ({nseeds.min()}-{nseeds.max()}); each cell is the mean of its seeds.")
        self.n_seeds = (int(nseeds.min()), int(nseeds.max()))
        avg = avg.reset_index()

        R, M, K = len(self.regions), len(self.metrics), len(self.schedulers)
        reg_ix = pd.Index(self.regions)
        sch_ix = pd.Index(self.schedulers)
        self.windows: dict[str, list] = {}
        self.values: dict[str, np.ndarray] = {}
        self.block: dict[str, np.ndarray] = {}
        self.missing_cells: list[dict] = []
        self.complete_blocks: list[dict] = []
        for s in self.sources:
            sub = avg[avg["source"] == s]
            wins = sorted(pd.unique(sub["window_id"]), key=window_key)
            self.windows[s] = wins
            win_ix = pd.Index(wins)
            W = len(wins)
            ri = reg_ix.get_indexer(sub["region"])
            wi = win_ix.get_indexer(sub["window_id"])
            ki = sch_ix.get_indexer(sub["scheduler"])
            vals = np.full((R, M, W, K), np.nan)
            vals[ri, :, wi, ki] = sub[self.metrics].to_numpy(dtype=np.float64)
            present = np.zeros((R, W, K), dtype=bool)
            present[ri, wi, ki] = True
            absent = [self.schedulers[k] for k in np.flatnonzero(~present.any(axis=(0, 1)))]
            if absent:
                notes.append(f"Scheduler(s) {', '.join(absent)} have no result for source {s}: none of its "
                             "windows is complete, so the source is left out.")
            block = present.all(axis=-1)
            for r, w, k in zip(*np.nonzero(~present)):
                self.missing_cells.append({"source": s, "window_id": _py(wins[w]), "region": self.regions[r],
                                           "scheduler": self.schedulers[k]})
            for r, reg in enumerate(self.regions):
                nb = int(block[r].sum())
                nw = int(present[r].any(axis=-1).sum())
                analysed = nb >= MIN_WINDOWS
                self.complete_blocks.append({"source": s, "region": reg, "n_windows": nw,
                                             "n_complete": nb, "analysed": analysed})
                if not analysed:
                    block[r] = False
                    notes.append(f"{s} @ {reg}: {nb} complete window(s) (< {MIN_WINDOWS}); condition skipped.")
                elif nb < nw:
                    notes.append(f"{s} @ {reg}: analysed on the complete block of {nb} of {nw} windows.")
            vals[np.broadcast_to(~block[:, None, :, None], vals.shape)] = np.nan
            self.values[s] = vals
            self.block[s] = block
        if not any(b["analysed"] for b in self.complete_blocks):
            raise SchedportError(f"no (source, region) condition has {MIN_WINDOWS} or more windows in which every "
                                 "scheduler has a result; nothing to analyse")
        if self.missing_cells:
            notes.append(f"{len(self.missing_cells)} cell(s) (source, window, region, scheduler) are missing "
                         "from the store; every condition is analysed on its complete block of windows.")


def _drop_metrics(st: "_Study", drop: Sequence[str]) -> None:
    """Remove metrics from the reshaped study (values, directions, metric list)."""
    keep = [i for i, m in enumerate(st.metrics) if m not in set(drop)]
    st.metrics = [st.metrics[i] for i in keep]
    st.direction = st.direction[keep]
    for s in st.sources:
        st.values[s] = st.values[s][:, keep]


def metric_families(st: "_Study", preferred: Sequence[str]) -> dict:
    """Groups of metrics whose within-window ranks agree in every window of every condition.

    Two metrics are the same ranking when, in every (source, region, window) of the complete
    blocks, one is defined exactly where the other is and both rank the schedulers identically
    (with at least one window where the ranks are not all tied): e.g. goodput = attainment x
    n_requests / horizon. Such a pair measures one thing twice, so only one member of each group
    is analysed: the first of `preferred` (the main metrics) in the group, else the first in
    column order. Returns {"groups": [[kept, dropped...], ...], "dropped": [...]}.
    """
    M = len(st.metrics)
    same = np.ones((M, M), dtype=bool)
    informative = np.zeros(M, dtype=bool)
    for s in st.sources:
        ranks, valid = _ranks(st.values[s], st.direction, st.block[s])  # (R, M, W, K), (R, M, W)
        spread = (ranks.max(axis=-1) > ranks.min(axis=-1)) & valid
        informative |= spread.any(axis=(0, 2))
        for i in range(M):
            for j in range(i + 1, M):
                if not same[i, j]:
                    continue
                ok = np.array_equal(valid[:, i], valid[:, j]) and np.array_equal(
                    ranks[:, i][valid[:, i]], ranks[:, j][valid[:, j]])
                same[i, j] = same[j, i] = ok
    pref = {m: n for n, m in enumerate(preferred)}
    seen: set = set()
    groups, dropped = [], []
    for i in range(M):
        if i in seen or not informative[i]:
            continue
        members = [j for j in range(M) if j == i or (same[i, j] and informative[j])]
        if len(members) < 2:
            continue
        seen.update(members)
        names = sorted((st.metrics[j] for j in members), key=lambda m: (pref.get(m, len(pref)), st.metrics.index(m)))
        groups.append(names)
        dropped += names[1:]
    return {"groups": groups, "dropped": dropped}


def _class_labels(x: np.ndarray) -> np.ndarray:
    """For each column k of x (..., K): the index of the first column bit-identical to it (NaN = NaN)."""
    K = x.shape[-1]
    cols = np.ascontiguousarray(np.asarray(x, dtype=np.float64).reshape(-1, K).T)
    nan = np.isnan(cols)
    cols = np.where(nan, 0.0, cols) + 0.0  # + 0.0 turns -0.0 into 0.0
    first: dict = {}
    out = np.empty(K, dtype=np.int64)
    for k in range(K):
        out[k] = first.setdefault(cols[k].tobytes() + nan[k].tobytes(), k)
    return out


def duplicate_schedulers(st: "_Study") -> dict:
    """Schedulers whose results are identical, per source and per (source, region) condition.

    Two schedulers are duplicates in a condition when every analysed metric is bit-identical
    (NaN equal to NaN) in every window of its complete block; in a source, when they are so in
    every condition of the source. Returns ``labels`` (S, R, K): per condition, the index of the
    first scheduler of each one's class, which the reversal counting uses so that a comparison
    repeated by a duplicate counts once; ``by_source`` {source: [[names...], ...]} (classes of 2+)
    and ``by_condition`` {source: {region: [[names...], ...]}} where a condition has classes the
    whole source does not.
    """
    S, R, K = len(st.sources), len(st.regions), len(st.schedulers)
    labels = np.tile(np.arange(K), (S, R, 1))
    by_source, by_condition = {}, {}

    def _groups(lab) -> list:
        out = []
        for k in range(K):
            members = [st.schedulers[j] for j in range(K) if lab[j] == k]
            if len(members) > 1:
                out.append(members)
        return out

    for si, s in enumerate(st.sources):
        vals = st.values[s]  # (R, M, W, K); NaN outside the block
        used = []
        for r in range(R):
            if not st.block[s][r].any():
                continue
            labels[si, r] = _class_labels(vals[r][:, st.block[s][r]])
            used.append(r)
        if not used:
            continue
        src_lab = _class_labels(np.concatenate([vals[r][:, st.block[s][r]].reshape(-1, K) for r in used]))
        g = _groups(src_lab)
        if g:
            by_source[s] = g
        whole = {frozenset(x) for x in g}
        cond = {}
        for r in used:
            gr = [x for x in _groups(labels[si, r]) if frozenset(x) not in whole]
            if gr:
                cond[st.regions[r]] = _groups(labels[si, r])
        if cond:
            by_condition[s] = cond
    return {"labels": labels, "by_source": by_source, "by_condition": by_condition}


# --------------------------------------------------------------------------- core


def _ranks(vals: np.ndarray, direction: np.ndarray, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Within-window ranks (R, M, W, K), 0 where invalid, and the validity mask (R, M, W)."""
    orient = -direction[None, :, None, None]  # lower oriented value = better
    ov = vals * orient
    ov = np.where(np.isfinite(ov), ov, np.inf)
    r = stats.rankdata(ov, axis=-1)
    valid = block[:, None, :] & np.isfinite(vals).any(axis=-1)
    return np.where(valid[..., None], r, 0.0), valid


def _mean_ranks(counts: np.ndarray, ranks: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Weighted mean ranks: counts (B, W) window weights -> (B, R, M, K); NaN where no weight."""
    R, M, W, K = ranks.shape
    num = counts @ ranks.transpose(2, 0, 1, 3).reshape(W, R * M * K)
    den = counts @ valid.transpose(2, 0, 1).reshape(W, R * M).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mr = num.reshape(-1, R, M, K) / den.reshape(-1, R, M, 1)
    return np.where(den.reshape(-1, R, M, 1) > 0, mr, np.nan)


def _top_sets(mr: np.ndarray) -> np.ndarray:
    """Boolean mask of the schedulers tied for the best (lowest) mean rank; all False if NaN."""
    finite = np.isfinite(mr).all(axis=-1, keepdims=True)
    best = np.min(np.where(np.isfinite(mr), mr, np.inf), axis=-1, keepdims=True)
    return (mr == best) & finite


def _ci_fields(point: float, boot: np.ndarray, lo_bound: float = -1.0, hi_bound: float = 1.0) -> dict:
    """value, basic-bootstrap CI and bootstrap bias (mean of replicates - value) of a scalar."""
    lo, hi = _basic_ci(point, boot, lo_bound, hi_bound)
    bias = _nanmean(np.asarray(boot, dtype=np.float64), 0) - point if point is not None else np.nan
    return {"value": _py(point), "ci_low": _py(lo), "ci_high": _py(hi), "boot_bias": _py(bias)}


def compute_portability(df: pd.DataFrame, manifest: dict, *, practical_threshold: float = 0.05,
                        q: float = 0.05, n_boot: int = 1000, seed: int = 0,
                        metrics: Optional[Sequence[str]] = None,
                        workload: Optional[dict] = None, results_dir: Optional[str] = None,
                        abs_threshold: float = ABS_THRESHOLD, n_splits: int = SPLITS) -> dict:
    """The whole portability analysis of a runs table; returns the ``portability.json`` dict.

    Pure: reads nothing but its arguments (`load_store` provides them) and is deterministic for
    a given `seed`. Rankings, concordance, best-changes share and reversals follow the module
    docstring; every number is JSON-safe (None where undefined).
    """
    t_start = time.perf_counter()
    if not (0 < q < 1):
        raise SchedportError(f"q must be in (0, 1), got {q}")
    if not (practical_threshold >= 0):
        raise SchedportError(f"practical threshold must be >= 0, got {practical_threshold}")
    if n_boot < 1:
        raise SchedportError(f"n_boot must be >= 1, got {n_boot}")
    if not (0 <= abs_threshold < 1):
        raise SchedportError(f"absolute threshold must be in [0, 1), got {abs_threshold}")
    if n_splits < 1:
        raise SchedportError(f"n_splits must be >= 1, got {n_splits}")
    notes: list[str] = []
    status = manifest.get("status")
    if status is not None and str(status).lower() not in ("complete", "completed", "done", "finished", "ok", "success"):
        notes.append(f"The store's manifest says status = {status!r}: its results may be partial.")
    st = _Study(df, metrics, notes)
    families = metric_families(st, MAIN_METRICS)
    for g in families["groups"]:
        notes.append(f"Metrics {' = '.join(g)} rank the schedulers identically in every window: one ranking "
                     f"measured {len(g)} times, so only {g[0]} is analysed.")
    if families["dropped"]:
        _drop_metrics(st, families["dropped"])
    dups = duplicate_schedulers(st)
    for s_, groups in dups["by_source"].items():
        notes.append(f"{s_}: " + "; ".join(" = ".join(g) for g in groups) + " give identical results in every "
                     "window and region (counted once in reversals).")
    S, R, M, K = len(st.sources), len(st.regions), len(st.metrics), len(st.schedulers)
    B = int(n_boot)
    main = [m for m in MAIN_METRICS if m in st.metrics]
    if not main:
        main = list(st.metrics)
        notes.append("None of the main metrics is in the store: headline averages use every analysed metric.")
    elif len(main) < len(MAIN_METRICS):
        notes.append("Main metrics absent from the store: "
                     + ", ".join(m for m in MAIN_METRICS if m not in main) + ".")
    mi = np.array([st.metrics.index(m) for m in main])
    rng = np.random.default_rng(seed)

    # ---- ranks, mean ranks, bootstrap
    point_mr, boot_mr, tauF, spF, tops = {}, {}, {}, {}, {}
    ranks_of, valid_of, counts_of = {}, {}, {}
    rankings = []
    for s in st.sources:
        ranks, valid = _ranks(st.values[s], st.direction, st.block[s])
        ranks_of[s], valid_of[s] = ranks, valid
        W = ranks.shape[2]
        n_valid = valid.sum(axis=-1)  # (R, M)
        allnan = (st.block[s][:, None, :] & ~valid).sum(axis=-1)
        for r, m in zip(*np.nonzero(allnan)):
            if n_valid[r, m] >= 1:
                notes.append(f"{s} @ {st.regions[r]}, {st.metrics[m]}: {allnan[r, m]} window(s) where every "
                             "scheduler is NaN left out.")
        pm = _mean_ranks(np.ones((1, W)), ranks, valid)[0]
        counts = rng.multinomial(W, np.full(W, 1.0 / W), size=B).astype(np.float64)
        counts_of[s] = counts
        bm = _mean_ranks(counts, ranks, valid)
        # conditions without enough valid windows are undefined
        too_few = n_valid < MIN_WINDOWS
        pm[too_few] = np.nan
        bm[:, too_few] = np.nan
        for r, m in zip(*np.nonzero(too_few & st.block[s].any(axis=-1)[:, None])):
            notes.append(f"{s} @ {st.regions[r]}: metric {st.metrics[m]} has < {MIN_WINDOWS} windows with a "
                         "value; left out there.")
        point_mr[s], boot_mr[s] = pm, bm
        # float32 keeps order and ties: distinct mean ranks differ by >= 1/(2W), far above its precision
        f, dfn = _tau_features(bm.astype(np.float32))
        tauF[s] = (f.astype(np.float32, copy=False), dfn)
        g, dg = _spearman_features(bm)
        spF[s] = (g.astype(np.float32), dg)
        tops[s] = _top_sets(bm)
        lo, hi = _percentile_ci(bm)
        for r in range(R):
            for m in range(M):
                if not np.isfinite(pm[r, m]).all():
                    continue
                for k in range(K):
                    rankings.append({"metric": st.metrics[m], "region": st.regions[r], "source": s,
                                     "scheduler": st.schedulers[k], "mean_rank": pm[r, m, k],
                                     "ci_low": lo[r, m, k], "ci_high": hi[r, m, k],
                                     "n_windows": int(n_valid[r, m])})
    point_top = {s: _top_sets(point_mr[s]) for s in st.sources}

    def _dot(a, b):
        fa, da = a
        fb, db = b
        v = (fa * fb).sum(axis=-1, dtype=np.float64)
        return np.where(da & db, np.clip(v, -1, 1), np.nan)

    # ---- concordance between sources
    conc_sources = []
    src_pairs = [(a, b) for ia, a in enumerate(st.sources) for b in st.sources[ia + 1:]]
    src_tau_pt = np.full((len(src_pairs), R, M), np.nan)
    src_tau_bt = np.full((B, len(src_pairs), R, M), np.nan)
    src_top_pt = np.full((len(src_pairs), R, M), np.nan)
    src_top_bt = np.full((B, len(src_pairs), R, M), np.nan)
    for pi, (a, b) in enumerate(src_pairs):
        tb = _dot(tauF[a], tauF[b])  # (B, R, M)
        sb = _dot(spF[a], spF[b])
        top_b = (tops[a] & tops[b]).any(axis=-1).astype(np.float64)
        defined_b = np.isfinite(boot_mr[a]).all(-1) & np.isfinite(boot_mr[b]).all(-1)
        top_b = np.where(defined_b, top_b, np.nan)
        src_tau_bt[:, pi] = tb
        src_top_bt[:, pi] = top_b
        tau_pt = kendall_tau_b(point_mr[a], point_mr[b])  # (R, M)
        sp_pt = spearman_rho(point_mr[a], point_mr[b])
        tlo, thi = _basic_ci(tau_pt, tb)
        slo, shi = _basic_ci(sp_pt, sb)
        for r in range(R):
            for m in range(M):
                x, y = point_mr[a][r, m], point_mr[b][r, m]
                if not (np.isfinite(x).all() and np.isfinite(y).all()):
                    continue
                t, sp = tau_pt[r, m], sp_pt[r, m]
                top1 = float((point_top[a][r, m] & point_top[b][r, m]).any())
                src_tau_pt[pi, r, m] = t
                src_top_pt[pi, r, m] = top1
                nda, ndb = len(np.unique(x)), len(np.unique(y))
                conc_sources.append({
                    "metric": st.metrics[m], "region": st.regions[r], "source_a": a, "source_b": b,
                    "tau": t, "ci_low": tlo[r, m], "ci_high": thi[r, m],
                    "n_distinct_a": nda, "n_distinct_b": ndb, "tied": min(nda, ndb) <= TIED_DISTINCT,
                    "spearman": sp, "spearman_ci_low": slo[r, m], "spearman_ci_high": shi[r, m],
                    "top1": top1, "top1_support": _nanmean(top_b[:, r, m], 0)})

    # ---- concordance between regions (same source, metric)
    conc_regions = []
    reg_pairs = [(i, j) for i in range(R) for j in range(i + 1, R)]
    for s in st.sources:
        f, dfn = tauF[s]
        g, dg = spF[s]
        # (B, R, M, P) -> (B, M, R, P): Gram over regions
        ft = np.ascontiguousarray(f.transpose(0, 2, 1, 3))
        gt = np.ascontiguousarray(g.transpose(0, 2, 1, 3))
        tg = ft @ ft.transpose(0, 1, 3, 2)  # (B, M, R, R)
        sg = gt @ gt.transpose(0, 1, 3, 2)
        tp = tops[s].transpose(0, 2, 1, 3).astype(np.float32)
        topg = (tp @ tp.transpose(0, 1, 3, 2)) > 0
        dd = dfn.transpose(0, 2, 1)  # (B, M, R)
        ds = dg.transpose(0, 2, 1)
        defined = np.isfinite(boot_mr[s]).all(-1).transpose(0, 2, 1)
        for (i, j) in reg_pairs:
            tb = np.where(dd[:, :, i] & dd[:, :, j], np.clip(tg[:, :, i, j], -1, 1), np.nan)
            sb = np.where(ds[:, :, i] & ds[:, :, j], np.clip(sg[:, :, i, j], -1, 1), np.nan)
            top_b = np.where(defined[:, :, i] & defined[:, :, j], topg[:, :, i, j].astype(float), np.nan)
            tau_pt = kendall_tau_b(point_mr[s][i], point_mr[s][j])  # (M,)
            sp_pt = spearman_rho(point_mr[s][i], point_mr[s][j])
            tlo, thi = _basic_ci(tau_pt, tb)
            slo, shi = _basic_ci(sp_pt, sb)
            for m in range(M):
                x, y = point_mr[s][i, m], point_mr[s][j, m]
                if not (np.isfinite(x).all() and np.isfinite(y).all()):
                    continue
                t, sp = tau_pt[m], sp_pt[m]
                nda, ndb = len(np.unique(x)), len(np.unique(y))
                conc_regions.append({
                    "metric": st.metrics[m], "source": s, "region_a": st.regions[i], "region_b": st.regions[j],
                    "tau": t, "ci_low": tlo[m], "ci_high": thi[m],
                    "n_distinct_a": nda, "n_distinct_b": ndb, "tied": min(nda, ndb) <= TIED_DISTINCT,
                    "spearman": sp, "spearman_ci_low": slo[m], "spearman_ci_high": shi[m],
                    "top1": float((point_top[s][i, m] & point_top[s][j, m]).any()),
                    "top1_support": _nanmean(top_b[:, m], 0)})

    # ---- concordance between metrics (same source, region)
    conc_metrics = []
    met_pairs = [(i, j) for i in range(M) for j in range(i + 1, M)]
    main_set = set(mi.tolist())
    main_pair_ix = [n for n, (i, j) in enumerate(met_pairs) if i in main_set and j in main_set]
    met_tau_pt = np.full((S, R, len(met_pairs)), np.nan)
    met_tau_bt = np.full((B, S, R, len(met_pairs)), np.nan)
    pi_i = np.array([i for i, _ in met_pairs], dtype=np.int64)
    pi_j = np.array([j for _, j in met_pairs], dtype=np.int64)
    for si, s in enumerate(st.sources):
        f, dfn = tauF[s]
        g, dg = spF[s]
        tg = f @ f.transpose(0, 1, 3, 2)  # (B, R, M, M)
        sg = g @ g.transpose(0, 1, 3, 2)
        tp = tops[s].astype(np.float32)
        topg = (tp @ tp.transpose(0, 1, 3, 2)) > 0
        defined = np.isfinite(boot_mr[s]).all(-1)  # (B, R, M)
        if not met_pairs:
            continue
        tb = np.where(dfn[:, :, pi_i] & dfn[:, :, pi_j], np.clip(tg[:, :, pi_i, pi_j], -1, 1), np.nan)
        sb = np.where(dg[:, :, pi_i] & dg[:, :, pi_j], np.clip(sg[:, :, pi_i, pi_j], -1, 1), np.nan)
        top_b = np.where(defined[:, :, pi_i] & defined[:, :, pi_j], topg[:, :, pi_i, pi_j].astype(float), np.nan)
        met_tau_bt[:, si] = tb
        tsup = _nanmean(top_b, 0)
        tau_pt = kendall_tau_b(point_mr[s][:, pi_i], point_mr[s][:, pi_j])  # (R, pairs)
        sp_pt = spearman_rho(point_mr[s][:, pi_i], point_mr[s][:, pi_j])
        tlo, thi = _basic_ci(tau_pt, tb)
        slo, shi = _basic_ci(sp_pt, sb)
        for r in range(R):
            for n, (i, j) in enumerate(met_pairs):
                x, y = point_mr[s][r, i], point_mr[s][r, j]
                if not (np.isfinite(x).all() and np.isfinite(y).all()):
                    continue
                t, sp = tau_pt[r, n], sp_pt[r, n]
                met_tau_pt[si, r, n] = t
                nda, ndb = len(np.unique(x)), len(np.unique(y))
                conc_metrics.append({
                    "source": s, "region": st.regions[r], "metric_a": st.metrics[i], "metric_b": st.metrics[j],
                    "tau": t, "ci_low": tlo[r, n], "ci_high": thi[r, n],
                    "n_distinct_a": nda, "n_distinct_b": ndb, "tied": min(nda, ndb) <= TIED_DISTINCT,
                    "spearman": sp, "spearman_ci_low": slo[r, n], "spearman_ci_high": shi[r, n],
                    "top1": float((point_top[s][r, i] & point_top[s][r, j]).any()),
                    "top1_support": tsup[r, n]})

    # ---- best scheduler changes with the metric
    per_condition = []
    changed_pt = np.full((S, R), np.nan)
    changed_bt = np.full((B, S, R), np.nan)
    pair_changed_pt = np.full((S, R, max(len(main_pair_ix), 1)), np.nan)
    pair_changed_bt = np.full((B, S, R, max(len(main_pair_ix), 1)), np.nan)
    mains_i = np.array([met_pairs[n][0] for n in main_pair_ix], dtype=np.int64)
    mains_j = np.array([met_pairs[n][1] for n in main_pair_ix], dtype=np.int64)
    for si, s in enumerate(st.sources):
        tp_pt = point_top[s][:, mi]  # (R, Mm, K)
        ok_pt = np.isfinite(point_mr[s][:, mi]).all(axis=(-1, -2))
        ch = ~tp_pt.all(axis=-2).any(axis=-1)
        changed_pt[si] = np.where(ok_pt, ch, np.nan)
        tb = tops[s][:, :, mi]  # (B, R, Mm, K)
        ok_b = np.isfinite(boot_mr[s][:, :, mi]).all(axis=(-1, -2))
        changed_bt[:, si] = np.where(ok_b, ~tb.all(axis=-2).any(axis=-1), np.nan)
        if len(main_pair_ix):
            pt = point_top[s]
            dis = ~(pt[:, mains_i] & pt[:, mains_j]).any(-1)
            okp = np.isfinite(point_mr[s][:, mains_i]).all(-1) & np.isfinite(point_mr[s][:, mains_j]).all(-1)
            pair_changed_pt[si] = np.where(okp, dis, np.nan)
            bt = tops[s]
            disb = ~(bt[:, :, mains_i] & bt[:, :, mains_j]).any(-1)
            okb = np.isfinite(boot_mr[s][:, :, mains_i]).all(-1) & np.isfinite(boot_mr[s][:, :, mains_j]).all(-1)
            pair_changed_bt[:, si] = np.where(okb, disb, np.nan)
        for r in range(R):
            if not ok_pt[r]:
                continue
            best = {st.metrics[m]: [st.schedulers[k] for k in np.flatnonzero(point_top[s][r, m])] for m in mi}
            per_condition.append({"source": s, "region": st.regions[r], "changed": bool(ch[r]), "best": best})
    if len(mi) >= 2 and np.isfinite(changed_pt).any():
        bc_value = float(np.nanmean(changed_pt))
        bc = _ci_fields(bc_value, _nanmean(changed_bt.reshape(B, -1), 1), 0.0, 1.0)
        bc.update(n_conditions=int(np.isfinite(changed_pt).sum()), n_changed=int(np.nansum(changed_pt)))
        bcp = _ci_fields(_nanmean(pair_changed_pt.ravel(), 0), _nanmean(pair_changed_bt.reshape(B, -1), 1), 0.0, 1.0)
    else:
        bc_value = None
        bc = {"value": None, "ci_low": None, "ci_high": None, "n_conditions": 0, "n_changed": 0}
        bcp = {"value": None, "ci_low": None, "ci_high": None}
        notes.append("Best-changes-with-metric share undefined: needs >= 2 main metrics in an analysed condition.")
    bc["definition"] = ("share of (source, region) conditions in which no scheduler is tied-best on every main "
                        "metric (the intersection over main metrics of the best-scheduler sets is empty)")
    bcp["definition"] = "share of (condition, main-metric pair) whose best-scheduler sets are disjoint"

    # ---- headline concordance aggregates
    def _agg(pt: np.ndarray, bt: np.ndarray, axes_pt, axes_bt, lo_b: float = -1.0) -> dict:
        return _ci_fields(_nanmean(pt, axes_pt), _nanmean(bt, axes_bt), lo_b, 1.0)

    by_pair_region, by_pair, by_pair_all = [], [], []
    pair_vals_pt, pair_vals_bt = [], []
    cell_pt = np.full((len(src_pairs), R), np.nan)
    cell_bt = np.full((B, len(src_pairs), R), np.nan)
    for pi, (a, b) in enumerate(src_pairs):
        sub_pt = src_tau_pt[pi][:, mi]  # (R, Mm)
        sub_bt = src_tau_bt[:, pi][:, :, mi]
        for r in range(R):
            cell_pt[pi, r] = _nanmean(sub_pt[r], 0)
            cell_bt[:, pi, r] = _nanmean(sub_bt[:, r], 1)
            d = _ci_fields(cell_pt[pi, r], cell_bt[:, pi, r])
            d.update(source_a=a, source_b=b, region=st.regions[r], n_metrics=int(np.isfinite(sub_pt[r]).sum()))
            by_pair_region.append(d)
        ppt = _nanmean(sub_pt.ravel(), 0)
        pbt = _nanmean(sub_bt.reshape(B, -1), 1)
        pair_vals_pt.append(ppt)
        pair_vals_bt.append(pbt)
        d = _ci_fields(ppt, pbt)
        d.update(source_a=a, source_b=b, n_values=int(np.isfinite(sub_pt).sum()))
        by_pair.append(d)
        d = _agg(src_tau_pt[pi].ravel(), src_tau_bt[:, pi].reshape(B, -1), 0, 1)
        d.update(source_a=a, source_b=b, n_values=int(np.isfinite(src_tau_pt[pi]).sum()))
        by_pair_all.append(d)
    if src_pairs and np.isfinite(pair_vals_pt).any():
        pv = np.array(pair_vals_pt)
        k = int(np.nanargmin(pv))
        min_pair = dict(by_pair[k])  # the pair's own interval: one interval per number
        mlo, mhi = _basic_ci(pv[k], _nanmin(np.stack(pair_vals_bt, axis=1), 1))
        min_pair.update(min_over_pairs_ci_low=_py(mlo), min_over_pairs_ci_high=_py(mhi))
        flat = cell_pt.ravel()
        kc = int(np.nanargmin(flat))
        min_cell = _ci_fields(flat[kc], _nanmin(cell_bt.reshape(B, -1), 1))
        pc, rc = divmod(kc, R)
        min_cell.update(source_a=src_pairs[pc][0], source_b=src_pairs[pc][1], region=st.regions[rc])
        top1_src = _agg(src_top_pt[:, :, mi].ravel(), src_top_bt[:, :, :, mi].reshape(B, -1), 0, 1, 0.0)
    else:
        min_pair = min_cell = None
        top1_src = {"value": None, "ci_low": None, "ci_high": None}
        if len(st.sources) < 2:
            notes.append("One source only: no cross-source concordance.")

    if main_pair_ix:
        mpt = met_tau_pt[:, :, main_pair_ix]
        mbt = met_tau_bt[:, :, :, main_pair_ix]
        met_main = _agg(mpt.ravel(), mbt.reshape(B, -1), 0, 1)
        met_main["n_values"] = int(np.isfinite(mpt).sum())
    else:
        met_main = {"value": None, "ci_low": None, "ci_high": None, "n_values": 0}
    if met_pairs:
        met_all = _agg(met_tau_pt.ravel(), met_tau_bt.reshape(B, -1), 0, 1)
        met_all["n_values"] = int(np.isfinite(met_tau_pt).sum())
    else:
        met_all = {"value": None, "ci_low": None, "ci_high": None, "n_values": 0}
    met_main["definition"] = "mean Kendall tau-b over all pairs of main metrics and all (source, region) conditions"
    met_all["definition"] = "mean Kendall tau-b over all pairs of analysed metrics and all conditions"

    # metric x metric matrix (mean over conditions), for the figure
    mat = np.full((M, M), np.nan)
    np.fill_diagonal(mat, 1.0)
    if met_pairs:
        mm = _nanmean(met_tau_pt.reshape(-1, len(met_pairs)), 0)
        mat[pi_i, pi_j] = mm
        mat[pi_j, pi_i] = mm

    # ---- reversals (pooled: every metric, cross-source and cross-region, BH over all tests)
    rev = _reversals(st, practical_threshold, abs_threshold, q, dups["labels"])

    # ---- the study's form: per main metric, cross-source only, BH within the metric
    tied_src = {}
    for d in conc_sources:
        key = (d["source_a"], d["source_b"], d["metric"])
        tied_src[key] = tied_src.get(key, 0) + int(d["tied"])
    cross_tau = []
    for pi, (a, b) in enumerate(src_pairs):
        for m in mi:
            pt = src_tau_pt[pi, :, m]
            if not np.isfinite(pt).any():
                continue
            d = _ci_fields(_nanmean(pt, 0), _nanmean(src_tau_bt[:, pi, :, m], 1))
            d.update(source_a=a, source_b=b, metric=st.metrics[m], n_regions=int(np.isfinite(pt).sum()),
                     n_tied_regions=tied_src.get((a, b, st.metrics[m]), 0),
                     by_region={st.regions[r]: _py(pt[r]) for r in range(R)})
            cross_tau.append(d)
    from schedport.analysis.studyform import claims as _claims
    from schedport.analysis.studyform import study_form as _study_form

    ctx = {"st": st, "raw": rev["raw"], "labels": dups["labels"], "pair_keys": _pair_keys,
           "pair_label": _pair_label, "mean_ranks": _mean_ranks, "tau_features": _tau_features}
    sform = _study_form(ctx, q=q, counts=counts_of, ranks=ranks_of, valid=valid_of, mi=mi, n_splits=n_splits,
                        split_rng=np.random.default_rng([seed, 16]), cross_source_tau=cross_tau, duplicates=dups)
    sform["metric_families"] = families
    sform["main_metrics"] = main
    modeled = [s_ for s_ in st.sources if source_info(s_).get("modeled")]
    sform["claims"] = _claims(st, sform, by_pair, met_main, modeled)

    headline = {
        "main_metrics": main,
        "cross_source": {
            "basis": "Kendall tau-b between two sources' mean-rank vectors, averaged over the main metrics",
            "by_pair_region": by_pair_region,
            "by_pair": by_pair,
            "by_pair_all_metrics": by_pair_all,
            "min_pair": min_pair,
            "min_cell": min_cell,
            "top1_agreement": top1_src,
        },
        "reversals": rev["headline"],
        "metrics": {
            "mean_pairwise_tau": met_main,
            "mean_pairwise_tau_all_metrics": met_all,
            "best_changes_with_metric": bc,
            "best_changes_pairwise": bcp,
        },
    }
    parameters = {
        "practical_threshold": practical_threshold,
        "q": q,
        "n_boot": B,
        "seed": seed,
        "ci_level": CI_LEVEL,
        "ci_method": "bootstrap over windows (sources resampled independently, one resample of window ids "
                     "shared by all regions and metrics of a source); percentile intervals for mean ranks, basic "
                     "(reverse-percentile) intervals for concordance statistics and pooled shares; percentile intervals "
                     "for the study form's reversal and best-changes shares; the estimates themselves are not "
                     "bias-corrected",
        "min_windows": MIN_WINDOWS,
        "main_metrics": main,
        "metrics": st.metrics,
        "directions": {m: ("higher" if d > 0 else "lower") for m, d in zip(st.metrics, st.direction)},
        "schedulers": st.schedulers,
        "sources": st.sources,
        "regions": [{"name": r, "rho": st.rho[r]} for r in st.regions],
        "windows_per_source": {s: len(st.windows[s]) for s in st.sources},
        "seeds_per_cell": {"min": st.n_seeds[0], "max": st.n_seeds[1]},
        "rank_method": "within-window ranks, 1 = best, ties averaged (scipy.stats.rankdata); NaN ranks worst; "
                       "seeds averaged first",
        "effect": "per-window d * (A - B) / ((|A| + |B|) / 2), d = +1 higher-is-better else -1; "
                  "0 when A = B = 0; condition effect = median over windows",
        "test": "two-sided Wilcoxon signed-rank on per-window relative effects (scipy.stats.wilcoxon); "
                "zeros dropped; exact when untied and n <= 50, else normal approximation",
        "multiplicity": "Benjamini-Hochberg over every per-condition test made (all scheduler pairs, metrics, "
                        "conditions)",
        "reversal_rule": "opposite signs of the median effects, both BH q <= q, both |median effect| >= threshold",
    }
    from schedport.study.regions import LEGACY_DRAIN, parse_region_def

    sel = manifest.get("selectors") if isinstance(manifest.get("selectors"), dict) else {}
    try:
        rdef = parse_region_def(sel.get("region_def", LEGACY_DRAIN))   # stores made before recorded none
        rdef_spec, rdef_text = rdef.spec, rdef.describe()
    except SchedportError:
        rdef_spec, rdef_text = str(sel.get("region_def")), f"recorded as {sel.get('region_def')!r} (not known here)"
    parameters.update(region_def=rdef_spec, region_def_description=rdef_text)
    parameters.update(abs_threshold=abs_threshold, n_splits=n_splits,
                      bounded_metrics=[m for m in st.metrics if metric_is_bounded(m)],
                      threshold_rule=f"|effect| >= {abs_threshold} (absolute) for bounded metrics, >= "
                                     f"{practical_threshold} (relative) for the others")
    elapsed = time.perf_counter() - t_start
    out = {
        "schema": "schedport.portability/2",
        "store": store_identity(manifest),
        "selection": {"schedulers": list(st.schedulers), "sources": list(st.sources), "regions": list(st.regions),
                      "windows_per_source": {s: int(df.loc[df["source"].astype(str) == s, "window_id"].nunique())
                                             for s in st.sources}},
        "subset": _subset_info(manifest, st, workload),
        "study_form": sform,
        "regimes": regime_check(df, st.regions, st.sources),
        "metric_families": families,
        "duplicates": {"by_source": dups["by_source"], "by_condition": dups["by_condition"]},
        "headline": headline,
        "concordance": {"sources": conc_sources, "regions": conc_regions, "metrics": conc_metrics},
        "metric_matrix": {"metrics": st.metrics, "tau": mat},
        "rankings": rankings,
        "best_changes_with_metric_share": bc_value,
        "best_changes_with_metric": {**bc, "pairwise": bcp, "conditions": per_condition},
        "metric_concordance_mean": met_main["value"],
        "reversals": rev["summary"],
        "parameters": parameters,
        "provenance": _provenance(manifest, st.sources, results_dir),
        "missing_cells": st.missing_cells,
        "complete_blocks": st.complete_blocks,
        "complete_blocks_only": True,
        "workload": workload or {"available": False, "note": "no corpus directory given (--corpus)"},
        "notes": list(dict.fromkeys(notes)),
        "run_info": {"elapsed_s": round(elapsed, 3), "note": "wall time of the statistics; the only "
                                                             "field that differs between identical runs"},
    }
    return _py(out)


def _pair_keys(lab1: np.ndarray, lab2: Optional[np.ndarray], I: np.ndarray, J: np.ndarray, K: int) -> np.ndarray:
    """For each scheduler pair: the index of the first pair it duplicates, or -1 for a pair of twins.

    `lab1` (and `lab2` for a comparison of two conditions) give each scheduler's class in a
    condition (`duplicate_schedulers`); schedulers identical in every condition involved share a
    joint class. Two pairs with the same joint classes are one comparison; a pair whose two
    schedulers share a joint class compares a scheduler with itself.
    """
    joint = lab1 if lab2 is None else lab1 * K + lab2
    a, b = joint[I], joint[J]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    first: dict = {}
    rep = np.empty(len(I), dtype=np.int64)
    for p_ in range(len(I)):
        rep[p_] = -1 if lo[p_] == hi[p_] else first.setdefault((int(lo[p_]), int(hi[p_])), p_)
    return rep


def _pair_label(st: _Study, k: int, lab1: np.ndarray, lab2: Optional[np.ndarray]) -> str:
    """A scheduler's name, joined with its duplicates in the conditions compared ("edf = vllm-fcfs")."""
    K = len(st.schedulers)
    joint = lab1 if lab2 is None else lab1 * K + lab2
    return " = ".join(st.schedulers[j] for j in range(K) if joint[j] == joint[k])


def _bh_by_group(p: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """BH q-values computed separately within each group label (NaN p stay NaN)."""
    out = np.full(p.shape, np.nan)
    for g in np.unique(groups):
        sel = groups == g
        out[sel] = bh_adjust(p[sel])
    return out


def regime_check(df: pd.DataFrame, regions: Sequence[str], sources: Sequence[str]) -> dict:
    """Is a region the same regime in every source? The reference scheduler's queue, per source and region.

    For each (source, region): the median over windows (seeds averaged first) of
    `REGIME_SCHEDULER`'s ``backlog_at_last_arrival`` (the share of accepted requests still
    queued when the last one arrives), beside the fluid value max(0, 1 - 1/rho) of a queue
    started empty at offered load rho, the median ``ttft_p50_s`` and the median standard-SLO
    attainment. A region whose sources' median backlogs differ by more than `REGIME_SPREAD` is
    flagged: there "at this load" compares different regimes across sources. The check reads
    only the store; a store without the reference scheduler or the backlog column (made before
    it was recorded) gives an empty table and says why.
    """
    out = {"scheduler": REGIME_SCHEDULER, "spread_limit": REGIME_SPREAD, "rows": [], "flagged": [],
           "available": False, "note": ""}
    if "backlog_at_last_arrival" not in df.columns:
        out["note"] = "the store has no backlog_at_last_arrival column (made before it was recorded): no regime check"
        return out
    ref = df[df["scheduler"].astype(str) == REGIME_SCHEDULER]
    if ref.empty:
        out["note"] = f"{REGIME_SCHEDULER} is not in the store: no regime check"
        return out
    cols = ["backlog_at_last_arrival", "rho"] + [m for m in REGIME_METRICS if m in ref.columns]
    per_window = (ref.assign(source=ref["source"].astype(str), region=ref["region"].astype(str))
                  .groupby(["source", "region", "window_id"], observed=True)[cols]
                  .mean(numeric_only=True).reset_index())
    for region in regions:
        spread_of = []
        for source in sources:
            g = per_window[(per_window["source"] == source) & (per_window["region"] == region)]
            if g.empty:
                continue
            rho = float(g["rho"].iloc[0])
            med = {c: (float(np.nanmedian(g[c])) if g[c].notna().any() else None) for c in cols if c != "rho"}
            row = {"source": source, "region": region, "rho": rho, "n_windows": int(len(g)),
                   "backlog_median": med["backlog_at_last_arrival"], "fluid_backlog": max(0.0, 1.0 - 1.0 / rho)}
            row.update({f"{m}_median": med.get(m) for m in REGIME_METRICS})
            row["vs_fluid"] = None if row["backlog_median"] is None else row["backlog_median"] - row["fluid_backlog"]
            out["rows"].append(row)
            if row["backlog_median"] is not None:
                spread_of.append(row["backlog_median"])
        if len(spread_of) > 1 and max(spread_of) - min(spread_of) > REGIME_SPREAD:
            out["flagged"].append({"region": region, "spread": max(spread_of) - min(spread_of),
                                   "low": min(spread_of), "high": max(spread_of)})
    out["available"] = bool(out["rows"])
    return out


def headline_digest(res: dict) -> dict:
    """The study-form headline of a portability dict in a few numbers (for comparing two runs).

    Cross-source tau per source pair with its interval and ceiling-adjusted value, reversal
    share per main metric with its interval, best-changes share per window x region, the
    split-half range, and the region definition it was run under.
    """
    sf = res["study_form"]
    half = {(d["source_a"], d["source_b"]): d.get("adjusted") for d in sf["cross_source_half"]["by_pair"]}
    sh = [d["value"] for d in sf["split_half"] if d.get("value") is not None]
    return {
        "region_def": res["parameters"].get("region_def", "throughput"),
        "region_def_description": res["parameters"].get("region_def_description"),
        "corpus_sha256": res["provenance"].get("corpus_sha256"),
        "engine_hash": res["provenance"].get("engine_hash"),
        "cross_source_tau": [{"source_a": d["source_a"], "source_b": d["source_b"], "value": d["value"],
                              "ci_low": d["ci_low"], "ci_high": d["ci_high"],
                              "adjusted": half.get((d["source_a"], d["source_b"]))}
                             for d in res["headline"]["cross_source"]["by_pair"]],
        "reversals": [{"metric": e["metric"], "n_reversals": e["n_reversals"], "n_comparisons": e["n_comparisons"],
                       "share": e["share"], "ci_low": e["ci_low"], "ci_high": e["ci_high"]} for e in sf["reversals"]],
        "best_changes": {k: sf["best_changes_with_metric"].get(k) for k in ("share", "ci_low", "ci_high",
                                                                              "n_conditions")},
        "metric_tau": {k: res["headline"]["metrics"]["mean_pairwise_tau"].get(k) for k in ("value", "ci_low",
                                                                                            "ci_high")},
        "split_half_min": min(sh) if sh else None,
        "split_half_max": max(sh) if sh else None,
        "claims": {c["id"]: c["verdict"] for c in sf["claims"]},
        "selection": res.get("selection"),
        "regimes_flagged": [f["region"] for f in (res.get("regimes") or {}).get("flagged", [])],
    }


def _selection_text(sel: Optional[dict]) -> str:
    if not isinstance(sel, dict):
        return "an unrecorded selection"
    w = sel.get("windows_per_source") or {}
    return (f"{len(sel.get('schedulers', []))} schedulers x {sum(w.values())} windows ("
            + ", ".join(f"{k} {v}" for k, v in w.items()) + f") x {len(sel.get('regions', []))} regions")


def load_comparison(path, res: dict) -> dict:
    """The headline of another analysis (its ``portability.json``, or a directory holding one) beside this one.

    Meant for the same study under the other region definition: a file from another corpus or
    engine config is refused (one line), one under the same region definition is noted.
    """
    pth = Path(path)
    f = pth / "portability.json" if pth.is_dir() else pth
    if not f.is_file():
        raise SchedportError(f"{f}: not found (--compare takes another analysis' portability.json or its directory)")
    other = read_json(f)
    try:
        dig = headline_digest(other)
    except (KeyError, TypeError, AttributeError):
        raise SchedportError(f"{f}: not a portability.json of this schedport version (no study_form)") from None
    here = headline_digest(res)
    for k in ("corpus_sha256", "engine_hash"):
        if here[k] and dig[k] and here[k] != dig[k]:
            raise SchedportError(f"{f}: {k} {dig[k]} differs from this store's {here[k]}; compare runs of one study")
    note = ("" if dig["region_def"] != here["region_def"] else
            f"both analyses use region definition {here['region_def']}")
    differs = dig.get("selection") != here.get("selection")
    sel_note = (f"the two analyses cover different selections (this: {_selection_text(here.get('selection'))}; "
                f"the other: {_selection_text(dig.get('selection'))}): their numbers are not of one study"
                if differs else "")
    return {"this": here, "other": dig, "other_path": str(f), "note": note, "selection_differs": differs,
            "selection_note": sel_note}


def _subset_info(manifest: dict, st: _Study, workload: Optional[dict]) -> dict:
    """Whether the store holds a subset of the study (``--quick``, fewer schedulers, windows or regions).

    Compared with the scheduler registry, the default regions and, when the corpus manifest is
    at hand, the corpus's windows per source. The report's title says so for a subset.
    """
    from schedport.study.regions import REGIONS

    sel = manifest.get("selectors") if isinstance(manifest.get("selectors"), dict) else {}
    reasons = []
    if sel.get("quick"):
        reasons.append("the --quick selection")
    try:
        from schedport.engine.schedulers import REGISTRY

        n_known = len(REGISTRY)
    except Exception:  # the registry is optional for reading a store
        n_known = None
    if n_known and len(st.schedulers) < n_known:
        reasons.append(f"{len(st.schedulers)} of {n_known} schedulers")
    if set(st.regions) < set(REGIONS):
        reasons.append(f"{len(st.regions)} of {len(REGIONS)} regions")
    n_win = sum(len(v) for v in st.windows.values())
    if workload and workload.get("available"):
        corpus_n = Counter(str(w.get("source")) for w in workload.get("windows", []))
        total = sum(corpus_n.get(s, 0) for s in st.sources)
        if total and n_win < total:
            reasons.append(f"{n_win} of {total} windows")
    elif sel.get("quick"):
        reasons.append(f"{n_win} windows")
    return {"is_subset": bool(reasons), "reasons": reasons,
            "n_schedulers": len(st.schedulers), "n_windows": n_win, "n_regions": len(st.regions)}


def _reversals(st: _Study, thr: float, abs_thr: float, q: float, labels: np.ndarray) -> dict:
    """Per-condition paired tests, BH over all of them, and the cross-condition reversals (pooled).

    Returns the pooled ``summary`` and ``headline`` and, under ``raw``, the per-test arrays
    (effects, p-values, medians, test representatives) that the study form reuses.
    """
    S, R, M, K = len(st.sources), len(st.regions), len(st.metrics), len(st.schedulers)
    I, J = _pair_index(K)
    P = len(I)
    Wmax = max(len(st.windows[s]) for s in st.sources)
    bounded = np.array([metric_is_bounded(m) for m in st.metrics])
    thr_m = np.where(bounded, abs_thr, thr)  # (M,)
    eff = np.full((S, R, M, P, Wmax), np.nan)
    for si, s in enumerate(st.sources):
        v = st.values[s]  # (R, M, W, K), NaN outside the complete block
        a, b = v[..., I], v[..., J]  # (R, M, W, P)
        rel = relative_effect(a, b, 1)
        absd = np.where(np.isfinite(a) & np.isfinite(b), a - b, np.nan)
        e = np.where(bounded[None, :, None, None], absd, rel) * st.direction[None, :, None, None]
        eff[si, :, :, :, : v.shape[2]] = e.transpose(0, 1, 3, 2)
    # a test per (condition, metric, distinct pair): twins are no test, a duplicate pair is its representative
    test_rep = np.empty((S, R, P), dtype=np.int64)
    for si in range(S):
        for r in range(R):
            test_rep[si, r] = _pair_keys(labels[si, r], None, I, J, K)
    flat = eff.reshape(-1, Wmax)
    p, n_used = wilcoxon_pvalues(flat)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ok_rows = n_used > 0
        med = np.where(ok_rows, np.nanmedian(np.where(ok_rows[:, None], flat, 0.0), axis=1), np.nan)
        mean = np.where(ok_rows, np.nanmean(np.where(ok_rows[:, None], flat, 0.0), axis=1), np.nan)
    shape = (S, R, M, P)
    p, med, mean, n_used = (x.reshape(shape) for x in (p, med, mean, n_used))
    rep_b = np.broadcast_to(test_rep[:, :, None, :], shape)
    is_rep = rep_b == np.arange(P)
    made = (n_used > 0) & (rep_b >= 0)
    distinct = made & is_rep
    # q over the distinct tests (all at once for the pooled analysis, per metric for the study form)
    q_all = np.full(shape, np.nan)
    q_all[distinct] = bh_adjust(p[distinct])
    metric_of = np.broadcast_to(np.arange(M)[None, None, :, None], shape)
    q_met = np.full(shape, np.nan)
    q_met[distinct] = _bh_by_group(p[distinct], metric_of[distinct])
    src_ix = np.broadcast_to(np.arange(S)[:, None, None, None], shape)
    reg_ix = np.broadcast_to(np.arange(R)[None, :, None, None], shape)
    met_ix = metric_of
    safe_rep = np.where(rep_b >= 0, rep_b, 0)
    q_all = np.where(made, q_all[src_ix, reg_ix, met_ix, safe_rep], np.nan)
    q_met = np.where(made, q_met[src_ix, reg_ix, met_ix, safe_rep], np.nan)
    sign = np.sign(med)
    n_tests = int(distinct.sum())
    n_sig = int((distinct & (q_all <= q)).sum())
    n_raw = int((distinct & (p <= q)).sum())
    sigprac = made & (q_all <= q) & (np.abs(med) >= thr_m[None, None, :, None])

    items, n_comp = [], {"source": 0, "region": 0}
    comp_region, comp_src_pair, comp_reg_pair, comp_source = Counter(), Counter(), Counter(), Counter()
    by_region, by_source_pair, by_region_pair, by_source = Counter(), Counter(), Counter(), Counter()
    by_sched, by_metric = Counter(), Counter()
    map_counts = Counter()

    def _add(kind, s1, r1, s2, r2):
        rep = _pair_keys(labels[s1, r1], labels[s2, r2], I, J, K)
        keep = rep == np.arange(P)
        both = made[s1, r1] & made[s2, r2] & keep[None, :]
        nc = int(both.sum())
        n_comp[kind] += nc
        if kind == "source":
            comp_region[st.regions[r1]] += nc
            comp_src_pair[f"{st.sources[s1]} vs {st.sources[s2]}"] += nc
        else:
            comp_reg_pair[f"{st.regions[r1]} vs {st.regions[r2]}"] += nc
            comp_source[st.sources[s1]] += nc
        hit = both & sigprac[s1, r1] & sigprac[s2, r2] & (sign[s1, r1] * sign[s2, r2] < 0)
        for m, pp in zip(*np.nonzero(hit)):
            A = _pair_label(st, int(I[pp]), labels[s1, r1], labels[s2, r2])
            Bn = _pair_label(st, int(J[pp]), labels[s1, r1], labels[s2, r2])
            sa, sb, ra, rb = st.sources[s1], st.sources[s2], st.regions[r1], st.regions[r2]
            items.append({
                "kind": kind, "scheduler_a": st.schedulers[I[pp]], "scheduler_b": st.schedulers[J[pp]],
                "pair": f"{A} vs {Bn}", "metric": st.metrics[m], "effect_scale": "absolute" if bounded[m] else "relative",
                "source_a": sa, "region_a": ra, "source_b": sb, "region_b": rb,
                "effect_a": med[s1, r1, m, pp], "effect_b": med[s2, r2, m, pp],
                "mean_effect_a": mean[s1, r1, m, pp], "mean_effect_b": mean[s2, r2, m, pp],
                "p_a": p[s1, r1, m, pp], "p_b": p[s2, r2, m, pp],
                "q_a": q_all[s1, r1, m, pp], "q_b": q_all[s2, r2, m, pp],
                "n_windows_a": n_used[s1, r1, m, pp], "n_windows_b": n_used[s2, r2, m, pp],
                "better_a": st.schedulers[I[pp]] if med[s1, r1, m, pp] > 0 else st.schedulers[J[pp]],
                "better_b": st.schedulers[I[pp]] if med[s2, r2, m, pp] > 0 else st.schedulers[J[pp]],
            })
            pair = f"{A} vs {Bn}"
            by_sched[pair] += 1
            by_metric[st.metrics[m]] += 1
            if kind == "source":
                by_region[ra] += 1
                by_source_pair[f"{sa} vs {sb}"] += 1
                map_counts[(pair, ra)] += 1
            else:
                by_region_pair[f"{ra} vs {rb}"] += 1
                by_source[sa] += 1

    for r in range(R):
        for s1 in range(S):
            for s2 in range(s1 + 1, S):
                _add("source", s1, r, s2, r)
    for s in range(S):
        for r1 in range(R):
            for r2 in range(r1 + 1, R):
                _add("region", s, r1, s, r2)

    # strongest flips first: by the smaller of the two |median effects| relative to its threshold
    items.sort(key=lambda d: -min(abs(d["effect_a"]), abs(d["effect_b"]))
               / (abs_thr if d["effect_scale"] == "absolute" else max(thr, 1e-12)))
    n_rev = len(items)
    n_comp_all = n_comp["source"] + n_comp["region"]
    share = n_rev / n_comp_all if n_comp_all else None
    lo, hi = _wilson(n_rev, n_comp_all)
    n_src = sum(1 for d in items if d["kind"] == "source")
    n_reg = n_rev - n_src

    def _table(hits: Counter, comps: Counter, total: int, order: Optional[list] = None) -> dict:
        keys = order if order is not None else sorted(set(hits) | set(comps), key=lambda k: (-hits[k], k))
        return {k: {"n_reversals": int(hits.get(k, 0)), "n_comparisons": int(comps.get(k, 0)),
                    "share_of_reversals": (hits.get(k, 0) / total) if total else None,
                    "rate": (hits.get(k, 0) / comps[k]) if comps.get(k) else None} for k in keys}

    def _top(c: Counter, total: int) -> Optional[dict]:
        if not c:
            return None
        k, v = max(c.items(), key=lambda kv: (kv[1], kv[0]))
        return {"key": k, "count": v, "share_of_reversals": v / total if total else None}

    def _ordered(c: Counter) -> dict:
        return {k: int(c[k]) for k in sorted(c, key=lambda k: (-c[k], k))}

    src_pair_keys = [f"{a} vs {b}" for i, a in enumerate(st.sources) for b in st.sources[i + 1:]]
    reg_pair_keys = [f"{a} vs {b}" for i, a in enumerate(st.regions) for b in st.regions[i + 1:]]
    summary = {
        "n_tests": n_tests,
        "n_tests_raw_p_below_q": n_raw,
        "n_tests_significant": n_sig,
        "n_tests_significant_practical": int((sigprac & distinct).sum()),
        "n_comparisons": n_comp_all,
        "n_significant_practical": n_rev,
        "share": share,
        "share_ci_low": lo,
        "share_ci_high": hi,
        "share_ci_method": "Wilson score interval (treats comparisons as independent; understates uncertainty)",
        "by_kind": {"source": {"n_reversals": n_src, "n_comparisons": n_comp["source"],
                               "rate": n_src / n_comp["source"] if n_comp["source"] else None},
                    "region": {"n_reversals": n_reg, "n_comparisons": n_comp["region"],
                               "rate": n_reg / n_comp["region"] if n_comp["region"] else None}},
        "cross_source": {
            "n_comparisons": n_comp["source"], "n_reversals": n_src,
            "by_region": _table(by_region, comp_region, n_src, st.regions),
            "by_source_pair": _table(by_source_pair, comp_src_pair, n_src, src_pair_keys),
        },
        "cross_region": {
            "n_comparisons": n_comp["region"], "n_reversals": n_reg,
            "by_region_pair": _table(by_region_pair, comp_reg_pair, n_reg, reg_pair_keys),
            "by_source": _table(by_source, comp_source, n_reg, st.sources),
        },
        "by_scheduler_pair": _ordered(by_sched),
        "by_metric": _ordered(by_metric),
        "map": [{"scheduler_pair": k[0], "region": k[1], "count": v} for k, v in sorted(map_counts.items())],
        "counting": "each reversal counts once; duplicate schedulers (identical results in both conditions "
                    "compared) are one scheduler, so their repeated comparisons count once; shares of "
                    "cross-source reversals divide by the cross-source count, of cross-region ones by the "
                    "cross-region count; the map holds cross-source reversals by their region",
        "items": items,
    }
    headline = {
        "n_comparisons": n_comp_all,
        "n_significant_practical": n_rev,
        "share": share,
        "ci_low": lo,
        "ci_high": hi,
        "ci_method": "Wilson score interval",
        "n_tests": n_tests,
        "n_cross_source": n_src,
        "n_cross_region": n_reg,
        "top_region": _top(by_region, n_src),
        "top_source_pair": _top(by_source_pair, n_src),
        "top_scheduler_pair": _top(by_sched, n_rev),
        "top_metric": _top(by_metric, n_rev),
    }
    raw = {"eff": eff, "p": p, "med": med, "n_used": n_used, "made": made, "distinct": distinct,
           "test_rep": test_rep, "q_metric": q_met, "thr_m": thr_m, "bounded": bounded, "I": I, "J": J}
    return {"summary": summary, "headline": headline, "raw": raw}


# --------------------------------------------------------------------------- provenance, workload

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
    ("servegen", None),  # alias of bailian
)


def source_info(label: str) -> dict:
    """License, citation and modeled/real flag for a source label (matched by prefix)."""
    low = label.lower()
    table = dict((k, v) for k, v in SOURCE_INFO if v is not None)
    for key, info in SOURCE_INFO:
        if low.startswith(key) or key in low:
            info = info or table["bailian"]
            return {"source": label, **info}
    return {"source": label, "name": label, "license": "unknown", "citation": "not known to schedport",
            "modeled": False, "note": ""}


def _provenance(manifest: dict, sources: list[str], results_dir: Optional[str]) -> dict:
    from schedport.__about__ import __version__

    keys = ("corpus_sha256", "engine_hash", "engine_config", "package_version", "git_commit", "selectors",
            "started", "finished", "ended", "status", "corpus_dir", "cells_done", "kind", "store_schema")
    prov = {k: manifest.get(k) for k in keys}
    prov["manifest_extra_keys"] = sorted(k for k in manifest if k not in keys)
    prov["results_dir"] = results_dir
    prov["analysis_version"] = __version__
    prov["data_sources"] = [source_info(s) for s in sources]
    return prov


# stat name -> (exact key in schedport.workload.corpus manifests, fallbacks: substrings that must all be in the key)
_WORKLOAD_STATS = (
    ("n_requests", "n_requests", (("num_requests",),)),
    ("duration_s", "duration_s", (("duration",),)),
    ("rate_mean_rps", "mean_rate_rps", (("mean", "rate"), ("rate",))),
    ("dispersion", "index_of_dispersion", (("dispersion",), ("idc",))),
    ("input_mean", "input_mean", (("input", "mean"),)),
    ("input_p50", "input_p50", (("input", "p50"), ("input", "median"))),
    ("input_p99", "input_p99", (("input", "p99"),)),
    ("output_mean", "output_mean", (("output", "mean"),)),
    ("output_p50", "output_p50", (("output", "p50"), ("output", "median"))),
    ("output_p99", "output_p99", (("output", "p99"),)),
)


def _match_stat(flat: dict, exact: str, alternatives) -> Optional[float]:
    v = flat.get(exact)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    for must in alternatives:
        for k, v in flat.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if all(t in k.lower() for t in must):
                return float(v)
    return None


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "_"))
        else:
            out[key] = v
    return out


def load_workload(corpus_dir, expect_corpus: Optional[str] = None) -> dict:
    """Per-window workload statistics from a corpus manifest, for the characterization figure.

    Reads ``corpus_dir/manifest.json``; its ``windows`` entries (a list, or a dict keyed by window
    id) carry a ``source`` and per-window statistics, matched by name (e.g. ``mean_input_tokens``,
    ``input_p99``, ``mean_rate_rps``, ``index_of_dispersion``). A corpus whose hash differs from
    the results store's is refused: the figure would describe other windows.
    """
    d = Path(corpus_dir)
    mpath = d / "manifest.json" if d.is_dir() else d
    if not mpath.is_file():
        raise SchedportError(f"{mpath}: corpus manifest not found")
    man = read_json(mpath)
    if not isinstance(man, dict):
        raise SchedportError(f"{mpath}: expected a JSON object (a corpus manifest)")
    h = man.get("corpus_sha256") or man.get("sha256")
    if expect_corpus and h and h != expect_corpus:
        raise SchedportError(f"{mpath}: corpus {h} is not the one the results were run on ({expect_corpus})")
    wins = man.get("windows")
    if isinstance(wins, dict):
        wins = [{"window_id": k, **v} for k, v in wins.items() if isinstance(v, dict)]
    if not isinstance(wins, list) or not wins:
        raise SchedportError(f"{mpath}: no 'windows' entries")
    rows = []
    for w in wins:
        if not isinstance(w, dict):
            continue
        flat = _flatten(w)
        row = {"source": str(flat.get("source", "unknown")),
               "window_id": _py(flat.get("window_id", flat.get("id")))}
        for name, exact, alternatives in _WORKLOAD_STATS:
            v = _match_stat(flat, exact, alternatives)
            if v is not None:
                row[name] = v
        rows.append(row)
    found = [n for n, _, _ in _WORKLOAD_STATS if any(n in r for r in rows)]
    srcs = man.get("sources") if isinstance(man.get("sources"), dict) else {}
    corpus_sources = {str(k): {"cite": v.get("cite"), "modeled": v.get("modeled"), "adapter": v.get("adapter")}
                      for k, v in srcs.items() if isinstance(v, dict)}
    return {"available": True, "corpus_dir": str(d), "corpus_sha256": h, "stats": found, "windows": rows,
            "corpus_sources": corpus_sources, "note": f"{len(rows)} windows from {mpath}"}


# --------------------------------------------------------------------------- entry points


def analyze(results_dir, out_dir=None, *, practical_threshold: float = 0.05, q: float = 0.05,
            n_boot: int = 1000, seed: int = 0, metrics: Optional[Sequence[str]] = None,
            corpus_dir=None, expect_corpus: Optional[str] = None,
            expect_engine: Optional[str] = None, validation=None,
            abs_threshold: float = ABS_THRESHOLD, n_splits: int = SPLITS, compare=None) -> dict:
    """Analyse a results store; write ``portability.json`` and ``report.html``; return the dict.

    `out_dir` defaults to `results_dir`. `corpus_dir` (optional) adds the workload
    characterization figure (the report says when it is absent). `validation` (optional: the
    path of a ``validation.json`` from ``schedport validate``, or its dict) appends the
    simulator-vs-real-engine section to the report. The store is refused (one-line
    `SchedportError`) when unusable, mixed, or not from the expected corpus/engine.
    """
    from schedport.report.html import write_report
    from schedport.analysis.validation_stats import load_validation

    vdict = load_validation(validation) if validation is not None else None

    rdir = Path(results_dir)
    df, manifest = load_store(rdir, expect_corpus=expect_corpus, expect_engine=expect_engine)
    workload = None
    if corpus_dir is not None:
        workload = load_workload(corpus_dir, expect_corpus=manifest.get("corpus_sha256"))
    elif isinstance(manifest.get("corpus_dir"), str):
        # the store names the corpus it was run on: use it for the figure when it is still there
        cdir = Path(manifest["corpus_dir"])  # as given to `schedport run` (relative to its cwd)
        if not (cdir / "manifest.json").is_file() and not cdir.is_absolute():
            cdir = rdir / cdir
        if (cdir / "manifest.json").is_file():
            try:
                workload = load_workload(cdir, expect_corpus=manifest.get("corpus_sha256"))
                workload["note"] += " (the corpus named by the results manifest)"
            except SchedportError as e:
                workload = {"available": False, "note": f"the corpus named by the results manifest is not "
                                                        f"usable: {e}"}
        else:
            workload = {"available": False, "note": f"the corpus named by the results manifest ({cdir}) is "
                                                    "not there and no --corpus was given"}
    res = compute_portability(df, manifest, practical_threshold=practical_threshold, q=q, n_boot=n_boot,
                              seed=seed, metrics=metrics, workload=workload, results_dir=str(rdir),
                              abs_threshold=abs_threshold, n_splits=n_splits)
    if compare is not None:
        res["region_comparison"] = _py(load_comparison(compare, res))
    odir = Path(out_dir) if out_dir is not None else rdir
    odir.mkdir(parents=True, exist_ok=True)
    tmp = odir / "portability.json.tmp"
    tmp.write_text(json.dumps(res, indent=1, allow_nan=False))
    tmp.replace(odir / "portability.json")
    write_report(res, odir / "report.html", vdict)
    return res


def analyze_command(
    results: Path = typer.Option(..., "--results", parser=parse_out_path, help="Results store written by `schedport run`."),
    out: Optional[Path] = typer.Option(None, "--out", parser=parse_out_path,
                                       help="Where to write portability.json and report.html "
                                                          "(default: the results directory)."),
    corpus: Optional[Path] = typer.Option(None, "--corpus", help="Corpus directory (its manifest.json) for the "
                                                                 "workload-characterization figure."),
    threshold: float = typer.Option(0.05, "--threshold", help="Practical threshold on |relative effect| "
                                                             "(unbounded metrics)."),
    abs_threshold: float = typer.Option(ABS_THRESHOLD, "--abs-threshold",
                                        help="Practical threshold on |absolute difference| for bounded metrics "
                                             "(attainment, Jain indices, shares): 0.02 = 2 percentage points."),
    n_splits: int = typer.Option(SPLITS, "--splits", help="Random splits for the split-half reliability."),
    compare: Optional[Path] = typer.Option(None, "--compare", help="portability.json (or its directory) of the "
                                                                  "same study under the other region definition: "
                                                                  "show both headlines side by side."),
    q: float = typer.Option(0.05, "--q", help="Benjamini-Hochberg false discovery rate."),
    n_boot: int = typer.Option(1000, "--boot", "--n-boot", help="Bootstrap replicates (>= 1000 for reporting)."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="Comma-separated metrics (default: all)."),
    expect_corpus: Optional[str] = typer.Option(None, "--expect-corpus", help="Refuse a store from another corpus."),
    validation: Optional[Path] = typer.Option(None, "--validation", help="validation.json from `schedport "
                                                                         "validate`: add its section to the report."),
    explain: Optional[str] = typer.Option(None, "--explain", help="K: explain the K strongest study-form reversals "
                                          "(`schedport explain`, cached in RESULTS/explain) and add a 'Why it flips' "
                                          "section to the report; or N1,N2,...: those reversals (numbers as in "
                                          "`schedport explain --list`)."),
) -> None:
    """Rank schedulers per source, region and metric; map where rankings hold and where they flip."""
    check_analyze_options(results=results, q=q, n_boot=n_boot, seed=seed, n_splits=n_splits, threshold=threshold,
                          abs_threshold=abs_threshold, metrics=metrics, explain=explain)
    mlist = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
    res = analyze(results, out, practical_threshold=threshold, q=q, n_boot=n_boot, seed=seed, metrics=mlist,
                  corpus_dir=corpus, expect_corpus=expect_corpus, validation=validation,
                  abs_threshold=abs_threshold, n_splits=n_splits, compare=compare)
    odir = out if out is not None else results
    if explain:
        from schedport.analysis.explain import add_explanations
        add_explanations(res, results, odir, explain, corpus_dir=corpus, validation=validation)
    for line in summary_lines(res):
        typer.echo(line)
    wl = res.get("workload") or {}
    if not wl.get("available"):
        typer.echo(f"workload figure left out of the report: {wl.get('note', 'no corpus')}")
    typer.echo(f"wrote {odir / 'portability.json'}")
    if validation is not None:
        typer.echo(f"report includes the validation section from {validation}")
    typer.echo(f"report: {odir / 'report.html'}")


def check_analyze_options(*, results, q, n_boot, seed, n_splits, threshold, abs_threshold, metrics, explain) -> None:
    """Every `analyze` option checked before any work, each error naming its flag."""
    from schedport.analysis.explain import check_results_dir, parse_selection

    check_results_dir(results)
    if not (0 < q < 1):
        raise SchedportError(f"--q must be in (0, 1), got {q}")
    if n_boot < 1:
        raise SchedportError(f"--boot must be at least 1, got {n_boot}")
    if seed < 0:
        raise SchedportError(f"--seed must be >= 0, got {seed}")
    if n_splits < 1:
        raise SchedportError(f"--splits must be at least 1, got {n_splits}")
    if not (threshold >= 0):
        raise SchedportError(f"--threshold must be >= 0, got {threshold}")
    if not (0 <= abs_threshold < 1):
        raise SchedportError(f"--abs-threshold must be in [0, 1), got {abs_threshold}")
    if metrics is not None and not metrics.strip(",").strip():
        raise SchedportError("--metrics: empty; give metric names, or leave the option out for all")
    if explain is not None:
        if not explain.strip():
            raise SchedportError("--explain: empty; give K or reversal numbers N1,N2,...")
        parse_selection(explain, 10 ** 9)  # the form now; the numbers against the reversals found, later


def summary_lines(res: dict) -> list[str]:
    """A few plain-text lines with the headline numbers in the study's form (for the terminal)."""
    from schedport.common.formatting import fmt, pct
    from schedport.analysis.studyform import adjusted_text

    h = res["headline"]
    sf = res["study_form"]
    lines = []
    if res.get("subset", {}).get("is_subset"):
        lines.append("subset run: " + ", ".join(res["subset"]["reasons"]))
    cs = h["cross_source"]
    half = {(d["source_a"], d["source_b"]): d for d in sf["cross_source_half"]["by_pair"]}
    for d in cs["by_pair"]:
        adj = half.get((d["source_a"], d["source_b"]), {}).get("adjusted")
        lines.append(f"tau {d['source_a']} vs {d['source_b']}: {fmt(d['value'])} "
                     f"[{fmt(d['ci_low'])}, {fmt(d['ci_high'])}] (main metrics, all regions; ceiling-adjusted "
                     f"{adjusted_text(adj)})")
    for e in sf["reversals"]:
        lines.append(f"reversals on {e['metric']}: {e['n_reversals']} of {e['n_comparisons']} cross-source "
                     f"comparisons ({pct(e['share'])} [{pct(e['ci_low'])}, {pct(e['ci_high'])}])")
    bc = sf["best_changes_with_metric"]
    lines.append(f"best scheduler changes with the metric in {pct(bc['share'])} [{pct(bc['ci_low'])}, "
                 f"{pct(bc['ci_high'])}] of {bc['n_conditions']} window x region cells"
                 + ("; forced by " + ", ".join(f"{f['scheduler']} on {f['metric']}" for f in bc["forced_by"])
                    if bc.get("forced_by") else ""))
    lines.append(f"mean metric tau {fmt(h['metrics']['mean_pairwise_tau']['value'])}")
    if sf["split_half"]:
        vals = [d["value"] for d in sf["split_half"] if d["value"] is not None]
        lines.append(f"split-half reliability {fmt(min(vals))}-{fmt(max(vals))} over source x region")
    rv = h["reversals"]
    lines.append(f"pooled reversals (all metrics, cross-source and cross-region): {rv['n_significant_practical']} "
                 f"of {rv['n_comparisons']} comparisons ({pct(rv['share'])})")
    for c in sf["claims"]:
        lines.append(f"claim '{c['study'][:60]}': {c['verdict']}")
    if res.get("missing_cells"):
        lines.append(f"{len(res['missing_cells'])} missing cell(s): analysed on complete blocks")
    rg = res.get("regimes") or {}
    for f in rg.get("flagged", []):
        lines.append(f"warning (regimes): at {f['region']} the sources' median {rg['scheduler']} backlog at the last "
                     f"arrival spans {fmt(f['low'], 2)}-{fmt(f['high'], 2)}: not one regime")
    rc = res.get("region_comparison") or {}
    if rc.get("selection_differs"):
        lines.append(f"warning (--compare): {rc['selection_note']}")
    return lines
