"""The 13 scheduling policies, each a short declaration over `schedport.engine.policy`'s parts.

Names are part of the CLI (`schedport schedulers` lists them). Parameters marked unverified in
../shared/docs/schedulers.md are our documented choices and can be overridden per run with a
`[scheduler.<name>]` table in the engine config. To add a policy, write one `Policy(...)`
declaration (and, if it needs a new mechanism, one small `Ordering` or gate class) and add it to
`REGISTRY`.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from functools import partial
from operator import attrgetter

import numpy as np

from schedport.engine.simulator import DONE, RUNNING, Request
from schedport.errors import ConfigError
from schedport.engine.policy import (
    Continuous, Fifo, Ordering, Policy, Selective, SortedEachStep, Static, StaticKey,
    StallFree,
)

# ============================================================================ orderings with state


class ShortestRemaining(SortedEachStep):
    """SRPT: rank all live requests by oracle remaining output tokens (ties by arrival).

    Preemptive at token granularity: the engine ranks running and waiting requests together each
    step (vllm-ltr's `srtf`). Waiting keys are fixed and running keys only shrink, so the ranking
    cannot turn against a running request between engine events.
    """

    preemptive = True
    static_keys = True

    def key(self, req, now):
        return (req.output - req.generated, req.arrival, req.idx)


class PredictedRank(SortedEachStep):
    """Learning-to-rank predicted SJF as in the headline runs of Fu et al. (NeurIPS 2024).

    Scores stand in for the OPT-125M ListMLE predictor: score = ln(output) + sigma z, with one
    noise scale sigma for every trace (`ltr_noise_sigma`: calibrated once, to `tau` on the
    reference spread `LTR_REFERENCE_LOG_SD`), so the Kendall tau a run achieves depends on how
    spread out its trace's lengths are, as a real ranker's quality depends on the workload; the
    achieved tau is kept in `achieved_tau` and lands in the run summary as `predictor_tau`.
    Requests are ranked by (class, score) every step, running and waiting together, and
    preempted by swap as in vllm-ltr. The repository's headline runs (`benchmarks/bench.sh`,
    `--schedule-type opt-xxx --swap-space 16`) run without the starvation guard, so it is off by
    default; with `starvation_threshold` > 0 (its fairness runs, `fair-*.sh`:
    `opt-xxx-starv200-period10`) a request not scheduled for that many consecutive steps is
    promoted to class -1 for `starvation_quantum` scheduled steps.

    In fast mode a decoding request that runs with the engine's decode cohort is scheduled at
    every cohort step, so its guard state is kept lazily: the cohort clock at which it joined
    (`base`) turns "last scheduled" and "boost steps left" into true values whenever they are
    read or the request leaves the cohort (`_rebase`).
    """

    preemptive = True
    static_keys = True                  # a waiting key changes only by a promotion in `prepare`

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.threshold = int(params["starvation_threshold"])
        self.quantum = int(params["starvation_quantum"])
        out = sim.trace.output_tokens
        scores = predicted_scores(out, float(params["tau"]), sim.seed)
        self.achieved_tau = achieved_tau(out, scores)
        self.scores = scores.tolist()
        self.last: dict[int, int] = {}      # idx -> engine iteration count when last scheduled / queued
        self.boost: dict[int, int] = {}     # idx -> scheduled steps left in the top class
        self.base: dict[int, int] = {}      # cohort member idx -> cohort clock its state is true at
        self.boosted_members: set[int] = set()
        self.cohort_it = 0                  # engine iteration count after the last cohort step

    def key(self, req, now):
        return (-1 if req.idx in self.boost else 0, self.scores[req.idx], req.arrival, req.idx)

    def push(self, req, now):
        super().push(req, now)
        self.last.setdefault(req.idx, self.sim.iterations)
        self._next_promo = min(self._next_promo, self.last[req.idx] + self.threshold)

    _next_promo = 0                     # no promotion can happen before this engine iteration

    # -- the lazy state of cohort members
    def cohort_changed(self, req, delta):
        idx = req.idx
        if delta > 0:
            self.base[idx] = self.sim.dclock
            if idx in self.boost:
                self.boosted_members.add(idx)
        else:
            self._rebase(idx)
            del self.base[idx]
            self.boosted_members.discard(idx)

    def _rebase(self, idx: int) -> None:
        """Make a cohort member's `last` and `boost` true at the current cohort clock."""
        d = self.sim.dclock
        ran = d - self.base[idx]
        if ran:
            self.last[idx] = self.cohort_it
            b = self.boost.get(idx)
            if b is not None:
                if b <= ran:
                    del self.boost[idx]
                else:
                    self.boost[idx] = b - ran
            self.base[idx] = d

    def prepare(self, now):
        if self.boosted_members:
            # a member's boost that ran out in cohort steps ends before the ranking is read
            for idx in list(self.boosted_members):
                self._rebase(idx)
                if idx not in self.boost:
                    self.boosted_members.discard(idx)
        if self.threshold <= 0:
            return
        it = self.sim.iterations
        if it < self._next_promo:
            return
        nxt = None
        boost, last, thr = self.boost, self.last, self.threshold
        for r in self.items:
            idx = r.idx
            if idx in boost:
                continue
            if it - last[idx] >= thr:
                boost[idx] = self.quantum
                last[idx] = it
                self._sorted_at = None          # the waiting order must be rebuilt
            due = last[idx] + thr
            if nxt is None or due < nxt:
                nxt = due
        base, d, cit = self.base, self.sim.dclock, self.cohort_it
        for r in self.sim.running:
            idx = r.idx
            if idx in boost:
                continue
            b = base.get(idx)
            # a member that ran in a cohort step since it joined was last scheduled in the latest one
            t = cit if b is not None and d > b else last[idx]
            if it - t >= thr:
                if b is not None:
                    self._rebase(idx)
                    self.boosted_members.add(idx)
                boost[idx] = self.quantum
                last[idx] = t = it
            due = t + thr
            if nxt is None or due < nxt:
                nxt = due
        self._next_promo = it + thr if nxt is None else nxt

    def _scheduled(self, plan, k):
        it = self.sim.iterations
        if plan.cohort:
            self.cohort_it = it
        for r, _ in plan.items:
            self.last[r.idx] = it
            b = self.boost.get(r.idx)
            if b is not None:
                if b <= k:
                    del self.boost[r.idx]
                else:
                    self.boost[r.idx] = b - k

    def after_step(self, plan, start, end):
        self._scheduled(plan, 1)

    def after_fast_forward(self, plan, starts, ends, k):
        self._scheduled(plan, k)

    def on_finish(self, req, t):
        self.last.pop(req.idx, None)
        self.boost.pop(req.idx, None)

    def fast_forward_limit(self, plan, now):
        k = None
        if self.threshold > 0 and self.items:
            k = self._next_promo - self.sim.iterations   # a lower bound on steps before a promotion
        for r, _ in plan.items:
            b = self.boost.get(r.idx)
            if b is not None:
                k = b if k is None else min(k, b)
        d = self.sim.dclock
        for idx in self.boosted_members:
            b = self.boost.get(idx)
            if b is not None:
                b -= d - self.base[idx]
                k = b if k is None else min(k, b)
        return (None if k is None else max(k, 1)), None


