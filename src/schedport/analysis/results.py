"""The analysis steps' result objects, and their one serialiser into ``portability.json``.

As scipy.stats returns result objects (a statistic, its confidence interval and the method
that gave it) rather than bare tuples, the analysis steps return frozen, typed results:
`Estimate` (a statistic with its interval, the interval's method and, for a bootstrap, the
replicates' bias), the pooled reversal step's `PooledReversals` (its per-test arrays
`ReversalTests`, the counted `Reversal` items, the `ReversalSummary` block and the
`ReversalHeadline`), concordance's `CrossSourceHeadline` and `BestChanges`, the study form's
`StudyForm` (per-metric `MetricReversals` with their `Flip` items and `HighLoad` cluster,
`WindowBestChanges`, the noise ceiling `SplitHalf` and the `Claim` verdicts) and the protocol
multiverse's `Robustness` (a `ClaimRobustness` per claim, each protocol's `ProtocolVerdict`).
The steps and their readers use the fields by name.

`to_json` is the one place that turns them into ``portability.json``'s dicts: each result
type says its keys, in order, in `json_fields`, and `to_json` walks the whole portability
dict, so the file's shape and key order are set here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional

import numpy as np

from schedport.analysis.stats import basic_ci, nanmean
from schedport.common.values import json_safe

#: The interval method of the concordance statistics and shares (`stats.basic_ci`).
BASIC_BOOTSTRAP = "basic bootstrap"
#: The interval method of the pooled reversal share (`stats.wilson_interval`).
WILSON = "Wilson score interval"


class Result:
    """A result object: its ``portability.json`` form is `json_fields`, in that order (by
    default every dataclass field under its own name)."""

    def json_fields(self) -> list[tuple[str, Any]]:
        """(key, value) pairs of the JSON object, in the order written."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)]  # type: ignore[arg-type]


@dataclass(frozen=True)
class Estimate(Result):
    """A statistic with its confidence interval and the interval's method.

    ``boot_bias`` is the bootstrap replicates' mean minus the statistic (None when undefined);
    ``replicated`` is False for an estimate that was never bootstrapped (too little data:
    every field None), which is written without ``boot_bias``. ``about`` says what it is an
    estimate of and with what counts ((key, value) pairs such as the source pair, the region,
    ``n_values``, a ``definition``), read with `of`. Written as ``value``, ``ci_low``,
    ``ci_high`` (and ``boot_bias``), then ``about`` in order; the interval's method is named
    once, in ``parameters.ci_method``.
    """

    statistic: Optional[float]
    ci_low: Optional[float]
    ci_high: Optional[float]
    method: str
    boot_bias: Optional[float] = None
    replicated: bool = True
    about: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def undefined(cls, method: str = BASIC_BOOTSTRAP) -> "Estimate":
        """The estimate of a statistic that has no data to stand on: every number None."""
        return cls(None, None, None, method, None, replicated=False)

    def labelled(self, **about: Any) -> "Estimate":
        """This estimate with `about` added after what it already says it is of."""
        return replace(self, about=self.about + tuple(about.items()))

    def of(self, key: str, default: Any = None) -> Any:
        """What ``about`` says under `key` (`default` when it says nothing)."""
        return dict(self.about).get(key, default)

    def json_fields(self) -> list[tuple[str, Any]]:
        """``value``, ``ci_low``, ``ci_high``, when bootstrapped ``boot_bias``, then ``about``."""
        out = [("value", self.statistic), ("ci_low", self.ci_low), ("ci_high", self.ci_high)]
        return out + ([("boot_bias", self.boot_bias)] if self.replicated else []) + list(self.about)


def bootstrap_estimate(point, boot: np.ndarray, lo_bound: float = -1.0, hi_bound: float = 1.0) -> Estimate:
    """A scalar statistic with its basic bootstrap interval (clipped to [lo_bound, hi_bound]) and
    bias (mean of the defined replicates minus the statistic), every number JSON-safe."""
    lo, hi = basic_ci(point, boot, lo_bound, hi_bound)
    bias = nanmean(np.asarray(boot, dtype=np.float64), 0) - point if point is not None else np.nan
    return Estimate(json_safe(point), json_safe(lo), json_safe(hi), BASIC_BOOTSTRAP, json_safe(bias))


