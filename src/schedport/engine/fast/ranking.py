"""The ranked fill from a kept rank order: a preemptive policy's batch without re-ranking every request.

vllm-ltr's ranked fill (`Continuous._plan_ranked`) walks running and waiting requests in one
rank order each step. Done from scratch that is a sort of every running request per step, which
at overload (hundreds hold KV) is most of a preemptive policy's cost. But for an order whose keys
change only as the policy declares — a served request's leading key moves by a fixed step per
token served (`PerServedToken`: srpt -1; a fixed preemptive key 0; the queue's
`served_key_step`) — the rank order between engine events is known without asking for keys again:

* decode-cohort members all gain one token per step, so their keys shift together: they are kept
  sorted by a cohort-clock invariant (`RankTracker.members`), and a run of them between two other
  requests is counted by bisection, not visited;
* running requests outside the cohort (prefills, members that sat out and were parked) and waiting
  requests keep their keys until they are served, so they are kept sorted as they are.

`RankTracker.plan` walks these three orders with the full pass's rules and returns the same batch.
Where blocks run short it preempts as the full pass does, the worst-ranked running requests not
yet reached first (`_victims`), counting the members' new blocks one by one where their total does
not settle a check. It returns None, and the full pass decides that step, where a rule needs more
request-by-request detail: a full host swap space, a request that would preempt itself, a victim
among the members just counted, or a preempted request that the pass would reach again.
"""

from __future__ import annotations

import math

from bisect import bisect_left, insort

from schedport.engine.policies.policy import Plan
from schedport.engine.core.simulator import RUNNING, Request


