"""What a user's policy may not do in a run, and the one line it gets when it does.

`schedport.engine.policies.plugins` loads a user's policy and binds each of its runs to a `CheckedPolicy`:
each arriving request's key is checked (a number or a tuple of numbers and strings, not NaN, of
one shape with the others); in exact mode and in the policy check (`checking`) every evaluation of
it is, and every call of the key and the ordering's hooks must leave the request as it found it. A
policy's code runs with `os._exit` trapped (`exits_trapped`), so that ending the process is a
failure the run reports, not an exit code the policy chose. Each finding is a `PolicyError`: one
line naming the file, the call (request and time) and what was wrong.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
import operator
import os
import threading
import traceback

from schedport.engine.policies.policy import Ordering
from schedport.engine.policies.queues import queue_for
from schedport.engine.policies.schedulers import BoundPolicy
from schedport.engine.core.simulator import Request
from schedport.errors import SchedportError


class PolicyError(SchedportError):
    """A user's policy that cannot be loaded, or that misbehaved in a run (one line, naming the file)."""


class CheckedPolicy(BoundPolicy):
    """A user policy (`engine.plugins.UserPolicy`) bound to one run: each arriving request's key is
    checked before it is queued.

    A key must be a real number or a tuple of real numbers and strings, none NaN, and compare with
    the previous arrival's key; anything else stops the run with the request and the value.

    In exact mode (``--exact``) and in the runs of `schedport schedulers` (`checking`), every
    evaluation of an `Ordering`'s key is checked so, against the previous evaluation's key, and
    the request must read the same after the key and the ordering's hooks as before: a policy
    reads the request, it never writes it. Fast mode's keys go to the engine unwrapped (they are
    its hot path); a run in any mode checks at its end that no request's arrival and lengths
    were changed (`UserPolicy.after_run`), and names the keys when they stop comparing.
    """

    def __init__(self, policy, sim, params: dict):
        super().__init__(policy, sim, params)
        self._ordering = self.ordering
        self._last_key = None
        self._last_idx = -1
        self._where = f"{policy.source.path}: scheduler {policy.name!r}"
        if isinstance(self.ordering, Ordering) and (sim.exact or _CHECKING.get()):
            self._watch(self.ordering)
            self.order = queue_for(self.ordering, sim, params)    # the queue takes the watched key

    def on_arrival(self, req, now: float) -> None:
        self._check(req, now)
        super().on_arrival(req, now)

    def _call(self, req, now: float) -> str:
        return f"{type(self._ordering).__name__}.key(request {req.idx}, now={now:.6g})"

    def _check(self, req, now: float) -> None:
        call = self._call(req, now)
        try:
            key = self._ordering.key(req, now)
        except PolicyError:      # a watched key's own finding (`_watch`)
            raise
        except Exception as e:   # the user's code: any exception is theirs to fix
            line = line_in(e, self.policy.source.path)
            raise PolicyError(f"{self.policy.source.path}{line}: scheduler {self.policy.name!r}: {call} raised "
                              f"{type(e).__name__}: {one_line(e)}") from None
        why = bad_key(key)
        if why:
            raise PolicyError(f"{self._where}: {call} returned {key!r}: {why}")
        if self._last_key is not None:
            try:
                bool(key < self._last_key)
            except TypeError:
                raise PolicyError(f"{self._where}: {call} returned {key!r}, which does not compare with the "
                                  f"previous request's key {self._last_key!r}; keys must be of one shape") from None
        self._last_key = key

    def _watch(self, ordering: Ordering) -> None:
        """Check every call of `ordering`'s key and hooks (class docstring): its own methods are
        shadowed on the instance by checking ones, which the engine's queue then binds."""
        key = ordering.key
        snap = _REQUEST_FIELDS

        def checked_key(req, now):
            before = snap(req)
            k = key(req, now)
            if snap(req) != before:
                self._wrote(req, before, self._call(req, now))
            why = "" if _plain_key(k) else bad_key(k)
            if why:
                raise PolicyError(f"{self._where}: {self._call(req, now)} returned {k!r}: {why}")
            last = self._last_key
            if last is not None:
                try:
                    bool(k < last)
                except TypeError:
                    raise PolicyError(f"{self._where}: {self._call(req, now)} returned {k!r}, which does not "
                                      f"compare with the key {last!r} of request {self._last_idx}; keys must keep "
                                      f"one shape at every evaluation") from None
            self._last_key, self._last_idx = k, req.idx
            return k

        ordering.key = checked_key
        for name in ("on_admit", "on_finish"):
            if getattr(type(ordering), name) is not getattr(Ordering, name):
                setattr(ordering, name, self._hook(getattr(ordering, name), name))

    def _hook(self, hook, name: str):
        snap = _REQUEST_FIELDS

        def checked(req, now):
            before = snap(req)
            hook(req, now)
            if snap(req) != before:
                self._wrote(req, before, f"{type(self._ordering).__name__}.{name}(request {req.idx}, now={now:.6g})")

        return checked

    def _wrote(self, req, before: tuple, call: str) -> None:
        after = _REQUEST_FIELDS(req)
        field, was, now = next((f, a, b) for f, a, b in zip(Request.__slots__, before, after) if a is not b and a != b)
        raise PolicyError(f"{self._where}: {call} wrote request.{field} ({was!r} -> {now!r}): a policy reads the "
                          f"request and never writes it (the engine's results would no longer be its own)")

    def diagnose(self, now: float) -> PolicyError | None:
        """After the engine's comparison of two keys failed: the waiting or running request whose key
        at `now` does not order with the others (NaN, a wrong type, another shape), as one line."""
        reqs = list(self.sim.running) + list(self.order)
        keys = []
        for r in reqs:
            try:
                keys.append((r, self._ordering.key(r, now)))
            except Exception:     # the key's own failure is a separate story: look at the others
                continue
        for r, k in keys:
            why = bad_key(k)
            if why:
                return PolicyError(f"{self._where}: {self._call(r, now)} returned {k!r}: {why}")
        for (r0, k0), (r, k) in zip(keys, keys[1:]):
            try:
                bool(k < k0)
            except TypeError:
                return PolicyError(f"{self._where}: {self._call(r, now)} returned {k!r}, which does not compare "
                                   f"with request {r0.idx}'s key {k0!r} at the same time; keys must keep one shape "
                                   f"at every evaluation, not only at arrival")
        return None


