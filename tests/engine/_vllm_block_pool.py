"""Replay block-pool operations on vLLM's real ``BlockPool`` and record what it answers.

Run with the *vLLM* interpreter: ``python _vllm_block_pool.py OPS.json OUT.json``. The operations
are the ones `schedport.engine.core.prefix_cache.PrefixCache` performed in a test (see
tests/engine/test_prefix_cache.py); the test compares the two records. Each operation is a list:

* ``["lookup", hashes]``: the first cached block of each hash, to the first miss;
* ``["touch", blocks]``, ``["take", n]``, ``["free", blocks]`` (in eviction order);
* ``["cache", blocks, hashes, start, end]``: cache blocks[start:end] under hashes[start:end].

Hashes are strings here and become bytes for vLLM. After every operation the record holds the
answer (block ids, or None) and the free queue, head first.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace


def main(ops_path: str, out_path: str) -> None:
    from vllm.v1.core.block_pool import BlockPool

    spec = json.loads(open(ops_path).read())
    bs = spec["block_size"]
    pool = BlockPool(num_gpu_blocks=spec["num_blocks"], enable_caching=True, hash_block_size=bs)
    record = []
    for op in spec["ops"]:
        kind, args = op[0], op[1:]
        try:
            answer = apply(pool, bs, kind, args)
        except Exception as e:  # vLLM refused the operation: the records diverge here
            record.append({"answer": f"vLLM refused: {type(e).__name__}: {e}", "free_queue": None})
            break
        queue = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        record.append({"answer": answer, "free_queue": queue})
    with open(out_path, "w") as f:
        json.dump(record, f)


def apply(pool, bs: int, kind: str, args: list):
    """Apply one operation to vLLM's pool; its answer (block ids) or None."""
    if kind == "lookup":
        answer = []
        for h in args[0]:
            got = pool.get_cached_block(h.encode(), [0])
            if not got:
                break
            answer.append(got[0].block_id)
        return answer
    if kind == "take":
        return [b.block_id for b in pool.get_new_blocks(args[0])]
    if kind == "touch":
        pool.touch([pool.blocks[b] for b in args[0]])
    elif kind == "free":
        pool.free_blocks([pool.blocks[b] for b in args[0]])
    elif kind == "cache":
        blocks, hashes, start, end = args
        request = SimpleNamespace(block_hashes=[h.encode() for h in hashes], request_id="r")
        pool.cache_full_blocks(request, [pool.blocks[b] for b in blocks], start, end, bs, 0)
    else:
        raise ValueError(f"unknown operation {kind!r}")
    return None

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
