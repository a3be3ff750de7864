"""Automatic prefix caching's block pool (`schedport.engine.core.prefix_cache`): vLLM v1's rules,
each on a hand-built case, and a random workload replayed on vLLM's real ``BlockPool``."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
from _vllm import require_vllm

from schedport.engine.core.prefix_cache import NULL_BLOCK, PrefixCache

BS = 16
DRIVER = Path(__file__).resolve().parent / "_vllm_block_pool.py"


def chain(*names: str) -> list[str]:
    """Block hashes of a prefix whose blocks are `names` in turn (each names its whole prefix)."""
    return ["/".join(names[:i + 1]) for i in range(len(names))]


def serve(cache: PrefixCache, hashes: list[str], tokens: int) -> tuple[list[int], list[int]]:
    """Admit one request of `tokens` known tokens: its hit blocks and all its blocks, cached."""
    hits = cache.longest_hit(hashes, tokens)
    blocks: list[int] = []
    cache.allocate(blocks, hits, tokens)
    cache.commit(blocks, hashes, len(hits), tokens)
    return hits, blocks


def test_the_null_block_is_never_handed_out_and_allocation_takes_the_head():
    cache = PrefixCache(num_blocks=5, block_size=BS)
    assert cache.num_free == 4
    assert cache.take(4) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="cannot take 1 blocks: 0 are free"):
        cache.take(1)


def test_only_full_blocks_are_cached_and_generated_tokens_extend_them():
    cache = PrefixCache(num_blocks=8, block_size=BS)
    prompt = chain("a", "b")                         # 40 prompt tokens: two full blocks, 8 more
    _, blocks = serve(cache, prompt, 40)
    assert [cache.block_hash[b] for b in blocks] == [prompt[0], prompt[1], None]
    # 8 tokens generated fill the third block: its hash (prompt + output) becomes cacheable too
    hashes = prompt + ["a/b/out-r1"]
    assert cache.commit(blocks, hashes, 2, 48) == 3
    assert cache.cached_block("a/b/out-r1") == blocks[2]


def test_a_fully_cached_prompt_recomputes_its_last_block():
    cache = PrefixCache(num_blocks=8, block_size=BS)
    prompt = chain("s", "t")                         # exactly 32 tokens
    _, first = serve(cache, prompt, 32)
    # the same 32-token prompt again: the hit is capped at num_tokens - 1 = 31, block-aligned: one block
    assert cache.longest_hit(prompt, 32) == first[:1]
    assert cache.longest_hit(prompt, 33) == first[:2]


def test_the_look_up_stops_at_the_first_miss_and_touches_nothing():
    cache = PrefixCache(num_blocks=8, block_size=BS)
    _, blocks = serve(cache, chain("s", "t", "u"), 60)
    free_before, refs_before = list(cache.free_queue), list(cache.ref_count)
    assert cache.longest_hit(chain("s", "x", "u"), 60) == blocks[:1]
    assert list(cache.free_queue) == free_before and cache.ref_count == refs_before


def test_hit_blocks_nobody_holds_still_count_as_blocks_to_allocate():
    cache = PrefixCache(num_blocks=10, block_size=BS)
    prompt = chain("s", "t", "u")
    _, blocks = serve(cache, prompt, 50)             # 4 blocks, 3 cached
    hits = cache.longest_hit(prompt, 50)
    assert len(hits) == 3
    # held by the running request: a second request with the prefix needs only its 4th block
    assert cache.blocks_to_allocate(0, hits, 50) == 1
    cache.release(blocks)
    # nobody holds them now: they sit in the free queue and leave it when hit
    assert cache.blocks_to_allocate(0, hits, 50) == 1 + 3
    free = cache.num_free
    cache.allocate([], hits, 50)
    assert cache.num_free == free - 4


def test_freed_blocks_go_tail_first_and_allocation_evicts_the_oldest():
    cache = PrefixCache(num_blocks=7, block_size=BS)
    _, a = serve(cache, chain("a1", "a2"), 40)       # blocks 1,2 cached, 3 partial
    _, b = serve(cache, chain("b1", "b2"), 32)       # blocks 4,5 cached
    cache.release(a)
    # a's partial (unhashed) block to the head, its cached ones to the tail, tail block first
    assert list(cache.free_queue) == [3, 6, 2, 1]
    cache.release(b)
    assert list(cache.free_queue) == [3, 6, 2, 1, 5, 4]
    assert cache.take(3) == [3, 6, 2]
    # block 2 held a2's hash: evicted, so the chain now hits only its first block
    assert cache.cached_block("a1/a2") is None
    assert cache.longest_hit(chain("a1", "a2", "a3"), 48) == [1]


def test_a_preempted_request_hits_its_own_blocks_when_it_returns():
    cache = PrefixCache(num_blocks=10, block_size=BS)
    hashes = chain("p1", "p2", "p3")
    _, blocks = serve(cache, hashes, 50)
    cache.release(blocks)                            # preempted by recompute: its blocks are freed
    hits, again = serve(cache, hashes, 50)
    assert hits == blocks[:3] and again[:3] == blocks[:3]
    # unless they were evicted meanwhile
    cache.release(again)
    cache.take(cache.num_free)
    assert cache.longest_hit(hashes, 50) == []


def test_blocks_are_cached_when_allocated_so_a_later_request_in_the_same_step_hits_them():
    cache = PrefixCache(num_blocks=10, block_size=BS)
    system = chain("sys1", "sys2")
    serve(cache, system + ["sys2/q1"], 50)           # scheduled: cached at allocation
    assert len(cache.longest_hit(system + ["sys2/q2"], 50)) == 2


class Recording(PrefixCache):
    """A prefix cache that writes down every pool operation, for a replay on vLLM's BlockPool."""

    __slots__ = ("ops", "answers")

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.ops: list[list] = []
        self.answers: list = []

    def _note(self, op, answer=None):
        self.ops.append(op)
        self.answers.append({"answer": answer, "free_queue": list(self.free_queue)})

    def longest_hit(self, hashes, num_tokens):
        hit = super().longest_hit(hashes, num_tokens)
        # vLLM's look-up stops at the first miss; replay only the hashes walked
        self._note(["lookup", list(hashes[:len(hit) + 1][:(num_tokens - 1) // self.block_size])], hit)
        return hit

    def touch(self, blocks):
        super().touch(blocks)
        self._note(["touch", list(blocks)])

    def take(self, n):
        got = super().take(n)
        self._note(["take", n], got)
        return got

    def cache(self, blocks, hashes, start, end):
        super().cache(blocks, hashes, start, end)
        self._note(["cache", list(blocks), list(hashes), start, end])

    def free(self, ordered):
        super().free(ordered)
        self._note(["free", list(ordered)])


def random_workload(cache: PrefixCache, rng: random.Random, steps: int) -> None:
    """Conversations over a few shared system prompts, growing, finishing and preempted at random."""
    running: dict[int, dict] = {}
    for rid in range(steps):
        act = rng.random()
        if running and act < 0.35:                   # a running request generates tokens
            r = running[rng.choice(sorted(running))]
            grow = rng.randint(1, 20)
            need = cache.blocks_to_allocate(len(r["blocks"]), [], r["tokens"] + grow)
            if need <= cache.num_free:
                r["tokens"] += grow
                cache.allocate(r["blocks"], [], r["tokens"])
                r["hashes"] += [f"{r['hashes'][-1]}/o{rid}-{i}" for i in range(r["tokens"] // BS - len(r["hashes"]))]
                r["cached"] = cache.commit(r["blocks"], r["hashes"], r["cached"], r["tokens"])
            continue
        if running and act < 0.6:                    # one finishes or is preempted
            r = running.pop(rng.choice(sorted(running)))
            cache.release(r["blocks"])
            continue
        system = chain(*[f"sys{rng.randrange(3)}"] + [f"s{i}" for i in range(rng.randint(0, 3))])
        tokens = rng.randint(1, 90) + BS * len(system)
        hashes = system + [f"{system[-1]}/u{rid}-{i}" for i in range(tokens // BS - len(system))]
        hashes = hashes[:tokens // BS]
        hits = cache.longest_hit(hashes, tokens)
        if cache.blocks_to_allocate(0, hits, tokens) > cache.num_free:
            continue
        blocks: list[int] = []
        cache.allocate(blocks, hits, tokens)
        running[rid] = {"blocks": blocks, "hashes": hashes, "tokens": tokens,
                        "cached": cache.commit(blocks, hashes, len(hits), tokens)}


@pytest.mark.realengine
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_random_workload_matches_vllms_block_pool(tmp_path, seed):
    require_vllm()
    from schedport.realengine.localserver import vllm_python

    cache = Recording(num_blocks=40, block_size=BS)
    random_workload(cache, random.Random(seed), steps=400)
    kinds = {op[0] for op in cache.ops}
    assert {"lookup", "touch", "take", "cache", "free"} <= kinds
    assert any(op[0] == "lookup" and ans["answer"] for op, ans in zip(cache.ops, cache.answers)), "no hit"
    ops = tmp_path / "ops.json"
    ops.write_text(json.dumps({"num_blocks": 40, "block_size": BS, "ops": cache.ops}))
    out = tmp_path / "out.json"
    subprocess.run([str(vllm_python()), str(DRIVER), str(ops), str(out)], check=True, timeout=300,
                   capture_output=True)
    theirs = json.loads(out.read_text())
    for i, (ours, vllm) in enumerate(zip(cache.answers, theirs)):
        assert ours == vllm, f"operation {i} {cache.ops[i][:2]}: ours {ours} vLLM {vllm}"
    assert len(theirs) == len(cache.answers)
    assert NULL_BLOCK not in cache.free_queue
