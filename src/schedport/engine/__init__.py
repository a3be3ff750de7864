"""Engine: the vLLM-like serving engine and the scheduling policies it runs.

Three subpackages, in the order they may import one another: `core` (request state, the exact
event loop and the paged KV cache, the engine's config, the step latency model and the metrics),
`policies` (the policy contract, the batching modes, orderings, stateful policies, gates and the
registry of the 13 declarations, and a user's own policies) and `fast` (the same runs with a
decode cohort and fast-forwards). On top of them, one trace through one scheduler: `modes` picks
the exact or the fast simulator, `inputs` checks what enters, `capacity` measures a request
mix's capacity and the regions against it, `execution` runs the scaled trace and `runner.simulate`
is all of it; `policycheck` is the check a study runs on a user's policy. Reads traces from
`schedport.workload`; never reads a corpus, a store or an analysis.
"""
