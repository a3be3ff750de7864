"""Orderings and gates with state of their own: SRPT (`ShortestRemaining`), HRRN
(`ResponseRatio`), VTC (`VirtualTokenCounter`) and SLO-aware admission control (`SloGate`).

The orderings of ltr and fastserve have modules of their own (`schedport.engine.ltr`,
`schedport.engine.mlfq`); the registry that names them all is `schedport.engine.schedulers`.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from schedport.engine.policy import Ordering, SortedEachStep
from schedport.engine.simulator import Request
from schedport.errors import ConfigError


class ShortestRemaining(SortedEachStep):
    """SRPT: rank all live requests by oracle remaining output tokens (ties by arrival).

    Preemptive at token granularity: the engine ranks running and waiting requests together each
    step (vllm-ltr's `srtf`). Waiting keys are fixed and running keys only shrink, so the ranking
    cannot turn against a running request between engine events.
    """

    preemptive = True
    static_keys = True
    served_key_step = -1                # remaining tokens: one fewer per token served

    def key(self, req, now):
        return (req.output - req.generated, req.arrival, req.idx)


class ResponseRatio(SortedEachStep):
    """HRRN: admit the waiting request with the highest response ratio (W + S) / S.

    S is the request's service time alone under the latency model (`size = "oracle"`: prefill
    plus its true output length of batch-1 decodes; `"prompt"`: prefill plus the trace's mean
    output length). Brinch Hansen, SOSP 1971. Non-preemptive; memory victim is the newest.
    """

    dynamic = True

    def __init__(self, sim, params):
        super().__init__(sim, params)
        size = params["size"]
        out = sim.trace.output_tokens
        if size == "prompt":
            out = np.full_like(out, max(1, int(round(float(out.mean()))) if len(out) else 1))
        elif size != "oracle":
            raise ConfigError(f"[scheduler.hrrn] size: must be 'oracle' or 'prompt', got {size!r}")
        self.S = sim.latency.alone_time(sim.trace.input_tokens, out) if len(out) else np.zeros(0)

    def key(self, req, now):
        S = float(self.S[req.idx])
        return (-((now - req.arrival) + S) / S, req.arrival, req.idx)


class VirtualTokenCounter(Ordering):
    """VTC fair scheduling (Sheng et al., OSDI 2024; Ying1123/VTC-artifact).

    Each client has a counter of weighted service. Whenever the engine can admit, the client
    with the smallest counter among those with queued requests sends its oldest request; on
    admission the counter grows by w_p x input tokens, and by w_q for every token it generates.
    A client that becomes backlogged again is lifted to the smallest counter of the other
    backlogged clients, so idle time is not banked. Requests without a client id are each their
    own client. Preemption (the engine's recompute) charges no refund.

    A counter is kept as lift offset + w_p x input tokens + w_q x output tokens, with the token
    counts as integers (output tokens of decode-cohort members are counted lazily from the
    cohort clock), so the step-by-step and fast-forward modes compute identical floats.
    """

    dynamic = True

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.wp = float(params["w_p"])
        self.wq = float(params["w_q"])
        self.base: dict[str, float] = {}          # lift offsets
        self.tin: dict[str, int] = {}             # input tokens charged
        self.tout: dict[str, int] = {}            # output tokens charged (synced part)
        self.ncoh: dict[str, int] = {}            # decode-cohort members of the client
        self.csync: dict[str, int] = {}           # cohort clock at the last sync of tout
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
            self.ncoh[c] = 0
            self.csync[c] = self.sim.dclock

    def _sync(self, c):
        d = self.sim.dclock
        self.tout[c] += self.ncoh[c] * (d - self.csync[c])
        self.csync[c] = d

    def service(self, c) -> float:
        """Weighted service received by client `c` so far (no lift offset)."""
        if c not in self.base:
            return 0.0
        self._sync(c)
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

    def cohort_changed(self, req, delta):
        c = self.client(req)
        self._sync(c)
        self.ncoh[c] += delta

    def after_step(self, plan, start, end):
        for r in plan.emitted:
            self.tout[self.client(r)] += 1


class SloGate:
    """SLO-aware admission control: reject requests whose TTFT deadline can no longer be met.

    At arrival and at every step, each waiting request that has not yet produced a token gets a
    lower bound on its first-token time: now + (prefill tokens queued ahead of it under FCFS,
    including unfinished prefills of running requests, plus its own prompt) / the engine's peak
    prefill rate under the latency model. If that bound exceeds arrival + TTFT_SLO x (1 + slack),
    the request is rejected: with slack = 0 a request is rejected only when a miss is certain
    under the cost model. Design after Mooncake's early rejection (Qin et al., FAST 2025) and
    SCORPIO's TTFT guard (Tang et al., 2025).
    """

    def __init__(self, sim, params):
        profiles = sim.config.slo_profiles
        prof = params["slo_profile"]
        if prof not in profiles:
            raise ConfigError(f"[scheduler.slo-admission] slo_profile: unknown profile {prof!r} "
                              f"(known: {', '.join(profiles)})")
        self.ttft = float(profiles[prof][0]) * (1.0 + float(params["slack"]))
        self.sim = sim
        self.rate = None

    def _rate(self, sched):
        if self.rate is None:
            budget = sched.mode.budget
            lat = self.sim.latency
            self.rate = max(n / lat.iteration_time([(n, 0)], 0, 0)
                            for n in sorted({16, 64, 128, 256, 512, 1024, budget} - {0})
                            if n <= budget)
        return self.rate

    def _ahead0(self):
        return sum(r.num_tokens - r.computed for r in self.sim.running if not r.decoding)

    def filter(self, sched, now):
        order = sched.order
        if not len(order):
            return
        rate = self._rate(sched)
        ahead = self._ahead0()
        for r in list(order.ordered(now)):
            if r.generated == 0:
                if now + (ahead + r.num_tokens) / rate > r.arrival + self.ttft:
                    order.remove(r)
                    self.sim.reject(r, "TTFT deadline cannot be met (admission control)")
                    continue
            ahead += r.num_tokens

    def _deadlines(self, sched, now):
        rate = self._rate(sched)
        ahead = self._ahead0()
        out = []
        for r in sched.order.ordered(now):
            if r.generated == 0:
                out.append((r.arrival + self.ttft, (ahead + r.num_tokens) / rate))
            ahead += r.num_tokens
        return out

    def fast_forward_limit(self, sched, plan, now):
        d = self._deadlines(sched, now) if len(sched.order) else []
        if not d:
            return None, None
        return None, min(D - x for D, x in d) - 1e-9

    def refine(self, sched, plan, starts, ends, k):
        d = self._deadlines(sched, float(starts[0])) if len(sched.order) else []
        for D, x in d:
            hit = np.nonzero(starts[:k] + x > D)[0]
            if hit.size:
                k = min(k, max(int(hit[0]), 1))
        return k


# ============================================================================ helpers


#: Standard deviation of ln(output tokens) pooled over the 107,837 requests of the default
#: study corpus (schedport-study-v1, 120 windows of Azure, Bailian and modeled BurstGPT; corpus