class SkipJoinMLFQ(SortedEachStep):
    """FastServe's skip-join multi-level feedback queue, as LLMServe/FastServe's `MLFQ` runs it.

    Wu et al., 'Fast Distributed Inference Serving for Large Language Models', arXiv 2305.05920;
    the rules are those of the official code, ``fastserve/scheduler.py``, class ``MLFQ``:

    * **Skip-join** (`add_request`): a job joins level p, the smallest with
      ``q1_s * ratio**p >= t_init``, where t_init is its batch-1 prefill time under the latency
      model (the official code reads it from a profiled database); it goes to the back of that
      queue.
    * **Quanta** ``q1_s * ratio**p`` (`base_quantum` 0.01 s, `threshold` 2). The official queues
      grow without bound; `levels` (24: a job would need 0.01 x (2^23 - 1) s ~ 23 h of service to
      reach the last one) bounds them and the last level keeps what reaches it.
    * **Demotion** (`pop_finished_requests`): after every step each job that ran is put back at
      the *front* of its queue, in batch order, and first moves down one level if its processing
      time since it joined its level (the summed times of the steps it ran in) exceeds the
      level's quantum; a demotion resets that time.
    * **Starvation** (`prevent_starvation`, called from `get_next_batch` every
      `starvation_period` = 1,000 iterations): every job not in that step's batch whose last step
      ended `starve_limit_s` (3 s) or more before the step began goes to the front of the top
      queue, keeping its processing time. A job that has never run has ``last_step_time = 0.0``
      there, so it is always due (`never_run_starves = true`); `false` measures its idle time from
      its arrival instead.
    * **Host gate, swap-only eviction**: the batching mode's ranked fill applies them
      (`Continuous._plan_ranked`, `host_gate` and `preemption = "swap"`).

    The queues are deques: a key is (level, position, index), where a push to the front takes a
    position below every other and a push to the back one above. The engine ranks running and
    waiting jobs together every step.
    """

    preemptive = True
    static_keys = True                  # a waiting key changes only at a starvation check
    per_request_steps = True            # per-step, per-request bookkeeping in `after_step`
    cached_key = True                   # req.key = (level, position, idx), set wherever they change

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.levels = int(params["levels"])
        q1 = float(params["q1_s"])
        r = float(params["ratio"])
        self.quanta = [q1 * r ** i for i in range(self.levels)]
        self.starve = float(params["starve_limit_s"])
        self.every = int(params["starve_every"])
        self.never_run_starves = bool(params["never_run_starves"])
        self.lat = sim.latency
        self._front = 0                 # positions handed out by pushes to the front (negated)
        self._back = 0                  # and by pushes to the back
        self.promotions = 0             # starvation promotions, for the run summary
        self.deepest = 0                # the lowest level any job reached
        self._ran: list = []            # the jobs scheduled in the last step run

    def _state(self, req):
        # [level, position, processing time of closed runs, open run's start, last step's end]
        if req.aux is None:
            t_init = self.lat.prefill_time(req.prompt)
            lvl = next((i for i, q in enumerate(self.quanta) if q >= t_init), self.levels - 1)
            self._back += 1
            last = -math.inf if self.never_run_starves else req.arrival
            req.aux = [lvl, self._back, 0.0, math.nan, last]
            req.key = (lvl, self._back, req.idx)
            if lvl > self.deepest:
                self.deepest = lvl
        return req.aux

    def key(self, req, now):
        s = req.aux                     # set when the request first joined the queue
        return (s[0], s[1], req.idx)    # == req.key, which sorting and ranking read instead

    def push(self, req, now):
        self._state(req)
        super().push(req, now)

    def _to_front(self, req, s) -> None:
        self._front += 1
        s[1] = -self._front
        req.key = (s[0], s[1], req.idx)

    @staticmethod
    def _close(s):
        if not math.isnan(s[3]):
            s[2] += s[4] - s[3]
            s[3] = math.nan

    def _run(self, s, start, end) -> bool:
        """Account one step [start, end] the job ran in; demote it if its processing time now
        exceeds its level's quantum (and say so)."""
        if s[4] != start or math.isnan(s[3]):
            self._close(s)
            s[3] = start
        s[4] = end
        if s[0] < self.levels - 1 and s[2] + (end - s[3]) > self.quanta[s[0]]:
            s[0] += 1
            s[2] = 0.0
            s[3] = math.nan
            if s[0] > self.deepest:
                self.deepest = s[0]
            return True
        return False

    def _check_due(self) -> bool:
        return not self.sim.iterations % self.every

    def _promote_starved(self, batch_ids: set, start: float) -> None:
        """`prevent_starvation`: every job outside the batch idle for `starve_limit_s`, collected
        queue by queue from the top and each pushed to the front of the top queue in turn."""
        limit = self.starve
        due = [r for r in self.items if start - r.aux[4] >= limit]
        due += [r for r in self.sim.running if r.idx not in batch_ids and start - r.aux[4] >= limit]
        if not due:
            return
        due.sort(key=_KEY_ATTR)
        for r in due:
            s = r.aux
            self._close(s)
            s[0] = 0
            self._to_front(r, s)
        self.promotions += len(due)
        self._sorted_at = None          # waiting keys changed: re-sort

    def after_step(self, plan, start, end):
        batch = sorted((r for r, _ in plan.items), key=_KEY_ATTR)
        if self._check_due():
            self._promote_starved({r.idx for r in batch}, start)
        run = self._run
        for r in batch:                 # `pop_finished_requests`, in batch (rank) order
            s = r.aux
            run(s, start, end)
            self._to_front(r, s)
        # a running job that sat this step out ends its open run (its KV stays resident); only
        # one that ran in the step before can have a run open
        if len(batch) != len(self.sim.running):
            for r in self._ran:
                s = r.aux
                if r.phase == RUNNING and s[4] != end and s[3] == s[3]:
                    self._close(s)
        self._ran = batch

    def requeue(self, req, now):
        # swapped or recomputed out of the batch's way: its place in its queue is kept
        self._close(self._state(req))
        super().requeue(req, now)

    def fast_forward_limit(self, plan, now):
        """The next starvation check, and the earliest time a running job may sink below a waiting one.

        In a decode-only batch every running job is served whatever the order. A job that ran
        is at the front of its queue, ahead of every waiting job of its level, so a demotion
        matters only when the job falls below the best waiting level lw: at level l <= lw it needs
        its level's remaining quantum and then the quanta of levels l+1..lw; below lw, any
        demotion may put it under some waiting job. Returned 1 us early (the
        step-by-step tests compare within float rounding of these sums). The run also ends at
        the step that is a starvation check, which `after_fast_forward` then performs.
        """
        k = self.every - self.sim.iterations % self.every
        t = math.inf
        if self.items:
            lw = min(r.aux[0] for r in self.items)
            quanta = self.quanta
            for r, _ in plan.items:
                s = r.aux
                lvl = s[0]
                if lvl < self.levels - 1:
                    seg = now if (s[4] != now or math.isnan(s[3])) else s[3]
                    due = seg + (quanta[lvl] - s[2])
                    for m in range(lvl + 1, lw + 1):    # empty from lw on: its next demotion counts
                        due += quanta[m]
                    if due < t:
                        t = due
        return k, (t - 1e-6 if t < math.inf else None)

    def after_fast_forward(self, plan, starts, ends, k):
        """Account k consecutive steps exactly as k calls of `after_step` would: demotions, the
        front pushes after each step, and a starvation check at the last step."""
        start = float(starts[0])
        end = float(ends[k - 1])
        last = self.levels - 1
        quanta = self.quanta
        bounds = None
        order = sorted((r for r, _ in plan.items), key=_KEY_ATTR)
        level0 = {r.idx: r.aux[0] for r in order}
        demoted: dict[int, list] = {}         # step index -> jobs demoted at its end
        for r in order:
            s = r.aux
            if s[4] != start or math.isnan(s[3]):
                self._close(s)
                s[3] = start
            s[4] = end
            if s[0] < last and s[2] + (end - s[3]) > quanta[s[0]]:
                if bounds is None:
                    bounds = (starts[:k].tolist(), ends[:k].tolist())
                for j in self._demote_within(s, bounds[0], bounds[1]):
                    demoted.setdefault(j, []).append(r)
                if s[0] > self.deepest:
                    self.deepest = s[0]
        # the batch's order after each step: within a level, the reverse of the step's order
        # (each job was pushed to the front in turn), regrouped by level where jobs were demoted
        lvl = dict(level0)
        done = 0
        for j in sorted(demoted):
            if (j - done) % 2:
                order = _reverse_within_levels(order, lvl)
            for r in demoted[j]:
                lvl[r.idx] += 1
            order.reverse()
            order.sort(key=lambda r: lvl[r.idx])
            done = j + 1
        if (k - done) % 2:
            order = _reverse_within_levels(order, lvl)
        if self._check_due():
            self._promote_starved({r.idx for r in order}, float(starts[k - 1]))
        self._ran = list(order)
        for r in reversed(order):              # fresh front positions that sort as `order`
            self._to_front(r, r.aux)

    def _demote_within(self, s, starts, ends) -> list[int]:
        """Replay the demotions of one job over a run of steps (`starts`, `ends`), step-exact;
        return the indices of the steps at whose end it was demoted.

        Within a level the test `time + (end_j - run start) > quantum` is monotone in j, so the
        step that exceeds the quantum is found by bisection; the next level's run starts with
        the following step, as it does when stepping one iteration at a time.
        """
        last = self.levels - 1
        k = len(ends)
        j = 0
        at = []
        while s[0] < last:
            q, base, seg = self.quanta[s[0]], s[2], s[3]
            if not base + (ends[k - 1] - seg) > q:
                break
            lo, hi = j - 1, k - 1           # the test fails at lo (or lo is before the run), holds at hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if base + (ends[mid] - seg) > q:
                    hi = mid
                else:
                    lo = mid
            s[0] += 1
            s[2] = 0.0
            at.append(hi)
            if hi == k - 1:
                s[3] = math.nan
                break
            s[3] = starts[hi + 1]
            j = hi + 1
        return at


