"""The ordering contract: a policy is a key and its dynamics; the engine does the rest.

A least-attained-service policy, declared here in a few lines with no fast-mode code, runs
bit-identical in the fast mode and step by step; the contract's surface stays small; the
orderings that are only a ranking never mention the engine's machinery; and the example in
docs/schedulers.md ("Write your own policy") runs as written.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from schedport.engine.policies.batching import Continuous
from schedport.engine.core.config import engine_config_from_dict
from schedport.engine.core.latency import make_latency_model
from schedport.engine.policies.policy import FIXED, WITH_TIME, Ordering, PerServedToken
from schedport.engine.policies.queues import SortedEachStep, StaticKey, queue_for
from schedport.engine.policies.schedulers import REGISTRY, Policy
from schedport.engine.modes import make_simulator
from schedport.workload.trace import Trace
from _engines import small_engine
from _paths import REPO

ROOT = REPO
ENGINE = ROOT / "src" / "schedport" / "engine" / "policies"


class LeastAttained(Ordering):
    """Least attained service: the request that has generated the fewest tokens runs first."""

    preemptive = True
    dynamics = PerServedToken(+1)

    def key(self, req, now):
        return (req.generated, req.arrival, req.idx)


LAS = Policy("las", "Least attained service, preemptive", Continuous, LeastAttained,
             params={"preemption": "swap"}, cite="Rai, Urvoy-Keller, Biersack, SIGMETRICS 2003")


def _trace(n: int, seed: int, rate: float) -> Trace:
    rng = np.random.default_rng(seed)
    return Trace(np.cumsum(rng.exponential(1.0 / rate, n)), rng.integers(10, 200, n), rng.integers(1, 150, n))


def _run(trace, policy, cfg, exact, observer=None):
    sim = make_simulator(trace, policy, cfg, make_latency_model(cfg), exact=exact, observer=observer)
    return sim, sim.run()


@pytest.mark.parametrize("blocks,seqs,budget", [(400, 16, 64), (120, 16, 256), (2000, 8, None)])
def test_least_attained_service_is_one_short_declaration_and_fast_equals_exact(blocks, seqs, budget):
    cfg = small_engine(blocks, seqs, budget)
    t = _trace(300, seed=blocks, rate=60.0)
    _, exact = _run(t, LAS, cfg, exact=True)
    sim, fast = _run(t, LAS, cfg, exact=False)
    assert sim.bulk and sim.rank_order is not None      # the engine kept its rank order
    if seqs == 16:                                               # (with 8 seats LAS round-robins
        assert fast.steps_fast_forwarded > 0                     # every step: nothing to skip)
    assert np.array_equal(fast.first_token_s, exact.first_token_s, equal_nan=True)
    assert np.array_equal(fast.finish_s, exact.finish_s, equal_nan=True)
    assert np.array_equal(fast.preemptions, exact.preemptions)
    assert fast.iterations == exact.iterations
    assert (fast.status == "completed").all()


def test_least_attained_service_serves_the_least_served_first():
    """Each step's batch, cut by max_num_seqs, is the requests with the fewest tokens generated."""
    cfg = small_engine(4000, 4)
    t = Trace(np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0]), np.full(6, 20), np.array([40, 40, 40, 40, 40, 40]))
    seen = []

    def watch(step):
        seen.append(sorted(i for i, _ in step.scheduled))
    _, out = _run(t, LAS, cfg, exact=True, observer=watch)
    assert (out.status == "completed").all()
    # six equal jobs, four seats: the two left out run as soon as they are the least served, so
    # every job is in some batch long before any finishes (round robin, not run to completion)
    first_in = {i: next(n for n, s in enumerate(seen) if i in s) for i in range(6)}
    assert max(first_in.values()) < 5
    assert out.preemptions.sum() == 0        # sitting out keeps the KV: no preemption needed


def test_a_key_that_climbs_is_not_fast_forwarded_past_its_crossing():
    """With two seats and a third job waiting, LAS alternates: a fast-forward that ignored the
    climbing keys would run the first two to completion."""
    cfg = small_engine(4000, 2)
    t = Trace(np.array([0.0, 0.0, 0.0]), np.full(3, 20), np.array([60, 60, 60]))
    _, exact = _run(t, LAS, cfg, exact=True)
    _, fast = _run(t, LAS, cfg, exact=False)
    assert np.array_equal(fast.finish_s, exact.finish_s)
    assert np.ptp(exact.finish_s) < 0.2 * exact.finish_s.max()      # they finish together