@dataclass(frozen=True, eq=False)
class ReversalTests:
    """Every per-condition paired test of the reversal step, as arrays over (source, region,
    metric, scheduler pair) (``eff`` has the windows last): effects, Wilcoxon p-values, median
    and mean effects, windows used, which tests were made and which are distinct, each pair's
    representative test (``test_rep``), BH q-values over all tests (``q_all``) and within each
    metric (``q_metric``), the medians' signs, which tests are significant and practical
    (``sigprac``), the counts of tests, the per-metric thresholds (``thr_m``), which metrics are
    bounded and the pair index (``I``, ``J``). Not written to portability.json."""

    eff: np.ndarray
    p: np.ndarray
    med: np.ndarray
    mean: np.ndarray
    n_used: np.ndarray
    made: np.ndarray
    distinct: np.ndarray
    test_rep: np.ndarray
    q_all: np.ndarray
    q_metric: np.ndarray
    sign: np.ndarray
    sigprac: np.ndarray
    n_tests: int
    n_sig: int
    n_raw: int
    thr_m: np.ndarray
    bounded: np.ndarray
    I: np.ndarray  # noqa: E741 - the pair index's name throughout the analysis
    J: np.ndarray


@dataclass(frozen=True)
class Reversal(Result):
    """One reversal between two conditions a and b: the scheduler pair and metric, both
    conditions, their median and mean effects, p- and q-values, windows and better scheduler."""

    kind: str
    scheduler_a: str
    scheduler_b: str
    pair: str
    metric: str
    effect_scale: str
    source_a: str
    region_a: str
    source_b: str
    region_b: str
    effect_a: float
    effect_b: float
    mean_effect_a: float
    mean_effect_b: float
    p_a: float
    p_b: float
    q_a: float
    q_b: float
    n_windows_a: int
    n_windows_b: int
    better_a: str
    better_b: str


@dataclass(frozen=True)
class Top(Result):
    """The key of a breakdown with the most reversals, its count and its share of them."""

    key: str
    count: int
    share_of_reversals: Optional[float]


@dataclass(frozen=True)
class ReversalSummary(Result):
    """The pooled ``reversals`` block: the test counts, the comparisons and reversals with the
    share's interval (`share`, Wilson's), the breakdowns (``by_kind``, ``cross_source``,
    ``cross_region``, ``by_scheduler_pair``, ``by_metric``, ``map``) and the reversals
    themselves, strongest first."""

    #: How reversals are counted (written as ``counting``).
    COUNTING = ("each reversal counts once; duplicate schedulers (identical results in both conditions "
                "compared) are one scheduler, so their repeated comparisons count once; shares of "
                "cross-source reversals divide by the cross-source count, of cross-region ones by the "
                "cross-region count; the map holds cross-source reversals by their region")
    #: What the share's method leaves out (appended to it as ``share_ci_method``).
    WILSON_CAVEAT = " (treats comparisons as independent; understates uncertainty)"

    n_tests: int
    n_tests_raw_p_below_q: int
    n_tests_significant: int
    n_tests_significant_practical: int
    n_comparisons: int
    n_significant_practical: int
    share: Estimate
    by_kind: Mapping[str, dict]
    cross_source: Mapping[str, Any]
    cross_region: Mapping[str, Any]
    by_scheduler_pair: Mapping[str, int]
    by_metric: Mapping[str, int]
    map: list
    items: list

    def json_fields(self) -> list[tuple[str, Any]]:
        """The counts, the share as ``share``/``share_ci_low``/``share_ci_high``/``share_ci_method``,
        the breakdowns, ``counting`` and ``items``."""
        return [("n_tests", self.n_tests), ("n_tests_raw_p_below_q", self.n_tests_raw_p_below_q),
                ("n_tests_significant", self.n_tests_significant),
                ("n_tests_significant_practical", self.n_tests_significant_practical),
                ("n_comparisons", self.n_comparisons), ("n_significant_practical", self.n_significant_practical),
                ("share", self.share.statistic), ("share_ci_low", self.share.ci_low),
                ("share_ci_high", self.share.ci_high),
                ("share_ci_method", self.share.method + self.WILSON_CAVEAT),
                ("by_kind", self.by_kind), ("cross_source", self.cross_source), ("cross_region", self.cross_region),
                ("by_scheduler_pair", self.by_scheduler_pair), ("by_metric", self.by_metric), ("map", self.map),
                ("counting", self.COUNTING), ("items", self.items)]