_KEY_ATTR = attrgetter("key")


def _reverse_within_levels(order: list, lvl: dict) -> list:
    """`order` (grouped by level) with each level's run of jobs reversed."""
    out = []
    i = 0
    n = len(order)
    while i < n:
        j = i
        L = lvl[order[i].idx]
        while j < n and lvl[order[j].idx] == L:
            j += 1
        out.extend(reversed(order[i:j]))
        i = j
    return out


class ResponseRatio(SortedEachStep):
    """HRRN: admit the waiting request with the highest response ratio (W + S) / S.

    S is the request's service time alone under the latency model (`size = "oracle"`: prefill
    plus its true output length of batch-1 decodes; `"prompt"`: prefill plus the trace's mean
    output length). Brinch Hansen, SOSP 1971. Non-preemptive; memory victim is the newest.
    """

    dynamic = True

    def __init__(self, sim, params):
        super().__init__(sim, params)
        size = params["size"]
        out = sim.trace.output_tokens
        if size == "prompt":
            out = np.full_like(out, max(1, int(round(float(out.mean()))) if len(out) else 1))
        elif size != "oracle":
            raise ConfigError(f"[scheduler.hrrn] size: must be 'oracle' or 'prompt', got {size!r}")
        self.S = sim.latency.alone_time(sim.trace.input_tokens, out) if len(out) else np.zeros(0)

    def key(self, req, now):
        S = float(self.S[req.idx])
        return (-((now - req.arrival) + S) / S, req.arrival, req.idx)


