"""The analysis's steps up to the claims, as one frozen result: `CoreSteps`.

`schedport.analysis.portability.core_steps` runs load, duplicates, ranks, concordance, reversals,
study form and claims on one runs table and returns this; `compute_portability` assembles it into
``portability.json``, and the simulator and deployment axes (`schedport.analysis.simulator`,
`schedport.analysis.deployments`) compute it once per engine variant, so that every variant is
judged by the very same steps. Its readers use the fields by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schedport.analysis.concordance import MetricConcordance, SourceConcordance
from schedport.analysis.ranks import Rankings
from schedport.analysis.results import BestChanges, CrossSourceHeadline, Estimate, PooledReversals, StudyForm
from schedport.analysis.store_loading import Study

__all__ = ["CoreSteps"]


@dataclass(frozen=True, eq=False)
class CoreSteps:
    """Each step's result, by name.

    ``notes``: what the steps noted for the reader; ``study``: the runs reshaped per source;
    ``families`` and ``duplicates``: the metric families and the duplicate schedulers (with their
    class ``labels``); ``main_metrics`` and ``main_index``: the main metrics present and their
    indices in ``study.metrics``; ``rankings``; ``sources``, ``regions`` and ``metrics``: the
    concordance between sources, between regions (``concordance.regions`` rows) and between
    metrics; ``best_changes``; ``cross_source``: the cross-source headline; ``metric_main`` and
    ``metric_all``: mean pairwise tau between metrics (main metrics, every metric);
    ``reversals``: the pooled reversal step; ``study_form``: the study form, its claims judged.
    """

    notes: list
    study: Study
    families: dict
    duplicates: dict
    main_metrics: list
    main_index: np.ndarray
    rankings: Rankings
    sources: SourceConcordance
    regions: list
    metrics: MetricConcordance
    best_changes: BestChanges
    cross_source: CrossSourceHeadline
    metric_main: Estimate
    metric_all: Estimate
    reversals: PooledReversals
    study_form: StudyForm
