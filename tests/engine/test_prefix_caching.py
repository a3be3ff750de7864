"""The engine with automatic prefix caching (`[engine] enable_prefix_caching`): vLLM 0.32's rules,
one test each, the outputs it adds, and the Mooncake trace's hit rate counted independently."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _engines import small_engine
from _paths import MIRROR
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedport.engine import runner
from schedport.engine.core.config import EngineConfig, engine_config_from_dict
from schedport.engine.core.latency import make_latency_model
from schedport.engine.core.simulator import StepRecord
from schedport.engine.modes import make_simulator
from schedport.engine.policies.plugins import get_scheduler
from schedport.engine.policies.schedulers import REGISTRY, get_policy
from schedport.errors import SchedportError
from schedport.workload.trace import Trace

APC = EngineConfig(enable_prefix_caching=True)


def _trace(arrivals, prompts, outputs, ids, block=16) -> Trace:
    return Trace.from_arrays(arrival_s=arrivals, input_tokens=prompts, output_tokens=outputs, hash_ids=ids,
                             hash_block_size=block)


def _run(trace: Trace, cfg: EngineConfig = APC, scheduler: str = "vllm-fcfs"):
    """The simulator's output and every step it took, [(request, tokens)] in scheduling order."""
    steps: list = []
    sim = make_simulator(trace, get_scheduler(scheduler), cfg, make_latency_model(cfg), exact=True,
                         observer=lambda rec: steps.append(rec.scheduled))
    return sim.run(), steps, sim