class VirtualTokenCounter(Ordering):
    """VTC fair scheduling (Sheng et al., OSDI 2024; Ying1123/VTC-artifact).

    Each client has a counter of weighted service. Whenever the engine can admit, the client
    with the smallest counter among those with queued requests sends its oldest request; on
    admission the counter grows by w_p x input tokens, and by w_q for every token it generates.
    A client that becomes backlogged again is lifted to the smallest counter of the other
    backlogged clients, so idle time is not banked. Requests without a client id are each their
    own client. Preemption (the engine's recompute) charges no refund.

    A counter is kept as lift offset + w_p x input tokens + w_q x output tokens, with the token
    counts as integers (output tokens of decode-cohort members are counted lazily from the
    cohort clock), so the step-by-step and fast-forward modes compute identical floats.
    """

    dynamic = True

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.wp = float(params["w_p"])
        self.wq = float(params["w_q"])
        self.base: dict[str, float] = {}          # lift offsets
        self.tin: dict[str, int] = {}             # input tokens charged
        self.tout: dict[str, int] = {}            # output tokens charged (synced part)
        self.ncoh: dict[str, int] = {}            # decode-cohort members of the client
        self.csync: dict[str, int] = {}           # cohort clock at the last sync of tout
        self.queues: dict[str, deque[Request]] = {}
        self.n = 0
        self.charged: set[int] = set()

    @staticmethod
    def client(req):
        return req.client if req.client is not None else f"#{req.idx}"

    def _ensure(self, c):
        if c not in self.base:
            self.base[c] = 0.0
            self.tin[c] = 0
            self.tout[c] = 0
            self.ncoh[c] = 0
            self.csync[c] = self.sim.dclock

    def _sync(self, c):
        d = self.sim.dclock
        self.tout[c] += self.ncoh[c] * (d - self.csync[c])
        self.csync[c] = d

    def service(self, c) -> float:
        """Weighted service received by client `c` so far (no lift offset)."""
        if c not in self.base:
            return 0.0
        self._sync(c)
        return self.wp * self.tin[c] + self.wq * self.tout[c]

    def counter(self, c) -> float:
        """The client's virtual counter: lift offset plus weighted service."""
        return self.base[c] + self.service(c)

    def __len__(self): return self.n
    def __iter__(self):
        for q in self.queues.values():
            yield from q

    def push(self, req, now):
        c = self.client(req)
        self._ensure(c)
        q = self.queues.get(c)
        if not q:
            others = [self.counter(u) for u, qq in self.queues.items() if qq and u != c]
            if others:
                m = min(others)
                if self.counter(c) < m:
                    self.base[c] = m - self.service(c)
            if q is None:
                q = self.queues[c] = deque()
        q.append(req)
        self.n += 1

    def requeue(self, req, now):
        c = self.client(req)
        self._ensure(c)
        self.queues.setdefault(c, deque()).appendleft(req)
        self.n += 1

    def _best(self):
        best = None
        for c, q in self.queues.items():
            if q:
                cand = (self.counter(c), q[0].arrival, q[0].idx)
                if best is None or cand < best[0]:
                    best = (cand, c)
        return best[1] if best else None

    def head(self, now):
        c = self._best()
        return self.queues[c][0] if c is not None else None

    def pop_head(self):
        c = self._best()
        self.n -= 1
        return self.queues[c].popleft()

    def remove(self, req):
        self.queues[self.client(req)].remove(req)
        self.n -= 1

    def ordered(self, now):
        return sorted(self, key=lambda r: (self.counter(self.client(r)), r.arrival, r.idx))

    def on_admit(self, req, now):
        if req.idx not in self.charged:
            self.charged.add(req.idx)
            self.tin[self.client(req)] += req.prompt

    def cohort_changed(self, req, delta):
        c = self.client(req)
        self._sync(c)
        self.ncoh[c] += delta

    def after_step(self, plan, start, end):
        for r in plan.emitted:
            self.tout[self.client(r)] += 1


