"""The decode cohort: the running requests that decode one token per step, advanced together.

In fast mode (`Simulator` without ``exact``) a step where every member decodes bumps one clock
(`decode_clock`) instead of touching each request: a member's true `computed` and `generated` are its
fields plus ``decode_clock - sync``, and what a step needs from the members as a whole is kept as
sums — their context lengths (`cohort_pval`), how many cross into a new KV block at each clock
(`cohort_buckets`, by offset modulo the block size) and when each emits its last token (a heap
of done clocks). `sync` makes one member's fields true; a request leaves the cohort
(`cohort_leave`) before anything reads it one by one, and joins again after (`cohort_join`).
`DecodeCohort` is the simulator's share of this bookkeeping, kept apart from its event loop.
"""

from __future__ import annotations

import heapq

from schedport.engine.core.simulator import Request

_ALONE_SLACK = 16   # clocks: how far below its done clock a member served alone is entered


class CohortRequest(Request):
    """A request with the fields the decode cohort keeps on it (the fast mode's requests)."""

    __slots__ = ("sync", "pval", "done_clock", "heap_at")

    def __init__(self, idx: int, arrival: float, prompt: int, output: int, client: str | None):
        super().__init__(idx, arrival, prompt, output, client)
        self.sync = -1            # cohort clock at which computed/generated were last true (-1: not in cohort)
        self.pval = 0             # computed - sync while in the cohort (invariant under syncing)
        self.done_clock = -1      # cohort clock at which it emits its last token
        self.heap_at = -1         # clock of its earliest entry in the cohort's done heap (-1: none kept)


