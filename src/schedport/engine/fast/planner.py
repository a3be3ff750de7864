"""The fast planner: a batching mode's passes with the decode cohort counted as a whole.

The batching modes (`schedport.engine.policies.batching`) form a batch request by request, as the
exact engine runs them. In fast mode the running requests that decode one token per step are a
cohort (`schedport.engine.fast.cohort`) whose counts lag until synced; `FastPlanner` wraps the
policy's mode and forms the same batch with the cohort's members counted in bulk, falling back to
the mode's own passes (after making every member exact, `sync_all`) where a rule needs them one by
one. It also keeps, for a preemptive order, its rank order between steps (`RankTracker`) or
FastServe's levels in the cohort (`MlfqCohort`), so the batching modes know nothing of either.
"""

from __future__ import annotations

from schedport.engine.fast.mlfq_cohort import MlfqCohort
from schedport.engine.fast.ranking import RankTracker
from schedport.engine.policies.batching import Continuous, Selective, Static, StallFree
from schedport.engine.policies.mlfq import SkipJoinMLFQ
from schedport.engine.policies.policy import Plan


class FastPlanner:
    """A batching mode's `plan` with the decode cohort counted in bulk (module docstring).

    Installed by the fast simulator as the bound policy's planner when decodes go in bulk; the
    batch it returns is the one the mode's own `plan` would return on the synced requests."""

    def __init__(self, sim, mode):
        self.sim = sim
        self.mode = mode
        self.tracker: RankTracker | None = None   # a preemptive order's kept rank order, once made
        self.plan = self._plan_own
        for cls, bulk_form in ((Continuous, self._plan_continuous), (StallFree, self._plan_stall_free),
                               (Selective, self._plan_selective), (Static, self._plan_static)):
            if isinstance(mode, cls) and type(mode).plan is cls.plan:
                self.plan = bulk_form
                break

    def _plan_own(self, sched, now: float) -> Plan:
        """A batching mode without a bulk form (one of a user's own, with a `plan` of its own):
        every member made exact, the mode decides."""
        self.sim.sync_all()
        return self.mode.plan(sched, now)

    # ----------------------------------------------------------------- the four modes
    def _plan_continuous(self, sched, now: float) -> Plan:
        """`Continuous.plan`: the running pass in bulk where it can decide, then the waiting pass."""
        if sched.order.preemptive:
            return self._plan_ranked(sched, now)
        sim = self.sim
        mode = self.mode
        plan = sim.plan_running_bulk(mode.budget)
        if plan is None:
            sim.sync_all()
            plan = mode.plan_running_in_order(sched, now)
            if plan.preempted:
                plan.decode_only = False
                return plan
        return mode.fill_waiting(sched, now, plan)

    def _plan_stall_free(self, sched, now: float) -> Plan:
        """`StallFree.plan`: every member decodes if the budget and the blocks allow, then the prefills."""
        sim = self.sim
        mode = self.mode
        cache = sim.cache
        cross = sim.cohort_crossings(sim.decode_clock)
        if sim.cohort_n <= mode.budget and cross <= cache.free:
            cache.free -= cross
            plan = Plan()
            plan.cohort = True
            return mode.plan_prefills(sched, now, plan, mode.budget - sim.cohort_n)
        sim.sync_all()
        return mode.plan(sched, now)

    def _plan_selective(self, sched, now: float) -> Plan:
        """`Selective.plan`: every running request decodes (prompts go in whole), then admissions."""
        plan = Plan(allocates_decode_blocks=False)
        plan.cohort = True
        return self.mode.fill_waiting(sched, now, plan)

    def _plan_static(self, sched, now: float) -> Plan:
        """`Static.plan`: a running batch decodes as a whole; an idle engine forms the next one."""
        if self.sim.running:
            plan = Plan(allocates_decode_blocks=False)
            plan.cohort = True
            return plan
        return self.mode.plan(sched, now)

    # ----------------------------------------------------------------- the ranked fill
    def _plan_ranked(self, sched, now: float) -> Plan:
        """`Continuous._plan_ranked` with the cohort: a shortcut, the kept rank order or FastServe's
        kept levels where they decide, else the mode's ranked fill with the members served as a group."""
        sim = self.sim
        mode = self.mode
        order = sched.order
        gated = mode.host_gated()
        host_was_full, sim.host_full_prev = sim.host_full_prev, False
        levels = None
        if isinstance(order, SkipJoinMLFQ):
            if order.levels_kept is None:
                order.levels_kept = MlfqCohort(order)
            levels = order.levels_kept
        plan = self._ranked_kept(sched, now, gated, host_was_full, levels)
        if plan is not None:
            return plan
        plan = Plan()
        plan.cohort = levels is None   # members decode in bulk unless preempted or left without budget
        for r in sim.running:
            sim.sync(r)                # keys and the pass read running requests' progress
        group = _Members(sim, self.tracker is not None) if plan.cohort or sim.cohort_n else None
        plan = mode.ranked_fill(sched, now, gated, host_was_full, plan, group)
        if levels is not None:
            plan.parked = len(sim.running) - len(plan.items)     # only the batch's decoders rejoin the cohort
        return plan

    def _ranked_kept(self, sched, now: float, gated: bool, host_was_full: bool, levels) -> Plan | None:
        """The batch without ranking every request: a shortcut, the kept rank order (`RankTracker`)
        or FastServe's levels kept in the cohort (`levels`); None: the full pass decides."""
        sim = self.sim
        mode = self.mode
        order = sched.order
        tracker = self.tracker
        if tracker is None and order.served_key_step is not None and not mode.host_gate:
            tracker = self.tracker = sim.rank_order = RankTracker(sim, order, mode)
        if levels is not None:
            levels.resume()
        skip = levels is not None and not len(order) and levels.over_budget(mode.budget)
        plan = None if skip else self._ranked_shortcut(sched, now, gated)
        if plan is not None:
            if levels is not None:
                levels.ran_all(plan)
            return plan
        if tracker is not None and not gated:
            return tracker.plan(sched, now)
        if levels is not None:
            plan = levels.walk(mode, sched, now, gated, host_was_full)
            if plan is None:
                levels.materialize()            # the full pass decides, outside the cohort
                sim.sync_all()
            return plan
        return None

    def _ranked_shortcut(self, sched, now: float, gated: bool) -> Plan | None:
        """`Continuous._ranked_shortcut` with the members counted in bulk."""
        sim = self.sim
        mode = self.mode
        order = sched.order
        if not len(order) and len(sim.running) <= mode.max_num_seqs:
            return sim.plan_running_bulk(mode.budget, in_order=False)
        if len(sim.running) + len(order) <= mode.max_num_seqs and not gated:
            tokens = blocks = 0
            if sim.cohort_n:
                tokens, blocks = sim.cohort_n, sim.cohort_crossings(sim.decode_clock)
            outside = [r for r in sim.running if r.sync < 0]
            return mode.plan_everyone(sched, now, tokens, blocks, outside, self._plan_all_running)
        return None

    def _plan_all_running(self) -> Plan | None:
        """Every running request given its full need, the members in bulk."""
        return self.sim.plan_running_bulk(self.mode.budget, in_order=False)


class _Members:
    """The cohort's members in a ranked fill (`Continuous.ranked_fill`'s `shared`): those given
    their token decode with the cohort, and those left out sit the step out (`settle_sitters`)."""

    __slots__ = ("sim", "kept", "run", "sit")

    def __init__(self, sim, kept: bool):
        self.sim = sim
        self.kept = kept
        self.run: list = []         # members given their token: (items position, request, tokens)
        self.sit: list = []         # members left out of the batch (budget, cap or a full host)

    def ran(self, pos: int, req, k: int) -> bool:
        if req.sync >= 0:
            self.run.append((pos, req, k))
            return True
        return False

    def sat(self, req) -> None:
        if req.sync >= 0:
            self.sit.append(req)

    def settle(self, plan: Plan, pending) -> None:
        if plan.cohort:
            self.sit.extend(r for r in pending if r.sync >= 0)
        if self.sit:
            self.sim.settle_sitters(plan, self.run, self.sit, self.kept)