class SloGate:
    """SLO-aware admission control: reject requests whose TTFT deadline can no longer be met.

    At arrival and at every step, each waiting request that has not yet produced a token gets a
    lower bound on its first-token time: now + (prefill tokens queued ahead of it under FCFS,
    including unfinished prefills of running requests, plus its own prompt) / the engine's peak
    prefill rate under the latency model. If that bound exceeds arrival + TTFT_SLO x (1 + slack),
    the request is rejected: with slack = 0 a request is rejected only when a miss is certain
    under the cost model. Design after Mooncake's early rejection (Qin et al., FAST 2025) and
    SCORPIO's TTFT guard (Tang et al., 2025).
    """

    def __init__(self, sim, params):
        profiles = sim.config.slo_profiles
        prof = params["slo_profile"]
        if prof not in profiles:
            raise ConfigError(f"[scheduler.slo-admission] slo_profile: unknown profile {prof!r} "
                              f"(known: {', '.join(profiles)})")
        self.ttft = float(profiles[prof][0]) * (1.0 + float(params["slack"]))
        self.sim = sim
        self.rate = None

    def _rate(self, sched):
        if self.rate is None:
            budget = sched.mode.budget
            lat = self.sim.latency
            self.rate = max(n / lat.iteration_time([(n, 0)], 0, 0)
                            for n in sorted({16, 64, 128, 256, 512, 1024, budget} - {0})
                            if n <= budget)
        return self.rate

    def _ahead0(self):
        return sum(r.num_tokens - r.computed for r in self.sim.running if not r.decoding)

    def filter(self, sched, now):
        order = sched.order
        if not len(order):
            return
        rate = self._rate(sched)
        ahead = self._ahead0()
        for r in list(order.ordered(now)):
            if r.generated == 0:
                if now + (ahead + r.num_tokens) / rate > r.arrival + self.ttft:
                    order.remove(r)
                    self.sim.reject(r, "TTFT deadline cannot be met (admission control)")
                    continue
            ahead += r.num_tokens

    def _deadlines(self, sched, now):
        rate = self._rate(sched)
        ahead = self._ahead0()
        out = []
        for r in sched.order.ordered(now):
            if r.generated == 0:
                out.append((r.arrival + self.ttft, (ahead + r.num_tokens) / rate))
            ahead += r.num_tokens
        return out

    def fast_forward_limit(self, sched, plan, now):
        d = self._deadlines(sched, now) if len(sched.order) else []
        if not d:
            return None, None
        return None, min(D - x for D, x in d) - 1e-9

    def refine(self, sched, plan, starts, ends, k):
        d = self._deadlines(sched, float(starts[0])) if len(sched.order) else []
        for D, x in d:
            hit = np.nonzero(starts[:k] + x > D)[0]
            if hit.size:
                k = min(k, max(int(hit[0]), 1))
        return k


# ============================================================================ helpers


#: Standard deviation of ln(output tokens) pooled over the 107,837 requests of the default
#: study corpus (schedport-study-v1, 120 windows of Azure, Bailian and modeled BurstGPT; corpus
#: sha256 963bf71d...): the reference spread ltr's predictor noise is calibrated to, once.
#: `reference_log_sd` recomputes it from any corpus.
LTR_REFERENCE_LOG_SD = 1.804


def ltr_noise_sigma(tau: float, reference_log_sd: float = LTR_REFERENCE_LOG_SD) -> float:
    """The predictor's noise scale: the sigma that gives Kendall tau `tau` on the reference spread.

    For bivariate-normal (ln L, score) Kendall's tau is (2/pi) arcsin(rho) (Greiner's relation),
    so tau fixes rho = sin(pi tau / 2), and score = ln L + sigma z has rho = s / sqrt(s^2 +
    sigma^2) for s = sd(ln L): sigma = s sqrt(1/rho^2 - 1) (schedulers.md section 7). It is
    computed once from `reference_log_sd`, never from the trace being run, so a trace whose
    lengths are more spread out than the reference gets a better ranking than `tau` and a
    narrower one a worse ranking; on the pooled default corpus the achieved tau is 0.530 for
    tau = 0.52 (the repository's value for the 8B-target predictor on ShareGPT).
    """
    if tau >= 1.0:
        return 0.0
    rho = math.sin(math.pi * tau / 2.0)
    return float(reference_log_sd) * math.sqrt(1.0 / (rho * rho) - 1.0)


def reference_log_sd(output_tokens: np.ndarray) -> float:
    """sd of ln(output tokens) over `output_tokens` (pass every request of a corpus, pooled)."""
    return float(np.log(np.asarray(output_tokens, dtype=np.float64)).std())