@dataclass(frozen=True)
class ReversalHeadline(Result):
    """``headline.reversals``: the share of reversals with its interval, the counts and the top
    region, source pair, scheduler pair and metric (None without reversals)."""

    n_comparisons: int
    n_significant_practical: int
    share: Estimate
    n_tests: int
    n_cross_source: int
    n_cross_region: int
    top_region: Optional[Top]
    top_source_pair: Optional[Top]
    top_scheduler_pair: Optional[Top]
    top_metric: Optional[Top]

    def json_fields(self) -> list[tuple[str, Any]]:
        """The counts with the share as ``share``/``ci_low``/``ci_high``/``ci_method``, then the tops."""
        return [("n_comparisons", self.n_comparisons), ("n_significant_practical", self.n_significant_practical),
                ("share", self.share.statistic), ("ci_low", self.share.ci_low), ("ci_high", self.share.ci_high),
                ("ci_method", self.share.method), ("n_tests", self.n_tests),
                ("n_cross_source", self.n_cross_source), ("n_cross_region", self.n_cross_region),
                ("top_region", self.top_region), ("top_source_pair", self.top_source_pair),
                ("top_scheduler_pair", self.top_scheduler_pair), ("top_metric", self.top_metric)]


@dataclass(frozen=True, eq=False)
class PooledReversals:
    """The reversal step's result: ``summary`` and ``headline`` (written to portability.json) and
    ``tests`` (the per-test arrays the study form and the simulator axis reuse)."""

    summary: ReversalSummary
    headline: ReversalHeadline
    tests: ReversalTests


# --------------------------------------------------------------------------- the concordance headlines


@dataclass(frozen=True)
class CrossSourceHeadline(Result):
    """``headline.cross_source``: Kendall tau-b between two sources' mean-rank vectors over the
    main metrics, as basic bootstrap `Estimate`s per source pair and region (``by_pair_region``),
    per pair (``by_pair``; ``by_pair_all_metrics`` over every metric), the lowest pair with its own
    interval and the interval of the minimum (``min_pair``), the lowest pair x region cell
    (``min_cell``; both None with fewer than two sources) and top-1 agreement. Written after
    ``basis``, what the statistic is."""

    #: What the statistic is (written first, as ``basis``).
    BASIS = "Kendall tau-b between two sources' mean-rank vectors, averaged over the main metrics"

    by_pair_region: list
    by_pair: list
    by_pair_all_metrics: list
    min_pair: Optional[Estimate]
    min_cell: Optional[Estimate]
    top1_agreement: Estimate

    def json_fields(self) -> list[tuple[str, Any]]:
        """``basis``, then every field under its own name."""
        return [("basis", self.BASIS)] + super().json_fields()


@dataclass(frozen=True)
class BestChanges:
    """Does the best scheduler change with the metric, per (source, region) condition: the share
    of conditions where no scheduler is tied-best on every main metric (``share``, basic
    bootstrap, labelled with its counts and definition), the share of (condition, main-metric
    pair) whose best sets are disjoint (``pairwise``) and, per condition, the best schedulers of
    each main metric (``conditions``). Its parts are written under three keys (`detailed`)."""

    share: Estimate
    pairwise: Estimate
    conditions: list

    @property
    def value(self) -> Optional[float]:
        """The share (None when undefined), written as ``best_changes_with_metric_share``."""
        return self.share.statistic

    def detailed(self) -> Estimate:
        """The share with the pairwise share and the conditions beside it (``best_changes_with_metric``)."""
        return self.share.labelled(pairwise=self.pairwise, conditions=self.conditions)


# --------------------------------------------------------------------------- the study form

#: The interval method of the study form's shares of windows (`studyform.window_best_changes`).
PERCENTILE = "percentile bootstrap over windows"
#: The interval method of the study form's reversal shares (`studyform.study_form`).
PERCENTILE_REDONE = "percentile bootstrap over windows (tests, BH and reversals redone on each resample)"


@dataclass(frozen=True)
class Flip(Result):
    """One study-form reversal (a cross-source flip on one main metric): the scheduler pair (duplicates
    joined), its schedulers, the region, both sources with their median effects and q-values."""

    scheduler_pair: str
    scheduler_a: str
    scheduler_b: str
    region: str
    source_a: str
    source_b: str
    effect_a: float
    effect_b: float
    q_a: float
    q_b: float


