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
    ids = trace.hash_ids_of(i)
    n = int(trace.input_tokens[i])
    per = bs // eb
    b = np.arange(n // eb)
    j = b // per
    tokens = np.minimum(n - j * bs, bs)
    return list(zip(ids[j].tolist(), (b % per).tolist(), tokens.tolist()))
