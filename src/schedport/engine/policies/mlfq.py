"""fastserve: FastServe's skip-join multi-level feedback queue (`SkipJoinMLFQ`)."""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from operator import attrgetter

from schedport.engine.policies.mlfq_job import MLFQJob
from schedport.engine.policies.queues import SortedEachStep


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
    waiting jobs together every step. That is how `--exact` runs it. The fast mode keeps the same
    state lazily in the decode cohort (`schedport.engine.fast.mlfq_cohort`): the last batch's order
    per level, processing times summed at demotions only, and a walk of the levels in place of
    the ranking, bit for bit the same.
    """

    preemptive = True
    static_keys = True                  # a waiting key changes only at a starvation check
    cached_key = True                   # req.key = (level, position, idx), set wherever they change

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.levels = int(params["levels"])
        q1 = float(params["q1_s"])
        r = float(params["ratio"])
        self.quanta = [q1 * r ** i for i in range(self.levels)]
        self.bounds = self.quanta[:-1] + [math.inf]     # the demotion test's (`MLFQJob.exceeds`)
        self.starve = float(params["starve_limit_s"])
        self.every = int(params["starve_every"])
        self.never_run_starves = bool(params["never_run_starves"])
        self.lat = sim.latency
        self._joins: dict[int, int] = {}    # prompt length -> the level a job of it joins (skip-join)
        self._front = 0                 # positions handed out by pushes to the front (negated)
        self._back = 0                  # and by pushes to the back
        self.promotions = 0             # starvation promotions, for the run summary
        self.deepest = 0                # the lowest level any job reached
        self.levels_kept = None         # fast mode: the state kept in the decode cohort (`MlfqCohort`)
        self.resumable: list = []       # waiting jobs past their context stage (`ordered_resumable`)
        self._resumable_sorted = True

    def _state(self, req) -> MLFQJob:
        """The job's `MLFQJob`, made when it first joins the queue (skip-join: at the back of its level)."""
        if req.aux is None:
            lvl = self._joins.get(req.prompt)
            if lvl is None:
                t_init = self.lat.prefill_time(req.prompt)
                lvl = min(bisect_left(self.quanta, t_init), self.levels - 1)   # the first quantum >= t_init
                self._joins[req.prompt] = lvl
            self._back += 1
            last = -math.inf if self.never_run_starves else req.arrival
            req.aux = MLFQJob(lvl, self._back, last)
            req.key = (lvl, self._back, req.idx)
            if lvl > self.deepest:
                self.deepest = lvl
        return req.aux

    def key(self, req, now):
        s = req.aux                     # set when the request first joined the queue
        return (s.level, s.pos, req.idx)    # == req.key, which sorting and ranking read instead

    def push(self, req, now):
        self._state(req)
        super().push(req, now)

    # The surface the fast mode (`schedport.engine.fast.mlfq_cohort`) shares with these rules.
    def to_front(self, req) -> None:
        """Push `req` to the front of its level's queue (`pop_finished_requests`, `prevent_starvation`):
        a position below every other one handed out."""
        s = req.aux
        self._front += 1
        s.pos = -self._front
        req.key = (s.level, s.pos, req.idx)

    def demote(self, s: MLFQJob, run_start: float) -> None:
        """Move job `s` down one level (its processing time there from 0, its next run from
        `run_start`), noting the deepest level reached."""
        s.demote(run_start)
        if s.level > self.deepest:
            self.deepest = s.level

    def run_step(self, s: MLFQJob, start: float, end: float) -> bool:
        """Account one step [start, end] the job ran in; demote it if its processing time now
        exceeds its level's quantum (and say so)."""
        s.run_from(start)
        s.last_end = end
        if s.exceeds(self.bounds, end):
            self.demote(s, math.nan)
            return True
        return False

    def starvation_check_due(self) -> bool:
        """Is the step just run a starvation check (`prevent_starvation` every `starve_every` iterations)?"""
        return not self.sim.iterations % self.every

    def steps_to_starvation_check(self) -> int:
        """How many steps from now the next starvation check comes (1: the next step is one)."""
        return self.every - self.sim.iterations % self.every

    def promote_starved(self, batch_ids: set, start: float) -> None:
        """`prevent_starvation`: every job outside the batch idle for `starve_limit_s`, collected
        queue by queue from the top and each pushed to the front of the top queue in turn."""
        limit = self.starve
        due = [r for r in self.items if start - r.aux.last_end >= limit]
        due += [r for r in self.sim.running if r.idx not in batch_ids and start - r.aux.last_end >= limit]
        if not due:
            return
        due.sort(key=_KEY_ATTR)
        for r in due:
            s = r.aux
            s.close_run()
            s.level = 0
            s.drop_entry()              # the fast mode's due entry (`MlfqCohort`) no longer bounds its due
            self.to_front(r)
        self.promotions += len(due)
        self._sorted_at = None          # waiting keys changed: re-sort
        self._resumable_sorted = False

    def after_step(self, plan, start, end):
        kept = self.levels_kept
        if kept is not None and not kept.written_out:
            kept.after_step(plan, start, end)
            return
        batch = [r for r, _ in plan.items]
        if not plan.ranked:
            batch.sort(key=_KEY_ATTR)
        if self.starvation_check_due():
            self.promote_starved({r.idx for r in batch}, start)
        # `pop_finished_requests`, in batch (rank) order
        for r in batch:
            self.run_step(r.aux, start, end)
            self.to_front(r)
        if kept is not None:
            kept.rebuild(batch, end)
        # a running job that sat this step out ended its open run (its KV stays resident) at its
        # last step's end, s.last_end; the run is closed when next read (`MLFQJob.run_from`, `due_at`),
        # with the same sum an eager close would make

    def on_finish(self, req, t):
        if self.levels_kept is not None:
            self.levels_kept.left(req)

    def requeue(self, req, now):
        # swapped or recomputed out of the batch's way: its place in its queue is kept
        self._state(req).close_run()
        super().push(req, now)
        if req.generated or req.swapped:
            if self._resumable_sorted:
                insort(self.resumable, req, key=_KEY_ATTR)
            else:
                self.resumable.append(req)

    def remove(self, req):
        self.items.remove(req)
        if req.generated or req.swapped:
            self.resumable.remove(req)

    def pop_head(self):
        req = self.items.pop(0)
        if req.generated or req.swapped:
            self.resumable.remove(req)
        return req

    def ordered_resumable(self, now) -> list:
        """The waiting jobs past their context stage (preempted after a token, or swapped out), in
        rank order: those the host gate lets start while it is closed."""
        if not self._resumable_sorted:
            self.resumable.sort(key=_KEY_ATTR)
            self._resumable_sorted = True
        return self.resumable

    def next_decision(self, plan, now):
        """The next starvation check, and the earliest time a running job may sink below a waiting one.

        In a decode-only batch every running job is served whatever the order. A job that ran
        is at the front of its queue, ahead of every waiting job of its level, so a demotion
        matters only when the job falls below the best waiting level lw: at level l <= lw it needs
        its level's remaining quantum and then the quanta of levels l+1..lw; below lw, any
        demotion may put it under some waiting job. Returned 1 us early (the
        step-by-step tests compare within float rounding of these sums). The run also ends at
        the step that is a starvation check, which `after_fast_forward` then performs.
        """
        kept = self.levels_kept
        if kept is not None and not kept.written_out:
            return kept.next_decision(plan, now)
        k = self.steps_to_starvation_check()
        t = math.inf
        if self.items:
            lw = min(r.aux.level for r in self.items)
            quanta = self.quanta
            for r, _ in plan.items:
                s = r.aux
                lvl = s.level
                if lvl < self.levels - 1:
                    due = s.due_at(quanta, now)  # (a run it sat out closed)
                    for m in range(lvl + 1, lw + 1):    # empty from lw on: its next demotion counts
                        due += quanta[m]
                    if due < t:
                        t = due
        return k, (t - 1e-6 if t < math.inf else None)

    def after_fast_forward(self, plan, starts, ends, k):
        """Account k consecutive steps exactly as k calls of `after_step` would: demotions, the
        front pushes after each step, and a starvation check at the last step."""
        kept = self.levels_kept
        if kept is not None and not kept.written_out:
            kept.after_fast_forward(plan, starts, ends, k)
            return
        start = float(starts[0])
        end = float(ends[k - 1])
        bounds = self.bounds
        steps = None                    # the run's step starts and ends, as lists, once a job is demoted
        order = sorted((r for r, _ in plan.items), key=_KEY_ATTR)
        level0 = {r.idx: r.aux.level for r in order}
        demoted: dict[int, list] = {}         # step index -> jobs demoted at its end
        for r in order:
            s = r.aux
            s.run_from(start)
            s.last_end = end
            if s.exceeds(bounds, end):
                if steps is None:
                    steps = (starts[:k].tolist(), ends[:k].tolist())
                for j in self._demote_within(s, steps[0], steps[1]):
                    demoted.setdefault(j, []).append(r)
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
        if self.starvation_check_due():
            self.promote_starved({r.idx for r in order}, float(starts[k - 1]))
        for r in reversed(order):              # fresh front positions that sort as `order`
            self.to_front(r)
        if kept is not None:
            kept.rebuild(order, end)

    def _demote_within(self, s, starts, ends) -> list[int]:
        """Replay the demotions of one job over a run of steps (`starts`, `ends`), step-exact;
        return the indices of the steps at whose end it was demoted.

        Within a level the test `time + (end_j - run start) > quantum` is monotone in j, so the
        step that exceeds the quantum is found by bisection; the next level's run starts with
        the following step, as it does when stepping one iteration at a time.
        """
        bounds = self.bounds
        k = len(ends)
        j = 0
        at = []
        while s.exceeds(bounds, ends[k - 1]):
            lo, hi = j - 1, k - 1           # the test fails at lo (or lo is before the run), holds at hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if s.exceeds(bounds, ends[mid]):
                    hi = mid
                else:
                    lo = mid
            at.append(hi)
            if hi == k - 1:
                self.demote(s, math.nan)
                break
            self.demote(s, starts[hi + 1])
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