@dataclass(frozen=True)
class HighLoad(Result):
    """The reversals at high load (rho >= ``rho_min``): its regions, the reversals and comparisons
    there, their share of all reversals and the reversal rate there and below (None when undefined)."""

    rho_min: float
    regions: list
    n_reversals: int
    n_comparisons: int
    share_of_reversals: Optional[float]
    rate: Optional[float]
    rate_elsewhere: Optional[float]


@dataclass(frozen=True)
class MetricReversals(Result):
    """The cross-source reversals of one main metric (BH within its tests): the counts, the share
    of comparisons reversed with its percentile interval (tests redone on every resample,
    ``share.method``) and the replicates' mean (``boot_mean``), the breakdowns, whether one
    scheduler pair or one source is on every reversal, the high-load cluster and the reversals
    themselves (``items``, strongest first)."""

    metric: str
    effect_scale: str
    practical_threshold: float
    n_tests: int
    n_comparisons: int
    n_reversals: int
    share: Estimate
    boot_mean: Optional[float]
    by_region: Mapping[str, dict]
    by_source_pair: Mapping[str, dict]
    by_scheduler_pair: Mapping[str, int]
    one_scheduler_pair: Optional[bool]
    sources_on_every_reversal: Optional[list]
    one_source: Optional[bool]
    high_load: HighLoad
    items: tuple[Flip, ...]

    def json_fields(self) -> list[tuple[str, Any]]:
        """The counts, the share as ``share``/``ci_low``/``ci_high``/``ci_method``, then the rest."""
        return [("metric", self.metric), ("effect_scale", self.effect_scale),
                ("practical_threshold", self.practical_threshold), ("n_tests", self.n_tests),
                ("n_comparisons", self.n_comparisons), ("n_reversals", self.n_reversals),
                ("share", self.share.statistic), ("ci_low", self.share.ci_low), ("ci_high", self.share.ci_high),
                ("ci_method", self.share.method), ("boot_mean", self.boot_mean), ("by_region", self.by_region),
                ("by_source_pair", self.by_source_pair), ("by_scheduler_pair", self.by_scheduler_pair),
                ("one_scheduler_pair", self.one_scheduler_pair),
                ("sources_on_every_reversal", self.sources_on_every_reversal), ("one_source", self.one_source),
                ("high_load", self.high_load), ("items", self.items)]


@dataclass(frozen=True)
class PairwiseBestChanges(Result):
    """The share of (window, region, main-metric pair) whose tied-best sets are disjoint, with its
    percentile interval; ``n_pairs``/``n_disjoint`` None (and not written) with fewer than two
    main metrics."""

    DEFINITION = "share of (window, region, main-metric pair) whose tied-best scheduler sets are disjoint"

    share: Estimate
    n_pairs: Optional[int] = None
    n_disjoint: Optional[int] = None

    def json_fields(self) -> list[tuple[str, Any]]:
        """``n_pairs``, ``n_disjoint`` (when counted), ``share``/``ci_low``/``ci_high``, ``definition``."""
        counts = [] if self.n_pairs is None else [("n_pairs", self.n_pairs), ("n_disjoint", self.n_disjoint)]
        return counts + [("share", self.share.statistic), ("ci_low", self.share.ci_low),
                         ("ci_high", self.share.ci_high), ("definition", self.DEFINITION)]


@dataclass(frozen=True)
class ForcedBest(Result):
    """A scheduler that is the sole best on `metric` in every (window, region) cell and never
    best on all the other main metrics, which makes the best-changes share 100% by
    construction; ``share_without`` is the share without that metric (percentile interval)."""

    metric: str
    scheduler: str
    n_cells: int
    share_without: Estimate

    def json_fields(self) -> list[tuple[str, Any]]:
        """``metric``, ``scheduler``, ``n_cells``, ``share_without`` with ``_ci_low``/``_ci_high``."""
        w = self.share_without
        return [("metric", self.metric), ("scheduler", self.scheduler), ("n_cells", self.n_cells),
                ("share_without", w.statistic), ("share_without_ci_low", w.ci_low),
                ("share_without_ci_high", w.ci_high)]