def test_the_contract_is_small():
    public = {n for n in vars(Ordering) if not n.startswith("_")}
    assert public == {"preemptive", "dynamics", "victim", "key", "on_admit", "on_finish", "rng"}
    assert repr(FIXED) == "FIXED" and repr(WITH_TIME) == "WITH_TIME" and repr(PerServedToken(-1)) == "PerServedToken(-1)"
    with pytest.raises(TypeError):
        PerServedToken(0.5)


def test_the_engine_picks_the_queue_from_the_dynamics():
    cfg = small_engine(200, 8)
    sim = make_simulator(_trace(5, 1, 1.0), REGISTRY["vllm-fcfs"], cfg, make_latency_model(cfg))
    kinds = {name: type(queue_for(REGISTRY[name].order(sim, dict(REGISTRY[name].params)), sim, {})).__name__
             for name in ("sjf", "edf", "srpt", "hrrn")}
    assert kinds == {"sjf": "StaticKey", "edf": "StaticKey", "srpt": "SortedEachStep", "hrrn": "SortedEachStep"}
    las = queue_for(LeastAttained(sim, {}), sim, {})
    assert isinstance(las, SortedEachStep) and las.served_key_step == 1 and las.preemptive
    assert isinstance(queue_for(REGISTRY["spf"].order(sim, {"aging": 0.0}), sim, {}), StaticKey)
    aging = queue_for(REGISTRY["spf"].order(sim, {"aging": 2.0}), sim, {})
    assert aging.dynamic and aging.victim == "newest"
    with pytest.raises(TypeError, match="Ordering or a Queue"):
        queue_for(object(), sim, {})


def test_orderings_that_are_only_a_ranking_never_touch_the_engines_machinery():
    """orderings.py and schedulers.py: no cohort, fast-forward or sort cache (issue: a policy
    author learns keys, dynamics and hooks, nothing of the fast mode)."""
    banned = re.compile(r"cohort|fast_forward|_sorted_at|static_keys|cached_key|dclock|decode_clock|\.sync\b")
    for name in ("orderings.py", "schedulers.py"):
        tree = ast.parse((ENGINE / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "Ordering" for b in node.bases):
                src = ast.get_source_segment((ENGINE / name).read_text(), node)
                assert not banned.search(src), (name, node.name, banned.search(src).group())
    orderings = [c for c in vars(__import__("schedport.engine.policies.orderings", fromlist=["x"])).values()
                 if inspect.isclass(c) and issubclass(c, Ordering) and c is not Ordering]
    assert len(orderings) == 5


def test_the_documented_example_runs_as_written():
    """docs/schedulers.md's "Write your own policy" code runs and is bit-identical fast vs exact."""
    text = (ROOT / "docs" / "schedulers.md").read_text()
    section = text[text.index("## Write your own policy"):]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "no example in docs/schedulers.md"
    ns: dict = {}
    exec(compile("\n".join(blocks), "docs/schedulers.md", "exec"), ns)
    policy = ns["LAS"]
    cfg = small_engine(300, 8, 128)
    t = _trace(150, seed=5, rate=40.0)
    _, exact = _run(t, policy, cfg, exact=True)
    _, fast = _run(t, policy, cfg, exact=False)
    assert np.array_equal(fast.finish_s, exact.finish_s, equal_nan=True)


def test_the_whole_contract_on_one_screen_is_the_code():
    """docs/own-scheduler.md's "The whole contract" lists exactly the public members of `Ordering`,
    `Queue` and `Hooks` (issue: a contract the size of vLLM's, on one screen): a member added to
    or dropped from the code without the page fails here, and the queue stays at ten."""
    from schedport.engine.policies.policy import Ordering
    from schedport.engine.policies.queues import Hooks, Queue

    text = (ROOT / "docs" / "own-scheduler.md").read_text()
    section = text[text.index("## The whole contract"):text.index("## What to know")]
    assert len(section.splitlines()) <= 60      # one screen
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    listed = {}
    for part in re.split(r"\n(?=class )", block):
        name = re.match(r"class (\w+)", part).group(1)
        listed[name] = set(re.findall(r"def (\w+)\(", part)) | set(re.findall(r"^    (\w+) = ", part, re.M))

    def public(cls, attrs=()):
        own = {n for n, v in vars(cls).items() if callable(v) and (not n.startswith("_") or n in ("__len__", "__iter__"))}
        return own | set(attrs)
    assert listed["Ordering"] == public(Ordering, ("preemptive", "dynamics", "victim", "params")) - {"rng"}
    assert listed["Queue"] == public(Queue) - {"__init__"}
    assert len(listed["Queue"]) == 10
    assert listed["Hooks"] == public(Hooks)
