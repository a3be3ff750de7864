"""The parts a scheduling policy is composed of, and the interfaces between them.

A policy is a short declaration (`schedport.engine.policies.schedulers.Policy`):

* a **batching mode** — how an iteration's batch is formed (`BatchingMode`; the four modes,
  `Continuous`, `StallFree`, `Selective` and `Static`, are in `schedport.engine.policies.batching`);
* an **ordering** — which waiting (and, if preemptive, which running) request goes first: an
  `Ordering`, a key and how it moves (`FIXED`, `PerServedToken`, `WITH_TIME`); the engine keeps
  the requests in the queue those dynamics allow (`schedport.engine.policies.queues`). FCFS and the
  policies with state beyond a key (VTC, ltr's guard, FastServe's MLFQ) are engine queues;
* an optional **admission gate** — requests it refuses are rejected (`schedport.engine.policies.gates`).

Each part is a small class; `Policy.bind(sim)` instantiates them for one simulation. The engine
calls the bound policy (`schedport.engine.policies.schedulers.BoundPolicy`) through a narrow interface:
`plan`, the queue hooks, and the fast-forward hooks that say when the next decision is due.
"""

from __future__ import annotations

import math

import numpy as np

from schedport.engine.core.simulator import Request
from schedport.errors import ConfigError

# ============================================================================ plans


class Plan:
    """One iteration's batch: (request, tokens) pairs plus what happened while forming it."""

    __slots__ = ("items", "admitted", "preempted", "decode_only", "allocates_decode_blocks", "pad",
                 "emitted", "cohort", "rejoin", "host_full", "parked", "ranked")

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
        self.ranked = False     # True: `items` are in the ordering's rank order

    def add(self, req: Request, k: int) -> None:
        self.items.append((req, k))
        if not req.decoding:
            self.decode_only = False

    def chunk_shape(self, req: Request, k: int) -> tuple[int, int]:
        """(chunk tokens, tokens already cached) of a prefill chunk, as the latency model wants it."""
        if self.pad:
            return (self.pad, 0)
        return (k, req.computed)


# ============================================================================ orderings: the policy's ranking


class Fixed:
    """A request's key never changes while it lives (sjf, spf, edf, ltr's scores)."""

    def __repr__(self) -> str:
        return "FIXED"


class PerServedToken:
    """A request's leading key moves by `step` for every output token it is given (a decode, or
    the token that ends a prefill), and only then
    (srpt: remaining tokens, step -1; least attained service: tokens generated, step +1)."""

    def __init__(self, step: int):
        if not isinstance(step, int) or isinstance(step, bool):
            raise TypeError(f"PerServedToken step must be an integer, got {step!r}")
        self.step = step

    def __repr__(self) -> str:
        return f"PerServedToken({self.step})"


class WithTime:
    """Keys move with the clock (response ratio, aging): the engine ranks afresh at every
    decision and fast-forwards only while no waiting request could start in any order."""

    def __repr__(self) -> str:
        return "WITH_TIME"


FIXED = Fixed()
WITH_TIME = WithTime()


class Ordering:
    """A scheduling policy's ranking: the whole of what a policy author writes.

    * `key(req, now)` — the request's rank, smallest first: a tuple ending in a unique tiebreak
      (``(..., req.arrival, req.idx)``). It is asked only of exact requests: a waiting one, or a
      running one once its counts (`generated`, `computed`) are true.
    * `dynamics` — how keys move: `FIXED`, `PerServedToken(step)` or `WITH_TIME`. The engine keeps
      its queues, its rank order between steps and its fast-forwards by this declaration, so it
      must be true: a key that moves otherwise is a wrong result, not a slow one.
    * `preemptive` — rank running and waiting requests together at every step (vllm-ltr's ranked
      fill): a running request outranked when the batch is full sits out, and when blocks run
      short the worst-ranked is preempted.
    * `victim` — for a non-preemptive order, whom memory pressure preempts: ``"worst"`` (the
      largest key, vLLM v1's priority policy) or ``"newest"`` (the last admitted, vLLM's FCFS).
    * `on_admit(req, now)`, `on_finish(req, now)` — optional hooks at a request's admission and
      completion, for policies that keep statistics.

    `__init__(sim, params)` gets the simulation (its trace, config and latency model, for keys
    computed ahead: deadlines, predicted scores) and the policy's parameters. docs/schedulers.md,
    "Write your own policy", walks through one.
    """

    preemptive = False
    dynamics = FIXED
    victim = "worst"

    def __init__(self, sim, params: dict):
        self.sim = sim
        self.params = params

    @property
    def rng(self) -> np.random.Generator:
        """This run's random generator, for a policy that draws: seeded from the run's seed
        (`sim.seed`, ``--seed``) alone, made at first use and kept for the run, so the same seed
        gives the same draws in every process and a new seed new ones."""
        rng = self.__dict__.get("_rng")
        if rng is None:
            rng = self.__dict__["_rng"] = np.random.Generator(np.random.PCG64([int(self.sim.seed), 0x5E1F]))
        return rng

    def key(self, req: Request, now: float) -> tuple:
        raise NotImplementedError(f"{type(self).__name__} must define key(req, now)")

    def on_admit(self, req: Request, now: float) -> None:
        """Called when `req` starts (or resumes) running."""

    def on_finish(self, req: Request, now: float) -> None:
        """Called when `req` emitted its last token."""


# ============================================================================ batching modes


class BatchingMode:
    """How an iteration's batch is formed; subclasses implement `plan`."""

    default_budget = 2048
    default_watermark = 0.0
    allocates_decode_blocks = True
    reserve_full = False    # a waiting request starts only when its whole known prompt's blocks are free

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

    def host_gated(self) -> bool:
        """Is the host gate closed this step (less than `host_gate` of the host swap space free)?"""
        sim = self.sim
        return bool(self.host_gate and sim.host_blocks
                    and sim.host_blocks - sim.host_used < self.host_gate * sim.host_blocks)

    def never_fits(self, req: Request) -> str:
        """Why `req` can never be served in this mode ('' if it can)."""
        c = self.sim.cache
        need = c.blocks_for(req.prompt + req.output)
        if need > c.num_blocks:
            return f"needs {need} KV blocks, the cache holds {c.num_blocks}"
        return ""

    def on_finish(self, req: Request, t: float) -> None:
        """`req` emitted its last token at `t` (a mode that delivers tokens late says so here)."""

    def planned_tokens(self, plan: Plan) -> int:
        """Tokens the plan computes this step (`Simulator.plan_tokens`)."""
        return self.sim.plan_tokens(plan)

    def any_admissible(self, sched, plan: Plan) -> bool:
        """Could some waiting request be admitted now, in any order? (for dynamic orderings)"""
        sim = self.sim
        if len(sim.running) >= self.max_num_seqs:
            return False
        left = self.budget - self.planned_tokens(plan)
        if left <= 0:
            return False
        m = min(r.num_tokens for r in sched.order)
        if not (self.reserve_full and not sched.order.preemptive):
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