@dataclass(frozen=True)
class WindowBestChanges(Result):
    """The study form's best-changes share: of the (window, region) cells over all sources with
    every main metric defined (``n_conditions``), those where no scheduler is tied-best on every
    main metric (``n_changed``), the share with its percentile interval, per source
    (``by_source``, None and not written with fewer than two main metrics), the pairwise variant
    and the schedulers that force the share (``forced_by``)."""

    CONDITION = "window x region"
    DEFINITION = ("share of (window, region) cells, over all sources, in which no scheduler is tied-best "
                  "(rank 1 in that window) on every main metric")

    n_conditions: int
    n_changed: int
    share: Estimate
    by_source: Optional[Mapping[str, dict]]
    pairwise: PairwiseBestChanges
    forced_by: tuple[ForcedBest, ...] = ()

    def json_fields(self) -> list[tuple[str, Any]]:
        """``condition``, the counts, the share with ``ci_low``/``ci_high``, ``by_source``, ``pairwise``,
        ``ci_method``, ``definition``, ``forced_by``."""
        by_source = [] if self.by_source is None else [("by_source", self.by_source)]
        return ([("condition", self.CONDITION), ("n_conditions", self.n_conditions), ("n_changed", self.n_changed),
                 ("share", self.share.statistic), ("ci_low", self.share.ci_low), ("ci_high", self.share.ci_high)]
                + by_source + [("pairwise", self.pairwise), ("ci_method", self.share.method),
                               ("definition", self.DEFINITION), ("forced_by", self.forced_by)])


@dataclass(frozen=True)
class HalfPair(Result):
    """Two sources' tau at half the windows (``tau_half``) and the reliability-adjusted portability
    (``adjusted``: tau_half / sqrt(rel_a rel_b)), means over regions (None when none has one), and
    the regions with an adjusted value."""

    source_a: str
    source_b: str
    tau_half: Optional[float]
    adjusted: Optional[float]
    n_regions: int


@dataclass(frozen=True)
class CrossSourceHalf(Result):
    """Cross-source tau at half the windows against the noise ceiling: per source pair (`HalfPair`),
    per pair and region (with the ranges over splits) and per pair and main metric."""

    by_pair: tuple[HalfPair, ...]
    by_pair_region: list
    by_pair_metric: list


@dataclass(frozen=True)
class SplitHalf:
    """The noise ceiling: split-half reliability per source and region (``value`` with the range
    over splits) and per main metric, over ``n_splits`` random splits, and the cross-source tau
    at the same window count. Written under four keys of the study form (`StudyForm`)."""

    CI_METHOD = "2.5-97.5 percentiles over random splits (the spread of one split's estimate)"
    DEFINITION = ("Kendall tau-b between the mean-rank vectors of two random disjoint halves of a "
                  "source's windows (floor(W/2) each), mean over main metrics and over splits")
    ADJUSTED_DEFINITION = ("tau_ab(half) / sqrt(rel_a(half) * rel_b(half)), all at half the windows; "
                           "1 means the sources agree as well as each agrees with itself")

    by_source_region: list
    by_source_region_metric: list
    n_splits: int
    cross_source_half: CrossSourceHalf

    def info(self) -> dict:
        """``split_half_info``: the number of splits, the range's method and the definitions."""
        return {"n_splits": self.n_splits, "ci_method": self.CI_METHOD, "definition": self.DEFINITION,
                "adjusted_definition": self.ADJUSTED_DEFINITION}


@dataclass(frozen=True)
class Claim(Result):
    """A verdict on one finding of the original study: its statement (``study``), this run's figure
    in the same form (``here``), the verdict, the rule it follows from and the estimate that
    decides it (statistic and interval; None when the run lacks the finding's sources, written
    then as nulls after the rule)."""

    id: str
    study: str
    here: str
    verdict: str
    rule: str
    estimate: Optional[Estimate] = None

    def _numbers(self) -> list[tuple[str, Any]]:
        e = self.estimate
        return [("value", e.statistic), ("ci_low", e.ci_low), ("ci_high", e.ci_high)]

    def json_fields(self) -> list[tuple[str, Any]]:
        """``id``, ``study``, ``here``, ``verdict``, then ``value``/``ci_low``/``ci_high`` and ``rule``
        (``rule`` first, the numbers null, without an estimate)."""
        head = [("id", self.id), ("study", self.study), ("here", self.here), ("verdict", self.verdict)]
        if self.estimate is None:
            return head + [("rule", self.rule), ("value", None), ("ci_low", None), ("ci_high", None)]
        return head + self._numbers() + [("rule", self.rule)]


