"""vtc: the Virtual Token Counter's fair queue (`VirtualTokenCounter`).

Its state is more than a key — a counter per client that every token served moves — so it is an
engine queue (`schedport.engine.policies.queues.Queue`) rather than an `Ordering`.
"""

from __future__ import annotations

import heapq
from collections import deque

from schedport.engine.policies.queues import Queue
from schedport.engine.core.simulator import Request


class VirtualTokenCounter(Queue):
    """VTC fair scheduling (Sheng et al., OSDI 2024; Ying1123/VTC-artifact).

    Each client has a counter of weighted service. Whenever the engine can admit, the client
    with the smallest counter among those with queued requests sends its oldest request; on
    admission the counter grows by w_p x input tokens, and by w_q for every token it generates.
    A client that becomes backlogged again is lifted to the smallest counter of the other
    backlogged clients, so idle time is not banked. Requests without a client id are each their
    own client. Preemption (the engine's recompute) charges no refund.

    A counter is kept as lift offset + w_p x input tokens + w_q x output tokens, with the token
    counts as integers, so that an engine that counts tokens many at a time computes identical floats.
    """

    dynamic = True

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.wp = float(params["w_p"])
        self.wq = float(params["w_q"])
        self.base: dict[str, float] = {}          # lift offsets
        self.tin: dict[str, int] = {}             # input tokens charged
        self.tout: dict[str, int] = {}            # output tokens charged
        self.queues: dict[str, deque[Request]] = {}   # backlogged clients only (never empty)
        self.heap: list = []                      # (counter, head arrival, head idx, client), lazily valid
        self.n = 0
        self.charged: set[int] = set()

    @staticmethod
    def client(req):
        return req.client if req.client is not None else f"#{req.idx}"

    def _ensure(self, c):
        if c not in self.base:
            self.base[c] = 0.0
            self.tin[c] = 0
            self.tout[c] = 0

    def service(self, c) -> float:
        """Weighted service received by client `c` so far (no lift offset)."""
        if c not in self.base:
            return 0.0
        return self.wp * self.tin[c] + self.wq * self.tout[c]

    def counter(self, c) -> float:
        """The client's virtual counter: lift offset plus weighted service."""
        return self.base[c] + self.service(c)

    def __len__(self): return self.n
    def __iter__(self):
        for q in self.queues.values():
            yield from q

    def _mark(self, c) -> None:
        """Client `c`'s queue head changed: enter its current (counter, arrival, index)."""
        h = self.queues[c][0]
        heapq.heappush(self.heap, (self.counter(c), h.arrival, h.idx, c))

    def push(self, req, now):
        c = self.client(req)
        self._ensure(c)
        q = self.queues.get(c)
        if q is None:
            if self.queues:
                m = self.counter(self._best())
                if self.counter(c) < m:
                    self.base[c] = m - self.service(c)
            q = self.queues[c] = deque()
            q.append(req)
            self._mark(c)
        else:
            q.append(req)
        self.n += 1

    def requeue(self, req, now):
        c = self.client(req)
        self._ensure(c)
        self.queues.setdefault(c, deque()).appendleft(req)
        self._mark(c)
        self.n += 1

    def _best(self):
        """The backlogged client with the smallest (counter, head arrival, head index).

        Counters only grow, and an entry is made whenever a client's head changes, so no entry
        is above its client's true value: the first entry that still equals it is the minimum.
        """
        heap = self.heap
        queues = self.queues
        while heap:
            cnt, arr, idx, c = heap[0]
            q = queues.get(c)
            if q is not None and q[0].idx == idx:
                now = self.counter(c)
                if now == cnt:
                    return c
                heapq.heapreplace(heap, (now, arr, idx, c))
            else:
                heapq.heappop(heap)
        return None

    def head(self, now):
        c = self._best()
        return self.queues[c][0] if c is not None else None

    def pop_head(self):
        c = self._best()
        self.n -= 1
        q = self.queues[c]
        req = q.popleft()
        if q:
            self._mark(c)
        else:
            del self.queues[c]
        return req

    def remove(self, req):
        c = self.client(req)
        q = self.queues[c]
        head = q[0] is req
        q.remove(req)
        if not q:
            del self.queues[c]
        elif head:
            self._mark(c)
        self.n -= 1

    def ordered(self, now):
        return sorted(self, key=lambda r: (self.counter(self.client(r)), r.arrival, r.idx))

    def on_admit(self, req, now):
        if req.idx not in self.charged:
            self.charged.add(req.idx)
            self.tin[self.client(req)] += req.prompt

    def after_step(self, plan, start, end):
        for r in plan.emitted:
            self.tout[self.client(r)] += 1
