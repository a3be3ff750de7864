"""The parts a scheduling policy is composed of.

A policy is a short declaration (see `schedport.engine.schedulers`):

* a **batching mode** — how an iteration's batch is formed: `Continuous` (vLLM v1: one token
  budget, running first, chunked prefill), `StallFree` (Sarathi-Serve: decodes, then ongoing
  prefills, then new ones, prompt blocks reserved at admission), `Selective` (Orca: whole
  prompts batched with decodes, max-length KV reservation, no preemption) or `Static`
  (FasterTransformer request-level batches);
* an **ordering** — which waiting (and, if preemptive, which running) request goes first,
  with whatever state it keeps (counters, levels, starvation guards);
* an optional **admission gate** — requests it refuses are rejected.

Each part is a small class; `Policy.bind(sim)` instantiates them for one simulation. The engine
calls the bound policy (`BoundPolicy`) through a narrow interface: `plan`, the queue hooks, and
the fast-forward hooks that say when the next decision is due.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from schedport.engine.simulator import RUNNING, WAITING, Request

# ============================================================================ plans


class Plan:
    """One iteration's batch: (request, tokens) pairs plus what happened while forming it."""

    __slots__ = ("items", "admitted", "preempted", "decode_only", "allocates_decode_blocks", "pad",
                 "emitted", "cohort", "rejoin", "host_full")

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

    def json_scalar(self):
        h = self.heap
        while h and h[0][2].idx in self.removed:
            self.removed.discard(heapq.heappop(h)[2].idx)

    def head(self, now):
        self.json_scalar()
        return self.heap[0][2] if self.heap else None

    def pop_head(self):
        self.json_scalar()
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

    def filter(self, sched: "BoundPolicy", now: float) -> None:
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
            from schedport.errors import ConfigError
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

    def any_admissible(self, sched: "BoundPolicy", plan: Plan) -> bool:
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

    def pick_victim(self, sched: "BoundPolicy", now: float) -> Request:
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