class RankTracker:
    """Running requests of a `served_key_step` order, in rank order, kept up to date by the engine's
    hooks (cohort joins and leaves, admissions, preemptions, completions, served items)."""

    __slots__ = ("sim", "order", "mode", "step", "members", "others", "entry", "_alone", "_moved",
                 "_order_hook")

    def __init__(self, sim, order, mode):
        self.sim = sim
        self.order = order
        self.mode = mode
        self.step = int(order.served_key_step)
        # Both are plain lists kept sorted with `bisect`: they hold running requests only (hundreds
        # at overload), where a list's insertion in C is several times cheaper than a SortedList's
        # bookkeeping in Python, and indexing (the walk's main access) is a list's own.
        self.members: list[list] = []   # [leading key - step x cohort clock, *rest of key, request]
        self.others: list[list] = []    # [key..., request]: running requests outside the cohort
        self.entry: dict[int, list] = {}
        self._alone: list | None = None   # member entries the last walk served alone, as a prefix
        self._moved: set[int] = set()     # the requests of those entries, once moved
        # the order's own cohort hook, told of the joins and leaves the walk makes itself
        self._order_hook = hook = getattr(order, "cohort_changed", None)
        if hook is None:
            sim.listen_cohort(self.cohort_changed)      # the order keeps no cohort state
        else:
            def both(req, delta, mine=self.cohort_changed):
                mine(req, delta)
                hook(req, delta)
            sim.listen_cohort(both)
        for r in sim.running:
            sim.sync(r)                 # a member's fields lag the cohort clock until synced
            self._add(r)

    # -- upkeep
    def _key(self, req: Request) -> tuple:
        return self.order.key(req, self.sim.now)

    def _add(self, req: Request) -> None:
        k = self._key(req)
        if req.sync >= 0:
            # lists, so that `served` can move a served prefix's leading keys in place (and the
            # two lists' entries compare alike)
            e = [k[0] - self.step * self.sim.decode_clock, *k[1:], req]
            insort(self.members, e)
        else:
            e = [*k, req]
            insort(self.others, e)
        self.entry[req.idx] = e

    def _drop(self, req: Request) -> None:
        e = self.entry.pop(req.idx, None)
        if e is not None:
            _remove(self.members if req.sync >= 0 else self.others, e)

    def cohort_changed(self, req: Request, delta: int) -> None:
        """A running request joined (+1: its fields are true, `sync` set) or left (-1: synced,
        `sync` still set) the decode cohort."""
        if self._alone:
            self._move_alone()
        e = self.entry.pop(req.idx, None)
        if not self.step and e is not None:
            # a fixed key (step 0) reads the same in both lists: the entry itself moves
            if delta > 0:
                _remove(self.others, e)
                insort(self.members, e)
            else:
                _remove(self.members, e)
                insort(self.others, e)
            self.entry[req.idx] = e
            return
        if delta > 0:
            if e is not None:
                _remove(self.others, e)
        elif e is not None:
            _remove(self.members, e)
        if delta > 0:
            self._add(req)
        else:
            k = self._key(req)
            e = [*k, req]
            insort(self.others, e)
            self.entry[req.idx] = e

    def admitted(self, req: Request) -> None:
        self._add(req)

    def left(self, req: Request) -> None:
        """`req` stopped running (preempted or finished)."""
        if self._alone:
            self._move_alone()
        self._drop(req)

    def served(self, plan: Plan) -> None:
        """After a step: requests that emitted a token as items have new keys (a member served
        alone while the cohort stood still included). A key moves only with a token served, so
        a fixed key (`step` 0) and a prefill chunk that emitted nothing keep their places; a
        request that just emitted its last token is about to leave."""
        if not self.step:
            return
        self._move_alone()
        skip, self._moved = self._moved, set()
        for r in plan.emitted:
            if r.generated < r.output and r.idx not in skip:
                self._drop(r)
                self._add(r)

    def _move_alone(self) -> None:
        """The members the last walk served alone while the cohort stood still were the first in
        rank order, and each took one token: with `step` < 0 their keys all moved by the same
        amount towards the front, so they stay first and in the same order, and their entries are
        updated where they stand. Done before any other change to the members (their tokens are
        counted by then: the step has run)."""
        alone, self._alone = self._alone, None
        if alone:
            step = self.step
            for e in alone:
                e[0] += step
            self._moved = {e[-1].idx for e in alone}

    def served_run(self, plan: Plan) -> None:
        """After a fast-forward: every request served as an item took tokens."""
        self._alone = None
        self._moved = set()
        if self.step:
            for r, _ in plan.items:
                if r.phase == RUNNING:
                    self._drop(r)
                    self._add(r)

    def next_decision(self, now: float) -> int | None:
        """Steps the cohort may run before its ranking can turn (None: never, between events).

        With `step` <= 0 a served member's key only improves on those of requests not served.
        With `step` > 0 (least attained service) the worst member's leading key climbs by `step`
        a step, and once it reaches the best leading key among requests not served (the parked
        ones, the head of the queue) the batch may change: the fast-forward stops before that."""
        if self.step <= 0 or not self.members:
            return None
        best = self.others[0][0] if self.others else None
        waiting = self.order.ordered(now)
        if waiting:
            k0 = self.order.key(waiting[0], now)[0]
            best = k0 if best is None or k0 < best else best
        if best is None:
            return None
        gap = best - (self.members[-1][0] + self.step * self.sim.decode_clock)
        return max(1, math.ceil(gap / self.step)) if gap > 0 else 1

    # -- the walk
    def plan(self, sched, now: float) -> Plan | None:
        """The ranked fill's batch for this step, `Continuous._plan_ranked`'s rules walked over the
        kept orders with its preemptions, or None where the full pass must decide (module
        docstring)."""
        sim = self.sim
        mode = self.mode
        cache = sim.cache
        bs = cache.block_size
        order = self.order
        members, others = self.members, self.others
        waiting = order.ordered(now)
        shift = self.step * sim.decode_clock
        cap = mode.max_num_seqs
        budget = mode.budget
        wm = mode.watermark_blocks
        n_mem = len(members)
        cross = sim.cohort_crossings(sim.decode_clock)   # new blocks of all members this step
        free = cache.free                           # less what non-members take, in rank order
        im = io = iw = 0
        n_oth = len(others)
        n_wait = len(waiting)
        selected = 0
        admitting = True
        picked: list = []                           # (request, tokens, blocks, is waiting), rank order
        key = order.key
        kw, kw_at = None, -1                        # the waiting head's entry, made once per head
        victims: list = []                          # running requests preempted for a waiting one
        host_room = sim.host_blocks - sim.host_used     # host swap space left for victims
        vbest = vkey = None                         # the best-ranked victim, and its key entry
        while True:
            # the next request outside the cohort in rank order, and the members ranked before it
            nxt = None
            if io < n_oth:
                nxt = others[io]
            if iw < n_wait:
                if kw_at != iw:
                    w = waiting[iw]
                    kw, kw_at = [*key(w, now), w], iw
                if nxt is None or kw < nxt:
                    nxt = kw
            if vkey is not None and (nxt is None or nxt > vkey):
                nxt = vkey                          # the victims come next, every live member first
                j = n_mem
            elif nxt is None:
                j = n_mem
            else:                                   # (members[:im] rank before every request reached)
                j = bisect_left(members, [nxt[0] - shift, *nxt[1:]] if shift else nxt, im)
            if j > im:
                room = min(cap - selected, budget)
                if room <= 0:
                    break
                t = min(j - im, room)
                im += t
                selected += t
                budget -= t
                if free - min(im, cross) < 0:
                    # a member may find no block: the members just counted, one by one
                    cut = self._members_short(im - t, im, free, io, n_mem, n_oth, shift, host_room)
                    if cut is None:
                        return None
                    got, freed, n_mem, n_oth, host_room = cut
                    if got:
                        victims += got
                        free += freed
                        vbest, cross = self._after_victims(victims)
                        vkey = vbest[1]
                if im < j:
                    break                           # the batch filled among the members
            if nxt is None:
                break
            if selected >= cap or budget <= 0:
                break
            pending = (n_mem - im) + (n_oth - io)   # running requests not reached (with `nxt`'s own)
            if not pending and not admitting:
                break
            req = nxt[-1]
            hi = im if im < cross else cross        # member blocks taken so far: at most
            lo = cross - n_mem + im if cross > n_mem - im else 0    # and at least
            if nxt is vkey:
                # the full pass now reaches the best-ranked victim, waiting again (every running
                # request left ranks before it): if its blocks do not fit, admissions stop and
                # nothing after it starts; if they fit, it would be taken back: the full pass decides
                need = self._readmit_need(vbest, budget)
                if need <= free - self._member_blocks(members, im, hi, lo) - wm:
                    return None
                break
            running = req.phase == RUNNING
            if running:
                io += 1
                k = min(req.prompt + req.generated - req.computed, budget)
                need = -(-(req.computed + k) // bs) - req.blocks
                short = need - (free - self._member_blocks(members, im, hi, lo)) if need > free - hi else 0
                if short > 0 and pending == 1:
                    return None                     # nothing to preempt but itself
            else:
                iw += 1
                k = min(req.prompt + req.generated - req.computed, budget)
                need = -(-(req.computed + k) // bs)
                short = (need + wm - (free - self._member_blocks(members, im, hi, lo))
                         if need > free - hi - wm else 0)
                if short > 0 and not pending:
                    admitting = False
                    iw = n_wait                     # no waiting request starts after it
                    continue
            if short > 0:
                # `_make_room`: the worst-ranked running requests not reached make room
                cut = self._victims(short, im, io, n_mem, n_oth, shift, host_room)
                if cut is None:
                    return None                     # the host is full, or too few to make room
                got, freed, n_mem, n_oth, host_room = cut
                victims += got
                free += freed
                vbest, cross = self._after_victims(victims)
                vkey = vbest[1]
            free -= need
            budget -= k
            selected += 1
            picked.append((req, k, need, not running))
        return self._apply(sched, now, members[:im], members[im:n_mem], picked, victims)

    def _member_blocks(self, members: list, im: int, hi: int, lo: int) -> int:
        """The new blocks the first `im` members take this step, where the bounds do not settle it."""
        if hi == lo:
            return hi
        d = self.sim.decode_clock
        bs = self.sim.cache.block_size
        return sum(1 for e in members[:im] if not (e[-1].pval + d) % bs)

    def _after_victims(self, victims: list) -> tuple:
        """The best-ranked of the victims so far (the last chosen), and the members' new blocks
        this step without theirs."""
        d = self.sim.decode_clock
        bs = self.sim.cache.block_size
        cross = self.sim.cohort_crossings(d) - sum(1 for r, _, member in victims if member and not (r.pval + d) % bs)
        return victims[-1], cross

    def _members_short(self, a: int, b: int, free: int, io: int, n_mem: int, n_oth: int, shift, host_room: int):
        """Members `a`..`b` reached in rank order, as the full pass takes them one by one: where one
        finds no block left, the worst-ranked running requests not reached are preempted for it
        (`_victims`). Returns (victims, blocks freed, member and outside counts left, host room
        left); None where the full pass would preempt otherwise (nothing left to preempt, a full
        host) or would preempt a member among those counted."""
        members = self.members
        d = self.sim.decode_clock
        bs = self.sim.cache.block_size
        m = sum(1 for e in members[:a] if not (e[-1].pval + d) % bs)   # blocks taken before `a`
        got: list = []
        freed = 0
        for i in range(a, b):
            if (members[i][-1].pval + d) % bs:
                continue
            m += 1
            if m <= free + freed:
                continue
            if not (n_mem - i - 1) + (n_oth - io):
                return None                         # nothing to preempt but itself
            cut = self._victims(m - free - freed, i + 1, io, n_mem, n_oth, shift, host_room)
            if cut is None:
                return None
            more, f, n_mem, n_oth, host_room = cut
            if n_mem < b:
                return None                         # it would preempt a member counted in this batch
            got += more
            freed += f
        return got, freed, n_mem, n_oth, host_room

    def _readmit_need(self, victim: tuple, budget: int) -> int:
        """The blocks a request the walk preempted would need to start again this step."""
        r, _, member = victim
        d = self.sim.decode_clock
        computed, generated = (r.pval + d, r.generated + d - r.sync) if member else (r.computed, r.generated)
        if not self.mode.swap:
            computed = 0                            # recomputed: its KV is gone
        k = min(r.prompt + generated - computed, budget)
        return -(-(computed + k) // self.sim.cache.block_size)

    def _victims(self, short: int, im: int, io: int, n_mem: int, n_oth: int, shift, room: int):
        """The running requests not yet reached that `Continuous._make_room` preempts for `short`
        more blocks, worst-ranked first: [(request, key entry, is a member)], the blocks they free,
        the member and outside counts left, and the host swap space (`room`) left. None where the
        full pass would find the host swap space full, or preempt every request not reached and
        still be short."""
        sim = self.sim
        d = sim.decode_clock
        bs = sim.cache.block_size
        members, others = self.members, self.others
        swap = self.mode.swap
        got = []
        freed = 0
        mi, oi = n_mem - 1, n_oth - 1
        while freed < short:
            em = [members[mi][0] + shift, *members[mi][1:]] if mi >= im else None
            eo = others[oi] if oi >= io else None
            if em is None and eo is None:
                return None
            if eo is None or (em is not None and em > eo):
                r = em[-1]
                blocks = -(-(r.pval + d) // bs)     # a member's blocks, made true
                got.append((r, em, True))
                mi -= 1
            else:
                r = eo[-1]
                blocks = r.blocks
                got.append((r, eo, False))
                oi -= 1
            if swap:
                if blocks > room:
                    return None
                room -= blocks
            freed += blocks
        return got, freed, mi + 1, oi + 1, room

    def _apply(self, sched, now: float, reached: list, sit: list, picked: list, victims: list) -> Plan:
        """Carry out a walk's decisions, with the full pass's two forms of a cut among members.

        Few sitters: they leave the cohort (parked until a walk reaches them again) and the
        cohort steps. Most sit (a long prefill ranked first took the budget): the cohort stands
        still and the few members reached take their token as items, in rank order, staying
        members (`Simulator._execute`)."""
        sim = self.sim
        sim.host_full_prev = False
        plan = Plan()
        order = self.order
        for r, _, _ in victims:                     # worst first, as `Continuous._make_room`
            sim.preempt(r, self.mode.swap)
        plan.preempted = len(victims)
        stand_still = len(sit) > len(reached)
        if stand_still:
            # the batch in rank order: each request picked goes before the reached members that
            # rank after it (as the walk compared them), the members in their kept order
            shift = self.step * sim.decode_clock
            key = order.key
            at = 0
            for req, k, need, is_waiting in picked:
                pk = key(req, now)
                j = bisect_left(reached, [pk[0] - shift, *pk[1:]], at)
                self._serve_alone(plan, reached, at, j)
                at = j
                self._take(sched, plan, req, k, need, is_waiting, now)
            self._serve_alone(plan, reached, at, len(reached))
        else:
            plan.cohort = True
            if sit:
                self._park(len(reached), now)
            sim.cache.free -= sim.cohort_crossings(sim.decode_clock)
            back = []
            for req, k, need, is_waiting in picked:
                if not is_waiting and req.decoding:
                    if need > 0:
                        sim.allocate(req, need)
                    back.append(req)            # a parked member back in the batch
                else:
                    self._take(sched, plan, req, k, need, is_waiting, now)
            if back:
                self._unpark(back)
        # the items outside the cohort: all the picked ones while it stands still; else every item
        # (a parked member picked joined it)
        plan.parked = len(sim.running) - sim.cohort_n - (len(picked) if stand_still else len(plan.items))
        if plan.admitted or plan.preempted:
            plan.decode_only = False
        if stand_still and self.step < 0:
            self._alone = reached           # their entries move in `served` (or at the next change)
        return plan

    def _park(self, im: int, now: float) -> None:
        """The members past the first `im` (those that sit this cohort step out, the worst-ranked)
        leave the cohort, to wait outside it until a walk reaches them."""
        sim = self.sim
        members = self.members
        sit = members[im:]
        del members[im:]
        reqs = [e[-1] for e in sit]
        sim.cohort_leave_all(reqs, self._order_hook)
        others, entry = self.others, self.entry
        if self.step:
            key = self.order.key
            sit = [[*key(r, now), r] for r in reqs]
        for e in sit:
            insort(others, e)
            entry[e[-1].idx] = e

    def _unpark(self, reqs: list) -> None:
        """Parked members `reqs` take their place in the cohort again (their blocks for this step
        are allocated)."""
        others, members, entry = self.others, self.members, self.entry
        # they were reached in rank order, so they lie among the parked ones up to the last
        end = bisect_left(others, entry[reqs[-1].idx]) + 1
        self.sim.cohort_join_all(reqs, self._order_hook)
        others[:end] = [e for e in others[:end] if e[-1].sync < 0]
        for r in reqs:
            e = entry[r.idx]
            if self.step:
                k = self._key(r)
                e = entry[r.idx] = [k[0] - self.step * self.sim.decode_clock, *k[1:], r]
            insort(members, e)

    def _serve_alone(self, plan: Plan, reached: list, a: int, b: int) -> None:
        """Members `a`..`b` of those reached take their token as items while the cohort stands
        still (`Simulator.serve_alone`)."""
        self.sim.serve_alone([reached[i][-1] for i in range(a, b)], plan.items)

    def _take(self, sched, plan: Plan, req: Request, k: int, need: int, is_waiting: bool, now: float) -> None:
        """Give one request outside the cohort its place in the batch as an item: admit a waiting
        one, or run a running one (a prefill, or a parked member while the cohort stands still;
        parked members that join a stepping cohort come back through `_unpark`)."""
        sim = self.sim
        if is_waiting:
            self.order.remove(req)
            sched.admit(req, now)
            sim.allocate(req, need)
            plan.add(req, k)
            plan.admitted += 1
            return
        if need > 0:
            sim.allocate(req, need)
        plan.add(req, k)


def _remove(entries: list, e: list) -> None:
    """Remove entry `e` (that very object) from the sorted list `entries`."""
    i = bisect_left(entries, e)
    if i == len(entries) or entries[i] is not e:
        raise RuntimeError(f"internal: rank entry {e[:-1]!r} not kept")
    del entries[i]
