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
  `last_end` and an open run; it is demoted at the first step end where ``served + (end - run_start) >
  quantum``, found from a heap of due times (`schedport.engine.fast.mlfq_due`). A fast-forward
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
* **The walk** (`MlfqCohort.walk`, `Walk`) takes the ranked fill's batch over levels: a level's
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
push at its last step did (`SkipJoinMLFQ.to_front`). `SkipJoinMLFQ` uses this in fast mode only;
`--exact` runs the rules as written, and the two agree bit for bit. The rules' arithmetic is
written once for both: the due time, the demotion test and closing a run are `MLFQJob`'s, the front
push and the starvation check `SkipJoinMLFQ`'s public surface. `MlfqCohort` holds the last batch's
order level by level, and two parts: its due times (`dues`, a `DueHeap`) and the freezing steps'
state (`freezing`, a `Freezing`).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import chain, islice

from schedport.engine.fast.mlfq_due import MARGIN, DueHeap
from schedport.engine.policies.mlfq_job import FROZEN, NO_ENTRY, THAWED
from schedport.engine.fast.mlfq_walk import ACT_PREEMPT, ACT_RUN, BY_KEY, GiveWay, Walk
from schedport.engine.policies.policy import Plan
from schedport.engine.core.simulator import RUNNING, Request


class Freezing:
    """The freezing steps' part of `MlfqCohort` (`MlfqCohort._freeze`): which of B's jobs sit out
    frozen, and what a freezing step ran, for its front pushes after the step (`_advance_frozen`)."""

    __slots__ = ("frozen", "thawing", "batch", "leads", "items", "outside")

    def __init__(self):
        self.frozen: list[Request] = []     # B's jobs frozen at the last step (they sat out, the cohort stood still)
        self.thawing: list[Request] = []    # the jobs frozen before this step: those in its batch thaw
        self.batch: list[Request] | None = None  # a freezing step's batch, in rank order (None: not one)
        self.leads: list = []           # and (level, how many of B's jobs lead it) in that batch
        self.items: list[Request] = []      # and its items outside the cohort
        self.outside: list[Request] = []    # the frozen jobs outside the cohort

    def thaw_next(self) -> None:
        """The jobs frozen at the last step thaw at this one if its batch takes them
        (`MlfqCohort._start_runs`); a step that freezes again says which (`MlfqCohort._freeze`)."""
        self.thawing = self.frozen
        self.frozen = []