def predicted_scores(output_tokens: np.ndarray, tau: float, seed: int) -> np.ndarray:
    """Synthetic predictor scores ln(L) + sigma z, z ~ N(0, 1) seeded by `seed`, sigma = `ltr_noise_sigma(tau)`.

    Lower score = predicted shorter. The same lengths, tau and seed always give the same scores
    (the simulator and the replay's priorities share them).
    """
    out = np.asarray(output_tokens)
    n = len(out)
    if n == 0:
        return np.zeros(0)
    logL = np.log(out.astype(np.float64))
    sigma = ltr_noise_sigma(float(tau))
    if sigma == 0.0:
        return logL
    rng = np.random.Generator(np.random.PCG64([int(seed), 0x17A]))
    return logL + sigma * rng.standard_normal(n)


def achieved_tau(output_tokens: np.ndarray, scores: np.ndarray) -> float:
    """Kendall tau-b between predicted scores and true output lengths on one trace (NaN if undefined)."""
    from scipy.stats import kendalltau

    if len(scores) < 2:
        return math.nan
    t = kendalltau(np.asarray(output_tokens), np.asarray(scores)).statistic
    return float(t)


def run_counters(sim) -> dict:
    """Per-run facts a policy measured, for the run summary: ltr's achieved `predictor_tau`
    (None for every other policy)."""
    tau = getattr(sim.sched.order, "achieved_tau", None)
    return {"predictor_tau": None if tau is None or math.isnan(tau) else float(tau)}


# -- EDF deadlines

#: Deadline rules `[scheduler.edf] deadline` accepts.
DEADLINE_RULES = ("last-token", "first-token")


def request_deadlines(arrival_s: np.ndarray, output_tokens: np.ndarray, ttft_slo: float, tpot_slo: float,
                      rule: str = "last-token") -> np.ndarray:
    """Each request's EDF deadline (absolute seconds) under an SLO profile (ttft_slo, tpot_slo).

    ``"last-token"`` (the default): the time its last token is due, arrival + ttft_slo +
    tpot_slo x (output_tokens - 1). Niyama (Goel et al., arXiv 2503.22562, ASPLOS 2026; code in
    microsoft/sarathi-serve, branch niyama_asplos2026, `Sequence._get_TBT_deadline` in
    sarathi/core/datatypes/sequence.py) gives token i the deadline first-token deadline + i x
    the per-token budget; the request's deadline is its last token's. It grows with the
    request's own work, so edf differs from FCFS wherever output lengths differ; like sjf it
    reads the true output length. ``"first-token"``: arrival + ttft_slo, the TTFT deadline
    alone (Niyama's `edf` ordering within one SLO tier), which with one profile for every
    request is arrival order, i.e. FCFS.
    """
    arr = np.asarray(arrival_s, dtype=np.float64)
    if rule == "first-token":
        return arr + float(ttft_slo)
    if rule != "last-token":
        raise ConfigError(f"deadline rule must be one of {', '.join(DEADLINE_RULES)}, got {rule!r}")
    n_out = np.asarray(output_tokens, dtype=np.float64)
    return arr + float(ttft_slo) + float(tpot_slo) * (n_out - 1.0)


def _by_output(r: Request):
    return r.output


def _by_prompt(r: Request):
    return r.prompt


def deadline_priorities(deadlines_s: np.ndarray) -> np.ndarray:
    """Deadlines as the integer priorities a vLLM server orders by: whole microseconds.

    edf ranks by these same integers, so the simulator and a replay (or `schedport conformance`)
    break every tie alike: by arrival, then request. Milliseconds were too coarse: two deadlines
    within 1 ms tied on the server but not in the simulator."""
    return np.round(np.asarray(deadlines_s, dtype=np.float64) * 1e6).astype(np.int64)


class _Deadline(StaticKey):
    """EDF: waiting order by deadline (`request_deadlines` under `slo_profile` and `deadline`),
    in whole microseconds (`deadline_priorities`)."""

    def __init__(self, sim, params):
        ttft, tpot = sim.config.slo_profiles[params["slo_profile"]]
        t = sim.trace
        dl = deadline_priorities(request_deadlines(t.arrival_s, t.output_tokens, ttft, tpot,
                                                   params["deadline"])).tolist()
        super().__init__(sim, params, lambda r: dl[r.idx])


class _Aging(SortedEachStep):
    """SPF with linear aging: key = prompt tokens - aging x seconds waited (aging > 0)."""

    dynamic = True

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.alpha = float(params["aging"])

    def key(self, req, now):
        return (req.prompt - self.alpha * (now - req.arrival), req.arrival, req.idx)


def _spf(sim, params):
    if float(params.get("aging", 0.0)) > 0.0:
        return _Aging(sim, params)
    return StaticKey(sim, params, _by_prompt)


# ============================================================================ the registry

_V1 = "Kwon et al., SOSP 2023 (PagedAttention/vLLM); vLLM v1 scheduler (vllm/v1/core/sched/scheduler.py)"

