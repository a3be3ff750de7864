"""The engine with vLLM's automatic prefix caching (APC): `[engine] enable_prefix_caching = true`.

The plain engine counts free KV blocks; with prefix caching a block's identity matters, so this
engine keeps every block in a `PrefixCache` (vLLM 0.32's block pool: reference counts, the hash
of each full block, the free queue in eviction order) and gives each request its block list. The
loop and the policies are the plain engine's; they reach the cache through four calls that are
trivial without it (`Simulator.lookup`, `blocks_to_allocate`, `allocate`, `free_blocks`). The
rules, each from vLLM 0.32 (``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``,
``single_type_kv_cache_manager.py``, ``sched/scheduler.py``; docs/engine.md §1.3):

* **What a block is named by.** A full block is named by its whole prefix: a prompt block by the
  trace's prefix identity (`schedport.workload.prefix.engine_block_keys`: equal keys only where
  the trace says the prefixes are equal), every other block (the prompt of a trace without
  ``hash_ids``, the block a prompt's tail shares with the first output tokens, the output's blocks)
  by a key of its own request: it can be hit only by that request, after a preemption. Only full
  blocks are named, and output blocks become nameable as the tokens that fill them are generated
  (vLLM extends a request's block hashes as it appends output tokens).
* **Look-up** (`lookup`): only for a request with no computed tokens (new, or preempted by
  recompute and back; `Scheduler.schedule` calls `get_computed_blocks` only then); it walks the
  names from the first block to the first miss, at most ``(num_tokens - 1) // block_size``
  blocks, so one token is always computed and a fully cached prompt recomputes its last block.
  The cached tokens are not charged to the step's token budget; a hit block that no running
  request holds still costs a free block (`blocks_to_allocate`).
* **When a block becomes a hit** (`allocate`): when the tokens that fill it are scheduled (vLLM's
  ``cache_blocks`` in ``allocate_slots``), so a request admitted later in the same step hits a
  prefix being computed in that step, and one that arrived before it was scheduled does not.
* **Eviction**: a finished or preempted request frees its blocks last first; a freed named block
  joins the tail of the free queue and stays a hit until allocation reaches it at the head, where
  its name is dropped; a freed unnamed block goes to the head. vLLM's null block (block 0) is
  set aside as in the plain engine.

A swapped-out request (swapping policies) frees its GPU blocks like a preempted one and gets new
ones when it returns, its full blocks named again; it keeps its computed tokens, so it looks
nothing up. The fast mode's cohort counts blocks without names, so a run with prefix caching
steps every iteration (`schedport.engine.modes.make_simulator`).
"""

from __future__ import annotations

import numpy as np

from schedport.engine.core.prefix_cache import PrefixCache
from schedport.engine.core.simulator import Request, Simulator
from schedport.workload.prefix import engine_block_keys


CACHE_SLOTS = ("block_ids", "named", "prompt_keys", "cached_tokens", "lost")


def init_cache_fields(req) -> None:
    """A new request's prefix-cache fields (the slots `CACHE_SLOTS` of its class)."""
    req.block_ids = []          # the blocks it holds, in token order
    req.named = 0               # how many of them are named (cached) so far
    req.prompt_keys = None      # the trace's names of its full prompt blocks (None: not read yet)
    req.cached_tokens = -1      # prompt tokens found cached at its first admission (-1: not admitted)
    req.lost = 0                # tokens its latest preemption dropped and no hit has given back


class CachedRequest(Request):
    """A request of the caching engine: its blocks by identity, and its prompt's block names."""

    __slots__ = CACHE_SLOTS

    def __init__(self, idx: int, arrival: float, prompt: int, output: int, client: str | None):
        super().__init__(idx, arrival, prompt, output, client)
        init_cache_fields(self)


