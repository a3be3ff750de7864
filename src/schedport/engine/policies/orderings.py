"""The rankings of the policies that are only a ranking: each an `Ordering`, a key and its dynamics.

sjf (`ShortestJob`), spf (`ShortestPrompt`, with optional aging), edf (`EarliestDeadline`), srpt
(`ShortestRemaining`) and hrrn (`ResponseRatio`). The engine keeps their requests in the queue
their dynamics allow (`schedport.engine.policies.queues.queue_for`). The policies with state beyond a key
have modules of their own: VTC (`vtc`), ltr (`ltr`), FastServe (`mlfq`); FCFS is the engine's
`Fifo`. The registry that names them all is `schedport.engine.policies.schedulers`.
"""

from __future__ import annotations

import numpy as np

from schedport.engine.policies.policy import WITH_TIME, Ordering, PerServedToken
from schedport.errors import ConfigError


class ShortestJob(Ordering):
    """SJF: oracle output length, shortest first (ties by arrival); non-preemptive.

    Classic SJF; the oracle-length baseline of Fu et al., NeurIPS 2024 (hao-ai-lab/vllm-ltr,
    `sjf` mode, which ranks waiting requests by their true output length)."""

    def key(self, req, now):
        return (req.output, req.arrival, req.idx)


class ShortestPrompt(Ordering):
    """SPF: prompt tokens, fewest first; with `aging` > 0, key = prompt tokens - aging x
    seconds waited, so a long prompt is not starved (and memory pressure then preempts the
    newest, as the re-sorted list's order carries no priority of its own)."""

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.alpha = float(params.get("aging", 0.0))
        if self.alpha > 0.0:
            self.dynamics = WITH_TIME
            self.victim = "newest"

    def key(self, req, now):
        if self.alpha > 0.0:
            return (req.prompt - self.alpha * (now - req.arrival), req.arrival, req.idx)
        return (req.prompt, req.arrival, req.idx)


#: Deadline rules `[scheduler.edf] deadline` accepts.
DEADLINE_RULES = ("last-token", "first-token")


def request_deadlines(arrival_s: np.ndarray, output_tokens: np.ndarray, ttft_slo: float, tpot_slo: float,
                      rule: str = "last-token") -> np.ndarray:
    """Each request's EDF deadline (absolute seconds) under an SLO profile (ttft_slo, tpot_slo).

    ``"last-token"`` (the default): the time its last token is due, arrival + ttft_slo +
    tpot_slo x (output_tokens - 1). Niyama (Goel et al., arXiv 2503.22562, ASPLOS 2026; code in
    microsoft/sarathi-serve, branch niyama_asplos2026, `Sequence._get_TBT_deadline` in
    sarathi/core/datatypes/sequence.py) gives token i the deadline first-token deadline + i x
    the per-token budget; the request's deadline is its last token's. It grows with the
    request's own work, so edf differs from FCFS wherever output lengths differ; like sjf it
    reads the true output length. ``"first-token"``: arrival + ttft_slo, the TTFT deadline
    alone (Niyama's `edf` ordering within one SLO tier), which with one profile for every
    request is arrival order, i.e. FCFS.
    """
    arr = np.asarray(arrival_s, dtype=np.float64)
    if rule == "first-token":
        return arr + float(ttft_slo)
    if rule != "last-token":
        raise ConfigError(f"deadline rule must be one of {', '.join(DEADLINE_RULES)}, got {rule!r}")
    n_out = np.asarray(output_tokens, dtype=np.float64)
    return arr + float(ttft_slo) + float(tpot_slo) * (n_out - 1.0)


def deadline_priorities(deadlines_s: np.ndarray) -> np.ndarray:
    """Deadlines as the integer priorities a vLLM server orders by: whole microseconds.

    edf ranks by these same integers, so the simulator and a replay (or `schedport conformance`)
    break every tie alike: by arrival, then request. Milliseconds were too coarse: two deadlines
    within 1 ms tied on the server but not in the simulator."""
    return np.round(np.asarray(deadlines_s, dtype=np.float64) * 1e6).astype(np.int64)


class EarliestDeadline(Ordering):
    """EDF: waiting order by deadline (`request_deadlines` under `slo_profile` and `deadline`),
    in whole microseconds (`deadline_priorities`); non-preemptive."""

    def __init__(self, sim, params):
        super().__init__(sim, params)
        ttft, tpot = sim.config.slo_profiles[params["slo_profile"]]
        t = sim.trace
        self.deadline = deadline_priorities(request_deadlines(t.arrival_s, t.output_tokens, ttft, tpot,
                                                              params["deadline"])).tolist()

    def key(self, req, now):
        return (self.deadline[req.idx], req.arrival, req.idx)


class ShortestRemaining(Ordering):
    """SRPT: rank all live requests by oracle remaining output tokens (ties by arrival).

    Preemptive at token granularity: the engine ranks running and waiting requests together each
    step (vllm-ltr's `srtf`). A served request's key drops by one per token, every other key
    stands still, so the ranking cannot turn against a running request between engine events.
    """

    preemptive = True
    dynamics = PerServedToken(-1)

    def key(self, req, now):
        return (req.output - req.generated, req.arrival, req.idx)


class ResponseRatio(Ordering):
    """HRRN: admit the waiting request with the highest response ratio (W + S) / S.

    S is the request's service time alone under the latency model (`size = "oracle"`: prefill
    plus its true output length of batch-1 decodes; `"prompt"`: prefill plus the trace's mean
    output length). Brinch Hansen, SOSP 1971. Non-preemptive; memory victim is the newest.
    """

    dynamics = WITH_TIME
    victim = "newest"

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
