"""Check a policy before a study trusts it: `schedport schedulers FILE.py:NAME` runs this.

A user's policy declares how its keys move (`FIXED`, `PerServedToken(step)`, `WITH_TIME`), and
the engine's fast mode relies on that declaration to skip the steps where nothing can change. A
wrong declaration gives wrong numbers, not slow ones. So the check simulates the bundled example
trace under the policy at light load, at saturation and in overload, and in overload once more on
a KV pool a sixteenth of the engine's (`TIGHT_POOL`), where a preemptive policy must preempt and,
with ``preemption = "swap"``, swap: that path is checked too, and the summary counts what each run
exercised. Each run goes once in the default fast mode
and once stepping every iteration (``--exact``), and requires every request's status, first
token, finish and preemption count to agree bit for bit. The same runs check every evaluation of
each request's key (a valid key, of one shape with the others) and that the policy never writes
to a request (`schedport.engine.policies.plugins.CheckedPolicy`); the exact run goes first, so a key that
goes bad is named as such rather than as a difference between the modes. When the modes differ,
the exact run is repeated: a policy whose two identical runs differ keeps state across runs
(module-level variables), which is reported as such, not as a wrong `dynamics` declaration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from schedport.engine.inputs import resolve_engine
from schedport.engine.policies.plugins import PolicyError, checking, get_scheduler
from schedport.engine.runner import simulate
from schedport.workload.examples import make_example_trace

#: Offered loads the check runs at: light, saturated, overloaded.
CHECK_LOADS = (0.5, 1.0, 1.6)
#: Requests of the example trace the check simulates.
CHECK_REQUESTS = 300
#: The last check load runs again on a KV pool this many times smaller than the engine's: memory
#: pressure makes a preemptive policy preempt (and swap, when it swaps), so that path is checked.
TIGHT_POOL = 16
_COMPARED = ("status", "first_token_s", "finish_s", "preemptions")


@dataclass
class PolicyCheck:
    """What `check_policy` ran: the policy's name, and per run (a load, and a label: the last on a
    tight KV pool) the requests completed, the preemptions and the KV blocks swapped out, all with
    fast == exact."""

    name: str
    loads: tuple[float, ...]
    completed: list[int] = field(default_factory=list)
    preemptions: list[int] = field(default_factory=list)
    swapped: list[int] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    n_requests: int = 0

    def summary(self) -> str:
        """One line: what was run, what it showed, and how many preemptions and swaps it exercised."""
        per = "; ".join(f"{label}: {c}/{self.n_requests} completed, {p} preemptions, {w} blocks swapped"
                        for label, c, p, w in zip(self.labels, self.completed, self.preemptions, self.swapped))
        return (f"{self.name}: fast == exact on {self.n_requests} example requests ({per}); every key valid; "
                f"exercised {sum(self.preemptions)} preemptions and {sum(self.swapped)} swapped blocks")


def check_policy(scheduler, engine=None, *, loads=CHECK_LOADS, n_requests: int = CHECK_REQUESTS,
                 seed: int = 0) -> PolicyCheck:
    """Simulate the example trace under `scheduler` at each of `loads`, and at the last one again on
    a KV pool `TIGHT_POOL` times smaller (`tight_engine`), fast and exact; a `PolicyError` naming
    the load and the first request that differs if the two disagree."""
    policy = get_scheduler(scheduler)
    trace = make_example_trace(n_requests, seed)
    cfg = resolve_engine(engine)
    tight = tight_engine(cfg)
    runs = [(f"rho {rho:g}", rho, cfg) for rho in loads]
    if loads:
        runs.append((f"rho {loads[-1]:g} on a {tight.num_gpu_blocks}-block KV pool", loads[-1], tight))
    out = PolicyCheck(policy.name, tuple(loads), n_requests=len(trace))
    for label, rho, engine in runs:
        with checking():    # every key evaluation and hook checked, fast mode too
            exact = simulate(trace, policy, engine=engine, load=rho, seed=seed, exact=True)
            fast = simulate(trace, policy, engine=engine, load=rho, seed=seed)
        differs = _first_difference(fast, exact)
        if differs:
            i, col, va, vb = differs
            with checking():     # the same run again: does the policy carry state from one run to the next?
                again = simulate(trace, policy, engine=engine, load=rho, seed=seed, exact=True)
            moved = _first_difference(again, exact)
            if moved:
                j, col2, v2, v1 = moved
                raise PolicyError(
                    f"{_where(policy)}: at {label} the same exact run twice in one process gives request {j} "
                    f"{col2} = {v1!r}, then {v2!r}: the policy keeps state from one run to the next (a module- or "
                    f"class-level variable, or randomness not drawn from the run's seed), so its results would "
                    f"depend on which cells a worker ran before (--workers); keep a run's state on the ordering "
                    f"itself (self), which each run gets fresh")
            raise PolicyError(
                f"{_where(policy)}: at {label} the fast mode gives request {i} {col} = {va!r}, stepping "
                f"every iteration gives {vb!r}: the keys do not move as its dynamics "
                f"({_dynamics(policy)}) declare")
        out.completed.append(int(fast.summary["n_completed"]))
        out.preemptions.append(int(fast.summary["preemptions"]))
        out.swapped.append(int(fast.summary.get("swapped_bytes", 0)) // engine.block_bytes)
        out.labels.append(label)
    return out


def tight_engine(cfg):
    """`cfg` with a KV pool `TIGHT_POOL` times smaller, but never below one max_model_len request
    (what a config must hold): overload on it preempts."""
    need = -(-cfg.max_model_len // cfg.block_size) + int(cfg.null_block)
    return dataclasses.replace(cfg, num_gpu_blocks=max(cfg.num_gpu_blocks // TIGHT_POOL, need))


def _first_difference(a, b):
    """(request, column, value in `a`, value in `b`) of the first request whose outcome differs
    between two runs' tables, or None when they agree bit for bit."""
    for col in _COMPARED:
        x, y = a.requests[col].to_numpy(), b.requests[col].to_numpy()
        same = (x == y) | (_isnan(x) & _isnan(y))
        if not same.all():
            i = int(np.flatnonzero(~same)[0])
            vx, vy = (v.item() if hasattr(v, "item") else v for v in (x[i], y[i]))
            return i, col, vx, vy
    return None


def _isnan(a: np.ndarray) -> np.ndarray:
    return np.isnan(a) if a.dtype.kind == "f" else np.zeros(len(a), dtype=bool)


def _where(policy) -> str:
    src = getattr(policy, "source", None)
    return f"{src.path}: scheduler {policy.name!r}" if src is not None else f"scheduler {policy.name!r}"


def _dynamics(policy) -> str:
    order = policy.order
    return repr(getattr(order, "dynamics", "a queue's own"))
