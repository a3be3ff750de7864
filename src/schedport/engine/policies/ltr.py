"""ltr: learning-to-rank predicted SJF (Fu et al., NeurIPS 2024) and its synthetic predictor.

`PredictedRank` is the ordering; `predicted_scores` the scores that stand in for the OPT-125M
ranker (shared with the replay's priorities), `ltr_noise_sigma` their noise scale, calibrated once
on `LTR_REFERENCE_LOG_SD`, and `achieved_tau` the Kendall tau a run reaches.
"""

from __future__ import annotations

import math

import numpy as np

from schedport.engine.policies.queues import SortedEachStep


class PredictedRank(SortedEachStep):
    """Learning-to-rank predicted SJF as in the headline runs of Fu et al. (NeurIPS 2024).

    Scores stand in for the OPT-125M ListMLE predictor: score = ln(output) + sigma z, with one
    noise scale sigma for every trace (`ltr_noise_sigma`: calibrated once, to `tau` on the
    reference spread `LTR_REFERENCE_LOG_SD`), so the Kendall tau a run achieves depends on how
    spread out its trace's lengths are, as a real ranker's quality depends on the workload; the
    achieved tau is kept in `achieved_tau` and lands in the run summary as `predictor_tau`.
    Requests are ranked by (class, score) every step, running and waiting together, and
    preempted by swap as in vllm-ltr. The repository's headline runs (`benchmarks/bench.sh`,
    `--schedule-type opt-xxx --swap-space 16`) run without the starvation guard, so it is off by
    default; with `starvation_threshold` > 0 (its fairness runs, `fair-*.sh`:
    `opt-xxx-starv200-period10`) a request not scheduled for that many consecutive steps is
    promoted to class -1 for `starvation_quantum` scheduled steps.
    """

    preemptive = True
    static_keys = True                  # a waiting key changes only by a promotion in `prepare`

    def __init__(self, sim, params):
        super().__init__(sim, params)
        self.threshold = int(params["starvation_threshold"])
        # scores are fixed; with the starvation guard on, promotions and boost ends move keys too
        self.served_key_step = 0 if self.threshold <= 0 else None
        self.quantum = int(params["starvation_quantum"])
        out = sim.trace.output_tokens
        scores = predicted_scores(out, float(params["tau"]), sim.seed)
        self.achieved_tau = achieved_tau(out, scores)
        self.scores = scores.tolist()
        self.last: dict[int, int] = {}      # idx -> engine iteration count when last scheduled / queued
        self.boost: dict[int, int] = {}     # idx -> scheduled steps left in the top class
        if self.threshold <= 0:
            # no guard: the ranking is the scores alone and there is no per-step state to keep;
            # every key is fixed, made once here (the class is 0 for all: left out, same order)
            for hook in ("push", "after_step", "after_fast_forward", "next_decision"):
                setattr(self, hook, getattr(super(), hook))
            arrival = sim.trace.arrival_s.tolist()
            self._keys = [(sc, arrival[i], i) for i, sc in enumerate(self.scores)]
            self.key = self._fixed_key

    def key(self, req, now):
        return (-1 if req.idx in self.boost else 0, self.scores[req.idx], req.arrival, req.idx)

    def _fixed_key(self, req, now):
        return self._keys[req.idx]

    def push(self, req, now):
        super().push(req, now)
        self.last.setdefault(req.idx, self.sim.iterations)
        self._next_promo = min(self._next_promo, self.last[req.idx] + self.threshold)

    _next_promo = 0                     # no promotion can happen before this engine iteration

    def prepare(self, now):
        if self.threshold <= 0:
            return
        it = self.sim.iterations
        if it < self._next_promo:
            return
        nxt = None
        boost, last, thr = self.boost, self.last, self.threshold
        for r in self.items:
            idx = r.idx
            if idx in boost:
                continue
            if it - last[idx] >= thr:
                boost[idx] = self.quantum
                last[idx] = it
                self._sorted_at = None          # the waiting order must be rebuilt
            due = last[idx] + thr
            if nxt is None or due < nxt:
                nxt = due
        for r in self.sim.running:
            idx = r.idx
            if idx in boost:
                continue
            t = self._last_scheduled(idx)
            if it - t >= thr:
                self._promoting(idx)
                boost[idx] = self.quantum
                last[idx] = t = it
            due = t + thr
            if nxt is None or due < nxt:
                nxt = due
        self._next_promo = it + thr if nxt is None else nxt

    def _last_scheduled(self, idx: int) -> int:
        """The engine iteration count at which running request `idx` was last scheduled."""
        return self.last[idx]

    def _promoting(self, idx: int) -> None:
        """Running request `idx` is about to be promoted to the top class."""

    def _scheduled(self, plan, k):
        it = self.sim.iterations
        for r, _ in plan.items:
            self.last[r.idx] = it
            b = self.boost.get(r.idx)
            if b is not None:
                if b <= k:
                    del self.boost[r.idx]
                else:
                    self.boost[r.idx] = b - k

    def after_step(self, plan, start, end):
        self._scheduled(plan, 1)

    def after_fast_forward(self, plan, starts, ends, k):
        self._scheduled(plan, k)

    def on_finish(self, req, t):
        self.last.pop(req.idx, None)
        self.boost.pop(req.idx, None)

    def next_decision(self, plan, now):
        k = self._steps_to_decision(plan)
        return (None if k is None else max(k, 1)), None

    def _steps_to_decision(self, plan) -> int | None:
        """A lower bound on the steps the same batch may run before a promotion or a boost's end."""
        k = None
        if self.threshold > 0 and self.items:
            k = self._next_promo - self.sim.iterations   # a lower bound on steps before a promotion
        for r, _ in plan.items:
            b = self.boost.get(r.idx)
            if b is not None:
                k = b if k is None else min(k, b)
        return k


