"""The fast mode with automatic prefix caching (`[engine] enable_prefix_caching = true`).

`CachingFastSimulator` is the fast engine with the prefix cache of
`schedport.engine.core.caching` as a part. It fast-forwards runs of identical decode-only steps as
the fast engine does, counting the blocks the decodes take; the cache takes them from its queue
before anything reads or reorders it (`PrefixCaching`). It plans every step through the policy's
own batching mode, request by request, which names prompt blocks as they are scheduled and looks
up admissions: the decode cohort and the bulk planners count requests without identities, so they
stay off (`cohort_allowed`), and the orders whose fast forms need the cohort (VTC's, ltr's) or
whose keys move with the clock (hrrn) step every iteration. A decode run never makes a waiting
request admissible under a fixed order: it only takes blocks, so hits and free blocks only shrink.
The property tests hold its runs to `CachingSimulator`'s bit for bit.
"""

from __future__ import annotations

from schedport.engine.core.caching import CACHE_SLOTS, PrefixCaching, init_cache_fields
from schedport.engine.fast.cohort import CohortRequest
from schedport.engine.fast.forms import with_fast_form
from schedport.engine.fast.simulator import FastSimulator


class CachedCohortRequest(CohortRequest):
    """A fast-mode request with the prefix cache's fields."""

    __slots__ = CACHE_SLOTS

    def __init__(self, idx: int, arrival: float, prompt: int, output: int, client: str | None):
        super().__init__(idx, arrival, prompt, output, client)
        init_cache_fields(self)


class CachingFastSimulator(PrefixCaching, FastSimulator):
    """The fast engine with automatic prefix caching (module docstring)."""

    request_class = CachedCohortRequest
    cohort_allowed = False

    def __init__(self, trace, policy, *args, **kwargs):
        super().__init__(trace, policy, *args, **kwargs)
        # an order whose counters move with the cohort (VTC's, ltr's: `fast.forms`) is kept true
        # by the cohort's bookkeeping alone; an order whose keys move with the clock (hrrn) is
        # fast-forwarded only while no waiting request could start in any order, which counts
        # blocks without the hits a look-up would find: without a cohort, both step every iteration
        self._steps_each = with_fast_form(policy) is not policy or getattr(self.sched.order, "dynamic", False)

    def _skip_ahead(self, plan) -> bool:
        return False if self._steps_each else super()._skip_ahead(plan)
