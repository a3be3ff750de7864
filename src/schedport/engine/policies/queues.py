"""The queues the engine keeps waiting requests in, and the protocol its ranked fill talks to.

A policy's ranking is an `Ordering` (`schedport.engine.policies.policy`): a key and how it moves. The
engine keeps the requests; `queue_for` picks the container the declared dynamics allow:

* `StaticKey` — a heap of keys fixed at arrival (vLLM v1's priority queue); non-preemptive
  orders with `FIXED` keys (sjf, spf, edf);
* `SortedEachStep` — a list kept sorted: by bisection for keys that do not move while a
  request waits (preemptive orders, `PerServedToken`), re-sorted at each decision for keys that
  move with time (`WITH_TIME`: hrrn, spf with aging);
* `Fifo` — arrival order with preempted requests back at the head (vLLM's FCFS queue), for the
  orders that have no key.

`Queue` is the contract of a policy whose state is more than a key — VTC's counters
(`schedport.engine.policies.vtc`), ltr's starvation guard (`schedport.engine.policies.ltr`),
FastServe's MLFQ (`schedport.engine.policies.mlfq`): ten members, the size of vLLM's
`RequestQueue` with its ranking, plus the optional `Hooks`. A policy written as an `Ordering`
never sees it.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from operator import attrgetter
from typing import Any

import numpy as np

from schedport.engine.policies.policy import FIXED, Ordering, PerServedToken, Plan, WithTime
from schedport.engine.core.simulator import Request

_KEY = attrgetter("key")


class Hooks:
    """The hooks a stateful policy may declare, each optional (a no-op by default).

    Told by the engine: `on_admit`, `on_finish`, `prepare` (before each step's batch is formed)
    and `after_step`. Telling the engine: `next_decision`, the point at which the policy next needs
    to act (SimPy's way: a process says when it next wakes), up to which the engine may run the
    same decode-only batch without asking. For an engine that runs several identical steps at
    once: `after_fast_forward`, `refine_fast_forward` and two declarations (`per_request_steps`,
    `served_key_step`).

    An engine may serve decoding requests without naming each in a step's items, so a running
    request's `computed`/`generated` fields are true where the policy is asked about it (its key,
    the batching passes) but may lag in its other hooks. A policy that reads running requests'
    progress anywhere else sets `per_request_steps = True`, which keeps every request exact at
    every step.
    """

    per_request_steps = False  # True: needs every decode step reported per request in `plan.items`
    #: How a preemptive order's keys move, if the engine may keep its rank order between steps:
    #: a served request's leading key changes by this much per token served (srpt: -1; a fixed
    #: key: 0) and no key changes otherwise. None: keys may change any time; ranked afresh each step.
    served_key_step: int | None = None

    def on_admit(self, req: Request, now: float) -> None:
        """`req` left the waiting queue for the running set."""

    def on_finish(self, req: Request, t: float) -> None:
        """`req` emitted its last token at `t`."""

    def prepare(self, now: float) -> None:
        """A step begins, before its batch is formed (time-driven promotions)."""

    def after_step(self, plan: Plan, start: float, end: float) -> None:
        """The step `plan` ran from `start` to `end`; its tokens are out."""

    def next_decision(self, plan: Plan, now: float) -> tuple[int | None, float | None]:
        """When the policy next needs to act, if the same decode-only batch ran on: after at most
        this many steps, or at the first step that starts at or after this time (None: no bound)."""
        return None, None

    def after_fast_forward(self, plan: Plan, starts: np.ndarray, ends: np.ndarray, k: int) -> None:
        """The engine ran `plan`'s decode-only batch `k` times at once (`starts`, `ends` per step)."""

    def refine_fast_forward(self, plan: Plan, starts: np.ndarray, ends: np.ndarray, k: int) -> int:
        """How many of the `k` steps about to be run at once may run before the policy acts."""
        return k


class Queue(Hooks):
    """What a stateful policy implements: its waiting requests in its order (vLLM's `RequestQueue`:
    add, prepend, peek, pop, remove, length, iteration) and the key they rank by.

    Ten members, and three declarations: `preemptive` orders rank running and waiting requests
    together every step and preempt running requests that fall outside the selected set;
    `dynamic` orders can change the order of waiting requests at any time (aging, counters), and
    the engine then fast-forwards only when no waiting request could be admitted in any order;
    `victim` says whom memory pressure preempts under a non-preemptive order. The optional hooks
    are `Hooks`'. A policy written as an `Ordering` gets one of the queues below and never sees it.
    """

    preemptive = False
    dynamic = False
    victim = "newest"      # memory-pressure victim for non-preemptive orderings: newest | worst

    def __init__(self, sim, params: dict):
        self.sim = sim
        self.params = params

    def push(self, req: Request, now: float) -> None:
        """Queue an arriving request (vLLM's `add_request`)."""
        raise NotImplementedError

    def requeue(self, req: Request, now: float) -> None:
        """Queue a preempted request again (vLLM's `prepend_request`)."""
        raise NotImplementedError

    def head(self, now: float) -> Request | None:
        """The first waiting request, left in place (vLLM's `peek_request`); None when empty."""
        raise NotImplementedError

    def pop_head(self) -> Request:
        """Take the request `head` returned (vLLM's `pop_request`)."""
        raise NotImplementedError

    def remove(self, req: Request) -> None:
        """Take `req` out wherever it is (vLLM's `remove_request`)."""
        raise NotImplementedError

    def ordered(self, now: float) -> list[Request]:
        """The waiting requests in order, first to be served first."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self):
        raise NotImplementedError

    def key(self, req: Request, now: float) -> Any:
        """`req`'s rank, smallest first, ending in a unique tiebreak (preemptive and worst-victim orders)."""
        return (req.arrival, req.idx)

    def victim_key(self, req: Request, now: float) -> Any:
        """The rank a memory-pressure victim is chosen by, without the final index tiebreak
        (vLLM ranks victims by (priority, arrival_time) only)."""
        return self.key(req, now)[:-1]


class Fifo(Queue):
    """Arrival order; a preempted request goes back to the head (vLLM's `prepend`)."""

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.q: deque[Request] = deque()

    def __len__(self): return len(self.q)
    def __iter__(self): return iter(self.q)
    def push(self, req, now): self.q.append(req)
    def requeue(self, req, now): self.q.appendleft(req)
    def head(self, now): return self.q[0] if self.q else None
    def pop_head(self): return self.q.popleft()
    def remove(self, req): self.q.remove(req)
    def ordered(self, now): return list(self.q)


class StaticKey(Queue):
    """Keys fixed at arrival in a heap, smallest first (vLLM v1's priority queue): a
    non-preemptive `Ordering` with `FIXED` keys. A request's key is taken once, when it first
    waits, and kept in `req.key`.

    Under memory pressure the victim is the running request with the largest key, as vLLM v1
    does for `policy="priority"` (the ordering's `victim`, "worst" by default).
    """

    def __init__(self, sim, params, ordering: Ordering):
        super().__init__(sim, params)
        self.rank = ordering.key
        self.victim = ordering.victim
        _bind_hooks(self, ordering)
        self.heap: list = []
        self.removed: set[int] = set()
        self.n = 0

    def __len__(self): return self.n
    def __iter__(self): return (e[2] for e in self.heap if e[2].idx not in self.removed)

    def key(self, req, now):
        return req.key

    def push(self, req, now):
        if req.key is None:
            req.key = self.rank(req, now)
        self.removed.discard(req.idx)
        heapq.heappush(self.heap, (req.key, req.idx, req))
        self.n += 1

    requeue = push

    def _clean(self):
        h = self.heap
        while h and h[0][2].idx in self.removed:
            self.removed.discard(heapq.heappop(h)[2].idx)

    def head(self, now):
        self._clean()
        return self.heap[0][2] if self.heap else None

    def pop_head(self):
        self._clean()
        self.n -= 1
        return heapq.heappop(self.heap)[2]

    def remove(self, req):
        self.removed.add(req.idx)
        self.n -= 1

    def ordered(self, now):
        return [e[2] for e in sorted(self.heap) if e[2].idx not in self.removed]


class SortedEachStep(Queue):
    """Waiting requests kept in a list, sorted by `key(req, now)` whenever the order is needed.

    For an `Ordering` (preemptive, or with keys that move with time) the key and the flags come
    from it. A queue whose waiting requests' keys do not depend on `now` has `static_keys = True`:
    the list then stays sorted (new requests are inserted by bisection on the key, taken once when
    the request is queued and kept in `req.key`) and is re-sorted, every key taken again, only
    after the queue itself changes a waiting key and says so by setting `_sorted_at = None`.

    A queue that keeps every queued and running request's current key in `req.key` (so that
    `key(req, now)` is `req.key`) sets `cached_key = True`: sorting and ranking then read the
    attribute in C instead of calling `key` per request per step, which is most of a preemptive
    policy's cost when hundreds of requests hold KV (FastServe at severe load).
    """

    static_keys = False
    cached_key = False

    def __init__(self, sim, params, ordering: Ordering | None = None):
        super().__init__(sim, params)
        if ordering is not None:
            self.key = ordering.key
            self.preemptive = ordering.preemptive
            self.victim = ordering.victim
            dyn = ordering.dynamics
            self.dynamic = isinstance(dyn, WithTime)
            self.static_keys = not self.dynamic
            if isinstance(dyn, PerServedToken):
                self.served_key_step = dyn.step
            elif dyn is FIXED and ordering.preemptive:
                self.served_key_step = 0
            _bind_hooks(self, ordering)
        self.items: list[Request] = []
        self._sorted_at = None

    def __len__(self): return len(self.items)
    def __iter__(self): return iter(self.items)

    def push(self, req, now):
        if self.static_keys and self._sorted_at is not None:
            if not self.cached_key:
                req.key = self.key(req, now)    # fixed while it waits: taken once, read in C
            bisect.insort(self.items, req, key=_KEY)
        else:
            self.items.append(req)
            self._sorted_at = None

    requeue = push

    def ordered(self, now):
        if self._sorted_at is None or (self._sorted_at != now and not self.static_keys):
            if self.static_keys and not self.cached_key:
                key = self.key
                for r in self.items:
                    r.key = key(r, now)
                self.items.sort(key=_KEY)
            else:
                self.items.sort(key=_KEY if self.cached_key else lambda r: self.key(r, now))
            self._sorted_at = now
        return self.items

    def head(self, now):
        if not self.items:
            return None
        return self.ordered(now)[0]

    def pop_head(self):
        return self.items.pop(0)

    def remove(self, req):
        self.items.remove(req)




def _bind_hooks(queue: Queue, ordering: Ordering) -> None:
    """The ordering's event hooks, where it has them, called by the engine through its queue."""
    for name in ("on_admit", "on_finish"):
        if getattr(type(ordering), name) is not getattr(Ordering, name):
            setattr(queue, name, getattr(ordering, name))


def queue_for(order, sim, params: dict) -> Queue:
    """The engine's queue for a policy's order: an `Ordering` gets the container its dynamics
    allow (module docstring); a `Queue` (FIFO, or a policy with state of its own) is its own."""
    if isinstance(order, Queue):
        return order
    if not isinstance(order, Ordering):
        raise TypeError(f"a policy's order must be an Ordering or a Queue, got {type(order).__name__}")
    if order.preemptive or order.dynamics is not FIXED:
        return SortedEachStep(sim, params, order)
    return StaticKey(sim, params, order)
