"""A trace's prefix identity at the engine's block size (docs/corpus.md, "Prefix identity in traces").

A trace's ids name blocks of `hash_block_size` prompt tokens (Mooncake: 512); the engine caches
blocks of `engine_block_tokens` (16). `engine_block_keys` gives each full engine block of a
request a key such that two engine blocks may share cached KV only when their keys are equal:
``(id, offset, tokens)``, where `id` names the covering id block, `offset` is the engine block's
place in it and `tokens` is how many prompt tokens that id block holds (`hash_block_size` when it
is full; less for a partial last block, which is then shared only with a request whose last
block has the same id and the same length: the conservative reading, which never invents a hit).
"""

from __future__ import annotations

import numpy as np

from schedport.workload.trace import Trace


def engine_block_keys(trace: Trace, i: int, engine_block_tokens: int = 16) -> list[tuple[int, int, int]]:
    """Keys of request i's full engine blocks, in order: floor(input_tokens / engine_block_tokens)
    of them (only full blocks are cached, as in vLLM). Raises `ValueError` when the trace has no
    ids or its block size is not a multiple of the engine's."""
    if trace.hash_ids is None or trace.hash_block_size is None:
        raise ValueError("this trace carries no hash_ids")
    bs, eb = int(trace.hash_block_size), int(engine_block_tokens)
    if eb < 1 or bs % eb:
        raise ValueError(f"hash_block_size {bs} is not a multiple of the engine's block of {eb} tokens")
    return _keys(trace.hash_ids_of(i), int(trace.input_tokens[i]), bs, eb)


def _keys(ids: np.ndarray, n: int, bs: int, eb: int) -> list[tuple[int, int, int]]:
    """`engine_block_keys` of a request of `n` prompt tokens with block ids `ids` of `bs` tokens."""
    per = bs // eb
    b = np.arange(n // eb)
    j = b // per
    tokens = np.minimum(n - j * bs, bs)
    return list(zip(ids[j].tolist(), (b % per).tolist(), tokens.tolist()))


def seen_prefix_tokens(trace: Trace, engine_block_tokens: int = 16) -> np.ndarray:
    """Per request, the prompt tokens a prefix cache that never evicts would serve it: the longest
    run of its leading full engine blocks (`engine_block_keys`) that some earlier request of the
    trace (in trace order) had, capped as vLLM caps a hit (at most input_tokens - 1 tokens, whole
    blocks: a fully cached prompt recomputes its last block).

    Computed from the trace alone, independently of the engine: the reference a simulated cache
    is held to at low load, and what `tools/warmup_hit_rate.py` measures a warm-up against when no
    engine with a prefix cache is at hand. It ignores time (a request hits a prefix whose
    prefill has not been scheduled yet) and memory (nothing is ever evicted), so it is the most
    any engine's cache could serve, not what one does.
    """
    eb = int(engine_block_tokens)
    engine_block_keys(trace, 0, eb)          # the checks: ids present, block sizes compatible
    bs, off = int(trace.hash_block_size), trace.hash_offsets()
    seen: set[tuple[int, int, int]] = set()
    out = np.zeros(len(trace), dtype=np.int64)
    for i in range(len(trace)):
        keys = _keys(trace.hash_ids[off[i]:off[i + 1]], int(trace.input_tokens[i]), bs, eb)
        hit = 0
        while hit < len(keys) and keys[hit] in seen:
            hit += 1
        out[i] = min(hit, (int(trace.input_tokens[i]) - 1) // eb) * eb
        seen.update(keys)
    return out
