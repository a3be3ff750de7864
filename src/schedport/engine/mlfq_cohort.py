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
  is in B, so that a level's order is one sort in C.)
* **Processing time is summed lazily.** A job that ran in the last step has its last step's end
  `last_end` and an open run; it is demoted at the first step end where ``s2 + (end - s3) >
  quantum``. That test is monotone in the end, so a heap holds each job's due time and the exact
  test is made only near it.
* **The walk** (`MlfqCohort.walk`) takes the ranked fill's batch over levels: a level's B members
  are counted, not visited, unless the batch fills inside them; B's jobs outside the cohort
  (prefills), the parked running jobs and the waiting jobs are visited one by one in rank order.
  Where a step needs more — a preemption, blocks that may run short, a cohort that stands still
  — it returns None: the state is written out (`materialize`) and the full pass decides.

A job leaving B without running (it sat out) gets its explicit position then: a fresh front
position, which ranks it after every later push and before every older position, as its own
push at its last step did. `SkipJoinMLFQ` uses this in fast mode only; `--exact` runs the rules
as written, and the two agree bit for bit.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from operator import attrgetter

from schedport.engine.policy import Plan
from schedport.engine.queues import Queue
from schedport.engine.simulator import RUNNING, Request

_KEY = attrgetter("key")
# aux fields: level, position, closed processing time, open run's start, last step's end, value in B, stamp
LVL, POS, DONE, RUN, LAST, VAL, STAMP = range(7)
MARGIN = 1e-6       # seconds: due times are compared with this slack, then tested exactly
_RUN, _ADMIT, _PREEMPT = range(3)   # a walk's actions


def _ignore(req, delta) -> None:
    pass


class _Walk:
    """One walk's running counts (`MlfqCohort.walk`)."""

    __slots__ = ("free", "taken", "xr", "freed", "unc", "room", "host_full", "preempted", "n_oth",
                 "io", "i", "pending", "acts", "sat", "victim", "vreq")

    def __init__(self):
        self.taken = self.xr = self.freed = 0
        self.unc: list = []             # levels whose members were all reached, not yet counted
        self.host_full = self.preempted = False
        self.io = self.i = 0
        self.acts: list = []            # (request, tokens, blocks, action, in B), in the walk's order
        self.sat: list = []             # B's jobs reached that sat out (the host full)
        self.victim = self.vreq = None  # the best-ranked job preempted so far: its rank, itself


