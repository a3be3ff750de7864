"""Portability analysis: do scheduler rankings carry over across sources, regions and metrics?

Reads only the results store written by ``schedport run`` (``DIR/runs/``, a Parquet dataset
with one row per (source, window_id, region, scheduler, seed), and ``DIR/manifest.json``) and
writes ``portability.json`` (every headline number with its CI, the parameters used and the
full reversal list). ``report.html`` is rendered from that dict by `schedport.report.html`
(`schedport.api.analyze` does both, as ``schedport analyze`` and ``schedport run`` do).

`compute_portability` runs the analysis as named steps, each in the module of its concept:
the inputs (`schedport.analysis.store_loading`), what is counted once (metric families and
duplicate schedulers, `schedport.analysis.duplicates`), the rankings and their bootstrap
(`schedport.analysis.ranks`), concordance and its headlines (`schedport.analysis.concordance`),
the pooled reversals (`schedport.analysis.reversals`), the study's form and its claims
(`schedport.analysis.studyform`), with the regime check (`schedport.analysis.regimes`) and
the provenance (`schedport.analysis.provenance`); the statistics themselves are in
`schedport.analysis.stats`, metric directions in `schedport.analysis.directions`.

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
    rho, exactly the statistics of ``scipy.stats.kendalltau`` / ``spearmanr`` (computed in
    vectorised form, `stats.kendall_tau_b` / `spearman_rho`, and checked against scipy in the tests:
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
    (step-up, `stats.bh_adjust`, tested against ``scipy.stats.false_discovery_control``)
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

Robustness (``robustness``, `schedport.analysis.multiverse`; ``--no-robustness`` leaves it out)
    The five claims recomputed under every analysis protocol: a protocol is one value per axis
    of ``axes`` {name: [values]} (aggregation, ties, rel_threshold, abs_threshold, test, bh_level,
    bh_family, metric_set, scheduler_set, comparison; region_def when ``--compare`` names an
    analysis whose directory holds its store), ``n_protocols`` their product,
    ``default_protocol`` the study form's, ``n_boot`` the resamples behind each protocol's
    intervals (200: those intervals are not shown), ``note``. ``claims``: one entry per claim,
    [{``id``, ``share_holds`` (share of protocols under which the verdict is "holds"),
    ``verdicts`` {verdict: share}, ``by_axis`` {axis: {value: share_holds}} (an axis that cannot
    move the claim has the claim's share at every value), ``axes`` (those that can),
    ``n_distinct`` (analyses actually computed: one per combination of those axes), ``robust``
    (one verdict under every protocol), ``depends_on`` (axes along which a verdict's share
    changes, largest change first), ``summary``, ``default`` {value, verdict, n_comparisons},
    ``closest`` {``protocol``, ``value``, ``verdict``, ``n_comparisons``, ``distance``; for the
    reversals also ``one_metric``: the closest single metric's share}, ``distance`` (the stated
    distance to the study's number), ``curve`` {value, verdict} (every distinct protocol, sorted
    by value: the specification curve)}]. The value of a protocol is the claim's number in the
    study form (the pooled share over the metric set for the reversals) and ``n_comparisons`` what
    it counts (comparisons, tau values, or window x region cells).

Simulator (``simulator``, `schedport.analysis.simulator`; only for a store run with ``--variants``)
    The study's steps (`core_steps`, the analysis's own parameters) on every engine variant's
    store (`schedport.study.variants`, docs/engine.md §3.6), then: ``set`` {name, version,
    description, source, digest}, ``default`` ("default"), ``variants`` [{name, overlay, why}],
    ``n_variants`` V (the default not counted); ``reversals``: every study-form reversal of the
    default [{metric, scheduler_pair, scheduler_a, scheduler_b, region, source_a, source_b, effect_a,
    effect_b, q_a, q_b, ``survival`` (share of the V variants where the same flip -- metric, region,
    sources, schedulers on the same sides, same direction -- is still a reversal under the same
    rules), ``n_survived``, ``n_variants``, ``fails_under`` [variant names], ``class`` (robust: all;
    fragile: under half; partial)}], strongest first; ``distribution`` {n_reversals, all,
    at_least_75, under_50, none, by_n_survived {k: count}, by_metric {metric: {n_reversals, robust,
    fragile}}}; ``new_by_variant`` {variant: reversals the default does not have}; ``claims``
    [{id, default (verdict), by_variant {variant: verdict}, share_holds, n_same, n_variants,
    share_same}]; ``rank_tau`` [{variant_a, variant_b, n_conditions, median, mean, min, by_metric}]
    (Kendall tau-b between two variants' mean-rank vectors per (source, region, main metric)) and
    ``rank_tau_vs_default`` {median, min}; ``stable``: rankings that hold everywhere in the default
    [{metric, scheduler_pair, region, winner, loser, effects {source: median effect}, strength,
    survival, n_survived, n_variants, fails_under, class}] (a pair significant, large and of one
    sign in every source; strongest first) and ``n_stable``; ``predicted``
    {strongest_reversal, most_stable_ranking} (the real-engine check, `schedport validate
    --predicted`); ``selection_differs`` (variants whose schedulers, regions or windows are not the
    default's: an interrupted or extended sweep) with its ``note``; ``definitions``; ``elapsed_s``.

Performance: the full default study (13 schedulers, 3 sources x 40 windows, 6 regions, 21
distinct metrics, B = 1000, ~23,000 Wilcoxon tests, the study form's 5 x 1,404 tests redone
on 1,000 resamples, 1,000 random splits) takes about 20 s for the statistics and about 40 s in
all with the report's figures on a busy 2-core machine (``run_info.elapsed_s`` records it); the
protocol multiverse adds about 45 s (``run_info.robustness_elapsed_s``: 41.5 s of a 57 s analysis
of the default store).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from schedport.analysis import multiverse, studyform
from schedport.analysis.answer import cross_region_headline, flips_headline, own_standing
from schedport.analysis.comparison import headline_digest, load_comparison
from schedport.analysis.concordance import (best_changes, cross_source_headline, cross_source_tau_by_metric,
                                            metric_concordance, metric_headline, metric_matrix, region_concordance,
                                            source_concordance)
from schedport.analysis.defaults import (ABS_THRESHOLD, CI_LEVEL, MIN_WINDOWS, N_BOOT, PRACTICAL_THRESHOLD, Q,
                                         SPLITS)
from schedport.analysis.directions import DIRECTIONS, MAIN_METRICS, metric_direction, metric_is_bounded
from schedport.analysis.duplicates import find_duplicates, pair_keys, pair_label
from schedport.analysis.provenance import provenance, source_info, subset_info
from schedport.analysis.ranks import Rankings, mean_ranks, rank_schedulers
from schedport.analysis.regimes import REGIME_SPREAD, regime_check
from schedport.analysis.results import (Claim, CrossSourceHeadline, Estimate, PooledReversals, StudyForm, Unavailable,
                                       to_json)
from schedport.analysis.reversals import pooled_reversals
from schedport.analysis.schema import SCHEMA_VERSION
from schedport.analysis.steps import CoreSteps
from schedport.analysis.simulator import SimulatorAxis, simulator_axis, variant_findings
from schedport.analysis.deployments import DeploymentAxis, deployment_axis, is_deployment_set
from schedport.analysis.stats import (bh_adjust, kendall_tau_b, relative_effect, spearman_rho,
                                      tau_features, wilcoxon_pvalues)
from schedport.analysis.store_loading import Study, load_store, load_workload, window_key
from schedport.common.atomic import atomic_write_text
from schedport.common.guard import store_identity
from schedport.errors import SchedportError
from schedport.study.regions import LEGACY_DRAIN, parse_region_def
from schedport.study.variants import DEFAULT_VARIANT, read_variant_runs

# The names this module offers: its own steps and the analysis steps' names it re-exports, which
# it had in 0.1.0 when the whole analysis lived here.
__all__ = [
    "ABS_THRESHOLD", "DIRECTIONS", "MAIN_METRICS", "MIN_WINDOWS", "REGIME_SPREAD", "SPLITS",
    "analyze", "bh_adjust", "compute_portability", "headline_digest", "kendall_tau_b", "load_comparison",
    "load_store", "load_workload", "metric_direction", "metric_is_bounded", "regime_check", "relative_effect",
    "source_info", "spearman_rho", "wilcoxon_pvalues", "window_key",
]

def check_parameters(*, practical_threshold: float, q: float, n_boot: int, abs_threshold: float,
                     n_splits: int) -> None:
    """Refuse (one-line `SchedportError`) parameters outside their range, before any work."""
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


def load_study(df: pd.DataFrame, manifest: dict, metrics: Optional[Sequence[str]],
               notes: list[str]) -> Study:
    """The load step: the runs table reshaped per source (`Study`), with a note when the
    manifest says the sweep did not finish."""
    status = manifest.get("status")
    if status is not None and str(status).lower() not in ("complete", "completed", "done", "finished", "ok", "success"):
        notes.append(f"The store's manifest says status = {status!r}: its results may be partial.")
    return Study(df, metrics, notes)


def main_metrics(st: Study, notes: list[str]) -> tuple[list[str], np.ndarray]:
    """The main metrics present in the study (every analysed metric when none is) and their indices."""
    main = [m for m in MAIN_METRICS if m in st.metrics]
    if not main:
        main = list(st.metrics)
        notes.append("None of the main metrics is in the store: headline averages use every analysed metric.")
    elif len(main) < len(MAIN_METRICS):
        notes.append("Main metrics absent from the store: "
                     + ", ".join(m for m in MAIN_METRICS if m not in main) + ".")
    return main, np.array([st.metrics.index(m) for m in main])


def study_form_step(st: Study, rk: Rankings, rev: PooledReversals, dups: dict, mi: np.ndarray, cross_tau: list, *,
                    families: dict, main: list[str], q: float, n_splits: int, seed: int) -> StudyForm:
    """The study-form step: the original study's statements computed its way
    (`schedport.analysis.studyform.study_form`), from the rankings and the reversal tests.

    The split-half reliability draws its splits from ``default_rng([seed, 16])``.
    """
    ctx = {"st": st, "raw": rev.tests, "labels": dups["labels"], "pair_keys": pair_keys,
           "pair_label": pair_label, "mean_ranks": mean_ranks, "tau_features": tau_features}
    return studyform.study_form(ctx, q=q, counts=rk.counts, ranks=rk.ranks, valid=rk.valid, mi=mi,
                                n_splits=n_splits, split_rng=np.random.default_rng([seed, 16]),
                                cross_source_tau=cross_tau, duplicates=dups, metric_families=families,
                                main_metrics=main)


def claims_step(st: Study, sform: StudyForm, cross: CrossSourceHeadline, met_main: Estimate) -> list[Claim]:
    """The claims step: a verdict per finding of the original study (`studyform.claims`), the
    modeled sources named as such."""
    modeled = [s_ for s_ in st.sources if source_info(s_).get("modeled")]
    return studyform.claims(st, sform, cross.by_pair, met_main, modeled)


def analysis_parameters(st: Study, manifest: dict, main: list[str], *, practical_threshold: float, q: float,
                        n_boot: int, seed: int, abs_threshold: float, n_splits: int) -> dict:
    """The ``parameters`` block: every setting and method the numbers depend on, and the region
    definition the store was run under (as recorded in its manifest)."""
    parameters = {
        "practical_threshold": practical_threshold,
        "q": q,
        "n_boot": n_boot,
        "seed": seed,
        "ci_level": CI_LEVEL,
        "ci_method": "bootstrap over windows (sources resampled independently, one resample of window ids "
                     "shared by all regions and metrics of a source); percentile intervals for mean ranks, basic "
                     "(reverse-percentile) intervals for concordance statistics and pooled shares; "
                     "percentile intervals for the study form's reversal and best-changes shares; "
                     "the estimates themselves are not bias-corrected",
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
    return parameters


def core_steps(df: pd.DataFrame, manifest: dict, *, practical_threshold: float, q: float, n_boot: int, seed: int,
               metrics: Optional[Sequence[str]], abs_threshold: float, n_splits: int) -> CoreSteps:
    """The analysis's steps up to the claims (load, duplicates, ranks, concordance, reversals,
    study form, claims), their results by name (`CoreSteps`): what `compute_portability` assembles into
    ``portability.json`` and what the simulator axis (`schedport.analysis.simulator`) computes
    once per engine variant, so that every variant is judged by the very same steps."""
    check_parameters(practical_threshold=practical_threshold, q=q, n_boot=n_boot, abs_threshold=abs_threshold,
                     n_splits=n_splits)
    notes: list[str] = []
    st = load_study(df, manifest, metrics, notes)
    families, dups = find_duplicates(st, notes)
    main, mi = main_metrics(st, notes)
    rk = rank_schedulers(st, n_boot, np.random.default_rng(seed), notes)
    sc = source_concordance(st, rk)
    conc_regions = region_concordance(st, rk)
    mc = metric_concordance(st, rk, mi)
    bc = best_changes(st, rk, mc, mi, notes)
    cross = cross_source_headline(st, sc, mi, rk.n_boot, notes)
    met_main, met_all = metric_headline(mc, rk.n_boot)
    rev = pooled_reversals(st, practical_threshold, abs_threshold, q, dups["labels"])
    sform = study_form_step(st, rk, rev, dups, mi, cross_source_tau_by_metric(st, sc, mi), families=families,
                            main=main, q=q, n_splits=n_splits, seed=seed)
    sform = replace(sform, claims=tuple(claims_step(st, sform, cross, met_main)))
    return CoreSteps(notes=notes, study=st, families=families, duplicates=dups, main_metrics=main, main_index=mi,
                     rankings=rk, sources=sc, regions=conc_regions, metrics=mc, best_changes=bc, cross_source=cross,
                     metric_main=met_main, metric_all=met_all, reversals=rev, study_form=sform)


def compute_portability(df: pd.DataFrame, manifest: dict, *, practical_threshold: float = PRACTICAL_THRESHOLD,
                        q: float = Q, n_boot: int = N_BOOT, seed: int = 0,
                        metrics: Optional[Sequence[str]] = None,
                        workload: dict | Unavailable | None = None, results_dir: Optional[str] = None,
                        abs_threshold: float = ABS_THRESHOLD, n_splits: int = SPLITS, robustness: bool = True,
                        robustness_boot: int = multiverse.N_BOOT_ROBUSTNESS) -> dict:
    """The whole portability analysis of a runs table; returns the ``portability.json`` dict.

    Pure: reads nothing but its arguments (`load_store` provides them) and is deterministic for
    a given `seed`. Runs the steps in order (load, duplicates, ranks, concordance, reversals,
    study form, claims, and with `robustness` the protocol multiverse) as the module docstring
    describes them; every number is JSON-safe (None where undefined).
    """
    t_start = time.perf_counter()
    core = core_steps(df, manifest, practical_threshold=practical_threshold, q=q, n_boot=n_boot, seed=seed,
                      metrics=metrics, abs_threshold=abs_threshold, n_splits=n_splits)
    notes, st, families, dups, main, mi, rk = (core.notes, core.study, core.families, core.duplicates,
                                                core.main_metrics, core.main_index, core.rankings)
    sc, conc_regions, mc, bc, cross = core.sources, core.regions, core.metrics, core.best_changes, core.cross_source
    met_main, met_all, rev, sform = core.metric_main, core.metric_all, core.reversals, core.study_form
    wl = workload if isinstance(workload, dict) else None      # the corpus's statistics, when at hand
    prov = provenance(manifest, st.sources, results_dir, (wl or {}).get("corpus_sources"))
    headline = {
        "main_metrics": main,
        "cross_source": cross,
        "reversals": rev.headline,
        "cross_region": cross_region_headline(conc_regions, list(st.regions), main),
        "flips": flips_headline(sform.reversals, [d["source"] for d in prov["data_sources"] if d.get("modeled")]),
        "own": own_standing(rk.table, sorted(prov["user_policies"]), main, list(st.sources), list(st.regions)),
        "metrics": {"mean_pairwise_tau": met_main, "mean_pairwise_tau_all_metrics": met_all,
                    "best_changes_with_metric": bc.share, "best_changes_pairwise": bc.pairwise},
    }
    parameters = analysis_parameters(st, manifest, main, practical_threshold=practical_threshold, q=q,
                                     n_boot=rk.n_boot, seed=seed, abs_threshold=abs_threshold, n_splits=n_splits)
    t_rob = time.perf_counter()
    if robustness:
        rob = multiverse.robustness(df, practical_threshold=practical_threshold, abs_threshold=abs_threshold, q=q,
                                    seed=seed, n_boot=robustness_boot)
    else:
        rob = Unavailable("not computed (--no-robustness)")
    elapsed_rob = time.perf_counter() - t_rob
    elapsed = time.perf_counter() - t_start
    out = {
        "schema": SCHEMA_VERSION,
        "store": store_identity(manifest),
        "selection": {"schedulers": list(st.schedulers), "sources": list(st.sources), "regions": list(st.regions),
                      "windows_per_source": {s: int(df.loc[df["source"].astype(str) == s, "window_id"].nunique())
                                             for s in st.sources}},
        "subset": subset_info(manifest, st, wl),
        "study_form": sform,
        "regimes": regime_check(df, st.regions, st.sources),
        "metric_families": families,
        "duplicates": {"by_source": dups["by_source"], "by_condition": dups["by_condition"]},
        "headline": headline,
        "concordance": {"sources": sc.entries, "regions": conc_regions, "metrics": mc.entries},
        "metric_matrix": {"metrics": st.metrics, "tau": metric_matrix(st, mc)},
        "rankings": rk.table,
        "best_changes_with_metric_share": bc.value,
        "best_changes_with_metric": bc.detailed(),
        "metric_concordance_mean": met_main.statistic,
        "reversals": rev.summary,
        "parameters": parameters,
        "provenance": prov,
        "missing_cells": st.missing_cells,
        "complete_blocks": st.complete_blocks,
        "complete_blocks_only": True,
        "workload": workload or Unavailable("no corpus directory given (--corpus)"),
        "notes": list(dict.fromkeys(notes)),
        "robustness": rob,
        "run_info": {"elapsed_s": round(elapsed, 3), "robustness_elapsed_s": round(elapsed_rob, 3),
                     "note": "wall times of the statistics and of the protocol multiverse; the only fields that "
                             "differ between identical runs"},
    }
    return to_json(out)


def find_workload(manifest: dict, results_dir: Path, corpus_dir=None) -> dict | Unavailable | None:
    """The corpus's per-window statistics for the workload figure (`load_workload`), or why not.

    From `corpus_dir` when given (a corpus other than the store's is refused); else from the
    corpus the store's manifest names, when it is still there (relative to the current
    directory, as given to `schedport run`, or to the store); else a note saying why the
    figure is left out (`Unavailable`; None when the manifest names no corpus).
    """
    if corpus_dir is not None:
        return load_workload(corpus_dir, expect_corpus=manifest.get("corpus_sha256"))
    if not isinstance(manifest.get("corpus_dir"), str):
        return None
    cdir = Path(manifest["corpus_dir"])  # as given to `schedport run` (relative to its cwd)
    if not (cdir / "manifest.json").is_file() and not cdir.is_absolute():
        cdir = results_dir / cdir
    if not (cdir / "manifest.json").is_file():
        return Unavailable(f"the corpus named by the results manifest ({cdir}) is not there and no --corpus was "
                           "given")
    try:
        workload = load_workload(cdir, expect_corpus=manifest.get("corpus_sha256"))
    except SchedportError as e:
        return Unavailable(f"the corpus named by the results manifest is not usable: {e}")
    workload["note"] += " (the corpus named by the results manifest)"
    return workload


def analyze(results_dir, out_dir=None, *, practical_threshold: float = PRACTICAL_THRESHOLD, q: float = Q,
            n_boot: int = N_BOOT, seed: int = 0, metrics: Optional[Sequence[str]] = None,
            corpus_dir=None, expect_corpus: Optional[str] = None,
            expect_engine: Optional[str] = None,
            abs_threshold: float = ABS_THRESHOLD, n_splits: int = SPLITS, compare=None, robustness: bool = True,
            robustness_boot: int = multiverse.N_BOOT_ROBUSTNESS) -> dict:
    """Analyse a results store; write ``portability.json`` (atomically) and return its dict.

    `out_dir` defaults to `results_dir`. `corpus_dir` (optional) adds the workload
    characterization (the report says when it is absent); `compare` (another analysis's
    ``portability.json`` or its directory) adds ``region_comparison``. The store is refused
    (one-line `SchedportError`) when unusable, mixed, or not from the expected corpus/engine.
    The report is not rendered here: `schedport.api.analyze` renders it from the dict.
    """
    rdir = Path(results_dir)
    df, manifest = load_store(rdir, expect_corpus=expect_corpus, expect_engine=expect_engine)
    workload = find_workload(manifest, rdir, corpus_dir)
    other_store = compare_store(compare) if compare is not None and robustness else None
    res = compute_portability(df, manifest, practical_threshold=practical_threshold, q=q, n_boot=n_boot,
                              seed=seed, metrics=metrics, workload=workload, results_dir=str(rdir),
                              abs_threshold=abs_threshold, n_splits=n_splits,
                              robustness=robustness and other_store is None, robustness_boot=robustness_boot)
    sim = simulator_step(rdir, practical_threshold=practical_threshold, q=q, n_boot=n_boot, seed=seed,
                         metrics=metrics, abs_threshold=abs_threshold, n_splits=n_splits)
    if not isinstance(sim, Unavailable):    # optional blocks: left out of portability.json when unavailable
        res["simulator"] = to_json(sim)
        dep = deployments_step(rdir, practical_threshold=practical_threshold, q=q, n_boot=n_boot, seed=seed,
                               metrics=metrics, abs_threshold=abs_threshold, n_splits=n_splits)
        if not isinstance(dep, Unavailable):     # deployment as a comparison kind (schedport.analysis.deployments)
            res["deployments"] = to_json(dep)
    if compare is not None:
        res["region_comparison"] = to_json(load_comparison(compare, res))
    if other_store is not None:
        # the same study under the other region definition: one more axis of the multiverse
        t0 = time.perf_counter()
        df2, _ = load_store(other_store, expect_corpus=manifest.get("corpus_sha256"))
        rc = res["region_comparison"]
        res["robustness"] = to_json(multiverse.robustness(
            df, practical_threshold=practical_threshold, abs_threshold=abs_threshold, q=q, seed=seed,
            n_boot=robustness_boot, compare=(str(rc["this"]["region_def"]), str(rc["other"]["region_def"]), df2)))
        res["run_info"]["robustness_elapsed_s"] = round(time.perf_counter() - t0, 3)
    odir = Path(out_dir) if out_dir is not None else rdir
    write_portability(res, odir)
    return res


def simulator_step(results_dir: Path, **params) -> SimulatorAxis | Unavailable:
    """The ``simulator`` block of a store run with engine variants (`schedport.analysis.simulator`),
    or `Unavailable` for a store without them: the study's steps (`core_steps`, with the analysis's
    own parameters) on every variant's runs, then each finding's survival across the variants."""
    per_variant, record = read_variant_runs(results_dir, load_store)
    if not per_variant:
        return Unavailable("the store was run without engine variants (schedport run --variants SET)")
    t0 = time.perf_counter()
    findings = {name: variant_findings(core_steps(df, manifest, **params), params["q"])
                for name, (df, manifest) in per_variant.items()}
    block = simulator_axis(findings, record, default=DEFAULT_VARIANT)
    return replace(block, elapsed_s=round(time.perf_counter() - t0, 3))


def deployments_step(results_dir: Path, **params) -> DeploymentAxis | Unavailable:
    """The ``deployments`` block of a store whose variants are deployments
    (`schedport.analysis.deployments`), or `Unavailable`: the study's steps with deployments in
    place of sources."""
    per_variant, record = read_variant_runs(results_dir, load_store)
    if not per_variant or not is_deployment_set(record):
        return Unavailable("the store's engine variants, if any, do not vary the deployment")
    t0 = time.perf_counter()
    block = deployment_axis(per_variant, record, lambda df, man: core_steps(df, man, **params), DEFAULT_VARIANT)
    return replace(block, elapsed_s=round(time.perf_counter() - t0, 3))


def compare_store(compare) -> Optional[Path]:
    """The results store beside a ``--compare`` analysis (its directory holds ``runs/`` and
    ``manifest.json``), whose runs join the multiverse as a second region definition; else None."""
    pth = Path(compare)
    d = pth if pth.is_dir() else pth.parent
    return d if (d / "runs").is_dir() and (d / "manifest.json").is_file() else None


def write_portability(res: dict, out_dir) -> Path:
    """Write `res` as ``portability.json`` in `out_dir` (created if needed) through a temporary
    file, so a failed write never leaves a half-written analysis; returns its path."""
    return atomic_write_text(Path(out_dir) / "portability.json", json.dumps(res, indent=1, allow_nan=False))
