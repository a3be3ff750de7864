"""The scheduling policies: what to run next, declared as batching mode + ordering + admission.

The contract is in `policy` (an `Ordering`: a key and how it moves; the `Plan` of one step; the
`BatchingMode`) and `queues` (the queue a stateful policy implements); the batching modes in
`batching`; key orderings in `orderings`; policies with state of their own in `vtc`, `ltr` and
`mlfq` (FastServe's readable reference, its job record in `mlfq_job`); admission gates in
`gates`; the 13 declarations and their registry in `schedulers`; a user's own policies are
loaded by `plugins` and checked at run time by `policyguard`. Policies never import the fast mode
nor name its state: they know one clock and one set of hooks, and the batching modes form their
batches request by request (the fast mode plans through them, `schedport.engine.fast.planner`).
"""

from schedport.engine.policies.batching import Continuous, Selective, StallFree, Static
from schedport.engine.policies.policy import FIXED, WITH_TIME, Ordering, PerServedToken, Plan
from schedport.engine.policies.queues import Hooks, Queue
from schedport.engine.policies.schedulers import Policy

#: What a policy of one's own imports (docs/own-scheduler.md, "The whole contract").
__all__ = ["Continuous", "FIXED", "Hooks", "Ordering", "PerServedToken", "Plan", "Policy", "Queue", "Selective",
           "StallFree", "Static", "WITH_TIME"]