REGISTRY: dict[str, Policy] = {p.name: p for p in [
    Policy("vllm-fcfs", "vLLM v1: continuous batching, chunked prefill, FCFS, recompute the newest",
           Continuous, Fifo, cite=_V1),
    Policy("sarathi", "Sarathi-Serve stall-free batching: decodes first, 512-token chunked prefills",
           StallFree, Fifo, params={"chunk_size": 512},
           cite="Agrawal et al., OSDI 2024 (Sarathi-Serve); microsoft/sarathi-serve sarathi_scheduler.py"),
    Policy("orca", "Orca iteration-level batching: whole prompts join decodes, max-length KV reservation",
           Selective, Fifo, params={"reserve": "max_model_len"},
           cite="Yu et al., OSDI 2022 (Orca); Sarathi-Serve's orca_scheduler.py baseline"),
    Policy("static", "Request-level batches (FasterTransformer): nothing joins a running batch",
           Static, Fifo, params={"batch_size": 128, "pad_compute": False, "return_at_batch_end": False},
           cite="NVIDIA FasterTransformer, the baseline of Yu et al., OSDI 2022; Sarathi-Serve faster_transformer_scheduler.py"),
    Policy("sjf", "Shortest job first by oracle output length, non-preemptive",
           Continuous, partial(StaticKey, keyfn=_by_output),
           cite="Classic SJF; oracle-length baseline of Fu et al., NeurIPS 2024 (hao-ai-lab/vllm-ltr, sjf mode)"),
    Policy("srpt", "Shortest remaining processing time (oracle), preemptive every step",
           Continuous, ShortestRemaining,
           params={"preemption": "swap"},
           cite="Schrage, Operations Research 1968; vllm-ltr srtf mode (Fu et al., NeurIPS 2024)"),
    Policy("ltr", "Learning-to-rank predicted SJF (noise calibrated to Kendall tau 0.52 once), preemptive",
           Continuous, PredictedRank,
           params={"tau": 0.52, "starvation_threshold": 0, "starvation_quantum": 10,
                   "preemption": "swap"},
           cite="Fu, Zhu, Su, Qiao, Stoica, Zhang, 'Efficient LLM Scheduling by Learning to Rank', NeurIPS 2024"),
    Policy("spf", "Shortest prompt first, non-preemptive (optional linear aging)",
           Continuous, _spf, params={"aging": 0.0},
           cite="Generic shortest-prompt-first baseline (prompt length known on arrival)"),
    Policy("edf", "Earliest deadline first: last-token deadline arrival + TTFT SLO + TPOT SLO x (output - 1)",
           Continuous, _Deadline, params={"slo_profile": "standard", "deadline": "last-token"},
           cite="Liu & Layland, JACM 1973; per-token deadlines of Niyama (Goel et al., arXiv 2503.22562; "
                "microsoft/sarathi-serve niyama_asplos2026, sequence.py _get_TBT_deadline)"),
    Policy("vtc", "Virtual token counters: least-served client first (w_p=1, w_q=2), counter lift",
           Continuous, VirtualTokenCounter, params={"w_p": 1.0, "w_q": 2.0},
           cite="Sheng et al., 'Fairness in Serving Large Language Models', OSDI 2024 (Ying1123/VTC-artifact)"),
    Policy("fastserve", "FastServe skip-join MLFQ: quantum-demoted levels, starvation promotion, swap only",
           Continuous, SkipJoinMLFQ,
           params={"levels": 24, "q1_s": 0.01, "ratio": 2.0, "starve_limit_s": 3.0, "starve_every": 1000,
                   "never_run_starves": True, "host_gate": 0.1, "preemption": "swap", "swap_overlap": True},
           cite="Wu et al., 'Fast Distributed Inference Serving for Large Language Models', arXiv 2305.05920; "
                "LLMServe/FastServe fastserve/scheduler.py, class MLFQ"),
    Policy("hrrn", "Highest response ratio next, (wait + service) / service, non-preemptive",
           Continuous, ResponseRatio, params={"size": "oracle"},
           cite="Brinch Hansen, 'Short-term scheduling in multiprogramming systems', SOSP 1971"),
    Policy("slo-admission", "FCFS with admission control: reject requests whose TTFT deadline cannot be met",
           Continuous, Fifo, admission=SloGate, params={"slo_profile": "standard", "slack": 0.0},
           cite="Qin et al., Mooncake (FAST 2025) early rejection; Tang et al., SCORPIO (2025); DistServe goodput (OSDI 2024)"),
]}


