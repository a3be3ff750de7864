"""Where a sweep's tasks run: in the driver (`--workers 1`), on a local process pool, or on Ray.

Every executor has the same small interface -- `put` (ship an object once), `submit`,
`as_completed` (results as tasks finish, and an idle tick) and `shutdown` -- so the sweep and
`schedport explain` drive any of them alike (`make_executor`).

A local pool's worker says which task it starts (`describe_task`) before it runs it, so a worker
that dies -- killed, out of memory -- ends the sweep with one line naming its task (`WorkerDied`),
not the pool's traceback; the sweep keeps every cell finished before, and a rerun resumes.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from typing import Any

from schedport.common.outputs import process_alive
from schedport.errors import SchedportError
from schedport.study.tasks import code_fingerprint, describe_task

EXECUTORS = ("local", "ray")

#: A pool worker's line back to the driver: (its pid, the task it starts), so that a worker that
#: dies (killed, out of memory) can be reported with what it was running.
_STARTED = None


class WorkerDied(SchedportError):
    """A pool worker process ended while it ran a task (one line naming the task)."""


def _worker_init(driver_pid: int, started=None) -> None:
    """Pool worker set-up: ignore Ctrl-C, die with the driver, pay the imports up front."""
    global _STARTED
    _STARTED = started
    # Ctrl-C reaches the whole process group; only the driver handles it (flush, mark, exit).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_driver, args=(driver_pid,), daemon=True, name="driver-watch").start()
    import schedport.engine.runner  # noqa: F401  (the workers' imports, before the first task)
    # The imported modules' objects live as long as the worker: out of the cyclic collector's
    # full passes, which would otherwise walk all of them again and again.
    gc.freeze()


def _watch_driver(pid: int, period: float = 1.0) -> None:
    # A SIGKILLed driver cannot stop its workers (forkserver children are not its own), and
    # they would otherwise wait for work forever: exit within a second of its death.
    while True:
        time.sleep(period)
        if not process_alive(pid):
            os._exit(1)


def _started(fn, args, what: str):
    """Worker side of `_Pool.submit`: say which task this process starts, then run it."""
    if _STARTED is not None:
        _STARTED.put((os.getpid(), what))
    return fn(*args)


def _warmup() -> int:
    """Worker task used to start every pool process before the sweep's clock starts."""
    time.sleep(0.05)  # long enough that each warm-up task lands on its own new process
    return os.getpid()


class _Task:
    """A deferred call (the serial executor's task handle; hashable by identity)."""

    __slots__ = ("fn", "args")

    def __init__(self, fn, args):
        self.fn = fn
        self.args = args


class _Serial:
    """Runs tasks in the driver process, one at a time (``--workers 1``)."""

    name = "local"

    def put(self, obj):
        return obj

    def submit(self, fn, *args):
        return _Task(fn, args)

    def as_completed(self, handles, tick: float):
        """Run each task now, in submission order, yielding (handle, result)."""
        for h in list(handles):
            yield h, h.fn(*h.args)

    def shutdown(self, cancel: bool = False) -> None:
        pass