class DecodeCohort:
    """The simulator's decode-cohort bookkeeping (module docstring). The simulator sets up its
    state (`decode_clock`, `cohort_n`, `cohort_pval`, `cohort_buckets`, `cohort_heap`, `_cohort_hook`: the
    policy's hook for joins and leaves, None where nothing listens) and owns what it reads here:
    `cache`, `running`, `_alloc_decode`."""

    def cohort_join(self, req) -> None:
        """Start advancing `req` with the cohort (its fields are true now)."""
        req.sync = d = self.decode_clock
        pv = req.computed - d
        req.pval = pv
        req.done_clock = d + (req.output - req.generated)
        self.cohort_n += 1
        self.cohort_pval += pv
        self.cohort_buckets[pv % self.cache.block_size] += 1
        c = req.done_clock
        if not 0 <= req.heap_at <= c:
            heapq.heappush(self.cohort_heap, (c, req.idx, req))
            req.heap_at = c
        if self._cohort_hook is not None:
            self._cohort_hook(req, 1)

    def cohort_leave(self, req) -> None:
        """Make `req`'s fields true and stop advancing it with the cohort."""
        self.sync(req)
        if self._cohort_hook is not None:
            self._cohort_hook(req, -1)
        req.sync = -1
        self.cohort_n -= 1
        self.cohort_pval -= req.pval
        self.cohort_buckets[req.pval % self.cache.block_size] -= 1

    def cohort_join_all(self, reqs: list, hook) -> None:
        """`cohort_join` for each of `reqs`, with `hook` (None: nobody) told in place of the
        policy's hook: for a caller that keeps its own account of the cohort."""
        d = self.decode_clock
        bs = self.cache.block_size
        buckets = self.cohort_buckets
        heap = self.cohort_heap
        moved = 0
        for req in reqs:
            req.sync = d
            req.pval = pv = req.computed - d
            req.done_clock = c = d + (req.output - req.generated)
            moved += pv
            buckets[pv % bs] += 1
            if not 0 <= req.heap_at <= c:
                heapq.heappush(heap, (c, req.idx, req))
                req.heap_at = c
            if hook is not None:
                hook(req, 1)
        self.cohort_n += len(reqs)
        self.cohort_pval += moved

    def cohort_leave_all(self, reqs: list, hook) -> None:
        """`cohort_leave` for each of `reqs`, with `hook` (None: nobody) told in place of the
        policy's hook: for a caller that keeps its own account of the cohort."""
        d = self.decode_clock
        bs = self.cache.block_size
        buckets = self.cohort_buckets
        alloc = self._alloc_decode
        moved = 0
        for req in reqs:
            lag = d - req.sync
            if lag:
                req.computed += lag
                req.generated += lag
                req.sync = d
                if alloc:
                    req.blocks = -(-req.computed // bs)
            if hook is not None:
                hook(req, -1)
            req.sync = -1
            moved += req.pval
            buckets[req.pval % bs] -= 1
        self.cohort_n -= len(reqs)
        self.cohort_pval -= moved

    def sync(self, req) -> None:
        """Bring a cohort member's computed/generated/blocks up to the cohort clock."""
        if req.sync >= 0:
            d = self.decode_clock - req.sync
            if d:
                req.computed += d
                req.generated += d
                req.sync = self.decode_clock
                if self._alloc_decode:
                    req.blocks = -(-req.computed // self.cache.block_size)

    def _alone_entry(self, req, c: int) -> None:
        """A done-heap entry for a member served alone (its done clock `c` moved one step earlier
        while the cohort stood still): at a bound below `c`, so that being served alone again
        needs no new entry."""
        lb = max(c - _ALONE_SLACK, min(c, self.decode_clock + 1))
        heapq.heappush(self.cohort_heap, (lb, req.idx, req))
        req.heap_at = lb

    def serve_alone(self, reqs, items: list) -> None:
        """Cohort members `reqs` take their token as items (appended to `items`) while the cohort
        stands still: each made exact (`sync`) and given its next KV block where it needs one."""
        cache = self.cache
        bs = cache.block_size
        d = self.decode_clock
        alloc = self._alloc_decode
        for r in reqs:
            if r.sync != d:
                lag = d - r.sync
                r.computed += lag
                r.generated += lag
                r.sync = d
                if alloc:
                    r.blocks = -(-r.computed // bs)
            need = -(-(r.computed + 1) // bs) - r.blocks
            if need > 0:
                cache.free -= need
                r.blocks += need
            items.append((r, 1))

    def sync_all(self) -> None:
        """Make every running request's fields true and dissolve the cohort (per-request step follows)."""
        if not self.cohort_n:
            return
        for r in self.running:
            if r.sync >= 0:
                self.sync(r)
                if self._cohort_hook is not None:
                    self._cohort_hook(r, -1)
                r.sync = -1
        self.cohort_n = 0
        self.cohort_pval = 0
        self.cohort_buckets = [0] * self.cache.block_size
        for _, _, r in self.cohort_heap:
            r.heap_at = -1
        self.cohort_heap = []

    def rebuild_cohort(self) -> None:
        """After a per-request step: every decoding running request rejoins the cohort."""
        for r in self.running:
            if r.decoding and r.sync < 0:
                self.cohort_join(r)

    def cohort_crossings(self, clock: int) -> int:
        """Cohort members that need a new KV block for the decode step taken at cohort clock `clock`."""
        return self.cohort_buckets[(-clock) % self.cache.block_size]

    def _pop_cohort_done(self, finished: list) -> None:
        """Move cohort members whose last token is due by now into `finished`.

        The heap keeps for each member an entry at or below its done clock: a member that left
        and joined again keeps its old entry (its done clock only moved later), which, when it
        comes up, is put back at the member's done clock; entries of requests that left stay
        until they come up."""
        heap = self.cohort_heap
        d = self.decode_clock
        pop = heapq.heappop
        while heap and heap[0][0] <= d:
            c, _, r = heap[0]
            if r.heap_at == c:
                r.heap_at = -1
            if r.sync >= 0:
                if r.done_clock == c:
                    pop(heap)
                    self.cohort_leave(r)
                    finished.append(r)
                    continue
                if not 0 <= r.heap_at <= r.done_clock:      # put back at its done clock
                    heapq.heapreplace(heap, (r.done_clock, r.idx, r))
                    r.heap_at = r.done_clock
                    continue
            pop(heap)

    def _cohort_next_done(self) -> int:
        """The earliest done clock among the cohort's members."""
        heap = self.cohort_heap
        while heap:
            c, _, r = heap[0]
            if r.sync >= 0 and r.done_clock == c:
                return c
            if r.heap_at == c:
                r.heap_at = -1
            if r.sync >= 0 and not 0 <= r.heap_at <= r.done_clock:   # put back at its done clock
                heapq.heapreplace(heap, (r.done_clock, r.idx, r))
                r.heap_at = r.done_clock
            else:
                heapq.heappop(heap)
        raise RuntimeError("internal: empty decode cohort")

    def _cohort_new_blocks(self, d0: int, k: int) -> int:
        """KV blocks the cohort's members take in decode steps 1..k-1 after cohort clock d0."""
        bs = self.cache.block_size
        buckets = self.cohort_buckets
        cycles, rest = divmod(k - 1, bs)
        total = cycles * self.cohort_n
        for j in range(1, rest + 1):
            total += buckets[(-(d0 + j)) % bs]
        return total