class MlfqCohort:
    """The lazy MLFQ state of one fast-mode run (module docstring)."""

    def __init__(self, q):
        self.q = q
        self.sim = q.sim
        n = q.levels
        self.lv: list[dict[int, Request]] = [dict() for _ in range(n)]   # B by level
        self.lo = [0] * n
        self.hi = [0] * n
        self.sign = 1
        self.last_end = -math.inf
        self.heap: list = []            # (due, idx, stamp, request) of B's jobs
        self.others: list[Request] = []         # running jobs outside B (parked), by key
        self.items_prev: list[Request] = []     # last step's items (B's jobs outside the cohort)
        self.x: list[Request] = []      # jobs outside B this step's batch took, in rank order
        self.explicit = False           # the full pass decides this step, on written-out state
        if getattr(q.cohort_changed, "__func__", None) is Queue.cohort_changed:
            self.sim._cohort_hook = _ignore     # nothing listens to cohort joins and leaves

    # ------------------------------------------------------------------ B's upkeep
    def _actual(self, L: int) -> list[Request]:
        """B's jobs of level L in rank order."""
        return sorted(self.lv[L].values(), key=_KEY, reverse=self.sign < 0)

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
        else:
            self.hi[L] += 1
            a[VAL] = r.key = self.hi[L]
        d[r.idx] = r

    def _write_out(self, order: list[Request]) -> None:
        """B's jobs `order` (one level, rank order) leave B: explicit positions, last end, runs."""
        q = self.q
        end = self.last_end
        for r in reversed(order):
            a = r.aux
            q._front += 1
            a[POS] = -q._front
            r.key = (a[LVL], a[POS], r.idx)
            a[LAST] = end
            if a[RUN] == end:           # demoted at its last step: no run open yet
                a[RUN] = math.nan
            a[VAL] = None
            a[STAMP] += 1
            del self.lv[a[LVL]][r.idx]

    def materialize(self) -> None:
        """Write every B job's state out, as `SkipJoinMLFQ.after_step` would have kept it, for the
        full pass; `rebuild` takes it up again after the step."""
        for L in range(self.q.levels):
            if self.lv[L]:
                self._write_out(self._actual(L))
        self.heap = []
        self.others = []
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
                self.lv[L][r.idx] = r
                self._push_due(r)
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
            del self.lv[a[LVL]][r.idx]
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
        where the full pass must decide (module docstring).

        Blocks are checked against a lower bound of what is free (every member's new block taken
        first). Where that fails, the exact count (the members reached so far, counted one by one)
        decides: a request that fits only by it goes to the full pass; one that does not fit makes
        room as `Continuous._make_room` does, preempting the worst-ranked running jobs not reached
        by swap, or finding the host full and preempting none."""
        if not mode.swap:
            return None
        sim = self.sim
        cache = sim.cache
        bs = cache.block_size
        q = self.q
        nlev = q.levels
        lv = self.lv
        wm = mode.watermark_blocks
        cap = mode.max_num_seqs
        budget = mode.budget
        others = self.others
        waiting = q.ordered(now)
        if not waiting:
            for r in others:
                if r.sync >= 0:         # joined by a shortcut that then gave way (`_plan_cohort`)
                    sim.cohort_leave(r)
        elif gated:
            # a context-stage job is held back while the gate is closed: only the rest can start
            waiting = [w for w in waiting if w.generated or w.swapped]
        bitems: dict[int, int] = {}
        for r in self.items_prev:
            if r.phase == RUNNING and r.sync < 0 and r.aux[VAL] is not None:
                bitems[r.aux[LVL]] = bitems.get(r.aux[LVL], 0) + 1
        d = sim.dclock
        st = _Walk()
        st.free = cache.free - sim.cohort_crossings(d)   # every member's new block, counted first
        if st.free < 0:
            return None                     # a member may find no block: the full pass preempts
        st.room = sim.host_blocks - sim.host_used
        st.n_oth = len(others)
        st.pending = len(sim.running)
        orders: dict[int, list] = {}        # B's levels in rank order, made when needed (less victims)

        def order_of(L1: int) -> list:
            o = orders.get(L1)
            if o is None:
                o = orders[L1] = self._actual(L1)
            return o

        def exact_free() -> int:
            for L1 in st.unc:
                st.xr += sum(1 for r in lv[L1].values() if r.sync >= 0 and not (r.pval + d) % bs)
            st.unc.clear()
            return cache.free - st.taken - st.xr + st.freed

        def blocks_of(v: Request) -> int:
            return -(-(v.pval + d) // bs) if v.sync >= 0 else v.blocks

        def make_room(need: int, bmin: int, cur: int | None, end: int) -> bool | None:
            """`_make_room(need)` over the running jobs not reached: B's levels from `bmin`, level
            `cur`'s order from `end` on... rather, before `end` and after the job reached, and the
            parked jobs from `io`. True: victims preempted; False: the host is full, none is;
            None: the full pass decides."""
            freed = exact_free()
            room = st.room
            vict = []
            j = st.n_oth - 1
            done = False
            for L1 in range(nlev - 1, -1, -1):
                seq = []
                while j >= st.io and others[j].aux[LVL] == L1:
                    seq.append(others[j])
                    j -= 1
                if L1 >= bmin and lv[L1]:
                    seq.extend(reversed(order_of(L1)))
                elif L1 == cur:
                    seq.extend(reversed(order_of(L1)[st.i + 1:end]))
                for v in seq:
                    if freed >= need:
                        done = True
                        break
                    vb = blocks_of(v)
                    if vb > room:
                        return False
                    room -= vb
                    freed += vb
                    vict.append((v, vb))
                if done or (L1 <= min(bmin, cur if cur is not None else nlev) and j < st.io):
                    break
            if freed < need:
                return None                 # every job not reached goes, and it is still short
            best = vict[-1][0]
            st.victim = (best.aux[LVL], -math.inf, 0) if best.aux[VAL] is not None else best.key
            st.vreq = best
            for v, vb in vict:
                L1 = v.aux[LVL]
                if v.aux[VAL] is None:
                    st.n_oth -= 1
                else:
                    o = orders[L1]
                    o.pop()                 # the worst of its level's kept order
                st.free += vb
                st.freed += vb
                st.pending -= 1
                st.acts.append((v, 0, vb, _PREEMPT, v.aux[VAL] is not None))
            st.room = room
            st.preempted = True
            return True

        n_wait = len(waiting)
        selected = 0
        admitting = True
        cut = None                      # (level, reached): the batch filled inside B's level
        iw = 0
        L = 0
        while True:
            c = others[st.io] if st.io < st.n_oth else None
            ck = None if c is None else c.key
            if iw < n_wait and admitting:
                w = waiting[iw]
                if c is None or w.key < ck:
                    c, ck = w, w.key
            if st.victim is not None and admitting and (c is None or st.victim < ck):
                c, ck = st.vreq, st.victim      # the best-ranked victim, waiting again where it ranked
            top = ck[0] if c is not None else nlev - 1
            while L <= top:
                if lv[L]:
                    if not bitems.get(L) and L not in orders:
                        m = len(lv[L])
                        t = max(0, min(m, cap - selected, budget))
                        selected += t
                        budget -= t
                        st.pending -= t
                        if t < m:
                            cut = (L, t)
                            break
                        st.unc.append(L)
                    else:
                        order = order_of(L)
                        st.i = 0
                        while st.i < len(order):
                            r = order[st.i]
                            if selected >= cap or budget <= 0:
                                cut = (L, st.i)
                                break
                            st.pending -= 1
                            selected += 1
                            if r.sync >= 0:
                                budget -= 1
                                if not (r.pval + d) % bs:
                                    st.xr += 1
                                st.i += 1
                                continue
                            k = min(r.prompt + r.generated - r.computed, budget)
                            need = -(-(r.computed + k) // bs) - r.blocks
                            if need > st.free:
                                if need <= exact_free():
                                    return None     # it fits, ahead of members' blocks: counted one by one
                                got = make_room(need, L + 1, L, len(order)) if st.pending else False
                                if got is None:
                                    return None
                                if need > exact_free():
                                    if st.room >= r.blocks:
                                        return None     # it would be preempted by swap itself
                                    st.host_full = True
                                    selected -= 1
                                    st.sat.append(r)
                                    st.i += 1
                                    continue
                                if need > st.free:
                                    return None
                            st.free -= need
                            st.taken += need
                            budget -= k
                            st.acts.append((r, k, need, _RUN, True))
                            st.i += 1
                        if cut is not None:
                            break
                L += 1
            if cut is not None:
                break
            if st.victim is not None and c is not st.vreq and admitting and (c is None or st.victim < ck):
                continue                    # a job preempted on the way ranks before `c`
            if c is None:
                break
            if selected >= cap or budget <= 0:
                cut = (L, 0)
                break
            if not st.pending and not admitting:
                break
            if c is st.vreq:
                # every running job left ranks before it (the victims were the worst): if it fits
                # it would start again (the full pass decides), else nothing after it starts
                if self._readmit_need(c, budget, d) <= exact_free() - wm:
                    return None
                break
            if c.phase == RUNNING:
                st.io += 1
                st.pending -= 1
                selected += 1
                k = min(c.prompt + c.generated - c.computed, budget)
                need = -(-(c.computed + k) // bs) - c.blocks
                if need > st.free:
                    if need <= exact_free():
                        return None
                    got = make_room(need, L, None, 0) if st.pending else False
                    if got is None:
                        return None
                    if need > exact_free():
                        if st.room >= c.blocks:
                            return None         # it would be preempted by swap itself
                        st.host_full = True
                        selected -= 1
                        continue                # it sits out, parked, holding its KV
                    if need > st.free:
                        return None
                st.free -= need
                st.taken += need
                budget -= k
                st.acts.append((c, k, need, _RUN, False))
                continue
            iw += 1
            k = min(c.prompt + c.generated - c.computed, budget)
            need = -(-(c.computed + k) // bs)
            if need > st.free - wm:
                if need <= exact_free() - wm:
                    return None
                got = make_room(need + wm, L, None, 0) if st.pending else False
                if got is None:
                    return None
                if got is False and st.pending:
                    st.host_full = True
                if need > exact_free() - wm:
                    admitting = False       # head-of-line: nothing ranked below it starts
                    continue
                if need > st.free - wm:
                    return None
            st.free -= need
            st.taken += need
            budget -= k
            selected += 1
            st.room += c.swapped            # its KV comes back from the host
            st.acts.append((c, k, need, _ADMIT, False))
        if st.host_full and not selected and not st.preempted:
            return None                     # nothing runs: the full pass breaks the stall
        sit: list = []
        if cut is not None:
            L0, reached = cut
            if reached:
                sit.extend(order_of(L0)[reached:])
            else:
                L0 -= 1
            for L1 in range(L0 + 1, nlev):
                if lv[L1]:
                    sit.extend(order_of(L1))
        plan = self._apply(sched, now, st.acts, st.sat + sit)
        if st.host_full:
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
        gone: dict[int, list] = {}
        for r, _, _, act, in_b in acts:
            if act == _PREEMPT and in_b:
                gone.setdefault(r.aux[LVL], []).append(r)
        for L, rs in gone.items():          # worst first: write out in rank order
            self._write_out(rs[::-1])
        by_level: dict[int, list] = {}
        for r in sit:
            by_level.setdefault(r.aux[LVL], []).append(r)
        for L, rs in by_level.items():      # `sit` is in rank order
            self._write_out(rs)
            for r in rs:
                if r.sync >= 0:
                    sim.cohort_leave(r)
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
        for r in join:
            sim.cohort_join(r)
        plan.parked = len(sim.running) - sim.cohort_n - sum(1 for r, _ in plan.items if r.sync < 0)
        if plan.admitted or plan.preempted:
            plan.decode_only = False
        return plan

    def ran_all(self, plan: Plan) -> None:
        """A step where every running job (and every waiting one the plan admitted) runs."""
        self.x = sorted((r for r in self.sim.running if r.aux[VAL] is None), key=_KEY)
        self.others = []

    # ------------------------------------------------------------------ after the step
    def _start_runs(self, start: float) -> None:
        """The jobs that joined the batch start a run (closing the one they left open)."""
        for r in self.x:
            s = r.aux
            s3 = s[RUN]
            if s[LAST] != start or s3 != s3:
                if s3 == s3:
                    s[DONE] += s[LAST] - s3
                s[RUN] = start

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
            if s[DONE] + (end - s[RUN]) > quanta[s[LVL]]:
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
        front, jobs demoted into a level behind its batch (in batch order: B's, then newcomers)."""
        q = self.q
        sign = self.sign
        dem = {r.idx for r in demoted}
        moved: dict[int, list] = {}             # old level -> its demoted jobs, in batch order
        b_dem = [r for r in demoted if r.aux[VAL] is not None]
        b_dem.sort(key=lambda r: (r.aux[LVL], sign * r.aux[VAL]))
        for r in b_dem:
            del self.lv[r.aux[LVL]][r.idx]
            moved.setdefault(r.aux[LVL], []).append(r)
        for r in self.x:
            if r.idx in dem:
                moved.setdefault(r.aux[LVL], []).append(r)
        self.sign = -sign
        for r in self.x:
            if r.idx not in dem:
                self._place(r, r.aux[LVL], True)
                self._push_due(r)
        for L, rs in moved.items():
            for r in reversed(rs):
                s = r.aux
                s[DONE] = 0.0
                s[RUN] = end            # its next run starts with the next step
                self._place(r, L + 1, False)
                self._push_due(r)
            if L + 1 > q.deepest:
                q.deepest = L + 1
        self.x = []

    def after_step(self, plan: Plan, start: float, end: float) -> None:
        """`SkipJoinMLFQ.after_step` on the lazy state."""
        q = self.q
        self._start_runs(start)
        demoted = self._due(end)
        if q._check_due():
            q._promote_starved(self._batch_ids(), start)
            self.others.sort(key=_KEY)          # promoted parked jobs have new keys
        self._advance(end, demoted)
        self.last_end = end
        self.items_prev = [r for r, _ in plan.items]

    def _batch_ids(self) -> set:
        ids = set(r.idx for r in self.x)
        for d in self.lv:
            ids.update(d)
        return ids

    def after_fast_forward(self, plan: Plan, starts, ends, k: int) -> None:
        """k steps of one batch: newcomers start at the first, no job is due before the last
        (`fast_forward_limit`), so only the order flips in between."""
        q = self.q
        self._start_runs(float(starts[0]))
        self._advance(float(ends[0]), [])
        if (k - 2) % 2:
            self.sign = -self.sign
        end = float(ends[k - 1])
        self.last_end = float(ends[k - 2])
        demoted = self._due(end)
        if q._check_due():
            q._promote_starved(self._batch_ids(), float(starts[k - 1]))
            self.others.sort(key=_KEY)
        self._advance(end, demoted)
        self.last_end = end
        self.items_prev = [r for r, _ in plan.items]

    def fast_forward_limit(self, plan: Plan, now: float):
        """The next starvation check, and a time before any job of the batch is due for demotion."""
        q = self.q
        k = q.every - self.sim.iterations % q.every
        heap = self.heap
        while heap and heap[0][3].aux[STAMP] != heap[0][2]:
            heapq.heappop(heap)
        t = heap[0][0] if heap else math.inf
        last = q.levels - 1
        for r in self.x:
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