class _Pool:
    """A process pool over `workers` processes (forkserver start: safe with the driver's threads)."""

    name = "local"

    def __init__(self, workers: int):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        self.started = ctx.SimpleQueue()
        self.running: dict[int, str] = {}      # worker pid -> the task it last started
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init,
                                        initargs=(os.getpid(), self.started))
        from concurrent.futures.process import BrokenProcessPool

        try:
            for f in [self.pool.submit(_warmup) for _ in range(workers)]:
                f.result()
        except BrokenProcessPool:
            self.pool.shutdown(wait=False, cancel_futures=True)
            raise SchedportError("the worker processes failed to start (a script calling run_sweep must "
                                 "guard its entry point with `if __name__ == \"__main__\":`)") from None
        self.procs = list((getattr(self.pool, "_processes", None) or {}).values())

    def put(self, obj):
        return obj

    def submit(self, fn, *args):
        return self.pool.submit(_started, fn, args, describe_task(fn, args))

    def _read_started(self) -> None:
        while not self.started.empty():
            pid, what = self.started.get()
            self.running[pid] = what

    def as_completed(self, handles, tick: float):
        """Yield (handle, result) as tasks finish, and (None, None) every `tick` seconds idle; a
        worker that dies is a `WorkerDied` naming the task it ran (the pool cannot go on)."""
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        pending = set(handles)
        while pending:
            done, pending = wait(pending, timeout=tick, return_when=FIRST_COMPLETED)
            self._read_started()
            if not done:
                yield None, None
            for f in done:
                try:
                    res = f.result()
                except BrokenProcessPool:
                    raise self._died() from None
                yield f, res

    def _died(self) -> WorkerDied:
        """The line for a pool broken by a worker's death: which worker, how, and what it ran."""
        self._read_started()
        dead = [p for p in self.procs if p.exitcode is not None]
        if not dead:
            for p in self.procs:      # the pool saw it first: give the processes a moment to be reaped
                p.join(timeout=1)
            dead = [p for p in self.procs if p.exitcode is not None]
        parts = []
        for p in dead[:3]:
            code = p.exitcode
            how = (f"killed by signal {-code} ({_signal_name(-code)})" if code is not None and code < 0
                   else f"exit code {code}")
            parts.append(f"pid {p.pid}, {how}, while running {self.running.get(p.pid, 'no task it had reported')}")
        which = "; ".join(parts) or "which one the pool does not say"
        return WorkerDied(f"a worker process died ({which}); the cells finished before it are kept in the store, "
                          f"and rerunning the same command resumes from them (a worker killed by the system may "
                          f"have run out of memory: try fewer --workers)")

    def shutdown(self, cancel: bool = False) -> None:
        if cancel:
            procs = list((getattr(self.pool, "_processes", None) or {}).values())
            self.pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:  # our own worker processes: stop their in-flight chunk now
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=5)
        else:
            self.pool.shutdown(wait=True)


class _Ray:
    """The same tasks as Ray remote tasks, on an existing cluster or a local instance."""

    name = "ray"

    def __init__(self, workers: int, address: str | None):
        try:
            import ray
        except ImportError:
            raise SchedportError("--executor ray needs Ray: pip install 'schedport[ray]'") from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            kw: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False}
            if address:
                _check_reachable(address)
            try:
                if address:
                    ray.init(address=address, **kw)
                else:
                    ray.init(num_cpus=workers, include_dashboard=False, **kw)
            except Exception as e:  # connection refused, bad address, ...
                where = f"the Ray cluster at {address}" if address else "a local Ray instance"
                raise SchedportError(f"cannot start or reach {where}: {' '.join(str(e).split())[:300]}") from None
            self.started = True
        self._remote: dict = {}
        self._pending: set = set()
        mine = code_fingerprint()
        theirs = ray.get(self._fn(code_fingerprint).remote())
        if theirs != mine:
            self.shutdown()
            raise SchedportError("the Ray workers run another schedport version/code than this driver "
                                 "(results would not be comparable); install the same schedport there")

    def _fn(self, fn):
        if fn not in self._remote:
            self._remote[fn] = self.ray.remote(fn)
        return self._remote[fn]

    def put(self, obj):
        return self.ray.put(obj)

    def submit(self, fn, *args):
        ref = self._fn(fn).remote(*args)
        self._pending.add(ref)
        return ref

    def as_completed(self, handles, tick: float):
        """Yield (ref, result) as tasks finish, and (None, None) every `tick` seconds idle."""
        pending = list(handles)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1, timeout=tick)
            if not done:
                yield None, None
            for ref in done:
                self._pending.discard(ref)
                try:
                    res = self.ray.get(ref)
                except self.ray.exceptions.RayTaskError as e:
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, SchedportError):
                        raise cause from None
                    raise
                yield ref, res

    def shutdown(self, cancel: bool = False) -> None:
        if cancel:  # on a shared cluster, do not leave our queued tasks behind
            for ref in self._pending:
                try:
                    self.ray.cancel(ref, force=True)
                except Exception:  # already finished or gone: nothing to cancel
                    pass
            self._pending.clear()
        if self.started:
            self.ray.shutdown()
            self.started = False


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast (one line) when a ``host:port`` Ray address refuses connections.

    `ray.init` would otherwise retry for minutes. Addresses without an explicit port
    ("auto", "local") are left to Ray.
    """
    import socket

    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise SchedportError(f"cannot start or reach the Ray cluster at {address}: "
                             f"{e.strerror or e}") from None


def make_executor(kind: str, workers: int, ray_address: str | None = None):
    """The executor named `kind` ("local" or "ray") with `workers` processes / local CPUs."""
    if kind == "local":
        if ray_address:
            raise SchedportError("--ray-address only applies to --executor ray")
        return _Serial() if workers == 1 else _Pool(workers)
    if kind == "ray":
        return _Ray(workers, ray_address)
    raise SchedportError(f"--executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")
