"""The batching modes: how an iteration's batch is formed.

* `Continuous` (vLLM v1: one token budget, running first, chunked prefill; with a preemptive
  ordering, vllm-ltr's ranked fill),
* `StallFree` (Sarathi-Serve: decodes, then ongoing prefills, then new ones, prompt blocks
  reserved at admission),
* `Selective` (Orca: whole prompts batched with decodes, max-length KV reservation, no
  preemption),
* `Static` (FasterTransformer request-level batches).

Each is a `schedport.engine.policies.policy.BatchingMode`; a policy declaration names one
(`schedport.engine.policies.schedulers`).
"""

from __future__ import annotations

import heapq
from collections import deque
from operator import attrgetter, itemgetter

from schedport.engine.policies.policy import BatchingMode, Plan
from schedport.engine.core.simulator import RUNNING, WAITING, Request

_KEY = attrgetter("key")
_SECOND = itemgetter(1)


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
            sim.set_aside_null_block()

    def plan(self, sched, now: float) -> Plan:
        if sched.order.preemptive:
            return self._plan_ranked(sched, now)
        sim = self.sim
        # (with prefix caching every request is allocated in turn: blocks are named as they go)
        plan = None if sim.caching else self.plan_running_unconstrained(sim.running, sim.cache, self.budget)
        if plan is None:
            plan = self.plan_running_in_order(sched, now)
            if plan.preempted:
                plan.decode_only = False
                return plan
        return self.fill_waiting(sched, now, plan)

    def fill_waiting(self, sched, now: float, plan: Plan) -> Plan:
        """vLLM v1's waiting pass: admit waiting requests in the ordering's order into what the
        running pass (`plan`) left of the budget, `max_num_seqs` and the free blocks, stopping at
        the first that does not fit."""
        sim = self.sim
        cache = sim.cache
        running = sim.running
        budget = self.budget - sim.plan_tokens(plan)
        order = sched.order
        bs = cache.block_size
        full = self.reserve_full
        while budget > 0 and len(running) < self.max_num_seqs and len(order):
            req = order.head(now)
            n_tok = req.prompt + req.generated
            hit = sim.lookup(req)                   # cached tokens are not charged to the budget
            cached = len(hit) * bs
            k = min(n_tok - cached, budget)
            need = sim.blocks_to_allocate(req, cached + k, hit)
            wm = self.watermark_blocks if running else 0
            if (sim.blocks_to_allocate(req, n_tok, hit) if full else need) > cache.free - wm:
                break
            order.pop_head()
            sched.admit(req, now)
            sim.allocate(req, need, cached + k, hit)
            plan.add(req, k)
            plan.admitted += 1
            budget -= k
        return plan

    @staticmethod
    def plan_running_unconstrained(running, cache, budget) -> Plan | None:
        """The common case, decided at once: every running request gets all it needs.

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

    def plan_running_in_order(self, sched, now: float) -> Plan:
        """vLLM v1's running pass, request by request, preempting when blocks run out."""
        sim = self.sim
        cache = sim.cache
        running = sim.running
        plan = Plan()
        budget = self.budget
        caching = sim.caching
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
            if need > 0 or caching:
                sim.allocate(req, need, req.computed + k)
            plan.add(req, k)
            scheduled[req.idx] = k
            budget -= k
            i += 1
        return plan

    def _plan_ranked(self, sched, now: float) -> Plan:
        """Preemptive orderings: rank running and waiting together and fill the batch in rank order
        (`ranked_fill`), unless a common case decides without ranking (`_ranked_shortcut`)."""
        sim = self.sim
        gated = self.host_gated()
        host_was_full, sim.host_full_prev = sim.host_full_prev, False
        plan = self._ranked_shortcut(sched, now, gated)
        if plan is not None:
            return plan
        return self.ranked_fill(sched, now, gated, host_was_full, Plan())

    def ranked_fill(self, sched, now: float, gated: bool, host_was_full: bool, plan: Plan,
                    shared=None) -> Plan:
        """vllm-ltr's ranked fill into `plan`: requests taken in rank order, running and waiting together.

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

        `shared` (None: every running request is an item of its own) takes the running requests
        that an engine serves as a group rather than as items: `shared.ran(position, request,
        tokens)` says whether it took a running request given its tokens, `shared.sat(request)`
        hears of a running request left out for want of host swap space, and `shared.settle(plan,
        pending)` is told, once the batch is formed, which running requests were not reached.
        """
        sim = self.sim
        cache = sim.cache
        bs = cache.block_size
        order = sched.order
        key = order.key
        swap = self.swap
        budget = self.budget
        wm = self.watermark_blocks
        caching = sim.caching
        cached = getattr(order, "cached_key", False)
        pending, stream, ranked = self._ranked_stream(order, key, now, cached)
        selected = 0
        admitting = True
        items = plan.items
        cap = self.max_num_seqs
        for req in stream:
            if selected >= cap or budget <= 0:
                break       # the batch is full: the running requests not reached sit this step out
            if not pending and not admitting:
                break       # every running request reached and nothing more can start
            if req.phase == RUNNING:
                if pending and pending[0] is req:
                    pending.popleft()
                elif req in pending:
                    pending.remove(req)
                selected += 1
                k = req.prompt + req.generated - req.computed
                if k > budget:
                    k = budget
                need = -(-(req.computed + k) // bs) - req.blocks
                if need > 0 and need > cache.free:
                    if pending:
                        self._make_room(need, pending, plan)
                    if need > cache.free:
                        selected -= 1
                        if not swap or sim.swap_fits(req):
                            sim.preempt(req, swap)
                            plan.preempted += 1
                        else:
                            plan.host_full = True   # the host cannot take it: it sits out, holding its KV
                            if shared is not None:
                                shared.sat(req)
                        continue
                if caching:
                    sim.allocate(req, need, req.computed + k)
                elif need > 0:
                    cache.free -= need
                    req.blocks += need
                if shared is None or not shared.ran(len(items), req, k):
                    items.append((req, k))
                    if not req.decoding:
                        plan.decode_only = False
                budget -= k
            elif req.phase == WAITING and admitting:
                if gated and not req.generated and not req.swapped:
                    continue                            # a context-stage job: held back, the rest go on
                hit = sim.lookup(req)
                done = req.computed + len(hit) * bs
                k = min(req.prompt + req.generated - done, budget)
                need = sim.blocks_to_allocate(req, done + k, hit)
                if need > cache.free - wm and pending:
                    self._make_room(need + wm, pending, plan)
                    if hit:     # a victim may have held the hit blocks: now they too cost free blocks
                        need = sim.blocks_to_allocate(req, done + k, hit)
                if need > cache.free - wm:
                    admitting = False                   # head-of-line: nothing ranked below it starts
                    continue
                order.remove(req)
                sched.admit(req, now)
                sim.allocate(req, need, done + k, hit)
                plan.add(req, k)
                plan.admitted += 1
                selected += 1
                budget -= k
                if cached:
                    ranked.append(req)
        if shared is not None:
            shared.settle(plan, pending)
        if cached:
            # (a job preempted in this pass and started again later in it is in `ranked` twice)
            self._rank_hint = list(dict.fromkeys(ranked)) if plan.preempted else ranked
        if plan.host_full:
            self._host_full_step(plan, host_was_full, key, now, cached)
        plan.ranked = True                          # items are in rank order
        if plan.preempted or plan.admitted or plan.host_full:
            # (a step that found the host full is not repeated unchanged: which job is worst-ranked
            # among those holding KV may differ in the next one, as FastServe's front pushes reorder)
            plan.decode_only = False
        return plan

    def _ranked_shortcut(self, sched, now: float, gated: bool) -> Plan | None:
        """The ranked pass's common cases, decided without ranking: nothing waits and every running
        request gets its full need (rank order is moot), or everything fits (`plan_everyone`).
        None when the ranking has to decide."""
        sim = self.sim
        order = sched.order
        if sim.caching:
            return None     # requests are allocated (and their blocks named) one by one, in rank order
        if not len(order) and len(sim.running) <= self.max_num_seqs:
            # nothing waiting: if every running request gets its full need, rank order is moot
            return self.plan_running_unconstrained(sim.running, sim.cache, self.budget)
        if len(sim.running) + len(order) <= self.max_num_seqs and not gated:
            return self.plan_everyone(sched, now, 0, 0, sim.running, self._plan_all_running)
        return None

    def _plan_all_running(self) -> Plan | None:
        """Every running request given its full need (`plan_running_unconstrained`)."""
        return self.plan_running_unconstrained(self.sim.running, self.sim.cache, self.budget)

    def _ranked_stream(self, order, key, now: float, cached: bool) -> tuple[deque, object, list | None]:
        """The running requests not yet reached (best first), running and waiting requests in one
        rank order, and for an ordering that keeps its keys in `req.key` the running requests'
        rank order, which the next step starts from."""
        keyed, ranked = self._rank_running(key, now, cached)
        if not cached:
            return deque(map(_SECOND, keyed)), _merge_ranked(keyed, list(order.ordered(now)), key, now), None
        # one sort of the two sorted runs in C where the queue is short, else merged as far as the
        # pass reads (over copies: both lists grow or shrink during the pass)
        waiting = order.ordered(now)
        if len(waiting) <= 4 * len(ranked):
            stream = ranked + waiting
            stream.sort(key=_KEY)
        else:
            stream = heapq.merge(ranked[:], waiting[:], key=_KEY)
        return deque(ranked), stream, ranked

    def _rank_running(self, key, now: float, cached: bool) -> tuple[list, list | None]:
        """The running requests best first: as sorted (key, request) pairs and None, or for an
        ordering that keeps its keys in `req.key`, None and the requests in rank order (the order
        the next step starts from)."""
        running = self.sim.running
        if not cached:
            keyed = [(key(r, now), r) for r in running]
            keyed.sort()
            return keyed, None
        # last step's rank order of the running requests, less those that left, is nearly
        # sorted: re-sorting it costs about one comparison per request (keys are unique, so
        # the result is the same as sorting from scratch); if requests joined the running set
        # by another path, the hint is short and everything is sorted afresh
        ranked = self._rank_hint
        if ranked is not None:
            ranked = [r for r in ranked if r.phase == RUNNING]
        if ranked is not None and len(ranked) == len(running):
            ranked.sort(key=_KEY)
        else:
            ranked = sorted(running, key=_KEY)
        return None, ranked

    def _host_full_step(self, plan: Plan, host_was_full: bool, key, now: float, cached: bool) -> None:
        """A step that found the host swap space full: count the event, and if nothing can run at
        all, break the stall by recomputing the worst-ranked holder of KV."""
        sim = self.sim
        sim.host_full_prev = True
        if not host_was_full:
            sim.host_full_events += 1
        if sim.runs_nothing(plan) and not plan.preempted and sim.running:
            # every job that could run needs a block the full host cannot free: the last resort
            # that breaks the stall is the engine's recompute of the worst-ranked holder, counted
            victim = max(sim.running, key=lambda r: key(r, now))
            sim.preempt(victim, False)
            sim.stall_recomputes += 1
            plan.preempted += 1
            if cached:
                self._rank_hint = None

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

    def plan_everyone(self, sched, now: float, tokens: int, blocks: int, running, plan_running) -> Plan | None:
        """Ranked mode when everything fits: every running request gets its full need and every
        waiting request starts (in rank order), with no preemption. None if anything binds.

        `tokens` and `blocks` are what running requests counted as a group take this step, and
        `running` the others; `plan_running()` is the running pass that gives each its need."""
        sim = self.sim
        cache = sim.cache
        bs = cache.block_size
        order = sched.order
        waiting = list(order.ordered(now))
        budget, room = self.budget, cache.free - self.watermark_blocks
        # (both sums only grow: the first request past the budget or the free blocks settles it)
        for r in waiting:
            tokens += r.prompt + r.generated - r.computed
            blocks += -(-(r.prompt + r.generated) // bs)
            if tokens > budget or blocks > room:
                return None
        for r in running:
            k = r.prompt + r.generated - r.computed
            tokens += k
            blocks += -(-(r.computed + k) // bs) - r.blocks
            if tokens > budget or blocks > room:
                return None
        plan = plan_running()
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
            if need > 0 or sim.caching:
                sim.allocate(req, need, req.computed + 1)
            plan.add(req, 1)
            budget -= 1
        plan = self.plan_prefills(sched, now, plan, budget)
        if plan.preempted:
            plan.decode_only = False
        return plan

    def plan_prefills(self, sched, now, plan: Plan, budget: int) -> Plan:
        """Second and third passes: ongoing prefills, then new requests, within what budget is left."""
        sim = self.sim
        cache = sim.cache
        running = sim.running
        for req in running:
            if req.decoding or budget <= 0:
                continue
            k = min(req.num_tokens - req.computed, budget)
            if sim.caching:
                sim.allocate(req, 0, req.computed + k)      # its blocks are named as its chunks are scheduled
            plan.add(req, k)
            budget -= k
        order = sched.order
        while budget > 0 and len(running) < self.max_num_seqs and len(order):
            req = order.head(now)
            hit = sim.lookup(req)
            cached = len(hit) * cache.block_size
            need = sim.blocks_to_allocate(req, req.num_tokens, hit)
            if cache.free - need < self.watermark_blocks:
                break
            order.pop_head()
            sched.admit(req, now)
            k = min(req.num_tokens - cached, budget)
            sim.allocate(req, need, cached + k, hit)
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
        plan = Plan(allocates_decode_blocks=False)
        for req in sim.running:
            plan.add(req, req.num_tokens - req.computed)
        return self.fill_waiting(sched, now, plan)

    def fill_waiting(self, sched, now, plan: Plan) -> Plan:
        """New requests join in arrival order, whole prompts, while the cap, the step's prompt
        budget and their reservations allow."""
        sim = self.sim
        cache = sim.cache
        budget = self.budget
        order = sched.order
        while len(sim.running) < self.max_num_seqs and len(order):
            req = order.head(now)
            need = self.reservation(req)
            if need > cache.free or req.num_tokens > budget:
                break
            order.pop_head()
            sched.admit(req, now)
            sim.allocate(req, need, req.num_tokens)
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

    def on_finish(self, req, t):
        """With `return_at_batch_end`, the whole batch is delivered when its last member ends."""
        if self.return_at_batch_end and not self.sim.running:
            for r in self.batch:
                r.first_token = t
                r.finish = t

    def plan(self, sched, now):
        sim = self.sim
        plan = Plan(allocates_decode_blocks=False)
        if sim.running:
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
            sim.allocate(req, self.reservation(), req.num_tokens)
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