def get_policy(name: str) -> Policy:
    """The policy registered under `name`; an unknown name is a one-line error listing the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown scheduler '{name}' (known: {', '.join(REGISTRY)})") from None


# ============================================================================ parameter validation
#
# Every `[scheduler.<name>]` table is checked against the registry before any simulation starts,
# as thoroughly as `[engine]` keys: unknown tables and keys, wrong types, zeros where a count or
# a rate must be positive, negatives, out-of-range values. Each failure is one line naming the
# config file, the table, the key, the value and the rule.


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))


def _int_rule(lo: int, hi: int | None = None):
    if hi is not None:
        return (lambda v, cfg: _is_int(v) and lo <= v <= hi), f"must be an integer in [{lo}, {hi}]"
    if lo == 1:
        return (lambda v, cfg: _is_int(v) and v >= 1), "must be a positive integer"
    return (lambda v, cfg: _is_int(v) and v >= lo), f"must be an integer >= {lo}"


def _real_rule(ok, text: str):
    return (lambda v, cfg: _is_real(v) and ok(float(v))), text


def _choice_rule(*choices: str):
    quoted = " or ".join(f'"{c}"' for c in choices)
    return (lambda v, cfg: isinstance(v, str) and v in choices), f"must be {quoted}"


_BOOL_RULE = (lambda v, cfg: isinstance(v, bool)), "must be true or false"
_PROFILE_RULE = ((lambda v, cfg: isinstance(v, str) and v in cfg.slo_profiles),
                 "must name an SLO profile of this config ([slo.<name>])")

#: Rule for each parameter name (policy parameters and the batching modes' shared keys):
#: (check(value, engine config) -> bool, the rule as the error states it).
PARAM_RULES: dict[str, tuple] = {
    # shared by every batching mode
    "max_num_batched_tokens": _int_rule(1),
    "max_num_seqs": _int_rule(1),
    "watermark": _real_rule(lambda x: 0.0 <= x < 0.5, "must be a fraction in [0, 0.5)"),
    # sarathi, orca, static
    "chunk_size": _int_rule(1),
    "reserve": _choice_rule("max_model_len", "request"),
    "batch_size": _int_rule(1),
    "pad_compute": _BOOL_RULE,
    "return_at_batch_end": _BOOL_RULE,
    # swap preemption (srpt, ltr, fastserve)
    "preemption": _choice_rule("recompute", "swap"),
    "swap_overlap": _BOOL_RULE,
    "swap_space_gib": _real_rule(lambda x: x >= 0.0, "must be a number >= 0 (GiB of host memory)"),
    "pcie_gb_s": _real_rule(lambda x: x > 0.0, "must be a number > 0 (GB/s)"),
    # ltr
    "tau": _real_rule(lambda x: 0.0 < x <= 1.0, "must be a number in (0, 1] (Kendall tau of the predictor)"),
    "starvation_threshold": _int_rule(0),
    "starvation_quantum": _int_rule(1),
    # spf, edf, vtc, hrrn, slo-admission
    "aging": _real_rule(lambda x: x >= 0.0, "must be a number >= 0 (tokens per second waited)"),
    "slo_profile": _PROFILE_RULE,
    "deadline": _choice_rule(*DEADLINE_RULES),
    "w_p": _real_rule(lambda x: x >= 0.0, "must be a number >= 0 (weight per input token)"),
    "w_q": _real_rule(lambda x: x >= 0.0, "must be a number >= 0 (weight per output token)"),
    "size": _choice_rule("oracle", "prompt"),
    "slack": _real_rule(lambda x: x >= 0.0, "must be a number >= 0 (fraction of the TTFT SLO)"),
    # fastserve
    "levels": _int_rule(1, 64),
    "q1_s": _real_rule(lambda x: x > 0.0, "must be a number > 0 (seconds)"),
    "ratio": _real_rule(lambda x: x >= 1.0, "must be a number >= 1 (each level's quantum over the previous one's)"),
    "starve_limit_s": _real_rule(lambda x: x > 0.0, "must be a number > 0 (seconds)"),
    "starve_every": _int_rule(1),
    "never_run_starves": _BOOL_RULE,
    "host_gate": _real_rule(lambda x: 0.0 <= x < 1.0,
                            "must be a fraction in [0, 1) (share of host swap blocks that must be free)"),
}

#: Keys every policy accepts besides its own parameters (the batching modes read them).
MODE_KEYS = ("max_num_batched_tokens", "max_num_seqs", "watermark")

#: Shared keys a policy's table may not set, and why (one line each).
_NOT_FOR = {
    ("sarathi", "max_num_batched_tokens"):
        "sarathi's per-step token budget is its chunk_size (Sarathi-Serve's get_max_num_batched_tokens "
        "returns chunk_size); set chunk_size instead",
}


def _fmt(v) -> str:
    from schedport.engine.config import _fmt as fmt

    return fmt(v)


def validate_scheduler_params(cfg, policies: dict | None = None) -> None:
    """Check every `[scheduler.<name>]` table of engine config `cfg`; raise a one-line ConfigError.

    `policies` maps names to `Policy` declarations (default: `REGISTRY`); a table for a name
    that is not there, a key the policy does not take, a value of the wrong type or out of its
    range, or a combination without meaning (vtc with both weights 0) is an error naming
    ``cfg.source``, the table, the key, the value and the rule. Called by `Policy.bind` (so by
    every simulation and the Python API) and by the sweep before any worker starts.
    """
    known = REGISTRY if policies is None else policies
    src = cfg.source
    for name, table in cfg.scheduler_params.items():
        pol = known.get(name)
        if pol is None:
            raise ConfigError(f"{src}: [scheduler.{name}]: unknown scheduler; known: {', '.join(known)}")
        allowed = list(pol.params) + [k for k in MODE_KEYS if k not in pol.params]
        for key, value in table.items():
            if key not in allowed or (name, key) in _NOT_FOR:
                why = _NOT_FOR.get((name, key))
                if why:
                    raise ConfigError(f"{src}: [scheduler.{name}] {key}: {why}, got {_fmt(value)}")
                raise ConfigError(f"{src}: [scheduler.{name}] unknown key {key!r}; known keys: {', '.join(allowed)}")
            rule = PARAM_RULES.get(key)
            if rule is not None and not rule[0](value, cfg):
                text = rule[1]
                if key == "slo_profile":
                    text += f" (known: {', '.join(cfg.slo_profiles)})"
                raise ConfigError(f"{src}: [scheduler.{name}] {key}: {text}, got {_fmt(value)}")
        if name == "vtc":
            merged = {**pol.params, **table}
            if float(merged["w_p"]) == 0.0 and float(merged["w_q"]) == 0.0:
                raise ConfigError(f"{src}: [scheduler.vtc] w_p, w_q: at least one weight must be > 0 "
                                  f"(with both 0 no client is ever charged), got 0 and 0")


def validate_for(policy: Policy, cfg) -> None:
    """`validate_scheduler_params` for a simulation of `policy` (which may be a declaration
    outside `REGISTRY`, e.g. a new policy under test): its own table is checked against it."""
    known = REGISTRY if REGISTRY.get(policy.name) is policy else {**REGISTRY, policy.name: policy}
    validate_scheduler_params(cfg, known)
