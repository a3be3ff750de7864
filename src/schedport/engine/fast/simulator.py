"""The fast engine: the exact engine's runs, bit for bit, with a decode cohort and fast-forwards.

`FastSimulator` extends the exact `Simulator` (`schedport.engine.core.simulator`) at its
extension points. It keeps the running requests that decode one token per step in a *decode
cohort* advanced by a clock bump rather than one by one (`schedport.engine.fast.cohort`; their
counts are made true on demand, `sync`): `_serve` and `_served`. And it fast-forwards through runs
of identical decode-only steps (`_skip_ahead`): when the batch is "every running request decodes
one token" and nothing can be admitted, it computes how many such steps happen before the next
decision point (an arrival, a completion, a KV block shortfall, the horizon, or a point the
policy declares with `next_decision`, such as a quantum expiry or a starvation promotion)
and prices them all at once with the latency model's vectorised decode path. Policies whose
order can change at any moment are only fast-forwarded when no waiting request could be
admitted whatever the order (`stable`).

The batching modes form their batches request by request; the fast planner
(`schedport.engine.fast.planner`) wraps the policy's mode and forms the same batches with the
cohort counted in bulk, keeping a preemptive order's rank order between steps
(`schedport.engine.fast.ranking`) or FastServe's levels in the cohort
(`schedport.engine.fast.mlfq_cohort`); the policies with cohort state of their own run in their
fast forms (`schedport.engine.fast.forms`); the requests carry the cohort's fields
(`CohortRequest`). No policy knows of the cohort. The property tests (tests/engine/test_engine_behaviour.py,
tests/policies/test_fastserve.py) hold every policy's runs here to the exact engine's.
"""

from __future__ import annotations

import math

import numpy as np

from schedport.engine.core.simulator import Simulator, StepRecord
from schedport.engine.fast.cohort import CohortRequest, DecodeCohort
from schedport.engine.fast.forms import with_fast_form
from schedport.engine.fast.planner import FastPlanner
from schedport.engine.policies.policy import Plan

_SCALAR_STEPS = 24      # fast-forwards of up to this many steps are timed with Python floats


