"""Drive vLLM's real v1 scheduler on a trace, with a simulated clock and no model.

Run with the *vLLM* interpreter: ``python _vllm_conformance.py CASES.json OUT.json``. schedport
itself never imports vLLM; `schedport.realengine.conformance` writes the case, runs this script and compares.

Each case gives the engine config (schedport's `EngineConfig.to_dict()`), the batch limits the
simulator's batching mode ran with (token budget, sequence cap, watermark), vLLM's scheduling
policy ("fcfs" or "priority") and the requests (index, arrival, prompt and output tokens,
priority). The script builds `vllm.v1.core.sched.scheduler.Scheduler` from the config, checks
that the built object has the settings asked for, and runs it step by step:

* requests whose arrival time has come are added (``Scheduler.add_request``) before each
  ``schedule()``; when nothing is running or waiting, the clock jumps to the next arrival;
* each step is priced with schedport's own latency model (imported from the source tree beside
  this file) for the batch vLLM chose: a request whose previous step completed its (re)prefill
  is a decode reading its context plus one, any other is a prefill chunk (tokens, cached);
* a `ModelRunnerOutput` samples one token for every request whose scheduled tokens reach its
  known sequence (it completes its prefill, a recompute, or decodes), none for a partial
  chunk; ``update_from_output`` then finishes requests at their ``max_tokens``.

It writes every step's (request, tokens) list in scheduling order, every preemption as
(step, request), each step's end time and every request's first-token and finish time.

With ``enable_prefix_caching`` in the engine config, vLLM's prefix cache is on (its own block
hasher, as its engine core builds it) and the token ids carry the case's prefix identity: each
request's full prompt blocks are given as ids (equal id, equal whole prefix up to that block), a
block with id ``k`` holds ``block_size`` copies of token ``PREFIX_TOKEN + k``, and every other
token (the prompt's tail, every sampled token) is the request's own, ``OWN_TOKEN + index``: so vLLM
hashes equal exactly the blocks schedport names equal. The record then also gives, per request,
the tokens vLLM found computed at its first scheduling (its prefix-cache hit).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # schedport's source tree

TOKEN = 7           # the token every step samples (never EOS: the tiny config's EOS is 2)
PREFIX_TOKEN = 1_000            # with prefix caching: a named block's token is this plus its id
OWN_TOKEN = 100_000_000         # with prefix caching: a request's own tokens are this plus its index


def build_scheduler(engine: dict, limits: dict, policy: str):
    """vLLM's v1 Scheduler for schedport's engine config, and the settings read back from it."""
    import torch
    from transformers import LlamaConfig
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    e = engine["engine"]
    max_len = int(e["max_model_len"])
    budget = limits["max_num_batched_tokens"]
    model_dir = tempfile.mkdtemp(prefix="schedport-conformance-")
    # a model config only: the scheduler reads the context length and vocabulary, no weights
    LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=max_len,
                bos_token_id=1, eos_token_id=2).save_pretrained(model_dir)
    model = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=max_len, dtype="float32")
    sched = SchedulerConfig(max_num_seqs=int(limits["max_num_seqs"]), max_num_batched_tokens=int(budget),
                            max_model_len=max_len, enable_chunked_prefill=True, is_encoder_decoder=False,
                            async_scheduling=False, policy=policy,
                            scheduler_reserve_full_isl=bool(e.get("reserve_full_prompt", True)),
                            watermark=float(limits["watermark"]))
    caching = bool(e.get("enable_prefix_caching", False))
    cache = CacheConfig(block_size=int(e["block_size"]), enable_prefix_caching=caching)
    cache.num_gpu_blocks = int(e["num_gpu_blocks"])
    vcfg = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache,
                      device_config=DeviceConfig("cpu"))
    kv = KVCacheConfig(num_blocks=int(e["num_gpu_blocks"]), kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer.0"], FullAttentionSpec(block_size=int(e["block_size"]), num_kv_heads=1,
                                                        head_size=1, dtype=torch.float32))])
    s = Scheduler(vllm_config=vcfg, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(vcfg),
                  block_size=int(e["block_size"]), log_stats=False)
    sc = s.scheduler_config
    built = {
        "block_size": s.block_size,
        "num_gpu_blocks": s.kv_cache_manager.block_pool.num_gpu_blocks,
        "usable_blocks": s.kv_cache_manager.block_pool.get_num_free_blocks(),
        "max_num_seqs": s.max_num_running_reqs,
        "max_num_batched_tokens": s.max_num_scheduled_tokens,
        "max_model_len": s.max_model_len,
        "chunked_prefill": bool(sc.enable_chunked_prefill),
        "prefix_caching": bool(s.cache_config.enable_prefix_caching),
        "async_scheduling": bool(sc.async_scheduling),
        "speculative": s.vllm_config.speculative_config is not None,
        "policy": s.policy.name.lower(),
        "reserve_full_isl": bool(s.scheduler_reserve_full_isl),
        "long_prefill_token_threshold": int(sc.long_prefill_token_threshold),
    }
    return s, built


def run(case: dict) -> dict:
    """Run the case through vLLM's scheduler; the record `schedport.realengine.conformance` compares."""
    import vllm
    from vllm import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    from schedport.engine.core.config import engine_config_from_dict
    from schedport.engine.core.latency import make_latency_model

    cfg = engine_config_from_dict(case["engine"], source="conformance case")
    lat = make_latency_model(cfg)
    s, built = build_scheduler(case["engine"], case["limits"], case["policy"])
    caching = bool(case["engine"]["engine"].get("enable_prefix_caching", False))
    hasher = _block_hasher(int(case["engine"]["engine"]["block_size"])) if caching else None
    blocks = case.get("blocks") or {}
    cached: dict[int, int] = {}
    log = _log_preemptions(s)
    reqs = case["requests"]                     # [idx, arrival, prompt, output, priority], by arrival
    n = len(reqs)
    width = len(str(max((r[0] for r in reqs), default=0)))
    rid = {}                                    # vLLM request id -> schedport index
    decoding: dict[str, bool] = {}
    first: dict[int, float] = {}
    finish: dict[int, float] = {}
    steps: list = []
    ends: list = []
    preempted: list = []
    max_steps = int(case.get("max_steps", 10_000_000))
    now = reqs[0][1] if n else 0.0
    i = 0
    idle_plans = 0
    while True:
        while i < n and reqs[i][1] <= now:
            idx, arrival, prompt, output, prio = reqs[i]
            req_id = str(idx).zfill(width)      # ids order like indices (vLLM breaks priority ties by id)
            sp = SamplingParams(max_tokens=int(output), ignore_eos=True, temperature=0.0)
            tokens = (_prompt_tokens(idx, int(prompt), blocks.get(str(idx), []), int(case["engine"]["engine"]
                                                                                    ["block_size"]))
                      if caching else [TOKEN] * int(prompt))
            s.add_request(Request(req_id, tokens, sp, None, arrival_time=float(arrival),
                                  priority=int(prio), block_hasher=hasher))
            rid[req_id] = idx
            decoding[req_id] = False
            i += 1
        if not s.has_unfinished_requests():
            if i >= n:
                break
            now = reqs[i][1]
            continue
        so = s.schedule()
        pre = [rid[r] for r in log if r in (so.preempted_req_ids or ())]
        log.clear()
        for r in so.preempted_req_ids or ():
            decoding[r] = False
        preempted.extend([len(steps), p] for p in pre)
        if so.total_num_scheduled_tokens == 0:
            s.update_from_output(so, ModelRunnerOutput(req_ids=[], req_id_to_index={}))
            if pre:
                idle_plans += 1
                if idle_plans > 1000:
                    raise RuntimeError("vLLM preempted without scheduling 1000 times in a row")
                continue
            if i < n:
                now = max(now, reqs[i][1])
                continue
            raise RuntimeError("vLLM scheduled nothing with requests waiting and none to arrive")
        idle_plans = 0
        chunks = []
        n_dec = 0
        kv = 0
        batch = []
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            k = so.num_scheduled_tokens[req_id]
            r = s.requests[req_id]
            before = r.num_computed_tokens - k          # schedule() already advanced it
            if decoding[req_id]:
                n_dec += 1
                kv += before + 1
            else:
                chunks.append((k, before))
            batch.append([rid[req_id], k])
            cached.setdefault(rid[req_id], before)
            own = OWN_TOKEN + rid[req_id] if caching else TOKEN
            sampled.append([own] if r.num_computed_tokens >= r.num_tokens else [])
        end = now + lat.iteration_time(chunks, n_dec, kv)
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: j for j, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        s.update_from_output(so, mro)
        for req_id, tok in zip(req_ids, sampled):
            if tok:
                idx = rid[req_id]
                first.setdefault(idx, end)
                decoding[req_id] = True
                r = s.requests.get(req_id)
                if r is None or r.is_finished():
                    finish[idx] = end
        steps.append(batch)
        ends.append(end)
        now = end
        if len(steps) > max_steps:
            raise RuntimeError(f"more than {max_steps} steps")
    return {"vllm_version": vllm.__version__, "built": built, "steps": steps, "ends": ends,
            "preemptions": preempted, "first_token": first, "finish": finish,
            "cached": cached if caching else {}}