class MlfqCohort:
    """The lazy MLFQ state of one fast-mode run (module docstring)."""

    __slots__ = (
        "mlfq", "sim",
        # the last batch B, level by level: its jobs and their values (rank order: ascending sign * value)
        "by_level", "values", "low", "high", "sign", "last_end",
        "dues",                         # B's due times (`DueHeap`)
        # the jobs outside B, and those this step takes into it
        "parked", "last_items", "joined",
        "written_out", "freezing")

    def __init__(self, q):
        self.mlfq = q                   # the `SkipJoinMLFQ` whose state this keeps
        self.sim = q.sim
        n = q.levels
        self.by_level: list[list[Request]] = [[] for _ in range(n)]  # B's jobs by level, by value ascending
        self.values: list[list[int]] = [[] for _ in range(n)]  # their values, to find a job by bisection
        self.low = [0] * n              # each level's lowest value given (the next front push goes below)
        self.high = [0] * n             # and highest
        self.sign = 1                   # each level's rank order is ascending sign * value
        self.last_end = -math.inf       # the last step's end
        self.dues = DueHeap(q.quanta, q.bounds)     # B's jobs' due times (`fast.mlfq_due`)
        self.parked: list[Request] = []     # running jobs outside B, by key
        self.last_items: list[Request] = []  # last step's items (B's jobs outside the cohort)
        self.joined: list[Request] = []     # jobs outside B this step's batch took, in rank order
        self.written_out = False        # the full pass decides this step, on written-out state
        self.freezing = Freezing()
        if getattr(q, "cohort_changed", None) is None:
            self.sim.listen_cohort(None)    # nothing listens to cohort joins and leaves

    # ------------------------------------------------------------------ B's upkeep
    def level_order(self, L: int) -> list[Request]:
        """B's jobs of level L in rank order."""
        o = self.by_level[L]
        return o[:] if self.sign > 0 else o[::-1]

    def _drop(self, r: Request) -> None:
        """Take B's job `r` out of its level (its value, in `key`, places it)."""
        L = r.aux.level
        k = self.values[L]
        i = bisect_left(k, r.key)
        del k[i]
        del self.by_level[L][i]

    def _cut(self, L: int, order: list[Request]) -> None:
        """Take B's jobs `order` (level L, in its rank order) out of their level: in one cut where
        they sit side by side (a batch's cut, jobs demoted together), else one by one."""
        o, k = self.by_level[L], self.values[L]
        n = len(order)
        v0, v1 = (order[0].key, order[-1].key) if self.sign > 0 else (order[-1].key, order[0].key)
        i = bisect_left(k, v0)
        if k[i + n - 1] == v1:
            del o[i:i + n], k[i:i + n]
        else:
            for r in order:
                self._drop(r)

    def _to_front(self, L: int, rs: list[Request], at_low: bool) -> None:
        """Push `rs` to the front of level L's kept order, each in turn (the last pushed leads), as
        `SkipJoinMLFQ.to_front` pushes jobs to the front of their queue: each takes a value past the
        level's end that is its front, the low end where `at_low`, else the high end."""
        d, k = self.by_level[L], self.values[L]
        if not d:
            self.low[L] = self.high[L] = 0
        n = len(rs)
        if at_low:
            v = self.low[L]
            self.low[L] = v - n
            d[0:0] = rs[::-1]
            k[0:0] = range(v - n, v)
            for r in rs:
                v -= 1
                r.aux.value = r.key = v
        else:
            v = self.high[L]
            self.high[L] = v + n
            d.extend(rs)
            k.extend(range(v + 1, v + n + 1))
            for r in rs:
                v += 1
                r.aux.value = r.key = v

    def _write_out(self, order: list[Request]) -> None:
        """B's jobs `order` (one level, rank order) leave B: explicit positions, last end, runs."""
        q = self.mlfq
        end = self.last_end
        self._cut(order[0].aux.level, order)
        for r in reversed(order):
            a = r.aux
            q.to_front(r)
            if a.frozen < 0:
                a.last_end = end
                if a.run_start == end:  # demoted at its last step: no run open yet
                    a.run_start = math.nan
            else:
                a.frozen = THAWED       # frozen: its last end and run were written when it froze
            a.value = None              # (its due entry stays: a bound below its due when it rejoins)

    def materialize(self) -> None:
        """Write every B job's state out, as `SkipJoinMLFQ.after_step` would have kept it, for the
        full pass; `rebuild` takes it up again after the step."""
        for L in range(self.mlfq.levels):
            if self.by_level[L]:
                self._write_out(self.level_order(L))
        self.dues.clear()
        self.parked = []
        self.freezing = Freezing()
        self.written_out = True

    def rebuild(self, batch: list[Request], end: float) -> None:
        """After a step run on explicit state: its batch is B, in the positions it was given."""
        self.written_out = False
        self.last_end = end
        self.sign = 1
        by = {}
        for r in batch:
            if r.phase == RUNNING:
                by.setdefault(r.aux.level, []).append(r)
        for L, rs in by.items():
            rs.sort(key=BY_KEY)
            for i, r in enumerate(rs):
                a = r.aux
                a.value = r.key = i
                if a.run_start != a.run_start:
                    a.run_start = end        # demoted: its next run starts with the next step
                self.dues.push(r)
            self.by_level[L] = rs
            self.values[L] = list(range(len(rs)))
            self.low[L], self.high[L] = 0, len(rs) - 1
        self.parked = sorted((r for r in self.sim.running if r.aux.value is None), key=BY_KEY)
        self.last_items = list(batch)
        self.joined = []

    def resume(self) -> None:
        """Take the lazy state up again after a step on written-out state that ran nothing (it only
        preempted): no job ran last, so B is empty and every running job is parked, out of the
        cohort the engine rebuilt."""
        if self.written_out:
            self.written_out = False
            self.sim.sync_all()
            self.parked = sorted(self.sim.running, key=BY_KEY)
            self.last_items = []
            self.joined = []

    def left(self, r: Request) -> None:
        """A job finished (or was preempted on written-out state): it leaves B or the parked set."""
        a = r.aux
        if a.value is not None:
            self._drop(r)
            a.value = None
        else:
            self._unpark(r)

    def _unpark_all(self, rs: list[Request]) -> None:
        """The parked jobs `rs` (in rank order) leave the parked set: where they are its first ones,
        as when the walk took every parked job it reached, in one cut."""
        o = self.parked
        n = len(rs)
        if o[:n] == rs:                 # (the same jobs: a request compares by identity)
            del o[:n]
        else:
            for r in rs:
                self._unpark(r)

    def _unpark(self, r: Request) -> None:
        """`r` leaves the parked jobs, if it is one."""
        o = self.parked
        i = bisect_left(o, r.key, key=BY_KEY)
        if i < len(o) and o[i] is r:
            del o[i]

    # ------------------------------------------------------------------ the walk
    def walk(self, mode, sched, now: float, gated: bool, host_was_full: bool) -> Plan | None:
        """The ranked fill's batch (`Continuous._plan_ranked`'s rules) over the lazy levels, or None
        where the full pass must decide (module docstring, `Walk`)."""
        if not mode.swap:
            return None
        sim = self.sim
        self.freezing.thaw_next()
        waiting = self.mlfq.ordered(now)
        if not waiting:
            for r in self.parked:
                if r.sync >= 0:         # joined by a shortcut that then gave way (`plan_running_bulk`)
                    sim.cohort_leave(r)
        elif gated:
            # a context-stage job is held back while the gate is closed: only the rest can start
            waiting = self.mlfq.ordered_resumable(now)
        w = Walk(self, mode, waiting)
        try:
            w.run()
        except GiveWay:
            return None
        if w.host_full and not w.selected and not w.preempted:
            return None                     # nothing runs: the full pass breaks the stall
        if self._may_freeze(w):
            return self._freeze(sched, now, w)
        sit = w.sitters()
        if w.sat_out:
            sit = w.sat_out + sit
        plan = self._apply(sched, now, w.acts, sit, w.preempted)
        if w.host_full:
            plan.host_full = True
            plan.decode_only = False
            sim.host_full_prev = True
            if not host_was_full:
                sim.host_full_events += 1
        return plan

    def readmit_need(self, r: Request, budget: int, d: int) -> int:
        """The blocks a job the walk preempts by swap would need to start again this step."""
        if r.sync >= 0:
            computed, generated = r.pval + d, r.generated + d - r.sync
        else:
            computed, generated = r.computed, r.generated
        k = min(r.prompt + generated - computed, budget)
        return -(-(computed + k) // self.sim.cache.block_size)

    def _apply(self, sched, now: float, acts: list, sit: list, preempted: bool) -> Plan:
        """Carry out a walk's decisions in its order: B's jobs that sat out leave B (parked), then
        the preemptions, admissions and running jobs taken; members' new blocks are taken once
        the members are known, and parked decoders join the cohort after."""
        sim = self.sim
        sim.host_full_prev = False
        plan = Plan()
        plan.cohort = True
        hook = sim.cohort_listener
        if sit or preempted:
            self._leave_b(acts, sit)
        if sit:
            sim.cohort_leave_all([r for r in sit if r.sync >= 0], hook)
            self._park(sit)
        x = self.joined = []
        join = []
        unparked = []
        for r, k, need, act, in_b in acts:
            if act != ACT_RUN:
                self._preempt_or_admit(sched, now, plan, r, need, act)
                if act == ACT_PREEMPT:
                    continue
                plan.add(r, k)
            else:
                if need > 0:
                    sim.allocate(r, need)
                if r.decoding:
                    join.append(r)
                else:
                    plan.add(r, k)
            if not in_b:
                if act == ACT_RUN:
                    unparked.append(r)
                x.append(r)
        if unparked:
            self._unpark_all(unparked)
        sim.cache.free -= sim.cohort_crossings(sim.decode_clock)
        if join:
            sim.cohort_join_all(join, hook)
        # (the items are prefills and admissions: none is a member)
        plan.parked = len(sim.running) - sim.cohort_n - len(plan.items)
        if plan.admitted or plan.preempted:
            plan.decode_only = False
        return plan

    def _park(self, rs: list[Request]) -> None:
        """Jobs just written out of B join the parked ones: their fresh front positions rank them
        before every parked job of their level, so each level's go in as one block."""
        o = self.parked
        new = sorted(rs, key=BY_KEY)
        i, n = 0, len(new)
        while i < n:
            L = new[i].aux.level
            j = i + 1
            while j < n and new[j].aux.level == L:
                j += 1
            p = bisect_left(o, (L,), key=BY_KEY)
            o[p:p] = new[i:j]
            i = j

    def _leave_b(self, acts: list, sit) -> None:
        """B's jobs that leave it (sitters `sit`, and jobs the walk preempted) get their positions
        level by level in rank order, together: one may have ranked before another of either kind."""
        leave: dict[int, list] = {}
        for r, _, _, act, in_b in acts:
            if act == ACT_PREEMPT and in_b:
                leave.setdefault(r.aux.level, []).append(r)
        for r in sit:
            leave.setdefault(r.aux.level, []).append(r)
        for rs in leave.values():
            rs.sort(key=BY_KEY, reverse=self.sign < 0)
            self._write_out(rs)

    def _preempt_or_admit(self, sched, now: float, plan: Plan, r: Request, need: int, act: int) -> None:
        """Carry out a walk's preemption (by swap) or admission."""
        if act == ACT_PREEMPT:
            self._unpark(r)
            self.sim.preempt(r, True)
            plan.preempted += 1
        else:
            self.mlfq.remove(r)
            sched.admit(r, now)
            self.sim.allocate(r, need)
            plan.admitted += 1

    def ran_all(self, plan: Plan) -> None:
        """A step where every running job (and every waiting one the plan admitted) runs: the jobs
        outside B (the parked ones and the admitted) join it."""
        self.freezing.thaw_next()
        x = self.parked
        if plan.admitted:
            seen = {r.idx for r in x}
            x = x + [r for r, _ in plan.items if r.aux.value is None and r.idx not in seen]
            x.sort(key=BY_KEY)
        self.joined = x
        self.parked = []

    def over_budget(self, budget: int) -> bool:
        """Do the running jobs' needs exceed the token budget? (Then no shortcut can serve them all,
        and the walk decides without the cohort taking in the parked jobs first.)"""
        tokens = self.sim.cohort_n
        for r in self.parked:
            tokens += r.prompt + r.generated - r.computed
        for r in self.last_items:
            if r.phase == RUNNING and r.sync < 0 and r.aux.value is not None:
                tokens += r.prompt + r.generated - r.computed
        return tokens > budget

    # ------------------------------------------------------------------ freezing
    def _may_freeze(self, w: "Walk") -> bool:
        """Can the walk's sitters (B's jobs after its cut) stay in B, frozen, while the cohort stands
        still this step? Where more of B sits out than runs, the batch cut clean (no job of B
        reached was short of a block, the host not full) and the step is no starvation check."""
        if w.cut is None or w.shorted or w.host_full or w.sat_out:
            return False
        n_b = len(self.sim.running) - len(self.parked)  # (every running job is in B or parked)
        return 2 * w.n_sitters() > n_b and self.mlfq.steps_to_starvation_check() != 1

    def _freeze(self, sched, now: float, w: "Walk") -> Plan:
        """A step where most of B sits out (a long prefill ranked first took the budget): the cohort
        stands still and B's sitters stay in B, frozen, where the front pushes of the few jobs that
        run leave them (`_advance_frozen`); the jobs that run take their tokens as items.

        A frozen job was not pushed this step: it keeps its place behind this step's batch, ahead
        of every older position, as its own push at its last step left it. Its run closes at that
        step's end (`last_end`); the step that takes it again opens a new one (`_start_runs`), and one
        that leaves it out writes it out as any sitter (`_write_out`). Freezing saves the sitters'
        leaving and rejoining B and the cohort one by one when the next step takes them all back.
        """
        sim = self.sim
        sim.host_full_prev = False
        plan = Plan()
        lv = self.by_level
        L0, reached = w.cut
        # the sitters not frozen yet: in each level they rank before the frozen ones (a suffix, so
        # a level whose first job is frozen is frozen whole). B's jobs the walk preempted rank last
        # and are written out below: one frozen first is written out alike.
        end = self.last_end
        fz = self.freezing
        frz = fz.thawing                # the jobs frozen before this step (`Freezing.thaw_next`): some thaw in it
        at_low = self.sign > 0
        for L in range(L0, self.mlfq.deepest + 1):  # (no job is below the deepest level reached)
            d = lv[L]
            if not d:
                continue
            if L == L0 and reached:
                seq = islice(d if at_low else reversed(d), reached, None)
            elif (d[0] if at_low else d[-1]).aux.frozen >= 0:
                continue
            else:
                seq = d if at_low else reversed(d)
            for r in seq:
                a = r.aux
                if a.frozen >= 0:
                    break
                a.frozen = FROZEN
                a.last_end = end           # (one demoted at its last step has a run [end, end]: it adds 0.0)
                # (its due entry stays: a bound below its due once it thaws, as its run restarts later)
                frz.append(r)
        # the frozen jobs outside the cohort (before or now): B's jobs outside it are the walk's `outside_by_level`
        items_out = [r for its in w.outside_by_level.values() for r in its if r.aux.frozen >= 0]
        # the walk's decisions in its order, as `_apply` makes them (B's jobs preempted written out
        # first; a preemption frees host room an admission may take back)
        self._leave_b(w.acts, ())
        ks = {}
        outside = []
        for r, k, need, act, in_b in w.acts:
            if act != ACT_RUN:
                self._preempt_or_admit(sched, now, plan, r, need, act)
                if act == ACT_PREEMPT:
                    continue
            elif need > 0:
                sim.allocate(r, need)
            ks[r.idx] = k
            if not in_b:
                if act == ACT_RUN:
                    self._unpark(r)
                outside.append(r)
        # the batch in rank order, level by level: B's jobs reached, then the jobs outside B
        items = plan.items
        ran = []
        cut = fz.leads = []             # (level, how many of B's lead it in the batch)
        x = self.joined = []
        out = fz.items = []             # the batch's items outside the cohort, in its order
        j = 0
        n_out = outside_cohort = len(outside)   # the batch's items outside the cohort, counted
        for L in range(self.mlfq.levels):
            if L > L0 and j == n_out:
                break
            if L <= L0 and lv[L]:
                if L < L0 or L in w.orders:
                    order = w.order_of(L)
                    if L == L0:
                        order = order[:reached]
                else:                   # (its first `reached` only, in rank order: no copy of the level)
                    order = lv[L][:reached] if at_low else lv[L][:-reached - 1:-1]
                cut.append((L, len(order)))
                if not w.outside_by_level.get(L):  # members only: made exact, given their next blocks, items
                    sim.serve_alone(order, items)
                else:
                    alone = []
                    for r in order:
                        if r.sync >= 0:
                            alone.append(r)
                        else:
                            if alone:
                                sim.serve_alone(alone, items)
                                alone = []
                            items.append((r, ks[r.idx]))     # (`Plan.add`: the step is not decode-only)
                            out.append(r)
                            outside_cohort += 1
                    if alone:
                        sim.serve_alone(alone, items)
                ran += order
            while j < n_out and outside[j].aux.level == L:
                r = outside[j]
                j += 1
                items.append((r, ks[r.idx]))     # (`Plan.add`: the step is not decode-only)
                out.append(r)
                x.append(r)
                ran.append(r)
        if j < n_out:
            raise RuntimeError("internal: a frozen step's batch is not in level order")
        fz.batch = ran
        # every frozen job sits this step; those the batch took thaw (`_start_runs`)
        fz.thawing = [r for r in ran if r.aux.frozen >= 0]
        fz.frozen = frz                 # (those that thaw, or leave B, are passed over later)
        # B's sitters outside the cohort are visited by the next walk, as B's items of this step are
        if fz.thawing and items_out:
            thawed = {r.idx for r in fz.thawing}
            items_out = [r for r in items_out if r.idx not in thawed]
        fz.outside = items_out
        plan.parked = len(sim.running) - sim.cohort_n - outside_cohort
        plan.decode_only = False
        return plan

    def _advance_frozen(self, end: float) -> None:
        """A freezing step's demotions and front pushes: each job of its batch, in batch order, goes
        to the front of its level (the next one if demoted), ahead of the frozen jobs; the order does
        not flip. B's jobs that ran lead their levels' rank order (`_freeze`), so each level's are
        cut off together, and each level's pushes go in as one block. Every job that ran gets its
        due entry when the heap is next read (`DueHeap.settle`)."""
        q = self.mlfq
        lv, vk = self.by_level, self.values
        ran = self.freezing.batch
        at_low = self.sign > 0          # rank order ascends with the list: the front is its start
        for L, n in self.freezing.leads:
            if n:
                if at_low:
                    del lv[L][:n], vk[L][:n]
                else:
                    del lv[L][-n:], vk[L][-n:]
        # the pushes by level, in batch order (levels ascend in it: one demoted into a level is
        # pushed before that level's own jobs). Only the jobs that ran can be demoted, so each is
        # tested exactly (one that passes is within the heap's margin of its due, where the heap
        # would pick it), and the heap, where the frozen jobs' entries stay, is left alone.
        to: dict[int, list] = {}
        bounds = q.bounds
        for r in ran:
            a = r.aux
            if a.exceeds(bounds, end):
                a.demote(end)           # its next run starts with the next step
            L = a.level
            g = to.get(L)
            if g is None:
                to[L] = [r]
            else:
                g.append(r)
        for L, rs in to.items():
            if L > q.deepest:
                q.deepest = L
            self._to_front(L, rs, at_low)
        self.dues.unsettled += ran      # (their due entries are made when the heap is next read: `settle`)
        self.freezing.batch = None
        self.joined = []

    # ------------------------------------------------------------------ after the step
    def _start_runs(self, start: float) -> None:
        """The jobs that joined the batch start a run (closing the one they left open), and the
        frozen jobs it took thaw: a new run, and a due time."""
        for r in self.joined:
            r.aux.run_from(start)
        if self.freezing.thawing:
            for r in self.freezing.thawing:
                s = r.aux
                f = s.frozen
                if f >= 0:              # (not written out; a job of B has a run open, `_freeze`)
                    s.close_run()
                    s.run_start = start
                    s.frozen = THAWED
                    if f == NO_ENTRY:
                        self.dues.push(r)
            self.freezing.thawing = []

    def _advance(self, end: float, demoted: tuple[dict, list]) -> None:
        """One step's front pushes and demotions: each level's batch reversed, newcomers (`joined`) at the
        front, jobs demoted into a level behind its batch (in batch order: B's, then newcomers)."""
        x = self.joined
        down, xs = demoted              # (`DueHeap.demoted`: B's by the level they leave, as due entries; newcomers)
        if not x and not down:          # (then no newcomer is demoted either) the order flips, no more
            self.sign = -self.sign
            return
        q = self.mlfq
        sign = self.sign
        moved: dict[int, list] = {}             # old level -> its demoted jobs, in batch order
        if down or xs:
            dem = {r.idx for r in xs} if xs else ()
            for L, es in down.items():  # B's: in their level's rank order, out of it
                rs = moved[L] = [e[1] for e in es]
                rs.sort(key=BY_KEY, reverse=sign < 0)
                self._cut(L, rs)
            for r in x:
                if r.idx in dem:
                    moved.setdefault(r.aux.level, []).append(r)
        else:
            dem = ()
        sign = self.sign = -sign
        if x:                           # at the front of their levels, in batch order
            fronts: dict[int, list] = {}
            for r in x:
                if r.idx not in dem:
                    fronts.setdefault(r.aux.level, []).append(r)
            for L, rs in fronts.items():
                self._to_front(L, rs, sign > 0)
            for r in x:
                if r.idx not in dem:
                    self.dues.push(r)
        for L, rs in moved.items():     # behind B's jobs of the next level
            L += 1
            # pushed to the front one by one in batch order before B's jobs of the level (the batch
            # ranks level by level), so behind them once the order flipped: the front as it was
            rs.reverse()
            fresh = [r for r in rs if r.aux.value is None]  # newcomers (B's had their entries moved in `demoted`)
            for r in rs:
                r.aux.demote(end)       # (from L - 1) its next run starts with the next step
            self._to_front(L, rs, sign < 0)
            for r in fresh:
                self.dues.push(r)
            if L > q.deepest:
                q.deepest = L
        self.joined = []

    def after_step(self, plan: Plan, start: float, end: float) -> None:
        """`SkipJoinMLFQ.after_step` on the lazy state."""
        q = self.mlfq
        self._start_runs(start)
        # (no member leaves the cohort until the next plan)
        if self.freezing.batch is not None:
            self.last_items = [r for r in self.freezing.items if r.sync < 0] + self.freezing.outside
            self.dues.held += end - start   # the heap's time stands still (`DueHeap.settle`)
            self.last_end = end
            self._advance_frozen(end)   # (never a starvation check: `_may_freeze`)
            return
        self.last_items = [r for r, _ in plan.items if r.sync < 0] if plan.items else []
        demoted = self.dues.demoted(end, self.joined, self.last_end)
        self.last_end = end
        if q.starvation_check_due():
            q.promote_starved(self._batch_ids(), start)
            self.parked.sort(key=BY_KEY)    # promoted parked jobs have new keys
        self._advance(end, demoted)

    def _batch_ids(self) -> set:
        ids = set(r.idx for r in self.joined)
        for d in self.by_level:
            ids.update(r.idx for r in d)
        return ids

    def after_fast_forward(self, plan: Plan, starts, ends, k: int) -> None:
        """k steps of one batch, as k calls of `after_step` would keep them: newcomers start at the
        first; between the steps where a job is due (found from the heap, tested exactly at that
        step's end) only the order flips."""
        q = self.mlfq
        ends_l = ends[:k].tolist()
        self._start_runs(float(starts[0]))
        dues = self.dues
        self._advance(ends_l[0], dues.demoted(ends_l[0], self.joined, self.last_end))
        j = 0
        heap = dues.times
        held = dues.held                # (no freezing step inside the run)
        while True:
            dues.top(self.last_end)
            if not heap:
                break
            nxt = bisect_left(ends_l, heap[0] + held - MARGIN, j + 1)   # the first step that may see it
            if nxt >= k - 1:
                break
            if (nxt - j - 1) % 2:
                self.sign = -self.sign
            self._advance(ends_l[nxt], dues.demoted(ends_l[nxt], self.joined, self.last_end))
            j = nxt
        if (k - 2 - j) % 2:
            self.sign = -self.sign
        end = ends_l[k - 1]
        demoted = dues.demoted(end, self.joined, self.last_end)
        if q.starvation_check_due():
            q.promote_starved(self._batch_ids(), float(starts[k - 1]))
            self.parked.sort(key=BY_KEY)
        self._advance(end, demoted)
        self.last_end = end
        self.last_items = [r for r, _ in plan.items]

    def next_decision(self, plan: Plan, now: float):
        """The next starvation check, and a time before any job of the batch is due for demotion.

        When every running job is in the batch and nothing waits, a demotion cannot change the next
        batch (every job runs, in any order): it is made inside the run (`after_fast_forward`)."""
        q = self.mlfq
        k = q.steps_to_starvation_check()
        if not self.parked and not len(q):
            return k, None
        dues = self.dues
        dues.top(self.last_end)
        t = dues.times[0] + dues.held if dues.times else math.inf
        last = q.levels - 1
        thaw = [r for r in self.freezing.thawing if r.aux.frozen >= 0] if self.freezing.thawing else ()
        for r in chain(self.joined, thaw):
            s = r.aux
            if s.level < last:
                due = s.due_at(q.quanta, now)
                if due < t:
                    t = due
        return k, (t - MARGIN if t < math.inf else None)