#: The whole state of a request, as one tuple: compared before and after a policy's call.
_REQUEST_FIELDS = operator.attrgetter(*Request.__slots__)
#: On while `schedport schedulers` checks a policy: every key evaluation is checked (`CheckedPolicy`).
_CHECKING: contextvars.ContextVar[bool] = contextvars.ContextVar("schedport_policy_checking", default=False)


@contextlib.contextmanager
def checking():
    """Within this block, every simulation of a user policy checks each key evaluation and each
    hook as exact mode does (`CheckedPolicy`), fast mode included: the policy check's runs."""
    token = _CHECKING.set(True)
    try:
        yield
    finally:
        _CHECKING.reset(token)


def _plain_key(key) -> bool:
    """Is `key` a valid key made of plain ints, floats and strs (a quick `bad_key` for the common case:
    exact mode checks every evaluation)? False says only: ask `bad_key`."""
    t = type(key)
    if t is tuple:
        if not key:
            return False
        for v in key:
            tv = type(v)
            if tv is float:
                if v != v:
                    return False
            elif tv is not int and tv is not str:
                return False
        return True
    if t is float:
        return key == key
    return t is int or t is str


def bad_key(key) -> str:
    """Why `key` cannot rank requests ('' when it can)."""
    parts = key if isinstance(key, tuple) else (key,)
    if isinstance(key, tuple) and not key:
        return "an empty tuple ranks nothing"
    for v in parts:
        if isinstance(v, bool) or not isinstance(v, (numbers.Real, str)):
            return ("a key must be a number or a tuple of numbers and strings "
                    f"(got a {type(v).__name__})")
        if isinstance(v, numbers.Real) and not isinstance(v, numbers.Integral) and math.isnan(float(v)):
            return "NaN does not order (every comparison with it is false)"
    return ""


# ============================================================================ a policy that ends the process


class _TrappedExit(SystemExit):
    """An `os._exit(code)` called by a user's policy, raised instead of ending the process."""


_REAL_EXIT = os._exit
_EXIT_LOCK = threading.Lock()
_TRAPPING: dict[int, int] = {}      # thread id -> nesting depth of `exits_trapped` in it


def _trapped_exit(code: int) -> None:
    if threading.get_ident() in _TRAPPING:
        raise _TrappedExit(code)
    _REAL_EXIT(code)


@contextlib.contextmanager
def exits_trapped():
    """Run a user policy's code with `os._exit` trapped in this thread: a call raises
    `SystemExit` (reported as the policy's failure) instead of ending the process with whatever
    code the policy gave, which would hide the failure (exit 0, no message, half a store).
    Other threads (a pool worker's watch of its driver) keep the real `os._exit`."""
    me = threading.get_ident()
    with _EXIT_LOCK:
        _TRAPPING[me] = _TRAPPING.get(me, 0) + 1
        os._exit = _trapped_exit
    try:
        yield
    finally:
        with _EXIT_LOCK:
            depth = _TRAPPING.pop(me) - 1
            if depth:
                _TRAPPING[me] = depth
            if not _TRAPPING:
                os._exit = _REAL_EXIT


def exit_call(exc: SystemExit) -> str:
    """What ended the process, as code: ``called os._exit(0)``, ``raised SystemExit(3)``."""
    if isinstance(exc, _TrappedExit):
        return f"called os._exit({exc.code!r})"
    return f"raised SystemExit({exc.code!r}) (sys.exit)"


def frame_at(frames, path: str) -> str:
    """``file:line (in function)`` of the innermost of `frames`, or `path` when there are none."""
    if not frames:
        return path
    f = frames[-1]
    return f"{f.filename}:{f.lineno} (in {f.name})"


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def line_in(e: BaseException, path: str) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
    return f":{frames[-1].lineno}" if frames else ""
