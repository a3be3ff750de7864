"""A discrete-event simulator of one vLLM-like serving replica.

The engine owns time, the paged KV cache and the request lifecycle; a policy
(`schedport.engine.policies.policy`) owns the decisions. Each iteration ("step") the policy's
batching mode forms a batch from the running and waiting requests within a token
budget, the running-sequence cap and the free KV blocks, preempting (by recompute, or by
swap for policies whose reference swaps) when blocks run out; the latency model prices the
step; tokens are emitted at the step's end. Semantics follow vLLM (see docs/engine.md and
../shared/docs/schedulers.md §0):

* KV blocks are allocated as tokens are computed (``ceil(tokens / block_size)`` per request);
  policies that reserve (Orca, static batching) allocate their reservation at admission.
* The step that completes a request's prefill emits its first token; each later step that
  schedules it emits one more. A preempted request loses its KV and later recomputes
  prompt + generated tokens as a prefill; no token is emitted twice.
* A request that can never fit (prompt + output > max_model_len, or more blocks than the
  cache can ever give it) is rejected at arrival, never left waiting forever.

This is the exact engine, the oracle: it steps every iteration, request by request. The fast
mode (`schedport.engine.fast.simulator`), the default, gives bit-identical per-request results
with a decode cohort and fast-forwards through runs of identical decode-only steps; it extends
this loop at its extension points (`_skip_ahead`, `_serve`, `_served`, the request class and the
events a request leaves the running set by) and plans through its own planner. Neither this loop
nor the policies know of the cohort.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from schedport.engine.core.config import EngineConfig
from schedport.errors import SchedportError
from schedport.engine.core.latency import LatencyModel
from schedport.workload.trace import Trace

WAITING, RUNNING, DONE = 0, 1, 2


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
        "reject_reason", "key", "aux", "swapped", "recomputed",
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
        self.swapped = 0          # KV blocks held in host memory while swapped out
        self.recomputed = 0       # tokens whose KV preemptions dropped (to be computed again)

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
    recomputed: np.ndarray | None = None     # per request: tokens preemptions made it compute again
    cached_tokens: np.ndarray | None = None  # per request: prompt tokens its first admission found cached


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


class Simulator:
    """Runs one trace through one policy on one engine configuration, one step at a time (the oracle).

    The policy's runtime object is created with `policy.bind(self)` and is called for every
    decision; the simulator only advances time, moves requests between queues and keeps the
    books (see `run`). The fast mode (`schedport.engine.fast.simulator.FastSimulator`) extends it
    at the points of the loop marked as such.
    """

    exact = True            # steps every iteration request by request (the fast mode sets False)
    caching = False         # automatic prefix caching (`schedport.engine.core.caching` sets True)
    request_class = Request     # the requests' class (the fast mode's carries its own fields)

    def __init__(self, trace: Trace, policy, config: EngineConfig, latency: LatencyModel, *,
                 seed: int = 0, horizon_s: float | None = None,
                 observer: Callable[[StepRecord], None] | None = None,
                 progress: Callable[[float, int, int], None] | None = None):
        self.trace = trace
        self.progress = progress
        self.config = config
        self.latency = latency
        self.seed = seed
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
            self.requests = list(map(self.request_class, range(len(arr)), arr, ins, outs, cl))
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
        self._last_dt = 0.0
        self.sched = policy.bind(self)

    def release(self) -> None:
        """Let go of the bound policy and the requests once the run's results are read.

        The policy's parts point back at the simulator (and some at each other), so without this a
        finished run's objects (a thousand requests and what they hold) are freed only by the
        cyclic collector, whose passes over them cost about a twentieth of a sweep; with it they
        are freed at once, and what a policy's own cycles keep is a few objects.
        """
        self.sched = None
        self.requests = []
        self.running = []

    # ----------------------------------------------------------------- what a plan does
    def plan_tokens(self, plan) -> int:
        """Tokens `plan` computes this step."""
        return sum(k for _, k in plan.items)

    def runs_nothing(self, plan) -> bool:
        """Does `plan` run no request this step?"""
        return not plan.items

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

    def set_aside_null_block(self) -> None:
        """Take one block out of the pool for good: vLLM v1's null block (`BlockPool.__init__`)."""
        self.cache.num_blocks -= 1
        self.cache.free -= 1

    def lookup(self, req: Request) -> tuple | list:
        """The cached blocks a waiting request would start from (its longest cached prefix); none
        without prefix caching. Looking touches nothing: `allocate` adopts them."""
        return ()

    def blocks_to_allocate(self, req: Request, tokens: int, hit=()) -> int:
        """Free blocks `req` needs to hold `tokens` tokens, starting from the cached blocks `hit`."""
        return -(-tokens // self.cache.block_size) - req.blocks

    def allocate(self, req: Request, blocks: int, tokens: int = 0, hit=()) -> None:
        """Give `blocks` more KV blocks to `req` (caller checked they are free, with
        `blocks_to_allocate`). With prefix caching, `req` first adopts the cached blocks `hit` (its
        computed tokens jump over them) and its full blocks among its first `tokens` tokens (those
        scheduled so far) become hits for others; a plain engine has no use for either."""
        self.cache.free -= blocks
        req.blocks += blocks

    def free_blocks(self, req: Request) -> None:
        """Give back every KV block `req` holds (it finished, or is preempted)."""
        self.cache.free += req.blocks
        req.blocks = 0

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
        if swap and self.host_used + req.blocks <= self.host_blocks and req.blocks:
            n = req.blocks
            self.free_blocks(req)
            self.host_used += n
            self.swap_bytes_pending += n * self.block_bytes
            self.swapped_blocks_total += n
            req.swapped = n
            req.preemptions += 1
            self.preemptions_total += 1
            self.running.remove(req)
            req.phase = WAITING
            self.sched.requeue_preempted(req, self.now)
            return
        self.free_blocks(req)
        self.recomputed_tokens += req.computed
        req.recomputed += req.computed
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
            if not plan.items and self.runs_nothing(plan):
                if plan.preempted:
                    self._preempted_only()
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
            if plan.decode_only and self._skip_ahead(plan):
                continue
            self._execute(plan)
        return self._output()

    def _preempted_only(self) -> None:
        """A plan preempted requests and ran nothing: the fast mode rebuilds its cohort here."""

    def _skip_ahead(self, plan) -> bool:
        """Run a stretch of identical decode-only steps at once, if the fast mode can (never here)."""
        return False

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
        chunks, n_dec, kv, finished, firsts = self._serve(plan)
        if self.observer is not None:
            # the whole batch in running order (vLLM's order: running requests, then admissions)
            batch = self._observed_batch(plan)
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
        self._served(plan, finished)
        self.iterations += 1
        self.sched.after_step(plan, start, end)
        for req in finished:
            self._finish(req, end)
        self.now = end
        if self.observer is not None:
            self.observer(StepRecord(start, end, 1, sum(k for _, k in batch), len(self.running) + len(finished),
                                     self.cache.used, batch, [end]))

    def _observed_batch(self, plan) -> list:
        """The whole batch in running order, [(request idx, tokens)], for the observer."""
        ks = {r.idx: k for r, k in plan.items}
        return [(r.idx, ks[r.idx]) for r in self.running if r.idx in ks]

    def _serve(self, plan) -> tuple[list, int, int, list, list]:
        """Advance each planned request by its tokens: the step's shape (prefill chunks, decodes and
        the KV they read, counted before) and what it emits (first tokens, finished requests)."""
        chunks = []
        n_dec = 0
        kv = 0
        finished = []
        emitted = plan.emitted = []
        firsts = []
        for req, k in plan.items:
            c = req.computed
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
        return chunks, n_dec, kv, finished, firsts

    def _served(self, plan, finished: list) -> None:
        """The step's tokens are out (first tokens stamped): the fast mode moves its cohort here."""

    def _finish(self, req: Request, t: float) -> None:
        req.finish = t
        req.phase = DONE
        req.status = "completed"
        self.free_blocks(req)
        self.running.remove(req)
        self.sched.on_finish(req, t)

    # ----------------------------------------------------------------- results
    def _output(self) -> SimOutput:
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
            recomputed=np.array([r.recomputed for r in self.requests], dtype=np.int64),
            cached_tokens=self._cached_tokens(),
        )

    def _cached_tokens(self) -> np.ndarray:
        """Per request, the prompt tokens found cached at its first admission (none here)."""
        return np.zeros(len(self.requests), dtype=np.int64)


def _no_progress(now: float, why: str) -> SchedportError:
    """The one-line error of a simulation that would otherwise spin without advancing."""
    return SchedportError(f"the simulation makes no progress at t={now!r} s: {why}; the trace's arrivals "
                          f"or the engine's step times are not finite numbers")
