"""The fast mode: the same runs as the exact engine, bit for bit, with less work per step.

A plug-in on the core loop and the policies, neither of which knows of it. `simulator` extends
the core's loop; `cohort` advances the running requests that decode one token per step together
(the decode cohort) and keeps its fields on the request (`CohortRequest`); `planner` wraps the
policy's batching mode and forms the same batches with the cohort counted in bulk; `ranking`
keeps a preemptive policy's rank order between steps instead of ranking every request afresh;
`forms` are VTC's and ltr's fast forms, which count the cohort's tokens; `mlfq_cohort`,
`mlfq_due` and `mlfq_walk` keep FastServe's multi-level queues lazily in the cohort. The property
tests check each against the exact engine.
"""
