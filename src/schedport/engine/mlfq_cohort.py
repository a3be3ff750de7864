"""FastServe's MLFQ kept in the decode cohort: the skip-join queue's order and accounting between steps
without touching every job every step.

`SkipJoinMLFQ.after_step` pushes every job of a step's batch to the front of its level's queue in
batch order, so each step reverses the order of the batch within each level, and it adds each
job's step time to its processing time. At overload that is a few hundred jobs per step, each
also walked by the ranked fill and executed one by one. This module keeps the same state lazily,
for the fast mode (the decode cohort):

* **The last batch ranks first in its level.** Every job of the last step's batch (`B`) was
  just pushed to the front, so in level L the rank order is: B's jobs of L, then every other job
  of L (waiting, or running and parked) by its explicit position. Within B a level's order is
  kept as an integer value per job and a global sign: the order is ascending ``sign * v``. A step
  whose batch is B reverses every level by flipping the sign; jobs that join B go to the front
  (new values past the level's low or high end), jobs demoted into a level go behind B's jobs
  there, as the front pushes in batch order put them. (A job's `key` holds its value while it
  is in B; each level is a list in value order, so that its rank order is a copy, or a
  reversed one.)
* **Processing time is summed lazily.** A job that ran in the last step has its last step's end
  `last_end` and an open run; it is demoted at the first step end where ``s2 + (end - s3) >
  quantum``. That test is monotone in the end, so a heap holds each job's due time and the exact
  test is made only near it. An entry may lie below its job's due (a run that restarted later
  only moves the due later): when it comes up early it is put back at the due. A fast-forward
  stops at the step where a job is next due, unless every running job is in the batch and
  nothing waits: then the order cannot change the batch and the demotions are made inside the
  run, at the steps the heap names.
* **Freezing** (`MlfqCohort._freeze`). Where a long prefill ranked first takes the budget, most
  of B sits a step out. Those sitters stay in B, frozen, and the cohort stands still: the few
  jobs that run take their tokens as items and are pushed to the front ahead of the frozen ones
  (`_advance_frozen`, no flip). A frozen job's run closes at its last step's end; the next step
  that takes it opens a new one (it thaws, `_start_runs`), one that leaves it out writes it out
  as any sitter. At overload this spares the sitters leaving B and the cohort and coming back
  one by one: on the bench window at rho 1.6, about 10,700 jobs a run freeze in 457 steps.
* **The walk** (`MlfqCohort.walk`, `_Walk`) takes the ranked fill's batch over levels: a level's
  B members are counted, not visited, unless the batch fills inside them or blocks are short;
  B's jobs outside the cohort (prefills), the parked running jobs and the waiting jobs are
  visited one by one in rank order. It preempts by swap and finds the host full as the full
  pass does. Where a step needs what it does not follow — a job it preempted that would start
  again, every job not reached preempted and still short, a stall, preemption by recompute —
  it returns None: the state is written out (`materialize`) and the full pass decides, on the
  bench window at rho 1.6 in none of 1,465 planned steps. Members are counted in runs between
  the jobs outside the cohort, and visited one by one only where blocks are short.

A job leaving B without running (it sat out) gets its explicit position then: a fresh front
position, which ranks it after every later push and before every older position, as its own
push at its last step did. `SkipJoinMLFQ` uses this in fast mode only; `--exact` runs the rules
as written, and the two agree bit for bit.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from itertools import chain
from operator import attrgetter

from schedport.engine.policy import Plan
from schedport.engine.queues import Queue
from schedport.engine.simulator import RUNNING, Request

_KEY = attrgetter("key")


def _NEG_KEY(r):
    return -r.key

# aux fields: level, position, closed processing time, open run's start, last step's end, value in B, stamp,
# and whether a job of B sits out frozen (1) or not (-1)
LVL, POS, DONE, RUN, LAST, VAL, STAMP, FRZ = range(8)
MARGIN = 1e-6       # seconds: due times are compared with this slack, then tested exactly
_FROZEN, _NO_ENTRY = 1, 2   # a frozen job's FRZ: its due entry kept (a bound below its due), or none
_RUN, _ADMIT, _PREEMPT = range(3)   # a walk's actions


def _ignore(req, delta) -> None:
    pass


class MlfqCohort:
    """The lazy MLFQ state of one fast-mode run (module docstring)."""

    __slots__ = ("q", "sim", "lv", "lo", "hi", "sign", "last_end", "heap", "others", "items_prev", "x",
                 "explicit", "frz", "thawing", "ran", "frz_items")

    def __init__(self, q):
        self.q = q
        self.sim = q.sim
        n = q.levels
        self.lv: list[list[Request]] = [[] for _ in range(n)]   # B by level, by value ascending
        self.lo = [0] * n
        self.hi = [0] * n
        self.sign = 1
        self.last_end = -math.inf
        self.heap: list = []            # (due, idx, stamp, request) of B's jobs
        self.others: list[Request] = []         # running jobs outside B (parked), by key
        self.items_prev: list[Request] = []     # last step's items (B's jobs outside the cohort)
        self.x: list[Request] = []      # jobs outside B this step's batch took, in rank order
        self.explicit = False           # the full pass decides this step, on written-out state
        self.frz: list[Request] = []    # B's jobs frozen at the last step (they sat out, the cohort stood still)
        self.thawing: list[Request] = []    # the jobs frozen before this step: those in its batch thaw
        self.ran: list[Request] | None = None   # a freezing step's batch, in rank order
        self.frz_items: list[Request] = []  # the frozen jobs outside the cohort
        if getattr(q.cohort_changed, "__func__", None) is Queue.cohort_changed:
            self.sim._cohort_hook = _ignore     # nothing listens to cohort joins and leaves

    # ------------------------------------------------------------------ B's upkeep
    def _actual(self, L: int) -> list[Request]:
        """B's jobs of level L in rank order."""
        o = self.lv[L]
        return o[:] if self.sign > 0 else o[::-1]

    def _drop(self, r: Request) -> None:
        """Take B's job `r` out of its level (its value, in `key`, places it)."""
        o = self.lv[r.aux[LVL]]
        del o[bisect_left(o, r.key, key=_KEY)]

    def _push_due(self, r: Request) -> None:
        a = r.aux
        a[STAMP] += 1
        if a[LVL] < self.q.levels - 1:
            heapq.heappush(self.heap, (self.q.quanta[a[LVL]] - a[DONE] + a[RUN], r.idx, a[STAMP], r))

    def _place(self, r: Request, L: int, front: bool) -> None:
        """Put `r` into B's level L at the front (the next front push) or behind B's jobs."""
        a = r.aux
        a[LVL] = L
        d = self.lv[L]
        if not d:
            self.lo[L] = self.hi[L] = 0
        if front == (self.sign > 0):
            self.lo[L] -= 1
            a[VAL] = r.key = self.lo[L]
            d.insert(0, r)
        else:
            self.hi[L] += 1
            a[VAL] = r.key = self.hi[L]
            d.append(r)

    def _write_out(self, order: list[Request]) -> None:
        """B's jobs `order` (one level, rank order) leave B: explicit positions, last end, runs."""
        q = self.q
        end = self.last_end
        for r in reversed(order):
            a = r.aux
            self._drop(r)
            q._front += 1
            a[POS] = -q._front
            r.key = (a[LVL], a[POS], r.idx)
            if a[FRZ] < 0:
                a[LAST] = end
                if a[RUN] == end:       # demoted at its last step: no run open yet
                    a[RUN] = math.nan
            else:
                a[FRZ] = -1             # frozen: its last end and run were written when it froze
            a[VAL] = None
            a[STAMP] += 1

    def materialize(self) -> None:
        """Write every B job's state out, as `SkipJoinMLFQ.after_step` would have kept it, for the
        full pass; `rebuild` takes it up again after the step."""
        for L in range(self.q.levels):
            if self.lv[L]:
                self._write_out(self._actual(L))
        self.heap = []
        self.others = []
        self.frz, self.thawing, self.frz_items, self.ran = [], [], [], None
        self.explicit = True

    def rebuild(self, batch: list[Request], end: float) -> None:
        """After a step run on explicit state: its batch is B, in the positions it was given."""
        self.explicit = False
        self.last_end = end
        self.sign = 1
        by = {}
        for r in batch:
            if r.phase == RUNNING:
                by.setdefault(r.aux[LVL], []).append(r)
        for L, rs in by.items():
            rs.sort(key=_KEY)
            for i, r in enumerate(rs):
                a = r.aux
                a[VAL] = r.key = i
                if a[RUN] != a[RUN]:
                    a[RUN] = end        # demoted: its next run starts with the next step
                self._push_due(r)
            self.lv[L] = rs
            self.lo[L], self.hi[L] = 0, len(rs) - 1
        self.others = sorted((r for r in self.sim.running if r.aux[VAL] is None), key=_KEY)
        self.items_prev = list(batch)
        self.x = []

    def resume(self) -> None:
        """Take the lazy state up again after a step on written-out state that ran nothing (it only
        preempted): no job ran last, so B is empty and every running job is parked, out of the
        cohort the engine rebuilt."""
        if self.explicit:
            self.explicit = False
            self.sim.sync_all()
            self.others = sorted(self.sim.running, key=_KEY)
            self.items_prev = []
            self.x = []

    def left(self, r: Request) -> None:
        """A job finished (or was preempted on written-out state): it leaves B or the parked set."""
        a = r.aux
        if a[VAL] is not None:
            self._drop(r)
            a[VAL] = None
            a[STAMP] += 1
        else:
            self._unpark(r)

    def _unpark(self, r: Request) -> None:
        """`r` leaves the parked jobs, if it is one."""
        o = self.others
        i = bisect_left(o, r.key, key=_KEY)
        if i < len(o) and o[i] is r:
            del o[i]

    # ------------------------------------------------------------------ the walk
    def walk(self, mode, sched, now: float, gated: bool, host_was_full: bool) -> Plan | None:
        """The ranked fill's batch (`Continuous._plan_ranked`'s rules) over the lazy levels, or None
        where the full pass must decide (module docstring, `_Walk`)."""
        if not mode.swap:
            return None
        sim = self.sim
        self._thaw_next()
        waiting = self.q.ordered(now)
        if not waiting:
            for r in self.others:
                if r.sync >= 0:         # joined by a shortcut that then gave way (`_plan_cohort`)
                    sim.cohort_leave(r)
        elif gated:
            # a context-stage job is held back while the gate is closed: only the rest can start
            waiting = self.q.ordered_resumable(now)
        w = _Walk(self, mode, waiting)
        try:
            w.run()
        except _GiveWay:
            return None
        if w.host_full and not w.selected and not w.preempted:
            return None                     # nothing runs: the full pass breaks the stall
        sit = w.sat + w.sitters()
        if self._may_freeze(w, sit):
            return self._freeze(sched, now, w, sit)
        plan = self._apply(sched, now, w.acts, sit)
        if w.host_full:
            plan.host_full = True
            plan.decode_only = False
            sim.host_full_prev = True
            if not host_was_full:
                sim.host_full_events += 1
        return plan

    def _readmit_need(self, r: Request, budget: int, d: int) -> int:
        """The blocks a job the walk preempts by swap would need to start again this step."""
        if r.sync >= 0:
            computed, generated = r.pval + d, r.generated + d - r.sync
        else:
            computed, generated = r.computed, r.generated
        k = min(r.prompt + generated - computed, budget)
        return -(-(computed + k) // self.sim.cache.block_size)

    def _apply(self, sched, now: float, acts: list, sit: list) -> Plan:
        """Carry out a walk's decisions in its order: B's jobs that sat out leave B (parked), then
        the preemptions, admissions and running jobs taken; members' new blocks are taken once
        the members are known, and parked decoders join the cohort after."""
        sim = self.sim
        sim.host_full_prev = False
        plan = Plan()
        plan.cohort = True
        # B's jobs that leave it (sitters, and jobs preempted) get their positions level by level
        # in rank order, together: one may have ranked before another of either kind
        leave: dict[int, list] = {}
        for r, _, _, act, in_b in acts:
            if act == _PREEMPT and in_b:
                leave.setdefault(r.aux[LVL], []).append(r)
        for r in sit:
            leave.setdefault(r.aux[LVL], []).append(r)
        for rs in leave.values():
            rs.sort(key=_KEY, reverse=self.sign < 0)
            self._write_out(rs)
        hook = None if sim._cohort_hook is _ignore else sim._cohort_hook
        sim.cohort_leave_all([r for r in sit if r.sync >= 0], hook)
        for r in sit:
            insort(self.others, r, key=_KEY)
        x = self.x = []
        join = []
        swap = True
        for r, k, need, act, in_b in acts:
            if act == _PREEMPT:
                self._unpark(r)
                sim.preempt(r, swap)
                plan.preempted += 1
                continue
            if act == _ADMIT:
                self.q.remove(r)
                sched.admit(r, now)
                sim.allocate(r, need)
                plan.add(r, k)
                plan.admitted += 1
            else:
                if need > 0:
                    sim.allocate(r, need)
                if r.decoding:
                    join.append(r)
                else:
                    plan.add(r, k)
            if not in_b:
                if act == _RUN:
                    self._unpark(r)
                x.append(r)
        sim.cache.free -= sim.cohort_crossings(sim.dclock)
        sim.cohort_join_all(join, hook)
        plan.parked = len(sim.running) - sim.cohort_n - sum(1 for r, _ in plan.items if r.sync < 0)
        if plan.admitted or plan.preempted:
            plan.decode_only = False
        return plan

    def ran_all(self, plan: Plan) -> None:
        """A step where every running job (and every waiting one the plan admitted) runs: the jobs
        outside B (the parked ones and the admitted) join it."""
        self._thaw_next()
        x = self.others
        if plan.admitted:
            seen = {r.idx for r in x}
            x = x + [r for r, _ in plan.items if r.aux[VAL] is None and r.idx not in seen]
            x.sort(key=_KEY)
        self.x = x
        self.others = []

    def over_budget(self, budget: int) -> bool:
        """Do the running jobs' needs exceed the token budget? (Then no shortcut can serve them all,
        and the walk decides without the cohort taking in the parked jobs first.)"""
        tokens = self.sim.cohort_n
        for r in self.others:
            tokens += r.prompt + r.generated - r.computed
        for r in self.items_prev:
            if r.phase == RUNNING and r.sync < 0 and r.aux[VAL] is not None:
                tokens += r.prompt + r.generated - r.computed
        return tokens > budget

    # ------------------------------------------------------------------ freezing
    def _thaw_next(self) -> None:
        """The jobs frozen at the last step thaw at this one if its batch takes them (`_start_runs`);
        a step that freezes again says which (`_freeze`)."""
        self.thawing = self.frz
        self.frz = []

    def _may_freeze(self, w: "_Walk", sit: list) -> bool:
        """Can B's sitters `sit` stay in B, frozen, while the cohort stands still this step? Where
        more of B sits out than runs, the batch cut clean (no job of B reached was short of a
        block, the host not full) and the step is no starvation check."""
        if w.cut is None or w.shorted or w.host_full or w.sat:
            return False
        n_b = len(self.sim.running) - len(self.others)     # (every running job is in B or parked)
        return 2 * len(sit) > n_b and (self.sim.iterations + 1) % self.q.every

    def _freeze(self, sched, now: float, w: "_Walk", sit: list) -> Plan:
        """A step where most of B sits out (a long prefill ranked first took the budget): the cohort
        stands still and B's sitters stay in B, frozen, where the front pushes of the few jobs that
        run leave them (`_advance_frozen`); the jobs that run take their tokens as items.

        A frozen job was not pushed this step: it keeps its place behind this step's batch, ahead
        of every older position, as its own push at its last step left it. Its run closes at that
        step's end (`LAST`); the step that takes it again opens a new one (`_start_runs`), and one
        that leaves it out writes it out as any sitter (`_write_out`). Freezing saves the sitters'
        leaving and rejoining B and the cohort one by one when the next step takes them all back.
        """
        sim = self.sim
        sim.host_full_prev = False
        plan = Plan()
        lv = self.lv
        L0, reached = w.cut
        # the sitters not frozen yet: in each level they rank before the frozen ones (a suffix)
        end = self.last_end
        items_out = [r for r in self.frz_items if r.aux[FRZ] >= 0]     # (frozen before)
        for L in range(L0, self.q.levels):
            if lv[L]:
                order = w.order_of(L)
                for i in range(reached if L == L0 else 0, len(order)):
                    r = order[i]
                    a = r.aux
                    if a[FRZ] >= 0:
                        break
                    a[FRZ] = _FROZEN
                    a[LAST] = end
                    if a[RUN] == end:   # demoted at its last step: no run open yet
                        a[RUN] = math.nan
                    # (its due entry stays: a bound below its due once it thaws, as its run
                    # restarts later)
                    if r.sync < 0:
                        items_out.append(r)
        # the walk's decisions in its order, as `_apply` makes them (B's jobs preempted written out
        # first; a preemption frees host room an admission may take back)
        leave: dict[int, list] = {}
        for r, _, _, act, in_b in w.acts:
            if act == _PREEMPT and in_b:
                leave.setdefault(r.aux[LVL], []).append(r)
        for rs in leave.values():
            rs.sort(key=_KEY, reverse=self.sign < 0)
            self._write_out(rs)
        ks = {}
        outside = []
        for r, k, need, act, in_b in w.acts:
            if act == _PREEMPT:
                self._unpark(r)
                sim.preempt(r, True)
                plan.preempted += 1
                continue
            if act == _ADMIT:
                self.q.remove(r)
                sched.admit(r, now)
                sim.allocate(r, need)
                plan.admitted += 1
            elif need > 0:
                sim.allocate(r, need)
            ks[r.idx] = k
            if not in_b:
                if act == _RUN:
                    self._unpark(r)
                outside.append(r)
        # the batch in rank order, level by level: B's jobs reached, then the jobs outside B
        cache = sim.cache
        bs = cache.block_size
        d = sim.dclock
        alloc = sim._alloc_decode
        items = plan.items
        ran = []
        x = self.x = []
        j = 0
        for L in range(self.q.levels):
            if L > L0 and j == len(outside):
                break
            if L <= L0 and lv[L]:
                order = w.order_of(L)
                for r in (order[:reached] if L == L0 else order):
                    if r.sync >= 0:         # a member: made exact, given its next block, an item
                        if r.sync != d:
                            lag = d - r.sync
                            r.computed += lag
                            r.generated += lag
                            r.sync = d
                            if alloc:
                                r.blocks = -(-r.computed // bs)
                        need = -(-(r.computed + 1) // bs) - r.blocks
                        if need > 0:
                            cache.free -= need
                            r.blocks += need
                        items.append((r, 1))
                    else:
                        plan.add(r, ks[r.idx])
                    ran.append(r)
            while j < len(outside) and outside[j].aux[LVL] == L:
                r = outside[j]
                j += 1
                plan.add(r, ks[r.idx])
                x.append(r)
                ran.append(r)
        if j < len(outside):
            raise RuntimeError("internal: a frozen step's batch is not in level order")
        self.ran = ran
        # every frozen job sits this step; those the batch took thaw (`_start_runs`)
        self.thawing = [r for r in ran if r.aux[FRZ] >= 0]
        self.frz = sit
        # B's sitters outside the cohort are visited by the next walk, as B's items of this step are
        if self.thawing and items_out:
            thawed = {r.idx for r in self.thawing}
            items_out = [r for r in items_out if r.idx not in thawed]
        self.frz_items = items_out
        plan.parked = len(sim.running) - sim.cohort_n - sum(1 for r, _ in items if r.sync < 0)
        plan.decode_only = False
        return plan

    def _advance_frozen(self, end: float, demoted: list[Request]) -> None:
        """A freezing step's front pushes: each job of its batch, in batch order, goes to the front of
        its level (the next one if demoted), ahead of the frozen jobs; the order does not flip.
        B's jobs that stay in their level keep their due entries."""
        q = self.q
        dem = {r.idx for r in demoted}
        lv = self.lv
        in_b = []
        for r in self.ran:
            a = r.aux
            if a[VAL] is not None:
                self._drop(r)
                in_b.append(True)
            else:
                in_b.append(False)
        for r, was_b in zip(self.ran, in_b):
            a = r.aux
            L = a[LVL]
            if r.idx in dem:
                a[DONE] = 0.0
                a[RUN] = end            # its next run starts with the next step
                L += 1
                if L > q.deepest:
                    q.deepest = L
                self._place(r, L, True)
                self._push_due(r)
            else:
                self._place(r, L, True)
                if not was_b:
                    self._push_due(r)
        self.ran = None
        self.x = []

    # ------------------------------------------------------------------ after the step
    def _start_runs(self, start: float) -> None:
        """The jobs that joined the batch start a run (closing the one they left open), and the
        frozen jobs it took thaw: a new run, and a due time."""
        for r in self.x:
            s = r.aux
            s3 = s[RUN]
            if s[LAST] != start or s3 != s3:
                if s3 == s3:
                    s[DONE] += s[LAST] - s3
                s[RUN] = start
        if self.thawing:
            for r in self.thawing:
                s = r.aux
                f = s[FRZ]
                if f >= 0:              # (not written out)
                    s3 = s[RUN]
                    if s3 == s3:
                        s[DONE] += s[LAST] - s3
                    s[RUN] = start
                    s[FRZ] = -1
                    if f == _NO_ENTRY:
                        self._push_due(r)
            self.thawing = []

    def _top_due(self) -> None:
        """Make the due heap's top a live entry at its job's due time (or empty the heap): entries of
        jobs that left B go, bounds below a due are put back at it, and frozen jobs' entries go
        (they get new ones when they thaw)."""
        heap = self.heap
        quanta = self.q.quanta
        while heap:
            e = heap[0]
            s = e[3].aux
            if s[STAMP] != e[2]:
                heapq.heappop(heap)
            elif s[FRZ] >= 0:
                heapq.heappop(heap)
                s[STAMP] += 1
                s[FRZ] = _NO_ENTRY
            else:
                due = quanta[s[LVL]] - s[DONE] + s[RUN]
                if due <= e[0]:
                    return
                heapq.heapreplace(heap, (due, e[1], e[2], e[3]))

    def _due(self, end: float) -> list[Request]:
        """B's jobs (and this step's newcomers `x`) demoted at a step ending at `end`."""
        q = self.q
        quanta = q.quanta
        last = q.levels - 1
        heap = self.heap
        out = []
        back = []
        lim = end + MARGIN
        while heap and heap[0][0] <= lim:
            e = heapq.heappop(heap)
            r = e[3]
            s = r.aux
            if s[STAMP] != e[2]:
                continue
            if s[FRZ] >= 0:             # frozen, not running: a new entry when it thaws
                s[STAMP] += 1
                s[FRZ] = _NO_ENTRY
                continue
            due = quanta[s[LVL]] - s[DONE] + s[RUN]
            if due > lim:               # a bound below its due (its run restarted): put back at it
                heapq.heappush(heap, (due, e[1], e[2], r))
            elif s[DONE] + (end - s[RUN]) > quanta[s[LVL]]:
                out.append(r)
            else:
                back.append(e)
        for e in back:
            heapq.heappush(heap, e)
        for r in self.x:
            s = r.aux
            if s[LVL] < last and s[DONE] + (end - s[RUN]) > quanta[s[LVL]]:
                out.append(r)
        return out

    def _advance(self, end: float, demoted: list[Request]) -> None:
        """One step's front pushes and demotions: each level's batch reversed, newcomers `x` at the
        front, jobs demoted into a level behind its batch (in batch order: B's, then newcomers).
        (`_place` and `_push_due` written out: this runs for every job that enters B.)"""
        q = self.q
        sign = self.sign
        x = self.x
        moved: dict[int, list] = {}             # old level -> its demoted jobs, in batch order
        if demoted:
            dem = {r.idx for r in demoted}
            b_dem = [r for r in demoted if r.aux[VAL] is not None]
            b_dem.sort(key=lambda r: (r.aux[LVL], sign * r.aux[VAL]))
            for r in b_dem:
                self._drop(r)
                moved.setdefault(r.aux[LVL], []).append(r)
            for r in x:
                if r.idx in dem:
                    moved.setdefault(r.aux[LVL], []).append(r)
        else:
            dem = ()
        sign = self.sign = -sign
        lv, lo, hi = self.lv, self.lo, self.hi
        heap = self.heap
        quanta = q.quanta
        last = q.levels - 1
        for r in x:                     # at the front of their levels, in batch order
            if r.idx in dem:
                continue
            a = r.aux
            L = a[LVL]
            d = lv[L]
            if not d:
                lo[L] = hi[L] = 0
            if sign > 0:
                v = lo[L] = lo[L] - 1
                d.insert(0, r)
            else:
                v = hi[L] = hi[L] + 1
                d.append(r)
            a[VAL] = r.key = v
            a[STAMP] += 1
            if L < last:
                heapq.heappush(heap, (quanta[L] - a[DONE] + a[RUN], r.idx, a[STAMP], r))
        for L, rs in moved.items():     # behind B's jobs of the next level
            L += 1
            d = lv[L]
            if not d:
                lo[L] = hi[L] = 0
            for r in reversed(rs):
                a = r.aux
                a[LVL] = L
                a[DONE] = 0.0
                a[RUN] = end            # its next run starts with the next step
                if sign > 0:
                    v = hi[L] = hi[L] + 1
                    d.append(r)
                else:
                    v = lo[L] = lo[L] - 1
                    d.insert(0, r)
                a[VAL] = r.key = v
                a[STAMP] += 1
                if L < last:
                    heapq.heappush(heap, (quanta[L] - a[DONE] + a[RUN], r.idx, a[STAMP], r))
            if L > q.deepest:
                q.deepest = L
        self.x = []

    def after_step(self, plan: Plan, start: float, end: float) -> None:
        """`SkipJoinMLFQ.after_step` on the lazy state."""
        q = self.q
        self._start_runs(start)
        demoted = self._due(end)
        self.last_end = end
        self.items_prev = [r for r, _ in plan.items]
        if self.ran is not None:
            self._advance_frozen(end, demoted)  # (never a starvation check: `_may_freeze`)
            self.items_prev += self.frz_items
            return
        if q._check_due():
            q._promote_starved(self._batch_ids(), start)
            self.others.sort(key=_KEY)          # promoted parked jobs have new keys
        self._advance(end, demoted)

    def _batch_ids(self) -> set:
        ids = set(r.idx for r in self.x)
        for d in self.lv:
            ids.update(r.idx for r in d)
        return ids

    def after_fast_forward(self, plan: Plan, starts, ends, k: int) -> None:
        """k steps of one batch, as k calls of `after_step` would keep them: newcomers start at the
        first; between the steps where a job is due (found from the heap, tested exactly at that
        step's end) only the order flips."""
        q = self.q
        ends_l = ends[:k].tolist()
        self._start_runs(float(starts[0]))
        self._advance(ends_l[0], self._due(ends_l[0]))
        j = 0
        heap = self.heap
        while True:
            self._top_due()
            if not heap:
                break
            nxt = bisect_left(ends_l, heap[0][0] - MARGIN, j + 1)   # the first step that may see it
            if nxt >= k - 1:
                break
            if (nxt - j - 1) % 2:
                self.sign = -self.sign
            self._advance(ends_l[nxt], self._due(ends_l[nxt]))
            j = nxt
        if (k - 2 - j) % 2:
            self.sign = -self.sign
        end = ends_l[k - 1]
        demoted = self._due(end)
        if q._check_due():
            q._promote_starved(self._batch_ids(), float(starts[k - 1]))
            self.others.sort(key=_KEY)
        self._advance(end, demoted)
        self.last_end = end
        self.items_prev = [r for r, _ in plan.items]

    def fast_forward_limit(self, plan: Plan, now: float):
        """The next starvation check, and a time before any job of the batch is due for demotion.

        When every running job is in the batch and nothing waits, a demotion cannot change the next
        batch (every job runs, in any order): it is made inside the run (`after_fast_forward`)."""
        q = self.q
        k = q.every - self.sim.iterations % q.every
        if not self.others and not len(q):
            return k, None
        heap = self.heap
        self._top_due()
        t = heap[0][0] if heap else math.inf
        last = q.levels - 1
        thaw = [r for r in self.thawing if r.aux[FRZ] >= 0] if self.thawing else ()
        for r in chain(self.x, thaw):
            s = r.aux
            if s[LVL] < last:
                done, s3 = s[DONE], s[RUN]
                if s[LAST] != now or s3 != s3:
                    if s3 == s3:
                        done = done + (s[LAST] - s3)
                    s3 = now
                due = q.quanta[s[LVL]] - done + s3
                if due < t:
                    t = due
        return k, (t - MARGIN if t < math.inf else None)


class _GiveWay(Exception):
    """The walk cannot settle this step: the full pass decides it."""


class _Walk:
    """One step's ranked fill over `MlfqCohort`'s kept levels, in `Continuous._plan_ranked`'s order
    and with its rules.

    The order is level by level: B's jobs of the level (members counted, not visited, unless the
    batch fills among them or jobs outside the cohort are among them), then the level's parked
    and waiting jobs by key. Blocks are checked against a lower bound of what is free (every
    member's new block taken first); where that fails, the exact count (the members reached so
    far, counted one by one) decides. A request that fits only by it goes to the full pass; one
    that does not fit makes room as `Continuous._make_room` does, preempting the worst-ranked
    running jobs not reached by swap, or finding the host full and preempting none. A preempted
    job is reached again where it ranked, as a waiting one: nothing after it starts.
    """

    __slots__ = ("kept", "cache", "bs", "lv", "nlev", "others", "waiting", "d", "wm", "cap", "budget",
                 "bitems", "free", "tight", "taken", "xr", "freed", "unc", "segs", "room", "host_full",
                 "preempted", "shorted", "n_oth", "io", "iw", "i", "pending", "selected", "admitting",
                 "cut", "acts", "sat", "victim", "vreq", "orders")

    def __init__(self, kept: "MlfqCohort", mode, waiting: list):
        sim = kept.sim
        self.kept = kept
        self.cache = sim.cache
        self.bs = sim.cache.block_size
        self.lv = kept.lv
        self.nlev = kept.q.levels
        self.others = kept.others
        self.waiting = waiting
        self.d = sim.dclock
        self.wm = mode.watermark_blocks
        self.cap = mode.max_num_seqs
        self.budget = mode.budget
        self.bitems: dict[int, list] = {}       # B's jobs outside the cohort, by level
        for r in kept.items_prev:
            if r.phase == RUNNING and r.sync < 0 and r.aux[VAL] is not None:
                self.bitems.setdefault(r.aux[LVL], []).append(r)
        # free blocks: a lower bound (every member's new block taken first), or where that leaves too
        # few (`tight`), the exact count, every member visited and given its block in rank order
        self.free = sim.cache.free - sim.cohort_crossings(self.d)
        self.tight = self.free < 0
        if self.tight:
            self.free = sim.cache.free
        self.taken = self.xr = self.freed = 0   # blocks taken by items, by members counted, freed by victims
        self.unc: list = []             # levels whose members were all reached, not yet counted
        self.segs: list = []            # (order, a, b): members order[a:b] reached, not yet counted
        self.room = sim.host_blocks - sim.host_used
        self.host_full = self.preempted = False
        self.shorted = False            # a running job reached found no block (`short`)
        self.n_oth = len(self.others)
        self.io = self.iw = self.i = 0
        self.pending = len(sim.running)
        self.selected = 0
        self.admitting = True
        self.cut = None                 # (level, reached): the batch filled inside B's level
        self.acts: list = []            # (request, tokens, blocks, action, in B), in the walk's order
        self.sat: list = []             # B's jobs reached that sat out (the host full)
        self.victim = self.vreq = None  # the best-ranked job preempted so far: its rank, itself
        self.orders: dict[int, list] = {}   # B's levels in rank order, made when needed (less victims)

    def order_of(self, L: int) -> list:
        o = self.orders.get(L)
        if o is None:
            o = self.orders[L] = self.kept._actual(L)
        return o

    def exact_free(self) -> int:
        """Blocks free at this point of the pass, the members reached counted one by one."""
        d, bs = self.d, self.bs
        n = 0                           # (every job counted here is a member)
        for L in self.unc:
            for r in self.lv[L]:
                if not (r.pval + d) % bs:
                    n += 1
        self.unc.clear()
        for order, a, b in self.segs:
            for i in range(a, b):
                if not (order[i].pval + d) % bs:
                    n += 1
        self.segs.clear()
        self.xr += n
        return self.cache.free - self.taken - self.xr + self.freed

    def run(self) -> None:
        """Walk the rank order until the batch is full or nothing more can start."""
        lv, nlev = self.lv, self.nlev
        others, waiting = self.others, self.waiting
        L = 0
        while True:
            c = others[self.io] if self.io < self.n_oth else None
            ck = None if c is None else c.key
            if self.iw < len(waiting) and self.admitting:
                w = waiting[self.iw]
                if c is None or w.key < ck:
                    c, ck = w, w.key
            if self.victim is not None and self.admitting and (c is None or self.victim < ck):
                c, ck = self.vreq, self.victim      # the best-ranked victim, waiting again where it ranked
            top = ck[0] if c is not None else nlev - 1
            vreq = self.vreq
            while L <= top:
                if lv[L] and not self.level(L):
                    return                  # the batch filled inside this level
                L += 1
            if self.vreq is not vreq:
                continue                    # jobs were preempted on the way (`c` among them, or after)
            if c is None:
                return
            if self.selected >= self.cap or self.budget <= 0:
                self.cut = (L, 0)
                return
            if not self.pending and not self.admitting:
                return
            if c is self.vreq:
                # every running job left ranks before it (the victims were the worst): if it fits
                # it would start again (the full pass decides), else nothing after it starts
                if self.kept._readmit_need(c, self.budget, self.d) <= self.exact_free() - self.wm:
                    raise _GiveWay
                return
            if c.phase == RUNNING:
                self.io += 1
                self.take_running(c, L, None, False)
            else:
                self.iw += 1
                self.take_waiting(c, L)

    def level(self, L: int) -> bool:
        """B's jobs of level L, in rank order; False where the batch filled among them."""
        if not self.tight and L not in self.orders:
            its = self.bitems.get(L)
            if its:
                return self.level_items(L, its)
            m = len(self.lv[L])         # members only: counted
            t = max(0, min(m, self.cap - self.selected, self.budget))
            self.selected += t
            self.budget -= t
            self.pending -= t
            if t < m:
                self.cut = (L, t)
                return False
            self.unc.append(L)
            return True
        return self.visit(L, self.order_of(L), 0)

    def count(self, L: int, order: list, a: int, b: int) -> bool:
        """Members order[a:b] take one token each as far as the batch has room (their blocks are
        counted when an exact count is wanted); False where it filled among them."""
        m = b - a
        t = max(0, min(m, self.cap - self.selected, self.budget))
        if t:
            self.selected += t
            self.budget -= t
            self.pending -= t
            self.segs.append((order, a, a + t))
        if t < m:
            self.cut = (L, a + t)
            return False
        return True

    def level_items(self, L: int, its: list) -> bool:
        """Level L with B's jobs outside the cohort `its` among its members: the members between them
        counted, each of them taken in its place; one by one from where blocks run short or room
        was made (`visit`)."""
        order = self.order_of(L)
        if self.kept.sign > 0:
            at = sorted(bisect_left(order, r.key, key=_KEY) for r in its)
        else:
            at = sorted(bisect_left(order, -r.key, key=_NEG_KEY) for r in its)
        n = len(order)
        i = 0
        for p in at:
            if not self.count(L, order, i, p):
                return False
            if self.selected >= self.cap or self.budget <= 0:
                self.cut = (L, p)
                return False
            self.i = p
            self.take_running(order[p], L + 1, L, True)
            i = p + 1
            if self.tight or len(order) != n:
                return self.visit(L, order, i)
        return self.count(L, order, i, n)

    def visit(self, L: int, order: list, i: int) -> bool:
        """B's jobs of level L in rank order from order[i], one by one; False where the batch
        filled among them."""
        d, bs, cap = self.d, self.bs, self.cap
        # members that need no block take one token each, counted in locals; the rest are taken
        # by calls that read and write the walk's own counts (and `i`, where room is made)
        sel, bud, pend = self.selected, self.budget, self.pending
        while i < len(order):           # (`make_room` may drop victims from this order's end)
            if sel >= cap or bud <= 0:
                self.selected, self.budget, self.pending = sel, bud, pend
                self.cut = (L, i)
                return False
            r = order[i]
            if r.sync >= 0 and (r.pval + d) % bs:
                sel += 1
                bud -= 1
                pend -= 1
            else:
                self.selected, self.budget, self.pending, self.i = sel, bud, pend, i
                if r.sync >= 0:
                    self.take_member(r, L)
                else:
                    self.take_running(r, L + 1, L, True)
                sel, bud, pend = self.selected, self.budget, self.pending
            i += 1
        self.selected, self.budget, self.pending = sel, bud, pend
        return True

    def go_tight(self) -> None:
        """Count blocks exactly from here on: every member visited and given its block as reached."""
        if not self.tight:
            self.free = self.exact_free()
            self.tight = True

    def take_member(self, r: Request, L: int) -> None:
        """A member that needs a new block this step: counted, or (`tight`) given it, room made for
        it, or preempted itself, or it sits out (a full host)."""
        self.pending -= 1
        self.selected += 1
        self.xr += 1
        if self.tight:
            if self.free < 1:
                if self.pending and not self.make_room(1, L + 1, L):
                    self.host_full = True       # (as `_make_room` marks it, whatever follows)
                if self.free < 1:
                    self.xr -= 1
                    self.short(r, -(-(r.pval + self.d) // self.bs), True)
                    return
            self.free -= 1
        self.budget -= 1

    def short(self, r: Request, blocks: int, in_b: bool) -> None:
        """A running job reached finds no block even after room was made: swapped out itself if
        the host can take it, else it sits out, holding its KV (the host full)."""
        self.selected -= 1
        self.shorted = True
        if self.room >= blocks:
            self.room -= blocks
            self.free += blocks
            self.freed += blocks
            self.preempted = True
            self.acts.append((r, 0, blocks, _PREEMPT, in_b))
        else:
            self.host_full = True
            if in_b:
                self.sat.append(r)

    def take_running(self, r: Request, bmin: int, cur: int | None, in_b: bool) -> None:
        """A running job outside the cohort reached: its tokens and blocks, room made for them, or
        it is short (`short`)."""
        self.pending -= 1
        self.selected += 1
        k = min(r.prompt + r.generated - r.computed, self.budget)
        need = -(-(r.computed + k) // self.bs) - r.blocks
        if need > self.free:
            self.go_tight()
            if need > self.free:
                if self.pending and not self.make_room(need, bmin, cur):
                    self.host_full = True
                if need > self.free:
                    self.short(r, r.blocks, in_b)
                    return
        self.free -= need
        self.taken += need
        self.budget -= k
        self.acts.append((r, k, need, _RUN, in_b))

    def take_waiting(self, c: Request, L: int) -> None:
        """A waiting job reached: admitted, room made for it, or admissions stop here."""
        k = min(c.prompt + c.generated - c.computed, self.budget)
        need = -(-(c.computed + k) // self.bs)
        wm = self.wm
        if need > self.free - wm:
            self.go_tight()
            if need > self.free - wm:
                if self.pending and not self.make_room(need + wm, L, None):
                    self.host_full = True
                if need > self.free - wm:
                    self.admitting = False  # head-of-line: nothing ranked below it starts
                    return
        self.free -= need
        self.taken += need
        self.budget -= k
        self.selected += 1
        self.room += c.swapped              # its KV comes back from the host
        self.acts.append((c, k, need, _ADMIT, False))

    def make_room(self, need: int, bmin: int, cur: int | None) -> bool:
        """`Continuous._make_room(need)` over the running jobs not reached — B's levels from `bmin`,
        the rest of level `cur`'s order after the job reached, the parked jobs from `io` — worst
        first: True if victims were preempted (by swap), False if the host cannot take the first
        one it needs (none is preempted)."""
        lv, others = self.lv, self.others
        d, bs = self.d, self.bs
        freed = self.exact_free()
        room = self.room
        vict = []
        j = self.n_oth - 1
        io = self.io
        low = min(bmin, cur if cur is not None else self.nlev)
        for L in range(self.kept.q.deepest, -1, -1):   # (no job is below the deepest level reached)
            while j >= io and others[j].aux[LVL] == L:     # parked jobs rank after B's in a level
                if freed >= need:
                    break
                v = others[j]
                j -= 1
                if v.blocks > room:
                    return False
                room -= v.blocks
                freed += v.blocks
                vict.append((v, v.blocks))
            if L >= bmin and lv[L]:
                order, stop = self.order_of(L), -1
            elif L == cur:
                order, stop = self.order_of(L), self.i
            else:
                order = None
            if order is not None:
                for n in range(len(order) - 1, stop, -1):
                    if freed >= need:
                        break
                    v = order[n]
                    vb = -(-(v.pval + d) // bs) if v.sync >= 0 else v.blocks
                    if vb > room:
                        return False
                    room -= vb
                    freed += vb
                    vict.append((v, vb))
            if freed >= need or (L <= low and j < io):
                break
        if freed < need:
            raise _GiveWay                  # every job not reached goes, and it is still short
        best = vict[-1][0]
        self.victim = (best.aux[LVL], -math.inf, 0) if best.aux[VAL] is not None else best.key
        self.vreq = best
        for v, vb in vict:
            if v.aux[VAL] is None:
                self.n_oth -= 1
            else:
                self.orders[v.aux[LVL]].pop()   # the worst of its level's kept order
            self.free += vb
            self.freed += vb
            self.pending -= 1
            self.acts.append((v, 0, vb, _PREEMPT, v.aux[VAL] is not None))
        self.room = room
        self.preempted = True
        return True

    def sitters(self) -> list:
        """B's jobs the batch left out (after the cut), in rank order."""
        if self.cut is None:
            return []
        L0, reached = self.cut
        sit = []
        if reached:
            sit.extend(self.order_of(L0)[reached:])
        else:
            L0 -= 1
        for L in range(L0 + 1, self.nlev):
            if self.lv[L]:
                sit.extend(self.order_of(L))
        return sit
