"""FastServe's ranked fill over the levels kept in the decode cohort (`mlfq_cohort.MlfqCohort`).

A job's `aux` is its `schedport.engine.policies.mlfq_job.MLFQJob` (made by `SkipJoinMLFQ`): its level,
explicit position and processing time, and the kept state's fields, among them its value in the
last batch B (None outside it). The walk (`Walk`) takes one step's batch from those levels with
the full pass's rules.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from operator import attrgetter

from schedport.engine.core.simulator import RUNNING, Request

BY_KEY = attrgetter("key")


ACT_RUN, ACT_ADMIT, ACT_PREEMPT = range(3)   # a walk's actions


class GiveWay(Exception):
    """The walk cannot settle this step: the full pass decides it."""


class Walk:
    """One step's ranked fill over `MlfqCohort`'s kept levels, in `Continuous._plan_ranked`'s order
    and with its rules.

    The order is level by level: B's jobs of the level (members counted, not visited, unless the
    batch fills among them or jobs outside the cohort are among them), then the level's parked
    and waiting jobs by key. Blocks are checked against a lower bound of what is free (every
    member's new block taken first); where that fails, the exact count (the members reached so
    far, counted one by one) decides, until the blocks free cover every member not reached yet
    (room was made): then the bound again. A request that fits only by it goes to the full pass; one
    that does not fit makes room as `Continuous._make_room` does, preempting the worst-ranked
    running jobs not reached by swap, or finding the host full and preempting none. A preempted
    job is reached again where it ranked, as a waiting one: nothing after it starts.
    """

    __slots__ = (
        # what it walks: the kept state and the step's limits
        "kept", "cache", "block_size", "by_level", "n_levels", "parked", "waiting", "clock", "watermark",
        "outside_by_level", "orders",
        # the batch so far: seats, tokens, the running jobs not reached, where it stopped
        "max_seqs", "budget", "selected", "pending", "admitting", "cut", "acts", "sat_out",
        # where the walk is: the next parked job, the position reached in a level's order
        "n_parked", "next_parked", "reached_at",
        # KV blocks: free (a bound, or exact where `tight`), taken, freed, members still to count
        "free", "crossing", "tight", "taken", "lost", "member_blocks", "freed", "uncounted_levels",
        "uncounted_runs",
        # preemption: host room for swaps, the best-ranked victim, what went short
        "host_room", "host_full", "preempted", "shorted", "victim_rank", "victim")

    def __init__(self, kept, mode, waiting: list):
        sim = kept.sim
        self.kept = kept
        self.cache = sim.cache
        self.block_size = sim.cache.block_size
        self.by_level = kept.by_level   # B's jobs by level (`MlfqCohort.by_level`)
        self.n_levels = kept.mlfq.levels
        self.parked = kept.parked       # running jobs outside B, by key
        self.waiting = waiting          # waiting jobs, by key
        self.clock = sim.decode_clock
        self.watermark = mode.watermark_blocks
        self.outside_by_level: dict[int, list] = {}  # B's jobs outside the cohort, by level
        for r in kept.last_items:
            if r.phase == RUNNING and r.sync < 0 and r.aux.value is not None:
                self.outside_by_level.setdefault(r.aux.level, []).append(r)
        self.orders: dict[int, list] = {}   # B's levels in rank order, made when needed (less victims)
        self.max_seqs = mode.max_num_seqs
        self.budget = mode.budget       # tokens left
        self.selected = 0               # seats taken
        self.pending = len(sim.running)     # running jobs not reached yet
        self.admitting = True           # False once a waiting job did not fit (head-of-line)
        self.cut = None                 # (level, reached): the batch filled inside B's level
        self.acts: list = []            # (request, tokens, blocks, action, in B), in the walk's order
        self.sat_out: list = []         # B's jobs reached that sat out (the host full)
        self.n_parked = len(self.parked)    # parked jobs not preempted
        self.next_parked = 0            # the next parked job to reach (`make_room` takes victims after it)
        self.reached_at = 0             # the position reached in the current level's order
        # free blocks: a lower bound (every member's new block taken first), or where that leaves too
        # few (`tight`), the exact count, every member visited and given its block in rank order
        self.crossing = sim.cohort_buckets[(-self.clock) % self.block_size]  # members needing a new block
        self.free = sim.cache.free - self.crossing
        self.tight = self.free < 0
        if self.tight:
            self.free = sim.cache.free
        self.taken = 0                  # blocks taken by items
        self.member_blocks = 0          # blocks taken by members counted
        self.freed = 0                  # blocks freed by victims
        self.lost = 0                   # members that needed a block and will not take one (preempted, short)
        self.uncounted_levels: list = []    # levels whose members were all reached, not yet counted
        self.uncounted_runs: list = []      # (order, a, b): members order[a:b] reached, not yet counted
        self.host_room = sim.host_blocks - sim.host_used  # host blocks free for swaps
        self.host_full = self.preempted = False
        self.shorted = False            # a running job reached found no block (`short`)
        self.victim_rank = self.victim = None  # the best-ranked job preempted so far: its rank, itself

    def order_of(self, L: int) -> list:
        """B's jobs of level L in rank order (made once a step, less the victims taken off its end)."""
        o = self.orders.get(L)
        if o is None:
            o = self.orders[L] = self.kept.level_order(L)
        return o

    def exact_free(self) -> int:
        """Blocks free at this point of the pass, the members reached counted one by one."""
        d, bs = self.clock, self.block_size
        n = 0                           # (every job counted here is a member)
        for L in self.uncounted_levels:
            for r in self.by_level[L]:
                if not (r.pval + d) % bs:
                    n += 1
        self.uncounted_levels.clear()
        for order, a, b in self.uncounted_runs:
            for i in range(a, b):
                if not (order[i].pval + d) % bs:
                    n += 1
        self.uncounted_runs.clear()
        self.member_blocks += n
        return self.cache.free - self.taken - self.member_blocks + self.freed

    def run(self) -> None:
        """Walk the rank order until the batch is full or nothing more can start."""
        lv, nlev = self.by_level, self.n_levels
        others, waiting = self.parked, self.waiting
        nw = len(waiting)
        iw = 0                          # the next waiting job (`next_parked`, the next parked one, `make_room` reads)
        L = 0
        while True:
            io = self.next_parked
            if io < self.n_parked:
                c = others[io]
                ck = c.key
            else:
                c = ck = None
            if self.admitting:
                if iw < nw:
                    w = waiting[iw]
                    if c is None or w.key < ck:
                        c, ck = w, w.key
                if self.victim_rank is not None and (c is None or self.victim_rank < ck):
                    c, ck = self.victim, self.victim_rank  # the best-ranked victim, waiting again where it ranked
            top = ck[0] if c is not None else nlev - 1
            victim = self.victim
            while L <= top:
                if lv[L] and not self.level(L):
                    return                  # the batch filled inside this level
                L += 1
            if self.victim is not victim:
                continue                    # jobs were preempted on the way (`c` among them, or after)
            if c is None:
                return
            if self.selected >= self.max_seqs or self.budget <= 0:
                self.cut = (L, 0)
                return
            if not self.pending and not self.admitting:
                return
            if c is self.victim:
                # every running job left ranks before it (the victims were the worst): if it fits
                # it would start again (the full pass decides), else nothing after it starts
                if self.kept.readmit_need(c, self.budget, self.clock) <= self.exact_free() - self.watermark:
                    raise GiveWay
                return
            if c.phase == RUNNING:
                self.next_parked = io + 1
                self.take_running(c, L, None, False)
            else:
                iw += 1
                self.take_waiting(c, L)

    def level(self, L: int) -> bool:
        """B's jobs of level L, in rank order; False where the batch filled among them."""
        if self.tight:
            # room made may cover every member not reached yet: blocks are counted by bound again
            free = self.free - (self.crossing - self.member_blocks - self.lost)
            if free >= 0:
                self.free = free
                self.tight = False
        if not self.tight and L not in self.orders:
            its = self.outside_by_level.get(L)
            if its:
                return self.level_items(L, its)
            m = len(self.by_level[L])   # members only: counted
            t = self.seat(m)
            if t < m:
                self.cut = (L, t)
                return False
            self.uncounted_levels.append(L)
            return True
        return self.visit(L, self.order_of(L), 0)

    def seat(self, m: int) -> int:
        """Seat up to m members (one token each) as far as the batch's seats and token budget
        allow; how many were seated."""
        t = max(0, min(m, self.max_seqs - self.selected, self.budget))
        self.selected += t
        self.budget -= t
        self.pending -= t
        return t

    def count(self, L: int, order: list, a: int, b: int) -> bool:
        """Members order[a:b] take one token each as far as the batch has room (their blocks are
        counted when an exact count is wanted); False where it filled among them."""
        m = b - a
        t = self.seat(m)
        if t:
            self.uncounted_runs.append((order, a, a + t))
        if t < m:
            self.cut = (L, a + t)
            return False
        return True

    def level_items(self, L: int, its: list) -> bool:
        """Level L with B's jobs outside the cohort `its` among its members: the members between them
        counted, each of them taken in its place; one by one from where blocks run short or room
        was made (`visit`)."""
        order = self.order_of(L)
        k = self.kept.values[L]         # the level's values, ascending: its rank order, or reversed
        if self.kept.sign > 0:
            at = sorted([bisect_left(k, r.key) for r in its])
        else:
            m = len(k) - 1
            at = sorted([m - bisect_left(k, r.key) for r in its])
        n = len(order)
        i = 0
        for p in at:
            if not self.count(L, order, i, p):
                return False
            if self.selected >= self.max_seqs or self.budget <= 0:
                self.cut = (L, p)
                return False
            self.reached_at = p
            self.take_running(order[p], L + 1, L, True)
            i = p + 1
            if self.tight or len(order) != n:
                return self.visit(L, order, i)
        return self.count(L, order, i, n)

    def visit(self, L: int, order: list, i: int) -> bool:
        """B's jobs of level L in rank order from order[i], one by one; False where the batch
        filled among them."""
        d, bs, cap = self.clock, self.block_size, self.max_seqs
        # members that need no block take one token each: skipped over as far as the batch has
        # room, and counted together; the rest are taken by calls that read and write the walk's
        # own counts (and `reached_at`, where room is made)
        while True:
            n = len(order)              # (`make_room` may drop victims from this order's end)
            stop = i + max(0, min(cap - self.selected, n - i, self.budget))
            j = i
            while j < stop:
                r = order[j]
                if r.sync < 0 or not (r.pval + d) % bs:
                    break
                j += 1
            if j > i:
                t = j - i
                self.selected += t
                self.budget -= t
                self.pending -= t
                i = j
            if i == n:
                return True
            if j == stop:               # the batch is full before order[i]
                self.cut = (L, i)
                return False
            self.reached_at = i
            if r.sync >= 0:
                self.take_member(r, L)
            else:
                self.take_running(r, L + 1, L, True)
            i += 1

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
        if self.tight:
            if self.free < 1:
                # (its block is not counted yet: `make_room` finds the same free blocks as `free`)
                if self.pending and not self.make_room(1, L + 1, L):
                    self.host_full = True       # (as `_make_room` marks it, whatever follows)
                if self.free < 1:
                    self.lost += 1
                    self.short(r, -(-(r.pval + self.clock) // self.block_size), True)
                    return
            self.free -= 1
        self.member_blocks += 1
        self.budget -= 1

    def short(self, r: Request, blocks: int, in_b: bool) -> None:
        """A running job reached finds no block even after room was made: swapped out itself if
        the host can take it, else it sits out, holding its KV (the host full)."""
        self.selected -= 1
        self.shorted = True
        if self.host_room >= blocks:
            self.host_room -= blocks
            self.free += blocks
            self.freed += blocks
            self.preempted = True
            self.acts.append((r, 0, blocks, ACT_PREEMPT, in_b))
        else:
            self.host_full = True
            if in_b:
                self.sat_out.append(r)

    def take_running(self, r: Request, bmin: int, cur: int | None, in_b: bool) -> None:
        """A running job outside the cohort reached: its tokens and blocks, room made for them, or
        it is short (`short`)."""
        self.pending -= 1
        self.selected += 1
        k = r.prompt + r.generated - r.computed
        if k > self.budget:
            k = self.budget
        need = -(-(r.computed + k) // self.block_size) - r.blocks
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
        self.acts.append((r, k, need, ACT_RUN, in_b))

    def take_waiting(self, c: Request, L: int) -> None:
        """A waiting job reached: admitted, room made for it, or admissions stop here."""
        k = c.prompt + c.generated - c.computed
        if k > self.budget:
            k = self.budget
        need = -(-(c.computed + k) // self.block_size)
        wm = self.watermark
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
        self.host_room += c.swapped     # its KV comes back from the host
        self.acts.append((c, k, need, ACT_ADMIT, False))

    def make_room(self, need: int, bmin: int, cur: int | None) -> bool:
        """`Continuous._make_room(need)` over the running jobs not reached — B's levels from `bmin`,
        the rest of level `cur`'s order after the job reached, the parked jobs from `next_parked` — worst
        first: True if victims were preempted (by swap), False if the host cannot take the first
        one it needs (none is preempted)."""
        lv, others = self.by_level, self.parked
        d, bs = self.clock, self.block_size
        freed = self.exact_free()
        room = self.host_room
        vict = []
        lost = 0
        j = self.n_parked - 1
        io = self.next_parked
        low = bmin if cur is None or bmin < cur else cur     # (bmin <= the level count)
        for L in range(self.kept.mlfq.deepest, -1, -1):  # (no job is below the deepest level reached)
            while j >= io and others[j].aux.level == L:     # parked jobs rank after B's in a level
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
                order, stop = self.order_of(L), self.reached_at
            else:
                order = None
            if order is not None:
                for n in range(len(order) - 1, stop, -1):
                    if freed >= need:
                        break
                    v = order[n]
                    vb = -(-(v.pval + d) // bs) if v.sync >= 0 else v.blocks
                    if v.sync >= 0 and not (v.pval + d) % bs:
                        lost += 1       # (counted once it is preempted)
                    if vb > room:
                        return False
                    room -= vb
                    freed += vb
                    vict.append((v, vb))
            if freed >= need or (L <= low and j < io):
                break
        if freed < need:
            raise GiveWay                  # every job not reached goes, and it is still short
        best = vict[-1][0]
        self.victim_rank = (best.aux.level, -math.inf, 0) if best.aux.value is not None else best.key
        self.victim = best
        for v, vb in vict:
            if v.aux.value is None:
                self.n_parked -= 1
            else:
                self.orders[v.aux.level].pop()   # the worst of its level's kept order
            self.free += vb
            self.freed += vb
            self.pending -= 1
            self.acts.append((v, 0, vb, ACT_PREEMPT, v.aux.value is not None))
        self.host_room = room
        self.lost += lost
        self.preempted = True
        return True

    def n_sitters(self) -> int:
        """How many of B's jobs a batch that cut clean (no job reached short of a block, the host not
        full) left out, as `sitters` lists them: those after the cut, less B's jobs the walk
        preempted (all of them after it)."""
        if self.cut is None:
            return 0
        L0, reached = self.cut
        n = sum(map(len, self.by_level[L0:self.kept.mlfq.deepest + 1])) - reached
        if self.preempted:
            n -= sum(1 for a in self.acts if a[3] == ACT_PREEMPT and a[4])
        return n

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
        for L in range(L0 + 1, self.kept.mlfq.deepest + 1):  # (no job is below the deepest level reached)
            if self.by_level[L]:
                sit.extend(self.order_of(L))
        return sit