class PrefixCaching:
    """The prefix cache, as a part of an engine (`CachingSimulator` here; the fast mode's
    `schedport.engine.fast.caching.CachingFastSimulator`).

    The engine's count of free blocks (`cache.free`) stays the truth the policies read. Block
    identities may lag it: the fast mode counts the blocks its fast-forwarded decodes take
    without naming them. Which block a request holds does not matter, only which named blocks the
    free queue still holds and in what order; so the blocks counted as taken are taken from the
    queue's head (evicting what they held) before anything reads or changes the queue's order: a
    look-up, and a request's release, which first gives the request its blocks and names its full
    ones (its own, which no other request can hit). Prompt blocks are always named when scheduled.
    """

    caching = True

    def __init__(self, trace, policy, config, latency, **options):
        # index 0 of the pool is its own null block, so num_gpu_blocks blocks remain usable, as in
        # the plain engine; a mode that keeps vLLM's null block sets one more aside
        self.pool = PrefixCache(config.num_gpu_blocks + 1, config.block_size)
        self._taken: list[int] = []     # blocks taken for counted blocks not yet given to their request
        super().__init__(trace, policy, config, latency, **options)
        self._has_keys = trace.hash_ids is not None

    # ----------------------------------------------------------------- names
    def _prompt_keys(self, req) -> list:
        keys = req.prompt_keys
        if keys is None:
            keys = req.prompt_keys = (engine_block_keys(self.trace, req.idx, self.cache.block_size)
                                      if self._has_keys else [])
        return keys

    def _name_full_blocks(self, req, tokens: int) -> None:
        """Name `req`'s full blocks among its first `tokens` tokens that are not named yet."""
        full = min(tokens, req.prompt + req.generated, len(req.block_ids) * self.cache.block_size) \
            // self.cache.block_size
        if full > req.named:
            keys = self._prompt_keys(req)
            ids = req.block_ids
            name = self.pool.name
            for j in range(req.named, full):
                name(ids[j], keys[j] if j < len(keys) else (-1 - req.idx, j))
            req.named = full

    # ----------------------------------------------------------------- counted blocks, taken
    def _take_counted(self) -> None:
        """Take from the queue's head the blocks the engine counted as taken and the pool still holds."""
        short = self.pool.num_free - self.cache.free
        if short > 0:
            self._taken.extend(self.pool.take(short))

    def _catch_up(self, req) -> None:
        """Give `req` the blocks it was counted as holding."""
        short = req.blocks - len(req.block_ids)
        if short > 0:
            self._take_counted()
            taken = self._taken
            req.block_ids.extend(taken[-short:])
            del taken[-short:]

    # ----------------------------------------------------------------- the calls the policies make
    def set_aside_null_block(self) -> None:
        self.pool.take(1)
        self.cache.num_blocks -= 1
        self.cache.free -= 1

    def lookup(self, req) -> list:
        if req.computed or req.swapped:
            return []
        self._take_counted()
        holders = self.pool.holders
        keys = self._prompt_keys(req)
        hit = []
        for j in range((req.prompt + req.generated - 1) // self.cache.block_size):
            blocks = holders.get(keys[j] if j < len(keys) else (-1 - req.idx, j))
            if not blocks:
                break
            hit.append(next(iter(blocks)))
        return hit

    def blocks_to_allocate(self, req, tokens: int, hit=()) -> int:
        return self.pool.blocks_to_allocate(req.blocks, hit, tokens)

    def allocate(self, req, blocks: int, tokens: int = 0, hit=()) -> None:
        if req.blocks > len(req.block_ids):
            self._catch_up(req)
        pool = self.pool
        ids = req.block_ids
        self.cache.free -= blocks
        if hit:
            fresh = sum(1 for b in hit if pool.ref_count[b] == 0)
            pool.touch(hit)
            ids.extend(hit)
            blocks -= fresh
            cached = len(hit) * self.cache.block_size
            req.computed = cached
            saved = min(cached, req.lost)       # a preempted request's own KV, found again
            req.recomputed -= saved
            self.recomputed_tokens -= saved
        if req.cached_tokens < 0:
            req.cached_tokens = len(hit) * self.cache.block_size
        req.lost = 0
        if blocks > 0:
            if len(self._taken) >= blocks:          # counted blocks already taken serve as well as any
                ids.extend(self._taken[-blocks:])
                del self._taken[-blocks:]
            else:
                ids.extend(pool.take(blocks))
        req.blocks = len(ids)
        if tokens > req.named * self.cache.block_size:
            self._name_full_blocks(req, tokens)

    def free_blocks(self, req) -> None:
        self._take_counted()        # every counted take came before this release
        self._catch_up(req)
        self._name_full_blocks(req, req.computed)
        freed = self.pool.release(req.block_ids) if req.block_ids else 0
        self.cache.free += freed
        req.block_ids = []
        req.named = 0
        req.blocks = 0
        req.lost = req.computed

    def _cached_tokens(self) -> np.ndarray:
        return np.array([max(r.cached_tokens, 0) for r in self.requests], dtype=np.int64)


class CachingSimulator(PrefixCaching, Simulator):
    """The exact engine with automatic prefix caching (see the module's docstring for the rules)."""

    request_class = CachedRequest