class Continuous(BatchingMode):
    """vLLM v1 continuous batching with chunked prefill (Kwon et al., SOSP 2023; vLLM v1 scheduler).

    One token budget per step (`max_num_batched_tokens`, default 2048 as vLLM's API server).
    Running requests are served first in admission order (decodes and unfinished prefill
    chunks alike), each taking what it still needs up to the remaining budget; KV blocks are
    allocated per scheduled chunk. When blocks run out the victim (the newest running request,
    or the largest-key one under a priority order) is preempted by recompute; if the victim is
    the request being scheduled, the running pass stops. Waiting requests are then admitted in
    the ordering's order while the budget, `max_num_seqs` and free blocks allow, stopping at
    the first that does not fit — and not at all in a step that preempted.

    Three vLLM 0.32 rules are followed, each an `[engine]` key (docs/engine.md §1.1):
    `reserve_full_prompt` — a waiting request starts only when the blocks for its whole known
    sequence (prompt + tokens generated before a preemption) are free, not just its first chunk
    (`scheduler_reserve_full_isl`, vllm/config/scheduler.py; the `full_sequence_must_fit` check of
    `KVCacheManager.allocate_slots`, vllm/v1/core/kv_cache_manager.py), and the waiting pass stops
    there; `null_block` — block 0 of the pool is vLLM's null block (`BlockPool.__init__`,
    vllm/v1/core/block_pool.py), so num_gpu_blocks - 1 blocks are usable; and
    `priority_victim_ties` (see `pick_victim`). The watermark, when set, applies to admissions
    only while some request is running (`allocate_slots`' `has_scheduled_reqs`).
    """

    _rank_hint = None           # ranked fill: the running requests in last step's rank order

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.reserve_full = sim.config.reserve_full_prompt
        if sim.config.null_block:
            sim.cache.num_blocks -= 1
            sim.cache.free -= 1

    def plan(self, sched: "BoundPolicy", now: float) -> Plan:
        if sched.order.preemptive:
            return self._plan_ranked(sched, now)
        sim = self.sim
        cache = sim.cache
        running = sim.running
        budget = self.budget
        if sim.bulk:
            plan = self._plan_cohort(sim, budget)
        else:
            plan = self._plan_running_unconstrained(running, cache, budget)
        if plan is None:
            sim.sync_all()
            plan = self._plan_running_in_order(sched, now)
            if plan.preempted:
                plan.decode_only = False
                return plan
        budget -= self.planned_tokens(plan)
        order = sched.order
        bs = cache.block_size
        full = self.reserve_full
        while budget > 0 and len(running) < self.max_num_seqs and len(order):
            req = order.head(now)
            n_tok = req.prompt + req.generated
            k = min(n_tok, budget)
            need = -(-k // bs)
            wm = self.watermark_blocks if running else 0
            if (-(-n_tok // bs) if full else need) > cache.free - wm:
                break
            order.pop_head()
            sched.admit(req, now)
            sim.allocate(req, need)
            plan.add(req, k)
            plan.admitted += 1
            budget -= k
        return plan

    @staticmethod
    def _plan_cohort(sim, budget, in_order: bool = True) -> Plan | None:
        """Bulk form of the running pass (fast mode): cohort members are not touched one by one.

        If the running requests' needs exceed the budget, the in-order pass is replayed on counts:
        cohort members reached after the budget runs out sit the step out (they leave the cohort
        for this step and rejoin after it); with `in_order=False` (a ranked order decides who is
        served) None is returned instead. Also None when blocks would run out, so that the
        request-by-request pass decides the preemptions. A decoding request outside the cohort
        (left by a request-by-request step) joins it here.
        """
        cache = sim.cache
        bs = cache.block_size
        running = sim.running
        items = []
        if sim.cohort_n != len(running):    # some running requests are outside the cohort
            for r in running:
                if r.sync < 0:
                    if r.decoding:
                        sim.cohort_join(r)
                    else:
                        items.append([r, r.prompt + r.generated - r.computed, 0])
        tokens = sim.cohort_n
        for it in items:
            tokens += it[1]
        skipped = []
        if tokens > budget:
            if not in_order:
                return None
            items = []
            left = budget
            for r in running:
                if left <= 0:
                    if r.sync >= 0:
                        skipped.append(r)
                    continue
                if r.sync >= 0:
                    left -= 1
                else:
                    k = min(r.prompt + r.generated - r.computed, left)
                    items.append([r, k, 0])
                    left -= k
            for r in skipped:
                sim.cohort_leave(r)
        blocks = sim.cohort_crossings(sim.dclock)
        for it in items:
            r, k, _ = it
            it[2] = nb = -(-(r.computed + k) // bs) - r.blocks
            blocks += nb
        if blocks > cache.free:
            for r in skipped:
                sim.cohort_join(r)
            return None
        cache.free -= blocks
        plan = Plan()
        plan.cohort = True
        plan.rejoin = skipped
        for r, k, nb in items:
            r.blocks += nb
            plan.add(r, k)
        return plan

    @staticmethod
    def _plan_running_unconstrained(running, cache, budget) -> Plan | None:
        """The common case, decided in bulk: every running request gets all it needs.

        When the running requests' total token need fits the budget and their new blocks fit
        the free pool, the in-order pass would give each its full need with no preemption,
        whatever the order; otherwise return None and let the in-order pass decide.
        """
        bs = cache.block_size
        pre = [r for r in running if not r.decoding]
        tokens = len(running) - len(pre)
        if tokens > budget:
            return None
        cross = [r for r in running if r.decoding and not r.computed % bs]
        blocks = len(cross)
        chunks = []
        for r in pre:
            k = r.prompt + r.generated - r.computed
            tokens += k
            nb = -(-(r.computed + k) // bs) - r.blocks
            blocks += nb
            chunks.append((r, k, nb))
        if tokens > budget or blocks > cache.free:
            return None
        for r in cross:
            r.blocks += 1
        for r, k, nb in chunks:
            r.blocks += nb
        cache.free -= blocks
        plan = Plan()
        if chunks:
            ks = {r.idx: k for r, k, _ in chunks}
            plan.items = [(r, ks[r.idx] if not r.decoding else 1) for r in running]
            plan.decode_only = False
        else:
            plan.items = [(r, 1) for r in running]
        return plan

    def _plan_running_in_order(self, sched: "BoundPolicy", now: float) -> Plan:
        """vLLM v1's running pass, request by request, preempting when blocks run out."""
        sim = self.sim
        cache = sim.cache
        running = sim.running
        plan = Plan()
        budget = self.budget
        scheduled: dict[int, int] = {}
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            k = min(req.num_tokens - req.computed, budget)
            need = cache.blocks_for(req.computed + k) - req.blocks
            stopped = False
            while need > cache.free:
                victim = self.pick_victim(sched, now)
                vi = running.index(victim)
                if victim.idx in scheduled:               # give back what it was given this step
                    budget += scheduled.pop(victim.idx)
                    plan.items = [(r, kk) for r, kk in plan.items if r is not victim]
                sim.preempt(victim)
                plan.preempted += 1
                if victim is req:
                    stopped = True
                    break
                if vi < i:
                    i -= 1
            if stopped:
                break
            if need > 0:
                sim.allocate(req, need)
            plan.add(req, k)
            scheduled[req.idx] = k
            budget -= k
            i += 1
        return plan

    def _plan_ranked(self, sched: "BoundPolicy", now: float) -> Plan:
        """Preemptive orderings: rank running and waiting together and fill the batch in rank order.

        This is vllm-ltr's global ordering (Fu et al., NeurIPS 2024; hao-ai-lab/vllm-ltr,
        vllm/core/scheduler.py, `Scheduler._general_schedule` and `reserve_free_blocks`): requests
        are taken in rank order while the token budget and `max_num_seqs` (counted over the
        requests *scheduled* this step) allow. A running request that does not make this step's
        batch — ranked past the first `max_num_seqs`, or reached after the budget ran out — keeps
        its KV blocks and sits the step out. Only when blocks are short for a better-ranked
        request is a running one preempted, the worst-ranked first (`reserve_free_blocks` swaps
        out "from the lowest priority request"): by swap when the policy's `preemption = "swap"`
        and the host swap space (`[engine] swap_space_gib`) has room, else by recompute. So more
        than `max_num_seqs` requests may hold KV at once, as in the reference.
        """
        sim = self.sim
        cache = sim.cache
        bs = cache.block_size
        order = sched.order
        gated = self._host_gated()
        host_was_full, sim.host_full_prev = sim.host_full_prev, False
        if not len(order) and len(sim.running) <= self.max_num_seqs:
            # nothing waiting: if every running request gets its full need, rank order is moot
            if sim.bulk:
                plan = self._plan_cohort(sim, self.budget, in_order=False)
            else:
                plan = self._plan_running_unconstrained(sim.running, cache, self.budget)
            if plan is not None:
                return plan
        elif len(sim.running) + len(order) <= self.max_num_seqs and not gated:
            plan = self._plan_everyone(sched, now)
            if plan is not None:
                return plan
        key = order.key
        swap = self.swap
        plan = Plan()
        if sim.bulk:
            # keys read running requests' progress: make it true, keeping the decode cohort, whose
            # members then decode in bulk (not as items) unless preempted or left without budget
            for r in sim.running:
                sim.sync(r)
            plan.cohort = True
        budget = self.budget
        wm = self.watermark_blocks
        cached = getattr(order, "cached_key", False)
        if cached:
            # last step's rank order of the running requests, less those that left, is nearly
            # sorted: re-sorting it costs about one comparison per request (keys are unique, so
            # the result is the same as sorting from scratch); if requests joined the running set
            # by another path, the hint is short and everything is sorted afresh
            ranked = self._rank_hint
            if ranked is not None:
                ranked = [r for r in ranked if r.phase == RUNNING]
            if ranked is not None and len(ranked) == len(sim.running):
                ranked.sort(key=_KEY)
            else:
                ranked = sorted(sim.running, key=_KEY)
            keyed = list(zip(map(_KEY, ranked), ranked))
        else:
            keyed = [(key(r, now), r) for r in sim.running]
            keyed.sort()
        pending = deque(map(_SECOND, keyed))        # running requests not yet reached, best first
        selected = 0
        admitting = True
        members_run = []                            # cohort members given their token, in items order
        members_sit = []                            # cohort members left out of the batch (budget or cap)
        for req in _merge_ranked(keyed, list(order.ordered(now)), key, now):
            if selected >= self.max_num_seqs or budget <= 0:
                break       # the batch is full: the running requests not reached sit this step out
            if not pending and not admitting:
                break       # every running request reached and nothing more can start
            if req.phase == RUNNING:
                if pending and pending[0] is req:
                    pending.popleft()
                elif req in pending:
                    pending.remove(req)
                selected += 1
                k = min(req.prompt + req.generated - req.computed, budget)
                need = -(-(req.computed + k) // bs) - req.blocks
                if need > cache.free and pending:
                    self._make_room(need, pending, plan)
                if need > cache.free:
                    selected -= 1
                    if not swap or sim.swap_fits(req):
                        sim.preempt(req, swap)
                        plan.preempted += 1
                    else:
                        plan.host_full = True       # the host cannot take it: it sits out, holding its KV
                        if req.sync >= 0:
                            members_sit.append(req)
                    continue
                if need > 0:
                    sim.allocate(req, need)
                if req.sync >= 0:
                    members_run.append((len(plan.items), req, k))
                else:
                    plan.add(req, k)
                budget -= k
            elif req.phase == WAITING and admitting:
                if gated and not req.generated and not req.swapped:
                    continue                            # a context-stage job: held back, the rest go on
                k = min(req.prompt + req.generated - req.computed, budget)
                need = -(-(req.computed + k) // bs)
                if need > cache.free - wm and pending:
                    self._make_room(need + wm, pending, plan)
                if need > cache.free - wm:
                    admitting = False                   # head-of-line: nothing ranked below it starts
                    continue
                order.remove(req)
                sched.admit(req, now)
                sim.allocate(req, need)
                plan.add(req, k)
                plan.admitted += 1
                selected += 1
                budget -= k
                if cached:
                    ranked.append(req)
        if plan.cohort:
            members_sit.extend(r for r in pending if r.sync >= 0)
        if members_sit:
            if len(members_sit) <= len(members_run):
                for r in members_sit:                   # they leave for this step and rejoin after it
                    sim.cohort_leave(r)
                plan.rejoin = members_sit
            else:
                # most members sit out (a long prefill took the budget): the cohort stands still
                # this step, and the few members that run take their token as items instead
                items = plan.items
                for pos, r, k in reversed(members_run):
                    sim.cohort_leave(r)
                    items.insert(pos, (r, k))
                plan.cohort = False
        if cached:
            self._rank_hint = ranked
        if plan.host_full:
            sim.host_full_prev = True
            if not host_was_full:
                sim.host_full_events += 1
            if not plan.items and not (plan.cohort and sim.cohort_n) and not plan.preempted and sim.running:
                # every job that could run needs a block the full host cannot free: the last resort
                # that breaks the stall is the engine's recompute of the worst-ranked holder, counted
                victim = max(sim.running, key=lambda r: key(r, now))
                sim.preempt(victim, False)
                sim.stall_recomputes += 1
                plan.preempted += 1
                if cached:
                    self._rank_hint = None
        if plan.preempted or plan.admitted or plan.host_full:
            # (a step that found the host full is not repeated unchanged: which job is worst-ranked
            # among those holding KV may differ in the next one, as FastServe's front pushes reorder)
            plan.decode_only = False
        return plan

    def _host_gated(self) -> bool:
        """Is the host gate closed this step (less than `host_gate` of the host swap space free)?"""
        sim = self.sim
        return bool(self.host_gate and sim.host_blocks
                    and sim.host_blocks - sim.host_used < self.host_gate * sim.host_blocks)

    def _make_room(self, need: int, pending: deque, plan: Plan) -> None:
        """Preempt running requests not yet reached (`pending`), the worst-ranked first, until
        `need` blocks are free or none is left.

        With swap preemption the victims go to the host swap space. If it cannot take the ones
        that would make room, none is preempted and the step is marked `host_full`: a swapping
        policy never recomputes through a full host, and never evicts a job for a request that
        still could not run.
        """
        sim = self.sim
        cache = sim.cache
        if self.swap:
            room = sim.host_blocks - sim.host_used
            freed = cache.free
            for victim in reversed(pending):
                if freed >= need:
                    break
                if victim.blocks > room:
                    plan.host_full = True
                    return
                room -= victim.blocks
                freed += victim.blocks
        while need > cache.free and pending:
            sim.preempt(pending.pop(), self.swap)
            plan.preempted += 1

    def _plan_everyone(self, sched: "BoundPolicy", now: float) -> Plan | None:
        """Ranked mode when everything fits: every running request gets its full need and every
        waiting request starts (in rank order), with no preemption. None if anything binds."""
        sim = self.sim
        cache = sim.cache
        bs = cache.block_size
        order = sched.order
        waiting = list(order.ordered(now))
        tokens = 0
        blocks = 0
        if sim.cohort_n:
            tokens = sim.cohort_n
            blocks = sim.cohort_crossings(sim.dclock)
        for r in sim.running:
            if r.sync < 0:
                k = r.prompt + r.generated - r.computed
                tokens += k
                blocks += -(-(r.computed + k) // bs) - r.blocks
        for r in waiting:
            tokens += r.prompt + r.generated - r.computed
            blocks += -(-(r.prompt + r.generated) // bs)
        if tokens > self.budget or blocks > cache.free - self.watermark_blocks:
            return None
        if sim.bulk:
            plan = self._plan_cohort(sim, self.budget, in_order=False)
        else:
            plan = self._plan_running_unconstrained(sim.running, cache, self.budget)
        for r in waiting:
            k = r.prompt + r.generated - r.computed
            need = -(-(r.computed + k) // bs)
            sched.order.remove(r)
            sched.admit(r, now)
            sim.allocate(r, need)
            plan.add(r, k)
            plan.admitted += 1
        plan.decode_only = False
        return plan


_KEY = attrgetter("key")
_SECOND = itemgetter(1)


def _merge_ranked(keyed: list, waiting: list, key, now: float):
    """Running requests (`keyed`: sorted (key, request) pairs) and waiting ones (`waiting`:
    already in key order) in one rank order; waiting keys are computed only as far as the
    caller iterates, since a ranked pass usually stops soon after the last running request."""
    i = 0
    n = len(keyed)
    for w in waiting:
        kw = key(w, now)
        while i < n and keyed[i][0] < kw:
            yield keyed[i][1]
            i += 1
        yield w
    for j in range(i, n):
        yield keyed[j][1]


class StallFree(BatchingMode):
    """Sarathi-Serve stall-free batching with chunked prefills (Agrawal et al., OSDI 2024).

    Each step fills a fixed token budget (`chunk_size`, default 512) in a fixed order: every
    ongoing decode (one token each), then requests whose prefill is under way, then new requests
    FCFS, each prefill taking a chunk of what is left. Decodes are never stalled by a prefill.
    A new request's prompt blocks are allocated at admission, subject to the 1% watermark;
    decodes append blocks and, when none is free, the last running request is preempted by
    recompute (the request itself if no other remains).
    """

    default_budget = 512
    default_watermark = 0.01

    def __init__(self, sim, params):
        if "chunk_size" in params and not params.get("max_num_batched_tokens"):
            params = {**params, "max_num_batched_tokens": params["chunk_size"]}
        super().__init__(sim, params)

    def never_fits(self, req):
        c = self.sim.cache
        need = c.blocks_for(req.prompt + req.output)
        if need > c.num_blocks - self.watermark_blocks:
            return (f"needs {need} KV blocks, the cache holds {c.num_blocks} "
                    f"less a {self.watermark_blocks}-block watermark")
        return ""

    def any_admissible(self, sched, plan):
        sim = self.sim
        if len(sim.running) >= self.max_num_seqs or self.budget - self.planned_tokens(plan) <= 0:
            return False
        m = min(r.num_tokens for r in sched.order)
        return sim.cache.blocks_for(m) <= sim.cache.free - self.watermark_blocks

    def plan(self, sched, now):
        sim = self.sim
        cache = sim.cache
        running = sim.running
        plan = Plan()
        budget = self.budget
        if sim.bulk:
            cross = sim.cohort_crossings(sim.dclock)
            if sim.cohort_n <= budget and cross <= cache.free:
                cache.free -= cross
                plan.cohort = True
                budget -= sim.cohort_n
                return self._plan_prefills(sched, now, plan, budget)
            sim.sync_all()
        for req in list(running):
            if not req.decoding or req.phase != RUNNING or budget <= 0:
                continue
            need = cache.blocks_for(req.computed + 1) - req.blocks
            gone = False
            while need > cache.free:
                victim = running[-1]
                sim.preempt(victim)
                plan.preempted += 1
                if victim is req:
                    gone = True
                    break
            if gone:
                continue
            if need > 0:
                sim.allocate(req, need)
            plan.add(req, 1)
            budget -= 1
        plan = self._plan_prefills(sched, now, plan, budget)
        if plan.preempted:
            plan.decode_only = False
        return plan

    def _plan_prefills(self, sched, now, plan: Plan, budget: int) -> Plan:
        """Second and third passes: ongoing prefills, then new requests, within what budget is left."""
        sim = self.sim
        cache = sim.cache
        running = sim.running
        for req in running:
            if req.decoding or budget <= 0:
                continue
            k = min(req.num_tokens - req.computed, budget)
            plan.add(req, k)
            budget -= k
        order = sched.order
        while budget > 0 and len(running) < self.max_num_seqs and len(order):
            req = order.head(now)
            need = cache.blocks_for(req.num_tokens)
            if cache.free - need < self.watermark_blocks:
                break
            order.pop_head()
            sched.admit(req, now)
            sim.allocate(req, need)
            k = min(req.num_tokens, budget)
            plan.add(req, k)
            plan.admitted += 1
            budget -= k
        return plan


class Selective(BatchingMode):
    """Orca iteration-level scheduling with selective batching (Yu et al., OSDI 2022).

    Every running request runs every iteration; new requests join in arrival order with their
    whole prompt in the same iteration (no chunking), up to `max_num_seqs`, while their KV
    reservation fits. As in Sarathi-Serve's Orca baseline each admitted request reserves the
    blocks for `max_model_len` tokens (`reserve = "max_model_len"`; `"request"` reserves its own
    prompt + output instead), so memory never runs out and nothing is preempted. A step's
    prompt tokens are capped at max(max_model_len, 2048), vLLM v0's unchunked budget.
    """

    allocates_decode_blocks = False

    def __init__(self, sim, params):
        super().__init__(sim, params)
        if not (params.get("max_num_batched_tokens") or sim.config.max_num_batched_tokens):
            self.budget = max(sim.config.max_model_len, 2048)
        self.reserve = params.get("reserve", "max_model_len")

    def reservation(self, req: Request) -> int:
        c = self.sim.cache
        if self.reserve == "request":
            return c.blocks_for(req.prompt + req.output)
        return c.blocks_for(self.sim.config.max_model_len)

    def never_fits(self, req):
        c = self.sim.cache
        if self.reservation(req) > c.num_blocks:
            return f"its reservation of {self.reservation(req)} KV blocks exceeds the cache's {c.num_blocks}"
        if req.prompt > self.budget:
            return f"prompt of {req.prompt} tokens exceeds the {self.budget}-token step budget"
        return ""

    def any_admissible(self, sched, plan):
        sim = self.sim
        if len(sim.running) >= self.max_num_seqs:
            return False
        return any(self.reservation(r) <= sim.cache.free and r.num_tokens <= self.budget
                   for r in sched.order)

    def plan(self, sched, now):
        sim = self.sim
        cache = sim.cache
        plan = Plan(allocates_decode_blocks=False)
        if sim.bulk:
            plan.cohort = True          # every running request is decoding (prompts go in whole)
        else:
            for req in sim.running:
                plan.add(req, req.num_tokens - req.computed)
        budget = self.budget
        order = sched.order
        while len(sim.running) < self.max_num_seqs and len(order):
            req = order.head(now)
            need = self.reservation(req)
            if need > cache.free or req.num_tokens > budget:
                break
            order.pop_head()
            sched.admit(req, now)
            sim.allocate(req, need)
            plan.add(req, req.num_tokens)
            plan.admitted += 1
            budget -= req.num_tokens
        return plan


class Static(BatchingMode):
    """Request-level (static) batching, FasterTransformer-style (the Orca paper's baseline).

    A batch of up to `batch_size` requests (default 128, Sarathi-Serve's FasterTransformer
    scheduler) is formed in arrival order only when nothing is running; it is prefilled in one
    forward pass and decoded until every member finishes; nothing joins mid-batch. Each member
    reserves `max_model_len` tokens of KV. Options: `pad_compute` (the batch prefill is padded
    to the longest prompt, as FasterTransformer pads its input) and
    `return_at_batch_end` (every member's tokens are delivered when the batch ends). Defaults
    follow Sarathi-Serve's re-implementation: no padding, each request returns when it finishes.
    The batch prefill is capped at `max_num_batched_tokens` (default 65,536) tokens.
    """

    default_budget = 65536
    allocates_decode_blocks = False

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.batch_size = int(params.get("batch_size", 128))
        self.pad_compute = bool(params.get("pad_compute", False))
        self.return_at_batch_end = bool(params.get("return_at_batch_end", False))
        self.batch: list[Request] = []
        self.pad_len = 0

    def reservation(self) -> int:
        return self.sim.cache.blocks_for(self.sim.config.max_model_len)

    def never_fits(self, req):
        c = self.sim.cache
        if self.reservation() > c.num_blocks:
            return f"its reservation of {self.reservation()} KV blocks exceeds the cache's {c.num_blocks}"
        if req.prompt > self.budget:
            return f"prompt of {req.prompt} tokens exceeds the {self.budget}-token batch budget"
        return ""

    def any_admissible(self, sched, plan):
        return False if self.sim.running else bool(len(sched.order))

    def plan(self, sched, now):
        sim = self.sim
        plan = Plan(allocates_decode_blocks=False)
        if sim.running:
            if sim.bulk:
                plan.cohort = True
            else:
                for req in sim.running:
                    plan.add(req, 1)
            return plan
        order = sched.order
        cache = sim.cache
        batch: list[Request] = []
        longest = 0
        while len(batch) < min(self.batch_size, self.max_num_seqs) and len(order):
            req = order.head(now)
            if self.reservation() > cache.free:
                break
            L = max(longest, req.num_tokens)
            tokens = (len(batch) + 1) * L if self.pad_compute else sum(r.num_tokens for r in batch) + req.num_tokens
            if tokens > self.budget:
                break
            order.pop_head()
            sched.admit(req, now)
            sim.allocate(req, self.reservation())
            batch.append(req)
            longest = L
        for req in batch:
            plan.add(req, req.num_tokens)
        plan.admitted = len(batch)
        if self.pad_compute:
            plan.pad = longest
        self.batch = batch
        self.pad_len = longest
        return plan


# ============================================================================ the bound policy


@dataclass(frozen=True)
class Policy:
    """A scheduling policy as a declaration: batching mode + ordering + admission gate.

    `params` are the policy's documented defaults; `[scheduler.<name>]` in the engine config
    overrides them. `cite` names the published source of the mechanism.
    """

    name: str
    summary: str
    batching: type[BatchingMode]
    order: Callable[..., Ordering]
    admission: Callable[..., Any] = AdmitAll
    params: dict = field(default_factory=dict)
    cite: str = ""

    def bind(self, sim) -> "BoundPolicy":
        """Instantiate the parts for one simulation (fresh state each run)."""
        from schedport.engine.schedulers import validate_for

        validate_for(self, sim.config)    # every [scheduler.*] table: names, keys, types, ranges
        params = dict(self.params)
        params.update(sim.config.scheduler_params.get(self.name, {}))
        return BoundPolicy(self, sim, params)


_MODE_KEYS = {"max_num_batched_tokens", "max_num_seqs", "watermark"}


class BoundPolicy:
    """A policy instantiated for one simulation: the single object the engine talks to."""

    def __init__(self, policy: Policy, sim, params: dict):
        self.policy = policy
        self.sim = sim
        self.params = params
        self.mode = policy.batching(sim, params)
        self.order = policy.order(sim, params)
        self.gate = policy.admission(sim, params)

    def supports_bulk(self) -> bool:
        """May the engine advance decoding requests in bulk (no per-request decode hooks needed)?"""
        return not self.order.per_request_steps

    # -- queue hooks used by the engine
    def has_waiting(self) -> bool:
        return len(self.order) > 0

    def never_fits(self, req: Request) -> str:
        return self.mode.never_fits(req)

    def on_arrival(self, req: Request, now: float) -> None:
        self.order.push(req, now)

    def requeue_preempted(self, req: Request, now: float) -> None:
        self.order.requeue(req, now)

    def on_reject(self, req: Request) -> None:
        pass

    def on_finish(self, req: Request, t: float) -> None:
        self.order.on_finish(req, t)
        if isinstance(self.mode, Static) and self.mode.return_at_batch_end and not self.sim.running:
            for r in self.mode.batch:       # the whole batch is delivered when its last member ends
                r.first_token = t
                r.finish = t

    def admit(self, req: Request, now: float) -> None:
        self.sim.admit(req)
        self.order.on_admit(req, now)

    # -- the step
    def plan(self, now: float) -> Plan:
        self.order.prepare(now)
        self.gate.filter(self, now)
        return self.mode.plan(self, now)

    def after_step(self, plan: Plan, start: float, end: float) -> None:
        self.order.after_step(plan, start, end)

    # -- fast-forward hooks
    def stable(self, plan: Plan) -> bool:
        """Would the same decode-only batch be chosen again until the next declared decision point?"""
        if plan.admitted or plan.preempted:
            return False
        if not len(self.order):
            return True
        if self.order.dynamic:
            return not self.mode.any_admissible(self, plan)
        return True

    def fast_forward_limit(self, plan: Plan, now: float):
        k1, t1 = self.order.fast_forward_limit(plan, now)
        k2, t2 = self.gate.fast_forward_limit(self, plan, now)
        return _min_opt(k1, k2), _min_opt(t1, t2)

    def refine_fast_forward(self, plan, starts, ends, k):
        k = self.order.refine_fast_forward(plan, starts, ends, k)
        return self.gate.refine(self, plan, starts[:k], ends[:k], k)

    def after_fast_forward(self, plan, starts, ends, k):
        self.order.after_fast_forward(plan, starts, ends, k)


def _min_opt(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