LTR_REFERENCE_LOG_SD = 1.804


def ltr_noise_sigma(tau: float, reference_log_sd: float = LTR_REFERENCE_LOG_SD) -> float:
    """The predictor's noise scale: the sigma that gives Kendall tau `tau` on the reference spread.

    For bivariate-normal (ln L, score) Kendall's tau is (2/pi) arcsin(rho) (Greiner's relation),
    so tau fixes rho = sin(pi tau / 2), and score = ln L + sigma z has rho = s / sqrt(s^2 +
    sigma^2) for s = sd(ln L): sigma = s sqrt(1/rho^2 - 1) (schedulers.md section 7). It is
    computed once from `reference_log_sd`, never from the trace being run, so a trace whose
    lengths are more spread out than the reference gets a better ranking than `tau` and a
    narrower one a worse ranking; on the pooled default corpus the achieved tau is 0.530 for
    tau = 0.52 (the repository's value for the 8B-target predictor on ShareGPT).
    """
    if tau >= 1.0:
        return 0.0
    rho = math.sin(math.pi * tau / 2.0)
    return float(reference_log_sd) * math.sqrt(1.0 / (rho * rho) - 1.0)


def reference_log_sd(output_tokens: np.ndarray) -> float:
    """sd of ln(output tokens) over `output_tokens` (pass every request of a corpus, pooled)."""
    return float(np.log(np.asarray(output_tokens, dtype=np.float64)).std())


def predicted_scores(output_tokens: np.ndarray, tau: float, seed: int) -> np.ndarray:
    """Synthetic predictor scores ln(L) + sigma z, z ~ N(0, 1) seeded by `seed`, sigma = `ltr_noise_sigma(tau)`.

    Lower score = predicted shorter. The same lengths, tau and seed always give the same scores
    (the simulator and the replay's priorities share them).
    """
    out = np.asarray(output_tokens)
    n = len(out)
    if n == 0:
        return np.zeros(0)
    logL = np.log(out.astype(np.float64))
    sigma = ltr_noise_sigma(float(tau))
    if sigma == 0.0:
        return logL
    rng = np.random.Generator(np.random.PCG64([int(seed), 0x17A]))
    return logL + sigma * rng.standard_normal(n)


def achieved_tau(output_tokens: np.ndarray, scores: np.ndarray) -> float:
    """Kendall tau-b between predicted scores and true output lengths on one trace (NaN if undefined)."""
    from scipy.stats import kendalltau

    if len(scores) < 2:
        return math.nan
    t = kendalltau(np.asarray(output_tokens), np.asarray(scores)).statistic
    return float(t)