@dataclass(frozen=True)
class CeilingClaim(Claim):
    """A tau claim with, beside its estimate, the noise-ceiling-adjusted tau of the same sources
    (``adjusted``, `HalfPair`; None when undefined)."""

    adjusted: Optional[float] = None

    def _numbers(self) -> list[tuple[str, Any]]:
        return super()._numbers() + [("adjusted", self.adjusted)]


@dataclass(frozen=True)
class MetricVerdict(Result):
    """The reversal finding on one main metric: the reversal share with its interval, the counts,
    the parts of the rule (``parts``: share, high_load, one_scheduler_pair, burstgpt_one_side)
    and the verdict."""

    metric: str
    share: Estimate
    n_reversals: int
    n_comparisons: int
    parts: Mapping[str, bool]
    verdict: str

    def json_fields(self) -> list[tuple[str, Any]]:
        """``metric``, ``share``/``ci_low``/``ci_high``, the counts, ``parts``, ``verdict``."""
        return [("metric", self.metric), ("share", self.share.statistic), ("ci_low", self.share.ci_low),
                ("ci_high", self.share.ci_high), ("n_reversals", self.n_reversals),
                ("n_comparisons", self.n_comparisons), ("parts", self.parts), ("verdict", self.verdict)]


@dataclass(frozen=True)
class ReversalClaim(Claim):
    """The reversal finding, judged per main metric (``per_metric``); no single estimate decides it."""

    per_metric: tuple[MetricVerdict, ...] = ()

    def json_fields(self) -> list[tuple[str, Any]]:
        """``id``, ``study``, ``here``, ``verdict``, ``per_metric``, ``rule``."""
        return [("id", self.id), ("study", self.study), ("here", self.here), ("verdict", self.verdict),
                ("per_metric", self.per_metric), ("rule", self.rule)]


@dataclass(frozen=True)
class StudyForm(Result):
    """The ``study_form`` block: the original study's statements computed its way: the reversals
    per main metric, the best-changes share per (window, region), cross-source tau per source pair
    and metric (`Estimate`s), the duplicates, the noise ceiling (`SplitHalf`, under four keys),
    the definitions, the metric families, the main metrics and the claims' verdicts."""

    DEFINITIONS = {
        "reversal": "for one main metric, a scheduler pair whose median per-window effect has opposite signs "
                    "in two sources at the same region, both Benjamini-Hochberg significant within that "
                    "metric's tests and both at or beyond the practical threshold (absolute for bounded "
                    "metrics, relative otherwise); duplicate schedulers count once",
        "n_comparisons": "distinct (scheduler pair, source pair, region) cases where both sources were tested",
    }

    reversals: tuple[MetricReversals, ...]
    best_changes_with_metric: WindowBestChanges
    cross_source_tau: list
    duplicates: Mapping[str, list]
    duplicates_by_condition: Mapping[str, dict]
    split_half: SplitHalf
    metric_families: Mapping[str, list]
    main_metrics: list
    claims: tuple[Claim, ...] = ()

    def json_fields(self) -> list[tuple[str, Any]]:
        """The fields in order, the noise ceiling as ``split_half``, ``split_half_by_metric``,
        ``split_half_info`` and ``cross_source_half``, and ``definitions`` before the families."""
        sh = self.split_half
        return [("reversals", self.reversals), ("best_changes_with_metric", self.best_changes_with_metric),
                ("cross_source_tau", self.cross_source_tau), ("duplicates", self.duplicates),
                ("duplicates_by_condition", self.duplicates_by_condition), ("split_half", sh.by_source_region),
                ("split_half_by_metric", sh.by_source_region_metric), ("split_half_info", sh.info()),
                ("cross_source_half", sh.cross_source_half), ("definitions", self.DEFINITIONS),
                ("metric_families", self.metric_families), ("main_metrics", self.main_metrics),
                ("claims", self.claims)]


# --------------------------------------------------------------------------- the protocol multiverse


