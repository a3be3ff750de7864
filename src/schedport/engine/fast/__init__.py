"""The fast mode: the same runs as the exact engine, bit for bit, with less work per step.

`cohort` advances the running requests that decode one token per step together (the decode
cohort); `ranking` keeps a preemptive policy's rank order between steps instead of ranking every
request afresh; `mlfq_cohort`, `mlfq_due` and `mlfq_walk` keep FastServe's multi-level queues
lazily in the cohort. The property tests check each against the exact engine.
"""
