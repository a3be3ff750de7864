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
