"""The parts a scheduling policy is composed of, and the interfaces between them.

A policy is a short declaration (`schedport.engine.schedulers.Policy`):

* a **batching mode** — how an iteration's batch is formed (`BatchingMode`; the four modes,
  `Continuous`, `StallFree`, `Selective` and `Static`, are in `schedport.engine.batching`);
* an **ordering** — which waiting (and, if preemptive, which running) request goes first,
  with whatever state it keeps (counters, levels, starvation guards): `Ordering` and the
  containers every ordering builds on (`Fifo`, `StaticKey`, `SortedEachStep`);
* an optional **admission gate** — requests it refuses are rejected (`AdmitAll`: none).

Each part is a small class; `Policy.bind(sim)` instantiates them for one simulation. The engine
calls the bound policy (`schedport.engine.schedulers.BoundPolicy`) through a narrow interface:
`plan`, the queue hooks, and the fast-forward hooks that say when the next decision is due.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import numpy as np

from schedport.engine.simulator import Request
from schedport.errors import ConfigError

_KEY = attrgetter("key")
# ============================================================================ plans


class Plan:
    """One iteration's batch: (request, tokens) pairs plus what happened while forming it."""

    __slots__ = ("items", "admitted", "preempted", "decode_only", "allocates_decode_blocks", "pad",
                 "emitted", "cohort", "rejoin", "host_full", "parked")

    def __init__(self, allocates_decode_blocks: bool = True):
        self.items: list[tuple[Request, int]] = []
        self.admitted = 0
        self.preempted = 0
        self.decode_only = True
        self.allocates_decode_blocks = allocates_decode_blocks
        self.pad = 0  # static batching with padded compute: prompt length every prefill is padded to
        self.emitted: list[Request] = []  # filled by the engine: requests that got a token this step
        self.cohort = False  # True: every decode-cohort member also decodes one token (not in items)
        self.rejoin: list[Request] = []   # cohort members sitting this step out (budget ran out first)
        self.host_full = False  # a swap-out was wanted and the host swap space could not take it
        self.parked = 0         # running requests sitting out a cohort step (neither cohort nor items)

    def add(self, req: Request, k: int) -> None:
        self.items.append((req, k))
        if not req.decoding:
            self.decode_only = False

    def chunk_shape(self, req: Request, k: int) -> tuple[int, int]:
        """(chunk tokens, tokens already cached) of a prefill chunk, as the latency model wants it."""
        if self.pad:
            return (self.pad, 0)
        return (k, req.computed)


# ============================================================================ orderings


class Ordering:
    """Base ordering: the waiting container plus the hooks a policy may need.

    `preemptive` orderings rank running and waiting requests together every step and
    preempt running requests that fall outside the selected set. `dynamic` orderings can
    change the order of waiting requests at any time (aging, counters): the engine then
    fast-forwards only when no waiting request could be admitted in any order.

    In fast mode the engine advances decoding requests as a cohort, so a running request's
    `computed`/`generated` fields may lag until it is synced. Waiting requests are always
    exact, and a preemptive ordering's keys for running requests are computed after every
    running request is synced. An ordering that reads running requests' progress anywhere else
    (in its hooks) must set `per_request_steps = True`, which keeps every request exact at
    every step.
    """

    preemptive = False
    dynamic = False
    victim = "newest"      # memory-pressure victim for non-preemptive orderings: newest | worst
    per_request_steps = False  # True: needs every decode step reported per request (no bulk cohort)
    #: How a preemptive order's keys move, if the engine may keep its rank order between steps:
    #: a served request's leading key changes by this much per token served (srpt: -1; a fixed
    #: key: 0) and no key changes otherwise. None: keys may change any time; ranked afresh each step.
    served_key_step: int | None = None

    def __init__(self, sim, params: dict):
        self.sim = sim
        self.params = params

    # -- container
    def __len__(self) -> int: raise NotImplementedError
    def push(self, req: Request, now: float) -> None: raise NotImplementedError
    def requeue(self, req: Request, now: float) -> None: raise NotImplementedError
    def head(self, now: float) -> Request | None: raise NotImplementedError
    def pop_head(self) -> Request: raise NotImplementedError
    def remove(self, req: Request) -> None: raise NotImplementedError
    def ordered(self, now: float) -> list[Request]: raise NotImplementedError
    def __iter__(self): raise NotImplementedError

    # -- keys (preemptive / worst-victim orderings)
    def key(self, req: Request, now: float) -> Any:
        return (req.arrival, req.idx)

    def victim_key(self, req: Request, now: float) -> Any:
        """The rank a memory-pressure victim is chosen by, without the final index tiebreak
        (vLLM ranks victims by (priority, arrival_time) only)."""
        return self.key(req, now)[:-1]

    # -- hooks
    def prepare(self, now: float) -> None:
        """Called at the start of every step, before the batch is formed (time-driven promotions)."""
    def on_admit(self, req: Request, now: float) -> None: pass
    def after_step(self, plan: Plan, start: float, end: float) -> None: pass
    def after_fast_forward(self, plan: Plan, starts: np.ndarray, ends: np.ndarray, k: int) -> None: pass
    def on_finish(self, req: Request, t: float) -> None: pass
    def cohort_changed(self, req: Request, delta: int) -> None:
        """A request joined (+1) or left (-1) the engine's decode cohort (fast mode only)."""
    def fast_forward_limit(self, plan: Plan, now: float) -> tuple[int | None, float | None]:
        return None, None
    def refine_fast_forward(self, plan: Plan, starts: np.ndarray, ends: np.ndarray, k: int) -> int:
        return k


class Fifo(Ordering):
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