@dataclass(frozen=True)
class ProtocolVerdict(Result):
    """A claim under one protocol: its value (None when undefined), verdict and what it counts
    (comparisons, tau values or cells); for the reversal claim ``per_metric`` holds each metric's
    (metric, share, n_comparisons), which is not written."""

    value: Optional[float]
    verdict: str
    n_comparisons: int
    per_metric: tuple = ()

    def json_fields(self) -> list[tuple[str, Any]]:
        """``value``, ``verdict``, ``n_comparisons``."""
        return [("value", self.value), ("verdict", self.verdict), ("n_comparisons", self.n_comparisons)]


@dataclass(frozen=True)
class OneMetric(Result):
    """The single metric whose own reversal share under some protocol is closest to the study's."""

    protocol: Mapping[str, Any]
    metric: str
    value: Optional[float]
    n_comparisons: int
    distance: float


@dataclass(frozen=True)
class Closest(Result):
    """The protocol whose value is closest to the study's number (ties: the fewest axes off the
    default), what the claim is under it (``result``) and the distance; ``one_metric`` for the
    reversal claim (else None, not written)."""

    protocol: Mapping[str, Any]
    result: ProtocolVerdict
    distance: float
    one_metric: Optional[OneMetric] = None

    def json_fields(self) -> list[tuple[str, Any]]:
        """``protocol``, ``value``, ``verdict``, ``n_comparisons``, ``distance`` (and ``one_metric``)."""
        return ([("protocol", self.protocol)] + self.result.json_fields() + [("distance", self.distance)]
                + ([] if self.one_metric is None else [("one_metric", self.one_metric)]))


@dataclass(frozen=True)
class Curve(Result):
    """The specification curve: every distinct protocol's value and verdict, sorted by value."""

    points: tuple[ProtocolVerdict, ...]

    def json_fields(self) -> list[tuple[str, Any]]:
        """``value`` and ``verdict``, one list each."""
        return [("value", [p.value for p in self.points]), ("verdict", [p.verdict for p in self.points])]


@dataclass(frozen=True)
class ClaimRobustness(Result):
    """One claim across the protocols: the share under which it holds, the share of each verdict
    (overall and per axis value), whether one verdict holds everywhere, the axes that move it, its
    one-phrase summary, the axes it depends on and the analyses made (``n_distinct``), the default
    protocol's verdict, the closest protocol, the stated distance and the specification curve."""

    id: str
    share_holds: Optional[float]
    verdicts: Mapping[str, float]
    by_axis: Mapping[str, dict]
    robust: bool
    depends_on: list
    summary: str
    axes: list
    n_distinct: int
    default: ProtocolVerdict
    closest: Closest
    distance: str
    curve: Curve


@dataclass(frozen=True)
class Robustness(Result):
    """The ``robustness`` block: the axes and their product (``n_protocols``), the default protocol,
    the resamples behind each protocol's intervals, each claim's `ClaimRobustness` and a note."""

    axes: Mapping[str, list]
    n_protocols: int
    default_protocol: Mapping[str, Any]
    n_boot: int
    claims: tuple[ClaimRobustness, ...]
    note: str


@dataclass(frozen=True)
class Unavailable(Result):
    """A block the analysis could not compute for this store, and why: written as
    ``{"available": false, "note": ...}`` (an optional block such as ``simulator`` is left out
    of portability.json instead)."""

    note: str

    def json_fields(self) -> list[tuple[str, Any]]:
        """``available`` (false) and ``note``."""
        return [("available", False), ("note", self.note)]


@dataclass(frozen=True)
class VariantSetInfo(Result):
    """The variant set a store was run with, as its ``variants/set.json`` records it: name,
    version, description, ``source`` (``shipped:NAME`` or the user's file), ``digest`` (sha256 of
    the set's name, version and variants) and ``shipped``: whether it is the set of that name this
    schedport ships (same source and digest), so that a user's set is never described as one."""

    name: Optional[str]
    version: Any
    description: Optional[str]
    source: Optional[str]
    digest: Optional[str]
    shipped: bool


def to_json(v: Any) -> Any:
    """The JSON-safe form of `v`, result objects written by their `json_fields`: the one
    serialiser of ``portability.json`` (containers walked, then `json_safe` for the scalars)."""
    if isinstance(v, Result):
        return {k: to_json(x) for k, x in v.json_fields()}
    if isinstance(v, dict):
        return {str(k): to_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_json(x) for x in v]
    return json_safe(v)
