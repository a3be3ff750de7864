"""Small engines for tests: few KV blocks and sequences, so that limits and preemption are exercised."""

from __future__ import annotations

from schedport.engine.core.config import engine_config_from_dict

#: a linear latency model with round numbers: step time = a + b * tokens + c * seqs + d * context
LINEAR = {"model": "linear", "a": 0.01, "b": 1e-5, "c": 1e-4, "d": 1e-7}


def small_engine(blocks: int = 64, seqs: int = 8, budget: int | None = None, extra: dict | None = None, *,
                 latency: dict | None = None, **engine_keys):
    """An engine config of `blocks` KV blocks of 16 tokens, `seqs` sequences and a 512-token context,
    with `budget` tokens a step (default: the engine's), more ``[engine]`` keys in `engine_keys`,
    more tables in `extra`, and `latency` (default `LINEAR`)."""
    eng = {"num_gpu_blocks": blocks, "max_num_seqs": seqs, "max_model_len": 512, "block_size": 16, **engine_keys}
    if budget:
        eng["max_num_batched_tokens"] = budget
    d = {"engine": eng, "latency": dict(LINEAR if latency is None else latency)}
    if extra:
        d.update(extra)
    return engine_config_from_dict(d)
