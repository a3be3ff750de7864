"""A discrete-event simulator of one vLLM-like serving replica.

The engine owns time, the paged KV cache and the request lifecycle; a policy
(`schedport.engine.policy`) owns the decisions. Each iteration ("step") the policy's
batching mode forms a batch from the running and waiting requests within a token
budget, the running-sequence cap and the free KV blocks, preempting (by recompute, or by
swap for policies whose reference swaps) when blocks run out; the latency model prices the
step; tokens are emitted at the step's end. Semantics follow vLLM (see docs/engine.md and ../shared/docs/schedulers.md §0):

* KV blocks are allocated as tokens are computed (``ceil(tokens / block_size)`` per request);
  policies that reserve (Orca, static batching) allocate their reservation at admission.
* The step that completes a request's prefill emits its first token; each later step that
  schedules it emits one more. A preempted request loses its KV and later recomputes
  prompt + generated tokens as a prefill; no token is emitted twice.
* A request that can never fit (prompt + output > max_model_len, or more blocks than the
  cache can ever give it) is rejected at arrival, never left waiting forever.

Two execution modes give bit-identical per-request results. ``exact=True`` steps every
iteration, request by request (the oracle). The default does two things. It keeps the running
requests that decode one token per step in a *decode cohort* advanced by a clock bump rather
than one by one (their counts are made true on demand, `sync`). And it fast-forwards through
runs of identical decode-only steps: when the
batch is "every running request decodes one token" and nothing can be admitted, the engine
computes how many such steps happen before the next decision point (an arrival, a completion,
a KV block shortfall, the horizon, or a point the policy declares such as a quantum expiry or
a starvation promotion) and prices them all at once with the latency model's vectorised
decode path. Policies whose order can change at any moment are only fast-forwarded when no
waiting request could be admitted whatever the order.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from schedport.engine.cohort import DecodeCohort
from schedport.engine.config import EngineConfig
from schedport.errors import SchedportError
from schedport.engine.latency import LatencyModel
from schedport.workload.trace import Trace

WAITING, RUNNING, DONE = 0, 1, 2
_SCALAR_STEPS = 24      # fast-forwards of up to this many steps are timed with Python floats


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for the block, back on after it if it was on.

    A run allocates many long-lived objects (its requests, their queue entries) and few cycles;
    each collector pass that the allocations trigger walks every object still young, which cost
    about 5% of a sweep's time. Cyclic garbage made meanwhile waits for the block's end: the
    engine's own steps make none, and a policy of one's own that makes cycles at every step
    holds their memory until its run ends.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Request:
    """One request's mutable simulation state (vLLM's `Request`, reduced to what scheduling needs)."""

    __slots__ = (
        "idx", "arrival", "prompt", "output", "client", "generated", "computed", "blocks",
        "phase", "decoding", "first_token", "finish", "preemptions", "admit_seq", "status",
        "reject_reason", "key", "aux", "sync", "pval", "done_clock", "heap_at", "swapped",
    )

    def __init__(self, idx: int, arrival: float, prompt: int, output: int, client: str | None):
        self.idx = idx
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.client = client
        self.generated = 0        # output tokens emitted so far
        self.computed = 0         # tokens whose KV is in the cache
        self.blocks = 0           # KV blocks held
        self.phase = WAITING
        self.decoding = False     # True once its (re)prefill has caught up: next step is a 1-token decode
        self.first_token = math.nan
        self.finish = math.nan
        self.preemptions = 0
        self.admit_seq = -1       # admission counter value at its latest admission
        self.status = ""
        self.reject_reason = ""
        self.key = None           # policy-maintained sort key
        self.aux = None           # policy-private state
        self.sync = -1            # decode-cohort clock at which computed/generated were last true (-1: not in cohort)
        self.pval = 0             # computed - sync while in the cohort (invariant under syncing)
        self.done_clock = -1      # cohort clock at which it emits its last token
        self.heap_at = -1         # clock of its earliest entry in the cohort's done heap (-1: none kept)
        self.swapped = 0          # KV blocks held in host memory while swapped out

    @property
    def num_tokens(self) -> int:
        """Tokens known for this request: prompt plus everything generated so far."""
        return self.prompt + self.generated

    @property
    def remaining(self) -> int:
        """Output tokens still to be emitted."""
        return self.output - self.generated

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Request({self.idx}, t={self.arrival:.3f}, in={self.prompt}, out={self.output}, "
                f"gen={self.generated}, comp={self.computed}, blocks={self.blocks})")


@dataclass
class StepRecord:
    """What one executed step (or a fast-forwarded run of identical steps) did; for observers/tests."""

    start: float
    end: float
    steps: int
    tokens: int                 # tokens computed per step (max over the run)
    running: int                # running requests during the step
    blocks_used: int            # KV blocks in use at the end of the run
    scheduled: list = field(default_factory=list)  # [(request idx, tokens)] of each step, in running order
    ends: list = field(default_factory=list)       # end time of each step of the run


@dataclass
class SimOutput:
    """Per-request outcome arrays plus engine counters of one simulation."""

    status: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    preemptions: np.ndarray
    reject_reason: list[str]
    iterations: int
    preemptions_total: int
    recomputed_tokens: int
    swapped_blocks: int
    steps_fast_forwarded: int
    events: int
    host_full_events: int = 0     # runs of steps in which the host swap space could not take a swap-out
    stall_recomputes: int = 0     # recomputes that broke a stall the full host left (swapping policies)


class KVCache:
    """The paged KV block pool: a count of free blocks (block identity does not matter here)."""

    __slots__ = ("num_blocks", "free", "block_size")

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.free = num_blocks
        self.block_size = block_size

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold `tokens` tokens."""
        return -(-tokens // self.block_size)

    @property
    def used(self) -> int:
        return self.num_blocks - self.free


class Simulator(DecodeCohort):
    """Runs one trace through one policy on one engine configuration.

    The policy's runtime object is created with `policy.bind(self)` and is called for every
    decision; the simulator only advances time, moves requests between queues and keeps the
    books (see `run`).
    """

    def __init__(self, trace: Trace, policy, config: EngineConfig, latency: LatencyModel, *,
                 seed: int = 0, exact: bool = False, horizon_s: float | None = None,
                 observer: Callable[[StepRecord], None] | None = None,
                 progress: Callable[[float, int, int], None] | None = None):
        self.trace = trace
        self.progress = progress
        self.config = config
        self.latency = latency
        self.seed = seed
        self.exact = exact
        self.horizon = math.inf if horizon_s is None else float(horizon_s)
        self.observer = observer
        self.cache = KVCache(config.num_gpu_blocks, config.block_size)
        self.max_num_seqs = config.max_num_seqs
        self.max_model_len = config.max_model_len
        clients = trace.client_id
        arr = trace.arrival_s.tolist()
        ins = trace.input_tokens.tolist()
        outs = trace.output_tokens.tolist()
        cl = clients.tolist() if clients is not None else [None] * len(arr)
        with collector_paused():
            self.requests = list(map(Request, range(len(arr)), arr, ins, outs, cl))
        self.running: list[Request] = []
        self.now = 0.0
        self.iterations = 0
        self.preemptions_total = 0
        self.recomputed_tokens = 0
        self.steps_fast_forwarded = 0
        self.events = 0
        self._admit_counter = 0
        self._next_arrival = 0
        # swap preemption (policies that use it set host_blocks via their parameters)
        self.block_bytes = config.block_bytes
        self.host_blocks = 0
        self.host_used = 0
        self.pcie_bytes_per_s = config.pcie_gb_s * 1e9
        self.swap_overlap = False
        self.swap_bytes_pending = 0
        self.swapped_blocks_total = 0
        self.host_full_events = 0
        self.host_full_prev = False
        self.stall_recomputes = 0
        self.sched = policy.bind(self)
        # The decode cohort (fast mode only): running requests that decode one token per step are
        # advanced together by bumping `dclock` instead of touching each one; a member's true
        # computed/generated counts are its fields plus (dclock - sync). `sync_all` makes every
        # field true before any per-request decision.
        self.bulk = (not exact) and self.sched.supports_bulk()
        self.dclock = 0
        self.cohort_n = 0
        self.cohort_pval = 0      # sum of members' pval
        self.cohort_buckets = [0] * config.block_size   # members by pval mod block_size
        self.cohort_heap: list = []     # (clock, idx, req): each member's done clock or a bound below it
        self._alloc_decode = self.sched.mode.allocates_decode_blocks
        self._last_dt = 0.0
        self._cohort_hook = self.sched.cohort_changed

    def release(self) -> None:
        """Let go of the bound policy and the requests once the run's results are read.

        The policy's parts point back at the simulator (and some at each other), so without this a
        finished run's objects (a thousand requests and what they hold) are freed only by the
        cyclic collector, whose passes over them cost about a twentieth of a sweep; with it they
        are freed at once, and what a policy's own cycles keep is a few objects.
        """
        self.sched = None
        self._cohort_hook = None
        self.requests = []
        self.running = []
        self.cohort_heap = []

    # ----------------------------------------------------------------- bookkeeping used by policies
    def admit(self, req: Request) -> None:
        """Move a waiting request into the running set (the policy already removed it from waiting).

        A swapped-out request's KV comes back from host memory (charged to this step).
        """
        if req.swapped:
            self.host_used -= req.swapped
            self.swap_bytes_pending += req.swapped * self.block_bytes
            self.swapped_blocks_total += req.swapped
            req.swapped = 0
        req.phase = RUNNING
        req.admit_seq = self._admit_counter
        self._admit_counter += 1
        self.running.append(req)

    def allocate(self, req: Request, blocks: int) -> None:
        """Give `blocks` more KV blocks to `req` (caller checked they are free)."""
        self.cache.free -= blocks
        req.blocks += blocks

    def swap_fits(self, req: Request) -> bool:
        """Can the host swap space take `req`'s KV blocks now?"""
        return self.host_used + req.blocks <= self.host_blocks

    def preempt(self, req: Request, swap: bool = False) -> None:
        """Preempt `req` and hand it back to waiting.

        By recompute (vLLM's default): its KV is freed and its progress reset, so resuming means
        prefilling prompt + generated tokens again. By swap (`swap=True`, when the host swap space
        has room): its KV blocks move to host memory, costing a PCIe transfer now and another
        when it resumes, and its progress is kept.
        """
        if req.sync >= 0:
            self.cohort_leave(req)
        if swap and self.host_used + req.blocks <= self.host_blocks and req.blocks:
            self.cache.free += req.blocks
            self.host_used += req.blocks
            self.swap_bytes_pending += req.blocks * self.block_bytes
            self.swapped_blocks_total += req.blocks
            req.swapped = req.blocks
            req.blocks = 0
            req.preemptions += 1
            self.preemptions_total += 1
            self.running.remove(req)
            req.phase = WAITING
            self.sched.requeue_preempted(req, self.now)
            return
        self.cache.free += req.blocks
        req.blocks = 0
        self.recomputed_tokens += req.computed
        req.computed = 0
        req.decoding = False
        req.preemptions += 1
        self.preemptions_total += 1
        self.running.remove(req)
        req.phase = WAITING
        self.sched.requeue_preempted(req, self.now)

    def reject(self, req: Request, reason: str) -> None:
        """Refuse a request: it is never served and counts as an SLO miss."""
        req.phase = DONE
        req.status = "rejected"
        req.reject_reason = reason
        self.sched.on_reject(req)

    # ----------------------------------------------------------------- main loop
    def run(self) -> SimOutput:
        """Simulate until every admitted request finishes (or the horizon cuts the run)."""
        with collector_paused():
            return self._run()

    def _run(self) -> SimOutput:
        reqs = self.requests
        n = len(reqs)
        sched = self.sched
        if n:
            self.now = reqs[0].arrival
        spin_at, spins = -1, 0
        while True:
            now = self.now
            # arrivals up to now join the waiting queue (or are rejected at the door)
            i = self._next_arrival
            while i < n and reqs[i].arrival <= now:
                self._arrive(reqs[i])
                i += 1
            self._next_arrival = i
            if now >= self.horizon:
                break
            if not self.running and not sched.has_waiting():
                if i >= n:
                    break
                if not reqs[i].arrival > now:   # NaN clock or arrivals: the jump would not advance time
                    raise _no_progress(now, f"the next arrival ({reqs[i].arrival!r} s) is not later")
                self.now = reqs[i].arrival
                continue
            plan = sched.plan(now)
            if not plan.items and not (plan.cohort and self.cohort_n):
                if plan.preempted:
                    if self.bulk:
                        self.rebuild_cohort()
                    if self.events != spin_at:
                        spin_at, spins = self.events, 0
                    spins += 1      # each such plan preempts someone: more than n in a row is a loop
                    if spins > n + 1:
                        raise _no_progress(now, f"{spins} plans in a row only preempted requests")
                    continue        # only preemptions (as vLLM can): nothing runs, plan again now
                if self.running:
                    raise RuntimeError("internal: running requests but the policy scheduled nothing")
                # nothing can start (e.g. everything waiting was just rejected); wait for an arrival
                if i < n:
                    if not reqs[i].arrival > now:
                        raise _no_progress(now, f"the next arrival ({reqs[i].arrival!r} s) is not later")
                    self.now = reqs[i].arrival
                    continue
                if sched.has_waiting():
                    raise RuntimeError("internal: requests wait on an idle engine with no arrival to come")
                break
            self.events += 1
            if self.progress is not None and not self.events & 1023:
                self.progress(now, i, n)    # (simulated time, arrived, total): reads the state, changes nothing
            if (not self.exact and plan.decode_only
                    and (self.cohort_n + plan.parked == len(self.running) if plan.cohort
                         else len(plan.items) == len(self.running))
                    and sched.stable(plan)):
                if self._fast_forward(plan):
                    continue
            self._execute(plan)
        return self._output()

    def _arrive(self, req: Request) -> None:
        total = req.prompt + req.output
        if total > self.max_model_len:
            self.reject(req, f"prompt + output = {total} tokens exceeds max_model_len {self.max_model_len}")
            return
        reason = self.sched.never_fits(req)
        if reason:
            self.reject(req, reason)
            return
        self.sched.on_arrival(req, self.now)

    # ----------------------------------------------------------------- one iteration
    def _execute(self, plan) -> None:
        """Run one iteration of the planned batch and emit its tokens at the step's end."""
        items = plan.items
        bulk = plan.cohort
        chunks = []
        n_dec = 0
        kv = 0
        if bulk:
            n_dec = self.cohort_n
            kv = self.cohort_pval + n_dec * (self.dclock + 1)
        # one pass over the items: the step's shape (read before) and its tokens (counted after);
        # first tokens are stamped once the step's end is known
        finished = []
        emitted = plan.emitted = []
        joined = []
        firsts = []
        alone = not bulk and self.bulk      # the cohort stands still: its members among the items run alone
        if alone:
            bs = self.cache.block_size
            buckets = self.cohort_buckets
            moved = 0
            outside = []                    # the items outside the cohort
        for req, k in items:
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
        if self.observer is not None:
            # the whole batch in running order (vLLM's order: running requests, then admissions)
            ks = {r.idx: k for r, k in items}
            batch = [(r.idx, ks.get(r.idx, 1)) for r in self.running if r.idx in ks or (bulk and r.sync >= 0)]
        dt = self.latency.iteration_time(chunks, n_dec, kv)
        if self.swap_bytes_pending:
            t_swap = self.swap_bytes_pending / self.pcie_bytes_per_s
            # vLLM's swap is a block copy before the step runs; FastServe's proactive offload
            # overlaps the copy with the step and costs only what it runs beyond it
            dt = max(dt, t_swap) if self.swap_overlap else dt + t_swap
            self.swap_bytes_pending = 0
        start = self.now
        end = start + dt
        self._last_dt = dt
        for req in firsts:
            req.first_token = end
        if bulk:
            self.dclock += 1
            self._pop_cohort_done(finished)
            for req in joined:
                self.cohort_join(req)
            for req in plan.rejoin:
                self.cohort_join(req)
        elif alone:
            self.cohort_pval += moved
            if plan.parked:             # requests parked out of the cohort stay out
                for req in outside:
                    if req.decoding and req.generated < req.output:
                        self.cohort_join(req)
            else:
                self.rebuild_cohort()
        self.iterations += 1
        self.sched.after_step(plan, start, end)
        for req in finished:
            self._finish(req, end)
        self.now = end
        if self.observer is not None:
            self.observer(StepRecord(start, end, 1, sum(k for _, k in batch), len(self.running) + len(finished),
                                     self.cache.used, batch, [end]))

    def _finish(self, req: Request, t: float) -> None:
        if req.sync >= 0:
            self.cohort_leave(req)
        req.finish = t
        req.phase = DONE
        req.status = "completed"
        self.cache.free += req.blocks
        req.blocks = 0
        self.running.remove(req)
        self.sched.on_finish(req, t)

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
        k_pol, t_pol = self.sched.fast_forward_limit(plan, self.now)
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
        self.sched.after_fast_forward(plan, starts[:k], ends[:k], k)
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
        d0 = self.dclock
        # the engine's own limits first: the policy's (the costlier to find) only if they leave a run
        k_max = self._cohort_next_done() - d0
        if k_max < 2:
            return False
        limit_t = self._limit_time(None)
        if self._too_close(limit_t):
            return False
        k_pol, t_pol = self.sched.fast_forward_limit(plan, self.now)
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
        self.dclock = d0 + k
        self.iterations += k
        self.steps_fast_forwarded += k
        finished: list = []
        self._pop_cohort_done(finished)
        self.sched.after_fast_forward(plan, starts[:k], ends[:k], k)
        for r in finished:
            self._finish(r, end)
        self.now = end
        if self.observer is not None:
            self.observer(StepRecord(start, end, k, n, n, self.cache.used, batch, ends[:k].tolist()))
        return True

    # ----------------------------------------------------------------- results
    def _output(self) -> SimOutput:
        self.sync_all()
        status = []
        for r in self.requests:
            if r.phase != DONE:
                r.status = "unfinished"
            status.append(r.status)
        return SimOutput(
            status=np.array(status, dtype=object),
            first_token_s=np.array([r.first_token for r in self.requests], dtype=np.float64),
            finish_s=np.array([r.finish for r in self.requests], dtype=np.float64),
            preemptions=np.array([r.preemptions for r in self.requests], dtype=np.int64),
            reject_reason=[r.reject_reason for r in self.requests],
            iterations=self.iterations,
            preemptions_total=self.preemptions_total,
            recomputed_tokens=self.recomputed_tokens,
            swapped_blocks=self.swapped_blocks_total,
            steps_fast_forwarded=self.steps_fast_forwarded,
            events=self.events,
            host_full_events=self.host_full_events,
            stall_recomputes=self.stall_recomputes,
        )


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


def _no_progress(now: float, why: str) -> SchedportError:
    """The one-line error of a simulation that would otherwise spin without advancing."""
    return SchedportError(f"the simulation makes no progress at t={now!r} s: {why}; the trace's arrivals "
                          f"or the engine's step times are not finite numbers")