class StaticKey(Ordering):
    """A fixed per-request key, smallest first, ties by arrival (vLLM v1's priority heap).

    Under memory pressure the victim is the running request with the largest key, as vLLM v1
    does for `policy="priority"`.
    """

    victim = "worst"

    def __init__(self, sim, params, keyfn: Callable[[Request], Any]):
        super().__init__(sim, params)
        self.keyfn = keyfn
        self.heap: list = []
        self.removed: set[int] = set()
        self.n = 0

    def __len__(self): return self.n
    def __iter__(self): return (e[2] for e in self.heap if e[2].idx not in self.removed)

    def key(self, req, now):
        return req.key

    def push(self, req, now):
        if req.key is None:
            req.key = (self.keyfn(req), req.arrival, req.idx)
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


class SortedEachStep(Ordering):
    """Waiting requests kept in a list and sorted by `key(req, now)` whenever the order is needed.

    An ordering whose waiting requests' keys do not depend on `now` sets `static_keys = True`:
    the list then stays sorted (new requests are inserted by bisection) and is re-sorted only
    after the ordering itself changes a waiting key and says so by setting `_sorted_at = None`.

    An ordering that keeps every queued and running request's current key in `req.key` (so that
    `key(req, now)` is `req.key`) sets `cached_key = True`: sorting and ranking then read the
    attribute in C instead of calling `key` per request per step, which is most of a preemptive
    policy's cost when hundreds of requests hold KV (FastServe at severe load).
    """

    static_keys = False
    cached_key = False

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.items: list[Request] = []
        self._sorted_at = None

    def __len__(self): return len(self.items)
    def __iter__(self): return iter(self.items)

    def push(self, req, now):
        if self.static_keys and self._sorted_at is not None:
            bisect.insort(self.items, req, key=_KEY if self.cached_key else lambda r: self.key(r, now))
        else:
            self.items.append(req)
            self._sorted_at = None

    requeue = push

    def ordered(self, now):
        if self._sorted_at is None or (self._sorted_at != now and not self.static_keys):
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


# ============================================================================ admission gates


class AdmitAll:
    """No admission control: every request that can ever fit is served."""

    def __init__(self, sim, params):
        pass

    def filter(self, sched, now: float) -> None:
        pass

    def fast_forward_limit(self, sched, plan, now):
        return None, None

    def refine(self, sched, plan, starts, ends, k):
        return k


# ============================================================================ batching modes


class BatchingMode:
    """How an iteration's batch is formed; subclasses implement `plan`."""

    default_budget = 2048
    default_watermark = 0.0
    allocates_decode_blocks = True
    tracker = None          # the kept rank order of a preemptive policy (`schedport.engine.ranking`)

    def __init__(self, sim, params: dict):
        cfg = sim.config
        self.sim = sim
        self.budget = int(params.get("max_num_batched_tokens") or cfg.max_num_batched_tokens
                          or self.default_budget)
        wm = cfg.watermark if cfg.watermark is not None else params.get("watermark", self.default_watermark)
        self.watermark = float(wm)
        self.watermark_blocks = int(math.floor(wm * sim.cache.num_blocks))
        self.max_num_seqs = int(params.get("max_num_seqs") or cfg.max_num_seqs)
        self.swap = params.get("preemption", "recompute") == "swap"
        if params.get("preemption", "recompute") not in ("recompute", "swap"):
            raise ConfigError(f"preemption: must be 'recompute' or 'swap', got {params['preemption']!r}")
        if self.swap:
            # one host swap space for every swapping policy ([engine] swap_space_gib, docs/engine.md)
            sim.host_blocks = int(cfg.swap_space_gib * 2**30 // sim.block_bytes)
            sim.pcie_bytes_per_s = cfg.pcie_gb_s * 1e9
            sim.swap_overlap = bool(params.get("swap_overlap", False))
        # FastServe's host gate (`MLFQ.get_next_batch`): no job in its context stage starts
        # while less than this share of the host swap space is free (0: no gate)
        self.host_gate = float(params.get("host_gate", 0.0)) if self.swap else 0.0

    def never_fits(self, req: Request) -> str:
        """Why `req` can never be served in this mode ('' if it can)."""
        c = self.sim.cache
        need = c.blocks_for(req.prompt + req.output)
        if need > c.num_blocks:
            return f"needs {need} KV blocks, the cache holds {c.num_blocks}"
        return ""

    def planned_tokens(self, plan: Plan) -> int:
        """Tokens the plan computes this step (cohort decodes included)."""
        return sum(k for _, k in plan.items) + (self.sim.cohort_n if plan.cohort else 0)

    def any_admissible(self, sched, plan: Plan) -> bool:
        """Could some waiting request be admitted now, in any order? (for dynamic orderings)"""
        sim = self.sim
        if len(sim.running) >= self.max_num_seqs:
            return False
        left = self.budget - self.planned_tokens(plan)
        if left <= 0:
            return False
        m = min(r.num_tokens for r in sched.order)
        if not (getattr(self, "reserve_full", False) and not sched.order.preemptive):
            m = min(m, left)
        return sim.cache.blocks_for(m) <= sim.cache.free - self.watermark_blocks

    def pick_victim(self, sched, now: float) -> Request:
        """The running request to preempt when blocks run out: the newest (vLLM's FCFS
        `self.running[-1]`), or for a priority order the worst-ranked, as vLLM v1's
        `max(self.running, key=lambda r: (r.priority, r.arrival_time))` (Scheduler.schedule,
        vllm/v1/core/sched/scheduler.py, 0.32): ties go to the first in running order, or with
        `[engine] priority_victim_ties = "last-index"` to the largest request index."""
        running = self.sim.running
        order = sched.order
        if order.victim == "worst":
            if self.sim.config.priority_victim_ties == "first-running":
                return max(running, key=lambda r: order.victim_key(r, now))
            return max(running, key=lambda r: order.key(r, now))
        return running[-1]
