"""The 13 scheduling policies, each a short declaration (`Policy`) over `schedport.engine.policies.policy`'s parts.

Names are part of the CLI (`schedport schedulers` lists them). Parameters marked unverified in
../shared/docs/schedulers.md are our documented choices and can be overridden per run with a
`[scheduler.<name>]` table in the engine config. A policy is one `Policy(...)` declaration
(and, if its ranking is new, one small `Ordering`: a key and its dynamics, docs/schedulers.md
"Write your own policy"). A built-in one is added to `REGISTRY`; a user's own stays in their file
or package and is loaded by `schedport.engine.policies.plugins` (docs/own-scheduler.md).

The batching modes are in `schedport.engine.policies.batching`; the key orderings in
`schedport.engine.policies.orderings`; the policies with state of their own in `schedport.engine.policies.vtc`,
`schedport.engine.policies.ltr` (with its predictor) and `schedport.engine.policies.mlfq`; the gates in
`schedport.engine.policies.gates`. `Policy.bind` checks every ``[scheduler.*]`` table against this
registry (`validate_for`) before a simulation starts.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schedport.engine.policies.batching import Continuous, Selective, Static, StallFree
from schedport.engine.core.config import fmt_toml
from schedport.engine.policies.ltr import (  # noqa: F401  (re-exported: the ltr predictor is part of this module's API)
    LTR_REFERENCE_LOG_SD, PredictedRank, achieved_tau, ltr_noise_sigma, predicted_scores, reference_log_sd,
)
from schedport.engine.policies.gates import AdmitAll, SloGate
from schedport.engine.policies.mlfq import SkipJoinMLFQ
from schedport.engine.policies.orderings import (  # noqa: F401  (re-exported: edf's deadlines are part of this module's API)
    DEADLINE_RULES, EarliestDeadline, ResponseRatio, ShortestJob, ShortestPrompt, ShortestRemaining,
    deadline_priorities, request_deadlines,
)
from schedport.engine.policies.policy import BatchingMode, Ordering, Plan
from schedport.engine.policies.queues import Fifo, Queue, SortedEachStep, StaticKey, queue_for  # noqa: F401
from schedport.engine.policies.vtc import VirtualTokenCounter
from schedport.engine.core.simulator import Request
from schedport.common.values import is_int as _is_int, is_real as _is_real
from schedport.errors import ConfigError

# ============================================================================ the declaration and its binding


@dataclass(frozen=True)
class Policy:
    """A scheduling policy as a declaration: batching mode + ordering + admission gate.

    `params` are the policy's documented defaults; `[scheduler.<name>]` in the engine config
    overrides them. `cite` names the published source of the mechanism. An ordering (or gate)
    class may hold defaults of its own in a class attribute ``params`` (a dict): they are the
    declaration's too, under the declaration's own `params`, so a policy's parameters can live with
    its class and every name of it gives one scheduler (`class_params`; no built-in has any).
    """

    name: str
    summary: str
    batching: type[BatchingMode]
    order: Callable[..., Ordering | Queue]
    admission: Callable[..., Any] = AdmitAll
    params: dict = field(default_factory=dict)
    cite: str = ""

    def __post_init__(self):
        """Take the class defaults of the ordering and gate (`class_params`) under the declared ones."""
        inherited = class_params(self.order, self.admission)
        if inherited and isinstance(self.params, dict):
            object.__setattr__(self, "params", {**inherited, **self.params})

    def bind(self, sim) -> "BoundPolicy":
        """Instantiate the parts for one simulation (fresh state each run)."""
        validate_for(self, sim.config)    # every [scheduler.*] table: names, keys, types, ranges
        params = dict(self.params)
        params.update(sim.config.scheduler_params.get(self.name, {}))
        return self._bound(sim, params)

    def _bound(self, sim, params: dict) -> "BoundPolicy":
        """The runtime object of one simulation (a user's policy binds a checking one)."""
        return BoundPolicy(self, sim, params)

    def failure(self, exc: BaseException, sim=None):
        """The user-facing error for an exception a run of this policy (on simulator `sim`, once
        made) raised, or None (a bug: let it propagate). Built-in policies have none; a user's
        names its file (`engine.plugins`)."""
        return None

    def after_run(self, sim) -> None:
        """Check a finished run of this policy: nothing for a built-in; a user's policy must have
        left every request's arrival and lengths as the trace gave them (`engine.plugins`)."""

    def guarded(self):
        """The context a run of this policy executes in: nothing for a built-in; a user's policy
        turns an `os._exit` in its code into an error the run reports (`engine.plugins`)."""
        return contextlib.nullcontext()


def class_params(*parts) -> dict:
    """The defaults that policy parts (ordering, gate classes) declare in a class attribute
    ``params``, merged in order: what a bare `Ordering` class named as a scheduler runs with, and
    what a `Policy` declared over it inherits."""
    out: dict = {}
    for part in parts:
        declared = getattr(part, "params", None)
        if isinstance(part, type) and isinstance(declared, dict):
            out.update(declared)
    return out


class BoundPolicy:
    """A policy instantiated for one simulation: the single object the engine talks to."""

    def __init__(self, policy: Policy, sim, params: dict):
        self.policy = policy
        self.sim = sim
        self.params = params
        self.mode = policy.batching(sim, params)
        self.ordering = policy.order(sim, params)      # the policy's own ranking (an Ordering or a Queue)
        self.order = queue_for(self.ordering, sim, params)
        self.gate = policy.admission(sim, params)
        self.planner = self.mode        # who forms each step's batch (an engine may plan through its own)

    # -- queue hooks used by the engine
    def has_waiting(self) -> bool:
        return len(self.order) > 0

    def never_fits(self, req: Request) -> str:
        return self.mode.never_fits(req)

    def on_arrival(self, req: Request, now: float) -> None:
        self.order.push(req, now)

    def requeue_preempted(self, req: Request, now: float) -> None:
        self.order.requeue(req, now)

    def on_reject(self, req: Request) -> None:
        pass

    def on_finish(self, req: Request, t: float) -> None:
        self.order.on_finish(req, t)
        self.mode.on_finish(req, t)

    def admit(self, req: Request, now: float) -> None:
        self.sim.admit(req)
        self.order.on_admit(req, now)

    # -- the step
    def plan(self, now: float) -> Plan:
        self.order.prepare(now)
        self.gate.filter(self, now)
        return self.planner.plan(self, now)

    def after_step(self, plan: Plan, start: float, end: float) -> None:
        self.order.after_step(plan, start, end)

    # -- fast-forward hooks
    def stable(self, plan: Plan) -> bool:
        """Would the same decode-only batch be chosen again until the next declared decision point?"""
        if plan.admitted or plan.preempted:
            return False
        if not len(self.order):
            return True
        if self.order.dynamic:
            return not self.mode.any_admissible(self, plan)
        return True

    def next_decision(self, plan: Plan, now: float):
        k1, t1 = self.order.next_decision(plan, now)
        k2, t2 = self.gate.next_decision(self, plan, now)
        return _min_opt(k1, k2), _min_opt(t1, t2)

    def refine_fast_forward(self, plan, starts, ends, k):
        k = self.order.refine_fast_forward(plan, starts, ends, k)
        return self.gate.refine(self, plan, starts[:k], ends[:k], k)

    def after_fast_forward(self, plan, starts, ends, k):
        self.order.after_fast_forward(plan, starts, ends, k)


def _min_opt(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


# ============================================================================ run facts


def run_counters(sim) -> dict:
    """Per-run facts a policy measured, for the run summary: ltr's achieved `predictor_tau`
    (None for every other policy)."""
    tau = getattr(sim.sched.order, "achieved_tau", None)
    return {"predictor_tau": None if tau is None or math.isnan(tau) else float(tau)}


_V1 = "Kwon et al., SOSP 2023 (PagedAttention/vLLM); vLLM v1 scheduler (vllm/v1/core/sched/scheduler.py)"

REGISTRY: dict[str, Policy] = {p.name: p for p in [
    Policy("vllm-fcfs", "vLLM v1: continuous batching, chunked prefill, FCFS, recompute the newest",
           Continuous, Fifo, cite=_V1),
    Policy("sarathi", "Sarathi-Serve stall-free batching: decodes first, 512-token chunked prefills",
           StallFree, Fifo, params={"chunk_size": 512},
           cite="Agrawal et al., OSDI 2024 (Sarathi-Serve); microsoft/sarathi-serve sarathi_scheduler.py"),
    Policy("orca", "Orca iteration-level batching: whole prompts join decodes, max-length KV reservation",
           Selective, Fifo, params={"reserve": "max_model_len"},
           cite="Yu et al., OSDI 2022 (Orca); Sarathi-Serve's orca_scheduler.py baseline"),
    Policy("static", "Request-level batches (FasterTransformer): nothing joins a running batch",
           Static, Fifo, params={"batch_size": 128, "pad_compute": False, "return_at_batch_end": False},
           cite="NVIDIA FasterTransformer, the baseline of Yu et al., OSDI 2022; "
                "Sarathi-Serve faster_transformer_scheduler.py"),
    Policy("sjf", "Shortest job first by oracle output length, non-preemptive",
           Continuous, ShortestJob,
           cite="Classic SJF; oracle-length baseline of Fu et al., NeurIPS 2024 (hao-ai-lab/vllm-ltr, sjf mode)"),
    Policy("srpt", "Shortest remaining processing time (oracle), preemptive every step",
           Continuous, ShortestRemaining,
           params={"preemption": "swap"},
           cite="Schrage, Operations Research 1968; vllm-ltr srtf mode (Fu et al., NeurIPS 2024)"),
    Policy("ltr", "Learning-to-rank predicted SJF (noise calibrated to Kendall tau 0.52 once), preemptive",
           Continuous, PredictedRank,
           params={"tau": 0.52, "starvation_threshold": 0, "starvation_quantum": 10,
                   "preemption": "swap"},
           cite="Fu, Zhu, Su, Qiao, Stoica, Zhang, 'Efficient LLM Scheduling by Learning to Rank', NeurIPS 2024"),
    Policy("spf", "Shortest prompt first, non-preemptive (optional linear aging)",
           Continuous, ShortestPrompt, params={"aging": 0.0},
           cite="Generic shortest-prompt-first baseline (prompt length known on arrival)"),
    Policy("edf", "Earliest deadline first: last-token deadline arrival + TTFT SLO + TPOT SLO x (output - 1)",
           Continuous, EarliestDeadline, params={"slo_profile": "standard", "deadline": "last-token"},
           cite="Liu & Layland, JACM 1973; per-token deadlines of Niyama (Goel et al., arXiv 2503.22562; "
                "microsoft/sarathi-serve niyama_asplos2026, sequence.py _get_TBT_deadline)"),
    Policy("vtc", "Virtual token counters: least-served client first (w_p=1, w_q=2), counter lift",
           Continuous, VirtualTokenCounter, params={"w_p": 1.0, "w_q": 2.0},
           cite="Sheng et al., 'Fairness in Serving Large Language Models', OSDI 2024 (Ying1123/VTC-artifact)"),
    Policy("fastserve", "FastServe skip-join MLFQ: quantum-demoted levels, starvation promotion, swap only",
           Continuous, SkipJoinMLFQ,
           params={"levels": 24, "q1_s": 0.01, "ratio": 2.0, "starve_limit_s": 3.0, "starve_every": 1000,
                   "never_run_starves": True, "host_gate": 0.1, "preemption": "swap", "swap_overlap": True},
           cite="Wu et al., 'Fast Distributed Inference Serving for Large Language Models', arXiv 2305.05920; "
                "LLMServe/FastServe fastserve/scheduler.py, class MLFQ"),
    Policy("hrrn", "Highest response ratio next, (wait + service) / service, non-preemptive",
           Continuous, ResponseRatio, params={"size": "oracle"},
           cite="Brinch Hansen, 'Short-term scheduling in multiprogramming systems', SOSP 1971"),
    Policy("slo-admission", "FCFS with admission control: reject requests whose TTFT deadline cannot be met",
           Continuous, Fifo, admission=SloGate, params={"slo_profile": "standard", "slack": 0.0},
           cite="Qin et al., Mooncake (FAST 2025) early rejection; Tang et al., SCORPIO (2025); "
                "DistServe goodput (OSDI 2024)"),
]}


def get_policy(name: str) -> Policy:
    """The policy registered under `name`; an unknown name is a one-line error listing the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown scheduler '{name}' (known: {', '.join(REGISTRY)})") from None


# ============================================================================ parameter validation
#
# Every `[scheduler.<name>]` table is checked against the registry before any simulation starts,
# as thoroughly as `[engine]` keys: unknown tables and keys, wrong types, zeros where a count or
# a rate must be positive, negatives, out-of-range values. Each failure is one line naming the
# config file, the table, the key, the value and the rule.


def _int_rule(lo: int, hi: int | None = None):
    if hi is not None:
        return (lambda v, cfg: _is_int(v) and lo <= v <= hi), f"must be an integer in [{lo}, {hi}]"
    if lo == 1:
        return (lambda v, cfg: _is_int(v) and v >= 1), "must be a positive integer"
    return (lambda v, cfg: _is_int(v) and v >= lo), f"must be an integer >= {lo}"


def _real_rule(ok, text: str):
    return (lambda v, cfg: _is_real(v) and math.isfinite(float(v)) and ok(float(v))), text


def _choice_rule(*choices: str):
    quoted = " or ".join(f'"{c}"' for c in choices)
    return (lambda v, cfg: isinstance(v, str) and v in choices), f"must be {quoted}"


_BOOL_RULE = (lambda v, cfg: isinstance(v, bool)), "must be true or false"
_PROFILE_RULE = ((lambda v, cfg: isinstance(v, str) and v in cfg.slo_profiles),
                 "must name an SLO profile of this config ([slo.<name>])")

#: Rule for each parameter name (policy parameters and the batching modes' shared keys):
#: (check(value, engine config) -> bool, the rule as the error states it).
PARAM_RULES: dict[str, tuple] = {
    # shared by every batching mode
    "max_num_batched_tokens": _int_rule(1),
    "max_num_seqs": _int_rule(1),
    "watermark": _real_rule(lambda x: 0.0 <= x < 0.5, "must be a fraction in [0, 0.5)"),
    # sarathi, orca, static
    "chunk_size": _int_rule(1),
    "reserve": _choice_rule("max_model_len", "request"),
    "batch_size": _int_rule(1),
    "pad_compute": _BOOL_RULE,
    "return_at_batch_end": _BOOL_RULE,
    # swap preemption (srpt, ltr, fastserve)
    "preemption": _choice_rule("recompute", "swap"),
    "swap_overlap": _BOOL_RULE,
    "swap_space_gib": _real_rule(lambda x: x >= 0.0, "must be a number >= 0 (GiB of host memory)"),
    "pcie_gb_s": _real_rule(lambda x: x > 0.0, "must be a number > 0 (GB/s)"),
    # ltr
    "tau": _real_rule(lambda x: 0.0 < x <= 1.0, "must be a number in (0, 1] (Kendall tau of the predictor)"),
    "starvation_threshold": _int_rule(0),
    "starvation_quantum": _int_rule(1),
    # spf, edf, vtc, hrrn, slo-admission
    "aging": _real_rule(lambda x: x >= 0.0, "must be a number >= 0 (tokens per second waited)"),
    "slo_profile": _PROFILE_RULE,
    "deadline": _choice_rule(*DEADLINE_RULES),
    "w_p": _real_rule(lambda x: x >= 0.0, "must be a number >= 0 (weight per input token)"),
    "w_q": _real_rule(lambda x: x >= 0.0, "must be a number >= 0 (weight per output token)"),
    "size": _choice_rule("oracle", "prompt"),
    "slack": _real_rule(lambda x: x >= 0.0, "must be a number >= 0 (fraction of the TTFT SLO)"),
    # fastserve
    "levels": _int_rule(1, 64),
    "q1_s": _real_rule(lambda x: x > 0.0, "must be a number > 0 (seconds)"),
    "ratio": _real_rule(lambda x: x >= 1.0, "must be a number >= 1 (each level's quantum over the previous one's)"),
    "starve_limit_s": _real_rule(lambda x: x > 0.0, "must be a number > 0 (seconds)"),
    "starve_every": _int_rule(1),
    "never_run_starves": _BOOL_RULE,
    "host_gate": _real_rule(lambda x: 0.0 <= x < 1.0,
                            "must be a fraction in [0, 1) (share of host swap blocks that must be free)"),
}

#: Keys every policy accepts besides its own parameters (the batching modes read them).
MODE_KEYS = ("max_num_batched_tokens", "max_num_seqs", "watermark")

#: Shared keys a policy's table may not set, and why (one line each).
_NOT_FOR = {
    ("sarathi", "max_num_batched_tokens"):
        "sarathi's per-step token budget is its chunk_size (Sarathi-Serve's get_max_num_batched_tokens "
        "returns chunk_size); set chunk_size instead",
}


def validate_scheduler_params(cfg, policies: dict | None = None, *, others: str = "error") -> None:
    """Check every `[scheduler.<name>]` table of engine config `cfg`; raise a one-line ConfigError.

    `policies` maps names to `Policy` declarations (default: `REGISTRY`); a table for a name
    that is not there, a key the policy does not take, a value of the wrong type or out of its
    range, or a combination without meaning (vtc with both weights 0) is an error naming
    ``cfg.source``, the table, the key, the value and the rule. Called with every policy a run can
    meet (built-in, from a user's file, installed) by `schedport.engine.policies.plugins.check_scheduler_tables`
    at each entry (`simulate`, the sweep before any worker starts); `Policy.bind` calls it with
    ``others="skip"``, which passes over tables naming neither a built-in nor the policy bound (a
    user policy's table, checked at the entry that knew that policy).
    """
    known = REGISTRY if policies is None else policies
    src = cfg.source
    for name, table in cfg.scheduler_params.items():
        pol = known.get(name)
        if pol is None and others == "skip":
            continue
        if pol is None:
            raise ConfigError(f"{src}: [scheduler.{name}]: unknown scheduler; known: {', '.join(known)} (a table "
                              f"for a policy of your own is checked by a run of it)")
        allowed = list(pol.params) + [k for k in MODE_KEYS if k not in pol.params]
        for key, value in table.items():
            if key not in allowed or (name, key) in _NOT_FOR:
                why = _NOT_FOR.get((name, key))
                if why:
                    raise ConfigError(f"{src}: [scheduler.{name}] {key}: {why}, got {fmt_toml(value)}")
                raise ConfigError(f"{src}: [scheduler.{name}] unknown key {key!r}; known keys: {', '.join(allowed)}")
            rule = PARAM_RULES.get(key)
            if rule is not None and not rule[0](value, cfg):
                text = rule[1]
                if key == "slo_profile":
                    text += f" (known: {', '.join(cfg.slo_profiles)})"
                raise ConfigError(f"{src}: [scheduler.{name}] {key}: {text}, got {fmt_toml(value)}")
        if name == "vtc":
            merged = {**pol.params, **table}
            if float(merged["w_p"]) == 0.0 and float(merged["w_q"]) == 0.0:
                raise ConfigError(f"{src}: [scheduler.vtc] w_p, w_q: at least one weight must be > 0 "
                                  f"(with both 0 no client is ever charged), got 0 and 0")


def validate_for(policy: Policy, cfg) -> None:
    """`validate_scheduler_params` for a simulation of `policy` (which may be a declaration
    outside `REGISTRY`, e.g. a user's policy): its own table and every built-in's are checked;
    a table for another name outside `REGISTRY` is left to the entry that knows its policy."""
    known = REGISTRY if REGISTRY.get(policy.name) is policy else {**REGISTRY, policy.name: policy}
    validate_scheduler_params(cfg, known, others="skip")