def _ids(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


# ----------------------------------------------------------------------------- the rules


def test_a_later_request_hits_a_prefix_already_scheduled_and_computes_only_the_rest():
    # 640 shared tokens (40 blocks of 16), then each its own 320
    t = _trace([0.0, 5.0], [960, 960], [4, 4], [_ids(0, 40) + _ids(100, 20), _ids(0, 40) + _ids(200, 20)])
    out, steps, _ = _run(t)
    assert out.cached_tokens.tolist() == [0, 640]
    assert [(1, 320)] in steps               # its prefill: the 320 tokens the cache did not hold


def test_the_look_up_leaves_one_token_to_compute():
    # the same 512-token prompt twice: the second finds 31 blocks, not 32, and computes the last block
    t = _trace([0.0, 5.0], [512, 512], [3, 3], [_ids(0, 32), _ids(0, 32)])
    out, steps, _ = _run(t)
    assert out.cached_tokens.tolist() == [0, 496]
    assert [(1, 16)] in steps


def test_a_request_admitted_in_the_same_step_hits_blocks_scheduled_before_it_in_that_step():
    # both arrive at once: the first's prompt blocks are named when scheduled, so the second hits them
    t = _trace([0.0, 0.0], [320, 320], [3, 3], [_ids(0, 20), _ids(0, 20)])
    out, steps, _ = _run(t)
    assert out.cached_tokens.tolist() == [0, 304]
    assert steps[0] == [(0, 320), (1, 16)]


def test_a_request_that_arrives_before_the_prefix_is_scheduled_does_not_hit_it():
    # the first is still waiting behind a long prefill when the second arrives: neither is scheduled
    # before the other's look-up... the second looks up in the step that schedules the first, after it
    big = _ids(1000, 128)
    t = _trace([0.0, 0.001, 0.002], [2048, 320, 320], [2, 2, 2], [big, _ids(0, 20), _ids(0, 20)])
    out, steps, _ = _run(t)
    # step 0 takes the 2,048-token prompt whole (the budget); requests 1 and 2 start together next step
    assert steps[0] == [(0, 2048)]
    assert out.cached_tokens.tolist() == [0, 0, 304]


def test_cached_tokens_are_not_charged_to_the_token_budget():
    cfg = dataclasses.replace(APC, max_num_batched_tokens=512)
    shared = _ids(0, 60)                                      # 960 tokens
    t = _trace([0.0, 30.0, 30.0], [992, 992, 992], [2, 2, 2],
               [shared + [500, 501], shared + [600, 601], shared + [700, 701]])
    out, steps, _ = _run(t, cfg)
    assert out.cached_tokens.tolist() == [0, 960, 960]
    # both later requests compute their 32 own tokens in one step of a 512-token budget
    assert [(1, 32), (2, 32)] in steps


def test_a_hit_block_no_running_request_holds_costs_a_free_block():
    sim = make_simulator(_trace([0.0], [64], [1], [_ids(0, 4)]), get_scheduler("vllm-fcfs"), APC,
                         make_latency_model(APC), exact=True)
    sim.run()
    held = sim.pool.num_free
    req = sim.request_class(9, 0.0, 64, 1, None)
    req.prompt_keys = sim.requests[0].prompt_keys
    hit = sim.lookup(req)
    assert len(hit) == 3                                      # capped at (64 - 1) // 16
    assert sim.blocks_to_allocate(req, 64, hit) == 4          # 3 hits taken off the free queue + 1 new
    assert sim.pool.num_free == held                          # looking touched nothing


def test_eviction_takes_the_least_recently_freed_prefix_first():
    # a cache of 1,600 usable blocks; A's prefix (60 blocks) is freed first, then B's; C (1,560 blocks)
    # takes nearly all free blocks from the queue's head: A's prefix goes, B's mostly survives
    cfg = dataclasses.replace(APC, num_gpu_blocks=1601, max_model_len=24576)
    a, b = _ids(0, 60), _ids(100, 60)
    c = _ids(1000, 1500)
    t = _trace([0.0, 10.0, 20.0, 60.0, 61.0], [960, 960, 24000, 976, 976], [2, 2, 2, 2, 2],
               [a, b, c, a + [5000], b + [6000]], block=16)
    out, _, _ = _run(t, cfg)
    # C's 1,501 blocks come from the queue's head: B's unnamed last block, the 1,479 never used,
    # then A's prefix from its last block back (A was freed first): 39 of A's 60 blocks remain.
    # C ends and its blocks join the tail; D adopts A's 39 and takes 23 from the head, which now
    # holds C's unnamed block and then B's prefix, last block first: 38 of B's 60 remain for E.
    assert out.cached_tokens[3:].tolist() == [39 * 16, 38 * 16]


def test_a_preempted_request_finds_its_own_blocks_again():
    # two long decodes in a small cache: one is preempted and, back, hits its own prompt (and outputs)
    cfg = dataclasses.replace(APC, num_gpu_blocks=400, max_model_len=4096, max_num_seqs=4)
    t = _trace([0.0, 0.0], [3000, 3000], [1000, 1000], [_ids(0, 188), _ids(1000, 188)])
    plain = dataclasses.replace(cfg, enable_prefix_caching=False)
    with_cache, _, _ = _run(t, cfg)
    without, _, _ = _run(t, plain)
    assert with_cache.preemptions_total >= 1 and without.preemptions_total >= 1
    assert with_cache.cached_tokens.tolist() == [0, 0]       # nothing shared at first admission
    assert with_cache.recomputed.sum() < without.recomputed.sum()
    assert without.recomputed.sum() == without.recomputed_tokens


def test_a_trace_without_prefix_identity_hits_nothing_and_runs_as_without_the_cache():
    rng = np.random.default_rng(1)
    n = 60
    t = Trace(np.sort(rng.uniform(0, 20, n)), rng.integers(20, 900, n), rng.integers(2, 200, n))
    plain = EngineConfig()
    for sched in ("vllm-fcfs", "sarathi", "sjf", "ltr", "fastserve", "orca"):
        a = runner.simulate(t, sched, APC, exact=True)
        b = runner.simulate(t, sched, plain, exact=True)
        assert a.summary["prefix_hit_rate"] == 0.0
        cols = ["first_token_s", "finish_s", "preemptions"]
        assert a.requests[cols].equals(b.requests[cols]), sched


def test_every_policy_runs_with_the_cache_and_the_vllm_like_ones_hit():
    t = _trace(np.arange(12) * 0.5, [700] * 12, [20] * 12, [_ids(0, 40) + _ids(100 + 10 * i, 4) for i in range(12)])
    hit = {}
    for sched in ("vllm-fcfs", "sarathi", "orca", "static", "sjf", "srpt", "ltr", "spf", "edf", "vtc",
                  "fastserve", "hrrn", "slo-admission"):
        res = runner.simulate(t, sched, APC)
        assert res.summary["completed"] if "completed" in res.summary else True
        hit[sched] = res.summary["prefix_hit_rate"]
    # Orca and request-level batching keep no prefix cache in their references: they never look up
    assert hit["orca"] == hit["static"] == 0.0
    assert all(hit[s] > 0.8 for s in hit if s not in ("orca", "static"))


# ----------------------------------------------------------------------------- outputs and config


def test_requests_table_gains_cached_and_recomputed_tokens_and_the_summary_a_hit_rate():
    t = _trace([0.0, 5.0], [960, 960], [4, 4], [_ids(0, 40) + _ids(100, 20), _ids(0, 40) + _ids(200, 20)])
    res = runner.simulate(t, "vllm-fcfs", APC)
    assert res.requests["cached_tokens"].tolist() == [0, 640]
    assert res.requests["recomputed_tokens"].tolist() == [0, 0]
    assert res.summary["prefix_hit_rate"] == pytest.approx(640 / 1920)
    assert res.summary["prefix_cached_tokens"] == 640
    off = runner.simulate(t, "vllm-fcfs", EngineConfig())
    assert off.requests["cached_tokens"].tolist() == [0, 0]
    assert "prefix_hit_rate" not in off.summary


def test_the_key_is_a_bool_and_written_only_when_on():
    with pytest.raises(SchedportError, match="enable_prefix_caching"):
        engine_config_from_dict({"engine": {"enable_prefix_caching": "yes"}})
    assert "enable_prefix_caching" not in EngineConfig().to_dict()["engine"]
    assert APC.to_dict()["engine"]["enable_prefix_caching"] is True
    assert APC.config_hash() != EngineConfig().config_hash()


def test_observer_records_stay_what_they_were():
    t = _trace([0.0], [64], [2], [_ids(0, 4)])
    recs: list[StepRecord] = []
    sim = make_simulator(t, get_scheduler("vllm-fcfs"), APC, make_latency_model(APC), observer=recs.append)
    sim.run()
    assert [r.scheduled for r in recs] == [[(0, 64)], [(0, 1)]]


# ----------------------------------------------------------------------------- Mooncake, counted independently


def _longest_seen_prefix_tokens(trace: Trace) -> list[int]:
    """Per request, the prompt tokens an earlier request already held, by the trace's own rule:
    leading 512-token ids equal, a partial last id shared only at equal id and equal length; then
    whole 16-token blocks, at most (prompt - 1) // 16 of them. Written from the ids alone, without
    the engine's block keys."""
    bs = int(trace.hash_block_size)
    seen: dict[tuple, None] = {}
    out = []
    for i in range(len(trace)):
        ids = trace.hash_ids_of(i).tolist()
        n = int(trace.input_tokens[i])
        shared = 0
        for j, h in enumerate(ids):
            tokens = min(bs, n - j * bs)
            if (j, h, tokens) not in seen:
                break
            shared += tokens
        out.append(min(shared // 16, (n - 1) // 16) * 16)
        for j, h in enumerate(ids):
            seen[(j, h, min(bs, n - j * bs))] = None
    return out


@pytest.mark.skipif(not (MIRROR / "mooncake-fast25" / "conversation_trace.jsonl").is_file(),
                    reason="public data mirror not present")
def test_mooncake_under_fcfs_with_a_cache_that_never_evicts_hits_the_longest_seen_prefix():
    from schedport.workload import sources

    full = sources.read("mooncake", [MIRROR / "mooncake-fast25" / "conversation_trace.jsonl"]).trace
    t = full.take(np.arange(400))
    # low load: each request alone (a minute apart), in a cache far larger than the 400 prompts
    t = dataclasses.replace(t, arrival_s=np.arange(len(t)) * 60.0)
    cfg = engine_config_from_dict({"engine": {"enable_prefix_caching": True, "num_gpu_blocks": 400_000,
                                              "max_model_len": 131072}})
    out, _, sim = _run(t, cfg)
    expected = _longest_seen_prefix_tokens(t)
    assert out.cached_tokens.tolist() == expected
    assert sum(expected) > 0.1 * int(t.input_tokens.sum())   # the trace does reuse its prefixes
    assert sim.pool.num_free == 400_000 - 1                   # every block back in the queue: nothing evicted


# ----------------------------------------------------------------------------- fast == exact, with the cache


@st.composite
def prefix_traces(draw, max_n=30):
    """Requests that start with one of three prefixes (or none) and go their own way, in ids of 16 tokens."""
    n = draw(st.integers(1, max_n))
    gaps = draw(st.lists(st.floats(0.0, 0.5), min_size=n, max_size=n))
    heads = draw(st.lists(st.sampled_from([0, 1, 2, 3]), min_size=n, max_size=n))
    heads_len = {0: 0, 1: 5, 2: 12, 3: 20}            # blocks of a shared prefix
    own = draw(st.lists(st.integers(1, 200), min_size=n, max_size=n))
    outs = draw(st.lists(st.integers(1, 200), min_size=n, max_size=n))
    ins, ids, fresh = [], [], 1000
    for h, u in zip(heads, own):
        p = heads_len[h] * 16 + u
        k = -(-p // 16) - heads_len[h]
        ids.append([100 * h + j for j in range(heads_len[h])] + list(range(fresh, fresh + k)))
        fresh += k
        ins.append(p)
    clients = draw(st.lists(st.sampled_from(["a", "b", None]), min_size=n, max_size=n))
    return Trace.from_arrays(arrival_s=np.cumsum(gaps), input_tokens=ins, output_tokens=outs, client_id=clients,
                             hash_ids=ids, hash_block_size=16)


@pytest.mark.parametrize("name", list(REGISTRY))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=prefix_traces(), blocks=st.sampled_from([40, 64, 200]), seqs=st.sampled_from([1, 3, 8, 32]),
       budget=st.sampled_from([None, 16, 100]))
def test_with_the_cache_fast_equals_exact_and_every_block_comes_back(name, trace, blocks, seqs, budget):
    cfg = small_engine(blocks=blocks, seqs=seqs, budget=budget, enable_prefix_caching=True)
    runs = {}
    for exact in (True, False):
        sim = make_simulator(trace, get_policy(name), cfg, make_latency_model(cfg), exact=exact)
        runs[exact] = out = sim.run()
        assert sim.cache.free == sim.cache.num_blocks == sim.pool.num_free      # every block back in the queue
        assert not sim._taken
        assert set(out.status) <= {"completed", "rejected"}
        assert (out.cached_tokens <= np.maximum(trace.input_tokens - 1, 0)).all()
    a, b = runs[True], runs[False]
    for field in ("status", "first_token_s", "finish_s", "preemptions", "cached_tokens", "recomputed"):
        x, y = getattr(a, field), getattr(b, field)
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), field
    assert a.iterations == b.iterations and a.recomputed_tokens == b.recomputed_tokens
