"""The fast forms of the policies whose state moves as their requests decode.

A decode-cohort member (`schedport.engine.fast.cohort`) is served at every cohort step without
being named in the step's items, so a policy that counts what each request is served would miss
those tokens. VTC's counters and ltr's starvation guard are therefore kept here, in subclasses
that count the members' tokens lazily from the cohort clock and are told of joins and leaves
(`cohort_changed`); the policies themselves (`schedport.engine.policies.vtc`, `.ltr`) know one
clock and one set of hooks. `with_fast_form` gives a policy declaration its order's fast form,
before the fast simulator binds it.
"""

from __future__ import annotations

import dataclasses

from schedport.engine.policies.ltr import PredictedRank
from schedport.engine.policies.vtc import VirtualTokenCounter


class CohortVirtualTokenCounter(VirtualTokenCounter):
    """VTC with the output tokens of decode-cohort members counted from the cohort clock: a
    client's `tout` is true at clock `csync[c]`, and its `ncoh[c]` members have each taken one
    token per cohort step since."""

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.ncoh: dict[str, int] = {}            # decode-cohort members of the client
        self.csync: dict[str, int] = {}           # cohort clock at the last sync of tout

    def _ensure(self, c):
        if c not in self.base:
            super()._ensure(c)
            self.ncoh[c] = 0
            self.csync[c] = self.sim.decode_clock

    def _sync(self, c):
        d = self.sim.decode_clock
        self.tout[c] += self.ncoh[c] * (d - self.csync[c])
        self.csync[c] = d

    def service(self, c) -> float:
        """`VirtualTokenCounter.service`, the members' tokens counted first (the same sum of the
        same integers, so the same float; written out, as it is the queue's hottest call)."""
        if c not in self.base:
            return 0.0
        d = self.sim.decode_clock
        tout = self.tout[c] = self.tout[c] + self.ncoh[c] * (d - self.csync[c])
        self.csync[c] = d
        return self.wp * self.tin[c] + self.wq * tout

    def cohort_changed(self, req, delta):
        """A request joined (+1) or left (-1) the decode cohort."""
        c = self.client(req)
        self._sync(c)
        self.ncoh[c] += delta


class CohortPredictedRank(PredictedRank):
    """ltr with the guard state of decode-cohort members kept lazily: a member is scheduled at
    every cohort step, so the cohort clock at which it joined (`base`) turns "last scheduled" and
    "boost steps left" into true values whenever they are read or it leaves (`_rebase`)."""

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.base: dict[int, int] = {}      # cohort member idx -> cohort clock its state is true at
        self.boosted_members: set[int] = set()
        self.cohort_it = 0                  # engine iteration count after the last cohort step
        if self.threshold <= 0:
            self.cohort_changed = None      # no guard: no state to keep

    def cohort_changed(self, req, delta):
        """A request joined (+1) or left (-1) the decode cohort."""
        idx = req.idx
        if delta > 0:
            self.base[idx] = self.sim.decode_clock
            if idx in self.boost:
                self.boosted_members.add(idx)
        else:
            self._rebase(idx)
            del self.base[idx]
            self.boosted_members.discard(idx)

    def _rebase(self, idx: int) -> None:
        """Make a cohort member's `last` and `boost` true at the current cohort clock."""
        d = self.sim.decode_clock
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
        if self.threshold > 0:
            PredictedRank.prepare(self, now)

    def _last_scheduled(self, idx: int) -> int:
        # a member that ran in a cohort step since it joined was last scheduled in the latest one
        b = self.base.get(idx)
        return self.cohort_it if b is not None and self.sim.decode_clock > b else self.last[idx]

    def _promoting(self, idx: int) -> None:
        if idx in self.base:
            self._rebase(idx)
            self.boosted_members.add(idx)

    def _scheduled(self, plan, k):
        if plan.cohort:
            self.cohort_it = self.sim.iterations
        super()._scheduled(plan, k)

    def _steps_to_decision(self, plan) -> int | None:
        k = super()._steps_to_decision(plan)
        d = self.sim.decode_clock
        for idx in self.boosted_members:
            b = self.boost.get(idx)
            if b is not None:
                b -= d - self.base[idx]
                k = b if k is None else min(k, b)
        return k


#: The fast form of each policy class that keeps state of the cohort's members.
FAST_FORMS = {VirtualTokenCounter: CohortVirtualTokenCounter, PredictedRank: CohortPredictedRank}


def with_fast_form(policy):
    """`policy` (a `Policy` declaration) with its order's fast form in its place, where the order
    is a class with one (`FAST_FORMS`); else `policy` itself. The declaration is otherwise the
    same: name, parameters and the rest."""
    order = policy.order
    form = FAST_FORMS.get(order) if isinstance(order, type) else None
    return policy if form is None else dataclasses.replace(policy, order=form)
