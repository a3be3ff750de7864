"""FastServe's demotions in the fast mode: which of the last batch's jobs a step's end demotes,
found from a heap of due times (`DueHeap`, a part of `schedport.engine.fast.mlfq_cohort.MlfqCohort`).

The rules are LLMServe/FastServe's (`fastserve/scheduler.py`, `MLFQ.pop_finished_requests`: a job
whose processing time in its level exceeds the level's quantum moves down one), as
`schedport.engine.policies.mlfq.SkipJoinMLFQ` runs them; the due time and the demotion test are
`MLFQJob.due` and `MLFQJob.exceeds`, written once for both.

A job that ran in the last step has an open run and is demoted at the first step end where its
processing time in its level, ``done + (end - run start)``, exceeds the level's quantum. That
test is monotone in the end, so each job of the last batch has an entry at its due time, and the
exact test is made only near it. An entry is a bound below its job's due: a run that restarted
later only moves the due later, so an entry that comes up early is put back at the due, and a job
keeps its entry while it sits out of the batch and when it comes back. The entry goes when it comes
up while its job is out of the batch, when a starvation check lifts the job (its due may then come
earlier), or at the last level, where nothing is demoted. The heap's clock stands
still in freezing steps (`MlfqCohort._freeze`): it keeps each due less `held`, the freezing steps'
summed time, so that the jobs frozen through them, whose dues move on by as much, keep their
entries untouched; the few jobs that ran in them (`unsettled`) get new entries when the heap is next
read (`DueHeap.settle`). A job has one live entry at most, the one that carries its stamp (odd while
it has one). Entries are grouped by due time: jobs demoted together into a level share their next
due (on the bench window at rho 1.6, 5,266 demotions a run come in 832 such groups), so the heap
holds each due time once (`times`, plain floats) and a table of the entries at it (`entries`).
"""

from __future__ import annotations

import heapq

from schedport.engine.policies.mlfq_job import NO_ENTRY
from schedport.engine.core.simulator import Request

MARGIN = 1e-6       # seconds: due times are compared with this slack, then tested exactly