def _block_hasher(block_size: int):
    """vLLM's request block hasher, built as its engine core builds it with prefix caching on."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    fn = get_hash_fn_by_name("sha256")
    init_none_hash(fn)
    return get_request_block_hasher(block_size, fn)


def _prompt_tokens(idx: int, prompt: int, ids: list, block_size: int) -> list[int]:
    """A prompt whose full blocks hold their ids' tokens and whose tail is the request's own."""
    tokens = []
    for k in ids:
        tokens.extend([PREFIX_TOKEN + int(k)] * block_size)
    return tokens + [OWN_TOKEN + idx] * (prompt - len(tokens))


def _log_preemptions(s) -> list[str]:
    """Record preemptions in the order vLLM makes them (its scheduler output keeps only a set)."""
    log: list[str] = []
    orig = s._preempt_request

    def preempt(request, *a, **kw):
        log.append(request.request_id)
        return orig(request, *a, **kw)

    s._preempt_request = preempt
    return log


def main() -> None:
    from schedport.common.atomic import atomic_write_text
    case_path, out_path = sys.argv[1], sys.argv[2]
    cases = json.loads(Path(case_path).read_text())["cases"]
    res = {"records": [run(case) for case in cases]}
    atomic_write_text(out_path, json.dumps(res))


if __name__ == "__main__":
    main()
