"""Admission gates: which requests a policy refuses outright.

`AdmitAll` (no gate) and `SloGate`, SLO-aware admission control.
"""

from __future__ import annotations

import numpy as np

from schedport.errors import ConfigError


class AdmitAll:
    """No admission control: every request that can ever fit is served."""

    def __init__(self, sim, params):
        pass

    def filter(self, sched, now: float) -> None:
        pass

    def next_decision(self, sched, plan, now):
        return None, None

    def refine(self, sched, plan, starts, ends, k):
        return k


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

    def next_decision(self, sched, plan, now):
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
