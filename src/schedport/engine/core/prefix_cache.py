"""Block identities for automatic prefix caching (APC), as vLLM v1 keeps them for one attention group.

The engine's `KVCache` counts free blocks, which is all it needs while no block is ever shared.
With prefix caching a block's *identity* matters: a full block is named by the hash of its whole
prefix, a later request whose prefix hashes the same reuses the block instead of computing it, and
which cached block is evicted first decides what the next request can still hit. `PrefixCache`
keeps exactly the state vLLM keeps for that, and nothing else:

* every block's reference count and hash, and the map from a hash to the blocks holding it
  (``vllm/v1/core/block_pool.py``: ``BlockPool``, ``BlockHashToBlockMap``);
* the free queue in eviction order: allocation takes from its head and drops the taken block's
  hash; a freed block with a hash goes to the tail (least recently used first), a freed block
  without one to the head (``BlockPool.free_blocks``, ``FreeKVCacheBlockQueue.prepend_n``/``append_n``);
  a request frees its blocks in reverse order, so its tail blocks are evicted first
  (``SingleTypeKVCacheManager.free``);
* block 0 is the null block and is never handed out (``BlockPool.__init__``).

The request-facing steps follow ``vllm/v1/core/kv_cache_manager.py`` (``get_computed_blocks``,
``allocate_slots``) and ``single_type_kv_cache_manager.py`` (``FullAttentionManager``) for the
configuration the engine models: one full-attention group whose hash block size is the engine's
block size, no speculative tokens, no KV connector:

* a look-up walks the request's block hashes from the start to the first miss, at most
  ``(num_tokens - 1) // block_size`` blocks, so a fully cached prompt recomputes its last block
  (`longest_hit`); it touches nothing;
* a hit block that no running request holds still costs a free block (it leaves the free queue),
  so it counts among the blocks to allocate (`blocks_to_allocate`);
* blocks are cached when they are allocated for tokens scheduled, up to the request's known
  tokens (`commit`), not when the step that computes them ends.

A request's blocks and how many of them are cached stay with the caller (the engine's request
state): this class holds only what is shared between requests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

NULL_BLOCK = 0


class PrefixCache:
    """The shared block pool of a prefix-caching engine: reference counts, hashes, eviction order."""

    __slots__ = ("block_size", "num_blocks", "ref_count", "block_hash", "holders", "free_queue")

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError(f"a prefix cache needs at least 2 blocks (one is the null block), got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.ref_count = [0] * num_blocks
        self.block_hash: list[Hashable | None] = [None] * num_blocks
        #: hash -> the blocks cached under it, in insertion order (a look-up takes the first)
        self.holders: dict[Hashable, dict[int, None]] = {}
        #: free blocks, head first: the next to be allocated (and so evicted) is the first key
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))

    @property
    def num_free(self) -> int:
        """Free blocks, cached ones that no request holds included (they can be evicted)."""
        return len(self.free_queue)

    # -- the pool (vLLM's BlockPool) ----------------------------------------------------------

    def cached_block(self, block_hash: Hashable) -> int | None:
        """The first block cached under `block_hash`, or None."""
        blocks = self.holders.get(block_hash)
        return next(iter(blocks)) if blocks else None

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on hit blocks, taking those nobody held out of the free queue."""
        for b in blocks:
            if self.ref_count[b] == 0 and b != NULL_BLOCK:
                del self.free_queue[b]
            self.ref_count[b] += 1

    def take(self, n: int) -> list[int]:
        """Allocate `n` blocks from the head of the free queue, evicting what they cached."""
        if n > len(self.free_queue):
            raise ValueError(f"cannot take {n} blocks: {len(self.free_queue)} are free")
        taken = [self.free_queue.popitem(last=False)[0] for _ in range(n)]
        for b in taken:
            self._evict(b)
            self.ref_count[b] = 1
        return taken

    def cache(self, blocks: Sequence[int], hashes: Sequence[Hashable], start: int, end: int) -> None:
        """Name blocks[start:end] by hashes[start:end]: they are full and can now be hit."""
        for i in range(start, end):
            self.name(blocks[i], hashes[i])

    def name(self, block: int, block_hash: Hashable) -> None:
        """Name one full block by the hash of its prefix: from now on it can be hit."""
        if block == NULL_BLOCK or self.block_hash[block] == block_hash:
            return
        self.block_hash[block] = block_hash
        self.holders.setdefault(block_hash, {})[block] = None

    def free(self, ordered: Sequence[int]) -> int:
        """Drop one reference on each block, first-to-evict first; released blocks rejoin the queue.

        Released blocks with a hash join the tail in the given order (they stay hittable until
        evicted); released blocks without one go to the head, the first of them first. Returns
        how many blocks were released (another request still holds the rest).
        """
        hashed, unhashed = [], []
        for b in ordered:
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0 and b != NULL_BLOCK:
                (unhashed if self.block_hash[b] is None else hashed).append(b)
        for b in reversed(unhashed):
            self.free_queue[b] = None
            self.free_queue.move_to_end(b, last=False)
        for b in hashed:
            self.free_queue[b] = None
        return len(hashed) + len(unhashed)

    def _evict(self, b: int) -> None:
        h = self.block_hash[b]
        if h is None:
            return
        blocks = self.holders[h]
        del blocks[b]
        if not blocks:
            del self.holders[h]
        self.block_hash[b] = None

    # -- a request's view (vLLM's KVCacheManager, one full-attention group) --------------------

    def longest_hit(self, hashes: Sequence[Hashable], num_tokens: int) -> list[int]:
        """The cached blocks of a request's longest cached prefix, capped so one token is computed."""
        hit: list[int] = []
        for h in hashes[:(num_tokens - 1) // self.block_size]:
            b = self.cached_block(h)
            if b is None:
                break
            hit.append(b)
        return hit

    def blocks_to_allocate(self, held: int, hits: Sequence[int], tokens: int) -> int:
        """Free blocks a request needs to hold `tokens` tokens, given `held` blocks and new `hits`."""
        need = max(-(-tokens // self.block_size) - held - len(hits), 0)
        return need + sum(1 for b in hits if self.ref_count[b] == 0 and b != NULL_BLOCK)

    def allocate(self, blocks: list[int], hits: Sequence[int], tokens: int) -> list[int]:
        """Add `hits` and then new blocks to a request's `blocks` so they hold `tokens` tokens."""
        if hits:
            self.touch(hits)
            blocks.extend(hits)
        new = self.take(max(-(-tokens // self.block_size) - len(blocks), 0))
        blocks.extend(new)
        return new

    def commit(self, blocks: Sequence[int], hashes: Sequence[Hashable], cached: int, tokens: int) -> int:
        """Cache a request's blocks that `tokens` known tokens fill; returns its new cached count."""
        full = min(tokens // self.block_size, len(hashes))
        if full > cached:
            self.cache(blocks, hashes, cached, full)
            return full
        return cached

    def release(self, blocks: Sequence[int]) -> int:
        """Free a finished or preempted request's blocks, tail first; how many were released."""
        return self.free(blocks[::-1])
