"""A vLLM scheduler that records, in order, every request it is given and every one it admits.

Loaded *by the vLLM server's interpreter* (``--scheduler-cls
schedport_admissions.RecordingAsyncScheduler``, this folder on ``PYTHONPATH``), never imported
by schedport itself. It changes no decision: it subclasses vLLM's own v1 schedulers
(``vllm/v1/core/sched/scheduler.py::Scheduler.add_request`` and ``::schedule``, and the
``AsyncScheduler`` the server runs by default) and appends one tab-separated line per event to
the file named by ``SCHEDPORT_ADMISSION_LOG``:

    <seq>  added      <request_id>  <arrival_time>  <priority>
    <seq>  scheduled  <request_id>

``seq`` counts events in the engine core's own order. Both methods run on the engine core's
busy loop (``EngineCore._process_input_queue`` then ``step``), so the order of the lines is
the order in which the scheduler saw them: a request "added" before another was "scheduled"
was in the waiting queue when the scheduler chose. That order is what the client cannot see:
on a busy machine the server's front end can hand a request to the engine seconds after the
client sent it. A request is written as "scheduled" only on its first admission (a preempted
request that resumes is not new).
"""

from __future__ import annotations

import os

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler


class _Recorder:
    _log = None
    _seq = 0

    def _write(self, *fields) -> None:
        if self._log is None:
            type(self)._log = open(os.environ["SCHEDPORT_ADMISSION_LOG"], "a", buffering=1)
        type(self)._seq += 1
        self._log.write("\t".join(map(str, (self._seq, *fields))) + "\n")

    def add_request(self, request) -> None:
        new = request.request_id not in self.requests
        super().add_request(request)
        if new:
            self._write("added", request.request_id, repr(request.arrival_time), request.priority)

    def schedule(self, *args, **kwargs):
        out = super().schedule(*args, **kwargs)
        for req in out.scheduled_new_reqs:
            self._write("scheduled", req.req_id)
        return out


class RecordingScheduler(_Recorder, Scheduler):
    """vLLM's synchronous v1 scheduler, recording its admissions."""


class RecordingAsyncScheduler(_Recorder, AsyncScheduler):
    """vLLM's asynchronous v1 scheduler (the server's default), recording its admissions."""