class FastSimulator(DecodeCohort, Simulator):
    """The exact engine's runs with a decode cohort and fast-forwards (module docstring)."""

    exact = False
    request_class = CohortRequest
    cohort_allowed = True   # decodes may advance as a cohort (the prefix-caching engine's may not)
    rank_order = None       # a preemptive order's kept rank order (`RankTracker`), once the planner makes it

    def __init__(self, trace, policy, *args, **kwargs):
        # VTC and ltr run in their fast forms, which count the cohort's tokens (`fast.forms`)
        super().__init__(trace, with_fast_form(policy) if self.cohort_allowed else policy, *args, **kwargs)
        # running requests that decode one token per step are advanced together by bumping
        # `decode_clock` instead of touching each one; a member's true computed/generated counts
        # are its fields plus (decode_clock - sync). `sync_all` makes every field true before any
        # per-request decision.
        sched = self.sched
        self.bulk = self.cohort_allowed and not sched.order.per_request_steps   # decode steps advance in bulk
        if self.bulk:
            sched.planner = FastPlanner(self, sched.mode)
        self.decode_clock = 0
        self.cohort_n = 0
        self.cohort_pval = 0      # sum of members' pval
        self.cohort_buckets = [0] * self.config.block_size   # members by pval mod block_size
        self.cohort_heap: list = []     # (clock, idx, req): each member's done clock or a bound below it
        self._alloc_decode = self.sched.mode.allocates_decode_blocks
        self._cohort_hook = getattr(sched.order, "cohort_changed", None)
        self._joined: list = []         # this step's requests that caught up and decode from now on
        self._outside: list = []        # this step's items outside the cohort while it stood still
        self._moved = 0                 # the change in members' summed offsets served alone

    def release(self) -> None:
        """`Simulator.release`, and the cohort's references too."""
        super().release()
        self._cohort_hook = None
        self.cohort_heap = []

    # ----------------------------------------------------------------- what policies are handed
    def listen_cohort(self, hook) -> None:
        """Tell `hook(req, +1 | -1)` of every join and leave of the cohort from now on (None: nobody),
        in place of the policy's `cohort_changed`."""
        self._cohort_hook = hook

    @property
    def cohort_listener(self):
        """Who is told of joins and leaves now (`listen_cohort`)."""
        return self._cohort_hook

    def plan_tokens(self, plan) -> int:
        """`Simulator.plan_tokens`, the cohort's decodes included."""
        return sum(k for _, k in plan.items) + (self.cohort_n if plan.cohort else 0)

    def runs_nothing(self, plan) -> bool:
        """`Simulator.runs_nothing`: no items, and no cohort step with members in it."""
        return not plan.items and not (plan.cohort and self.cohort_n)

    # ----------------------------------------------------------------- the engine's events, told to the kept rank order
    def admit(self, req) -> None:
        """`Simulator.admit`, and the kept rank order takes the request in."""
        Simulator.admit(self, req)
        if self.rank_order is not None:
            self.rank_order.admitted(req)

    def preempt(self, req, swap: bool = False) -> None:
        """`Simulator.preempt` of a request made exact and out of the cohort (and the kept rank order)."""
        if req.sync >= 0:
            self.cohort_leave(req)
        if self.rank_order is not None:
            self.rank_order.left(req)
        Simulator.preempt(self, req, swap)

    def _finish(self, req, t: float) -> None:
        if req.sync >= 0:
            self.cohort_leave(req)
        if self.rank_order is not None:
            self.rank_order.left(req)
        Simulator._finish(self, req, t)

    def _next_decision(self, plan):
        """The policy's next decision point (`BoundPolicy.next_decision`), bounded by when the kept
        rank order's ranking can turn."""
        k, t = self.sched.next_decision(plan, self.now)
        if self.rank_order is not None:
            k2 = self.rank_order.next_decision(self.now)
            if k2 is not None:
                k = k2 if k is None else min(k, k2)
        return k, t

    def _after_fast_forward(self, plan, starts, ends, k: int) -> None:
        if self.rank_order is not None:
            self.rank_order.served_run(plan)
        self.sched.after_fast_forward(plan, starts, ends, k)

    def _observed_batch(self, plan) -> list:
        """`Simulator._observed_batch`, the cohort's members included."""
        ks = {r.idx: k for r, k in plan.items}
        return [(r.idx, ks.get(r.idx, 1)) for r in self.running
                if r.idx in ks or (plan.cohort and r.sync >= 0)]

    def _output(self):
        self.sync_all()
        return Simulator._output(self)

    # ----------------------------------------------------------------- the bulk forms of a batching pass
    def plan_running_bulk(self, budget: int, in_order: bool = True) -> Plan | None:
        """The running pass with the members counted, not touched one by one.

        If the running requests' needs exceed the budget, the in-order pass is replayed on counts:
        cohort members reached after the budget runs out sit the step out (they leave the cohort
        for this step and rejoin after it); with `in_order=False` (a ranked order decides who is
        served) None is returned instead. Also None when blocks would run out, so that the
        request-by-request pass decides the preemptions. A decoding request outside the cohort
        (left by a request-by-request step) joins it here.
        """
        cache = self.cache
        bs = cache.block_size
        running = self.running
        items = []
        if self.cohort_n != len(running):    # some running requests are outside the cohort
            for r in running:
                if r.sync < 0:
                    if r.decoding:
                        self.cohort_join(r)
                    else:
                        items.append([r, r.prompt + r.generated - r.computed, 0])
        tokens = self.cohort_n
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
                self.cohort_leave(r)
        blocks = self.cohort_crossings(self.decode_clock)
        for it in items:
            r, k, _ = it
            it[2] = nb = -(-(r.computed + k) // bs) - r.blocks
            blocks += nb
        if blocks > cache.free:
            for r in skipped:
                self.cohort_join(r)
            return None
        cache.free -= blocks
        plan = Plan()
        plan.cohort = True
        plan.rejoin = skipped
        for r, k, nb in items:
            r.blocks += nb
            plan.add(r, k)
        return plan

    def settle_sitters(self, plan: Plan, members_run: list, members_sit: list, kept: bool) -> None:
        """Decode-cohort members a ranked batch leaves out
        (`members_sit`) leave the cohort for this step, or, when most sit out, the cohort stands
        still and the members that run (`members_run`: (items position, request, tokens)) take
        their token as items.

        With a kept rank order (`kept`: a `RankTracker`) the sitters stay out (parked) until a walk
        reaches them, and members that run alone stay members (`_serve`)."""
        if len(members_sit) <= len(members_run):
            for r in members_sit:                   # they leave for this step and rejoin after it
                self.cohort_leave(r)
            if kept:
                plan.parked = len(self.running) - self.cohort_n - len(plan.items)
            else:
                plan.rejoin = members_sit
        else:
            # most members sit out (a long prefill took the budget): the cohort stands still
            # this step, and the few members that run take their token as items instead
            items = plan.items
            for pos, r, k in reversed(members_run):
                if kept:
                    self.sync(r)
                else:
                    self.cohort_leave(r)
                items.insert(pos, (r, k))
            plan.cohort = False
            if kept:
                plan.parked = len(self.running) - self.cohort_n - sum(1 for r, _ in items if r.sync < 0)

    # ----------------------------------------------------------------- the loop's extension points
    def _preempted_only(self) -> None:
        if self.bulk:
            self.rebuild_cohort()

    def _skip_ahead(self, plan) -> bool:
        if ((self.cohort_n + plan.parked == len(self.running) if plan.cohort
             else len(plan.items) == len(self.running))
                and self._stable(plan)):
            return self._fast_forward(plan)
        return False

    def _stable(self, plan) -> bool:
        """`BoundPolicy.stable`; and keys that climb as they are served (`served_key_step` > 0) of
        a preemptive order: only the kept rank order bounds a run."""
        order = self.sched.order
        if (self.rank_order is None and (order.served_key_step or 0) > 0 and order.preemptive and len(order)
                and not plan.admitted and not plan.preempted):
            return False
        return self.sched.stable(plan)

    def _serve(self, plan) -> tuple[list, int, int, list, list]:
        """`Simulator._serve` with the cohort: a bulk step counts the members as a whole; a step
        where the cohort stands still serves the members among its items alone."""
        bulk = plan.cohort
        alone = not bulk and self.bulk      # the cohort stands still: its members among the items run alone
        if not bulk and not alone:
            return Simulator._serve(self, plan)
        chunks = []
        n_dec = 0
        kv = 0
        if bulk:
            n_dec = self.cohort_n
            kv = self.cohort_pval + n_dec * (self.decode_clock + 1)
        finished = []
        emitted = plan.emitted = []
        joined = self._joined = []
        firsts = []
        if alone:
            bs = self.cache.block_size
            buckets = self.cohort_buckets
            moved = 0
            outside = self._outside = []    # the items outside the cohort
        for req, k in plan.items:
            c = req.computed
            if alone and req.sync >= 0:
                # a member served alone (decoding, synced when planned: `serve_alone`) emits its
                # token, and its cohort offset, block bucket and done clock move with it
                n_dec += 1
                kv += c + 1
                c += k
                req.computed = c
                emitted.append(req)
                g = req.generated + 1
                req.generated = g
                if g >= req.output:
                    finished.append(req)
                pv = c - req.sync
                p0 = req.pval
                moved += pv - p0
                buckets[p0 % bs] -= 1
                buckets[pv % bs] += 1
                req.pval = pv
                req.done_clock = d = req.sync + (req.output - g)
                if not 0 <= req.heap_at <= d:
                    self._alone_entry(req, d)
                continue
            if alone:
                outside.append(req)
            if req.decoding:
                n_dec += 1
                kv += c + 1
            else:
                chunks.append(plan.chunk_shape(req, k))
            c += k
            req.computed = c
            if c >= req.prompt + req.generated:
                emitted.append(req)
                g = req.generated + 1
                req.generated = g
                if g == 1:
                    firsts.append(req)
                if g >= req.output:
                    finished.append(req)
                elif not req.decoding:
                    req.decoding = True
                    joined.append(req)
        if alone:
            self._moved = moved
        return chunks, n_dec, kv, finished, firsts

    def _served(self, plan, finished: list) -> None:
        """A bulk step moves the cohort's clock and takes in who caught up; a step that served
        members alone moves their summed offsets and takes in (or rebuilds from) the rest."""
        if plan.cohort:
            self.decode_clock += 1
            self._pop_cohort_done(finished)
            for req in self._joined:
                self.cohort_join(req)
            for req in plan.rejoin:
                self.cohort_join(req)
        elif self.bulk:
            self.cohort_pval += self._moved
            if plan.parked:             # requests parked out of the cohort stay out
                for req in self._outside:
                    if req.decoding and req.generated < req.output:
                        self.cohort_join(req)
            else:
                self.rebuild_cohort()
        if self.rank_order is not None:
            self.rank_order.served(plan)    # the requests served move (before the policy's `after_step`)

    # ----------------------------------------------------------------- fast-forward
    def _time_steps(self, n: int, kv: np.ndarray):
        """Start and end times of consecutive decode-only steps with KV reads `kv` (sequential sums)."""
        k = kv.shape[0]
        acc = np.empty(k + 1)
        acc[0] = self.now
        acc[1:] = self.latency.decode_times(n, kv)
        ends = np.add.accumulate(acc)[1:]
        starts = np.empty(k)
        starts[0] = self.now
        starts[1:] = ends[:-1]
        return starts, ends

    def _limit_time(self, t_pol) -> float:
        """When the next time-driven decision is due: the next arrival, the horizon or a policy time."""
        limit = self.horizon
        if self._next_arrival < len(self.requests):
            limit = min(limit, self.requests[self._next_arrival].arrival)
        if t_pol is not None:
            limit = min(limit, t_pol)
        return limit

    def _time_cap(self, limit_t: float, n: int, kv0: int) -> int | None:
        """Generous bound on how many decode steps start before `limit_t`, to size the arrays.

        Decode steps lengthen as contexts grow, so the first step's duration bounds the count
        (with a margin, as the latency model need not be monotone). Only sizes the work: a
        fast-forward cut short by it is taken up again by the engine's next pass, with the
        same floating-point sums, so results never depend on it.
        """
        if limit_t == math.inf:
            return None
        dt0 = self.latency.iteration_time((), n, kv0)
        if dt0 <= 0.0:
            return None
        return int((limit_t - self.now) / dt0 * 1.25) + 2

    def _time_limit(self, starts: np.ndarray, k: int, limit_t: float) -> int:
        """Cut k so that no step starts at or after `limit_t` (see `_limit_time`)."""
        if limit_t < math.inf:
            j = int(np.searchsorted(starts, limit_t, side="left"))
            k = min(k, max(j, 1))
        return k

    def _too_close(self, limit_t: float) -> bool:
        """Cheap pre-check: is the next time-driven decision due within about one step?

        Only decides whether a fast-forward is worth attempting; results never depend on it.
        """
        return limit_t - self.now < 1.5 * self._last_dt

    def _fast_forward(self, plan) -> bool:
        """Run K identical decode-only steps at once; False if fewer than 2 are possible."""
        if plan.cohort:
            return self._fast_forward_cohort(plan)
        k_pol, t_pol = self._next_decision(plan)
        limit_t = self._limit_time(t_pol)
        if self._too_close(limit_t):
            return False
        running = self.running
        B = len(running)
        comp_sum = 0
        k_max = None                                 # the step that completes the first request(s)
        for r in running:
            comp_sum += r.computed
            rem = r.output - r.generated
            if k_max is None or rem < k_max:
                k_max = rem
        if k_pol is not None:
            k_max = min(k_max, k_pol)
        cap = self._time_cap(limit_t, B, comp_sum + B)
        if cap is not None:
            k_max = min(k_max, cap)
        if k_max < 2:
            return False
        # KV: step j computes token position comp_i + j and needs ceil((comp_i + j + 1)/bs) blocks;
        # no request takes more than one block per bs steps, so a pool that holds that many can't run short
        bs = self.cache.block_size
        if plan.allocates_decode_blocks and self.cache.free < B * -(-k_max // bs):
            comp = np.fromiter((r.computed for r in running), dtype=np.int64, count=B)
            held = np.fromiter((r.blocks for r in running), dtype=np.int64, count=B)
            first_need = held * bs - comp            # step index at which request i needs a new block
            k_max = min(k_max, _first_shortfall(first_need, bs, self.cache.free, k_max))
            if k_max < 2:
                return False
        if k_max <= _SCALAR_STEPS:
            starts, ends = self._step_times(B, comp_sum + B, k_max, limit_t)
            k = len(starts)
        else:
            starts, ends = self._time_steps(B, comp_sum + B + B * np.arange(k_max, dtype=np.int64))
            k = self._time_limit(starts, k_max, limit_t)
        k = self.sched.refine_fast_forward(plan, starts[:k], ends[:k], k)
        if k < 2:
            return False
        end = float(ends[k - 1])
        start = self.now
        finished = []
        for r in running:
            r.computed += k
            r.generated += k
            if r.generated >= r.output:
                finished.append(r)
        if plan.allocates_decode_blocks:
            bs = self.cache.block_size
            for r in running:
                need = -(-r.computed // bs)
                if need > r.blocks:
                    self.cache.free -= need - r.blocks
                    r.blocks = need
        self.iterations += k
        self.steps_fast_forwarded += k
        self._after_fast_forward(plan, starts[:k], ends[:k], k)
        if self.observer is not None:
            batch = [(r.idx, 1) for r in running]
        for r in finished:
            self._finish(r, end)
        self.now = end
        if self.observer is not None:
            self.observer(StepRecord(start, end, k, B, B, self.cache.used, batch, ends[:k].tolist()))
        return True

    def _step_times(self, n: int, kv0: int, k_max: int, limit_t: float):
        """`_time_steps` + `_time_limit` for a few steps in plain floats (numpy's per-call cost
        dominates short runs); the same sums in the same order, so the same bits."""
        starts, ends = self.latency.decode_steps(n, kv0, self.now, k_max, limit_t)
        return np.array(starts), np.array(ends)

    def _fast_forward_cohort(self, plan) -> bool:
        """Fast-forward when every running request is a cohort member: O(k) numpy, no per-request work."""
        n = self.cohort_n
        d0 = self.decode_clock
        # the engine's own limits first: the policy's (the costlier to find) only if they leave a run
        k_max = self._cohort_next_done() - d0
        if k_max < 2:
            return False
        limit_t = self._limit_time(None)
        if self._too_close(limit_t):
            return False
        k_pol, t_pol = self._next_decision(plan)
        if t_pol is not None and t_pol < limit_t:
            limit_t = t_pol
            if self._too_close(limit_t):
                return False
        if k_pol is not None:
            k_max = min(k_max, k_pol)
        cap = self._time_cap(limit_t, n, self.cohort_pval + n * (d0 + 1))
        if cap is not None:
            k_max = min(k_max, cap)
        if k_max < 2:
            return False
        bs = self.cache.block_size
        cum = None
        alloc = plan.allocates_decode_blocks
        if alloc and self.cache.free < n * -(-(k_max - 1) // bs):
            # the cache may run short: new blocks needed by steps 1..k_max-1 (step 0 was
            # allocated when it was planned)
            clocks = d0 + np.arange(1, k_max, dtype=np.int64)
            cum = np.cumsum(np.asarray(self.cohort_buckets, dtype=np.int64)[(-clocks) % bs])
            over = np.searchsorted(cum, self.cache.free, side="right")   # first j-1 with cum > free
            k_max = min(k_max, int(over) + 1)
            if k_max < 2:
                return False
        kv0 = self.cohort_pval + n * (d0 + 1)
        if k_max <= _SCALAR_STEPS:
            starts, ends = self._step_times(n, kv0, k_max, limit_t)
            k = len(starts)
        else:
            starts, ends = self._time_steps(n, kv0 + n * np.arange(k_max, dtype=np.int64))
            k = self._time_limit(starts, k_max, limit_t)
        k = self.sched.refine_fast_forward(plan, starts[:k], ends[:k], k)
        if k < 2:
            return False
        start = self.now
        end = float(ends[k - 1])
        if cum is not None:
            self.cache.free -= int(cum[k - 2])
        elif alloc:
            self.cache.free -= self._cohort_new_blocks(d0, k)
        if self.observer is not None:       # the members (parked requests sit these steps out)
            batch = [(r.idx, 1) for r in self.running if r.sync >= 0]
        self.decode_clock = d0 + k
        self.iterations += k
        self.steps_fast_forwarded += k
        finished: list = []
        self._pop_cohort_done(finished)
        self._after_fast_forward(plan, starts[:k], ends[:k], k)
        for r in finished:
            self._finish(r, end)
        self.now = end
        if self.observer is not None:
            self.observer(StepRecord(start, end, k, n, n, self.cache.used, batch, ends[:k].tolist()))
        return True


def _first_shortfall(first_need: np.ndarray, bs: int, free: int, k_max: int) -> int:
    """Number of decode steps that can run before some step needs more new blocks than are free.

    Request i needs a new block at steps first_need_i, first_need_i + bs, ...; a step can run
    only if the blocks needed by all steps up to and including it fit in `free`.
    """
    def needed_through(j: int) -> int:
        d = j - first_need
        return int(np.maximum(d // bs + 1, 0).sum())
    if needed_through(k_max - 1) <= free:
        return k_max
    lo, hi = 0, k_max - 1          # needed_through(hi) > free; find the first such step index
    if needed_through(0) > free:
        return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if needed_through(mid) > free:
            hi = mid
        else:
            lo = mid
    return hi
