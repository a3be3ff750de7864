"""FastServe's per-job state (`MLFQJob`): what `SkipJoinMLFQ` and its fast mode keep on `Request.aux`."""

from __future__ import annotations

import math

THAWED = -1                 # `MLFQJob.frozen` of a job that does not sit out frozen
FROZEN, NO_ENTRY = 1, 2     # a frozen job's `frozen`: its due entry kept (a bound below its due), or none


class MLFQJob:
    """One job's place and accounting in the skip-join MLFQ.

    The exact rules (`SkipJoinMLFQ`) read the first five fields; the fast mode's kept state
    (`schedport.engine.fast.mlfq_cohort.MlfqCohort`) adds the last three.

    * `level`: its queue (0 the top).
    * `pos`: its explicit position in the queue (pushes to the front take negative ones).
    * `served`: its processing time in this level from runs already closed (seconds).
    * `run_start`: the start of its open run, NaN when none is open.
    * `last_end`: the end of the last step it ran in (-inf, or its arrival, before it ran).
    * `value`: its value in the last batch B, which orders B within a level; None outside B.
    * `stamp`: tells its live due entry in the fast mode's heap; odd while it has one.
    * `frozen`: whether a job of B sits out frozen, with its due entry kept (`FROZEN`) or not
      (`NO_ENTRY`), or not frozen (`THAWED`).
    """

    __slots__ = ("level", "pos", "served", "run_start", "last_end", "value", "stamp", "frozen")

    def __init__(self, level: int, pos: int, last_end: float):
        self.level = level
        self.pos = pos
        self.served = 0.0
        self.run_start = math.nan
        self.last_end = last_end
        self.value = None
        self.stamp = 0
        self.frozen = THAWED

    # The rules' arithmetic, each written once: the exact rules (`SkipJoinMLFQ`) and the fast mode
    # (`schedport.engine.fast`) both call these, so the two cannot drift apart. The rules are
    # LLMServe/FastServe's (`fastserve/scheduler.py`, class `MLFQ`): a job's processing time in its
    # level is the summed time of the steps it ran in since it joined the level, and past the level's
    # quantum it moves down one (`pop_finished_requests`).
    def exceeds(self, bounds: list[float], end: float) -> bool:
        """The demotion test of `pop_finished_requests`: is its processing time in its level at `end`
        (its open run's time to `end` added) past the level's bound? `bounds`: `SkipJoinMLFQ.bounds`,
        the quanta with none (infinity) at the last level, which keeps what reaches it."""
        return self.served + (end - self.run_start) > bounds[self.level]

    def due(self, quanta: list[float]) -> float:
        """When its open run passes its level's quantum: the end of the step that demotes it is the
        first past this time (`exceeds` is monotone in the end)."""
        return quanta[self.level] - self.served + self.run_start

    def due_from(self, quanta: list[float], start: float) -> float:
        """Its due time (`due`) if its open run, if any, closed at its last step's end and a new one
        opened at `start`."""
        done = self.served
        if self.run_start == self.run_start:
            done = done + (self.last_end - self.run_start)
        return quanta[self.level] - done + start

    def due_at(self, quanta: list[float], now: float) -> float:
        """Its due time if it runs in the step that starts at `now`: its open run goes on if its last
        step ended then, else a new run opens (`run_from`)."""
        if self.last_end != now or self.run_start != self.run_start:
            return self.due_from(quanta, now)
        return self.due(quanta)

    def close_run(self) -> None:
        """Close its open run, if any: the run's time, to its last step's end, joins `served`."""
        if self.run_start == self.run_start:
            self.served += self.last_end - self.run_start
            self.run_start = math.nan

    def run_from(self, start: float) -> None:
        """It runs in the step that starts at `start`: its open run goes on if its last step ended
        then; otherwise that run closes (it sat steps out) and a new one opens at `start`."""
        if self.last_end != start or self.run_start != self.run_start:
            self.close_run()
            self.run_start = start

    def demote(self, run_start: float) -> None:
        """Down one level: processing time there starts at 0, its next run at `run_start` (NaN: none
        open)."""
        self.level += 1
        self.served = 0.0
        self.run_start = run_start

    def drop_entry(self) -> None:
        """Let go of its due entry in the fast mode's heap, if it has one (its stamp goes even)."""
        if self.stamp & 1:
            self.stamp += 1
