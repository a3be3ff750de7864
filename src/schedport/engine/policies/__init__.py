"""The scheduling policies: what to run next, declared as batching mode + ordering + admission.

The contract is in `policy` (an `Ordering`: a key and how it moves; the `Plan` of one step; the
`BatchingMode`) and `queues` (the queue a stateful policy implements); the batching modes in
`batching`; key orderings in `orderings`; policies with state of their own in `vtc`, `ltr` and
`mlfq` (FastServe's readable reference, its job record in `mlfq_job`); admission gates in
`gates`; the 13 declarations and their registry in `schedulers`; a user's own policies are
loaded by `plugins` and checked at run time by `policyguard`. Policies never import the fast mode.
"""