class DueHeap:
    """The due times of the last batch B's jobs (module docstring): a heap of times less `held`, the
    entries at each, and the jobs that ran in freezing steps still to be entered. A freezing step's
    demotions are found where its jobs are pushed (`MlfqCohort._advance_frozen`): only the few that
    ran can be demoted."""

    __slots__ = ("quanta", "bounds", "last", "times", "entries", "held", "unsettled")

    def __init__(self, quanta: list[float], bounds: list[float]):
        self.quanta = quanta            # the levels' quanta (`SkipJoinMLFQ.quanta`)
        self.bounds = bounds            # and the demotion test's bounds (`SkipJoinMLFQ.bounds`)
        self.last = len(quanta) - 1     # the last level, where nothing is demoted (no entry kept)
        self.times: list[float] = []    # a heap of due times (less `held`), each once
        self.entries: dict[float, list] = {}  # the entries at each time: (stamp, request)
        self.held = 0.0                 # the freezing steps' summed durations: the heap's time is wall time less this
        self.unsettled: list[Request] = []  # the jobs that ran in freezing steps since the heap was last read

    def enter(self, due: float, stamp: int, r: Request) -> None:
        """An entry for `r` (carrying `stamp`) at `due` (less `held`)."""
        g = self.entries.get(due)
        if g is None:
            self.entries[due] = [(stamp, r)]
            heapq.heappush(self.times, due)
        else:
            g.append((stamp, r))

    def push(self, r: Request) -> None:
        """Give B's job `r` a due entry if it has none (one it kept lies below its due), or at the
        last level, where nothing is demoted, let go of the one it has."""
        a = r.aux
        if a.level == self.last:
            a.drop_entry()
        elif not a.stamp & 1:
            a.stamp += 1
            self.enter(a.due(self.quanta) - self.held, a.stamp, r)

    def clear(self) -> None:
        """No job keeps an entry (the state is written out)."""
        for g in self.entries.values():
            for stamp, r in g:
                a = r.aux
                if a.stamp == stamp:
                    a.stamp += 1
        self.times = []
        self.entries = {}
        self.unsettled = []

    def top(self, now: float) -> None:
        """Make the heap's first due time one at which a live entry's job is due (or empty the heap):
        entries of jobs that left B go, bounds below a due are put back at it, and frozen jobs'
        entries go (they get new ones when they thaw). `now`: the last step's end (`settle`)."""
        if self.unsettled:
            self.settle(now)
        heap, at = self.times, self.entries
        quanta = self.quanta
        held = self.held
        while heap:
            key = heap[0]
            g = at[key]
            moved = []
            for i, (stamp, r) in enumerate(g):
                s = r.aux
                if s.stamp != stamp:
                    continue
                if s.value is None:      # out of B: a new entry if it rejoins
                    s.stamp += 1
                elif s.frozen >= 0:
                    s.stamp += 1
                    s.frozen = NO_ENTRY
                else:
                    due = s.due(quanta) - held
                    if due <= key:
                        if i:
                            del g[:i]
                        for e in moved:
                            self.enter(*e)
                        return
                    moved.append((due, stamp, r))
            heapq.heappop(heap)
            del at[key]
            for e in moved:
                self.enter(*e)

    def settle(self, now: float) -> None:
        """Due entries for the jobs that ran in freezing steps since the heap was last read.

        The heap keeps due times less `held`, the summed durations of the freezing steps: a job
        frozen through them sees its due move on by as much (its run restarts that much later), so
        its entry stays a bound below its due without being touched. The few jobs that ran in them
        moved on in their dues by less: each gets a new entry (a frozen one's as if it thawed now,
        a bound below its due), or, out of B or at the last level, loses the one it had. `now`: the
        last step's end, where a frozen job's next run opens at the earliest."""
        quanta = self.quanta
        last = self.last
        held = self.held
        for r in dict.fromkeys(self.unsettled):
            a = r.aux
            L = a.level
            if a.value is None or L == last:
                a.drop_entry()
                continue
            # a frozen job's run closed at its last step's end; the next opens no earlier than now
            due = a.due_from(quanta, now) if a.frozen >= 0 else a.due(quanta)
            stamp = a.stamp
            stamp = a.stamp = stamp + 2 if stamp & 1 else stamp + 1
            self.enter(due - held, stamp, r)
        self.unsettled = []

    def demoted(self, end: float, newcomers: list[Request], now: float) -> tuple[dict, list]:
        """The jobs demoted at a step ending at `end`: B's, as their entries by the level they leave,
        and of `newcomers` (the jobs outside B the step took). `now`: the last step's end (`settle`)."""
        if self.unsettled:
            self.settle(now)
        heap = self.times
        held = self.held
        lim = end + MARGIN - held
        if not newcomers and (not heap or heap[0] > lim):
            return {}, []               # (no entry comes up and no job joined the batch)
        quanta, bounds = self.quanta, self.bounds
        last = self.last
        at = self.entries
        enter = self.enter
        back = []
        down: dict[int, list] = {}      # the entries of the jobs demoted from each level
        while heap and heap[0] <= lim:
            key = heapq.heappop(heap)
            for e in at.pop(key):
                stamp, r = e
                s = r.aux
                if s.stamp != stamp:
                    continue
                if s.value is None:      # out of B (parked, waiting or done): a new entry if it rejoins
                    s.stamp += 1
                    continue
                if s.frozen >= 0:         # frozen, not running: a new entry when it thaws
                    s.stamp += 1
                    s.frozen = NO_ENTRY
                    continue
                if s.exceeds(bounds, end):  # (then its due is not past `lim`)
                    g = down.get(s.level)
                    if g is None:
                        down[s.level] = [e]
                    else:
                        g.append(e)
                    continue
                due = s.due(quanta) - held
                if due > lim:           # a bound below its due (its run restarted): put back at it
                    enter(due, stamp, r)
                else:
                    back.append((key, stamp, r))
        # the demoted jobs' entries at the next level, as `_advance` will set them: done 0, the run
        # from `end` (those demoted into a level together share their due)
        for L, es in down.items():
            if L + 1 == last:           # nothing is demoted from the last level: no entry kept there
                for stamp, r in es:
                    r.aux.stamp += 1
                continue
            key = quanta[L + 1] + end - held
            g = at.get(key)
            if g is None:
                at[key] = es[:]
                heapq.heappush(heap, key)
            else:
                g += es
        for e in back:
            enter(*e)
        if not newcomers:
            return down, []
        return down, [r for r in newcomers if r.aux.exceeds(bounds, end)]
