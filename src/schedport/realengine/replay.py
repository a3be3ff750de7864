"""Replay a trace against a real OpenAI-compatible streaming server, open loop in wall-clock time.

The measured twin of `schedport.simulate`: the same (scaled) trace is sent to a running server
(vLLM, or anything speaking `/v1/completions` with streaming) at its arrival times, and the
same `requests.parquet` and `summary.json` come back, measured from the stream.

How a request is sent, so that its size on the server is exactly the trace's:
- ``prompt`` is a list of ``input_tokens`` token ids drawn from `token_range`, distinct per
  request *and per run* (a fresh random salt each replay, recorded as ``prompt_salt``): a server's
  prefix cache would otherwise serve a second replay of the same trace from memory and skip its
  prefills;
- ``max_tokens = min_tokens = output_tokens`` with ``ignore_eos`` so it generates exactly that many;
- ``stream`` with usage on every chunk, so tokens are counted even when a chunk carries several.

What is measured (times in the trace's own time frame, so rows line up with a simulation):
``arrival_s`` is when the request was actually sent (its scheduled time plus the client's send
lag), ``first_token_s`` when the first chunk carrying a token arrived, ``finish_s`` when the last
one did; TTFT, TPOT and E2E follow as for a simulation. The send lag is recorded per request
(``send_lag_s``) and summarised; a run whose 99th-percentile lag exceeds `max_lag_s` (default
50 ms) did not replay the trace it claims to — `ReplayResult.lag_ok` is False and the CLI
exits non-zero after writing what it measured.

Outcomes (``status``): completed; rejected (the server refused it as invalid, HTTP 400, e.g.
longer than its max_model_len — the simulator rejects the same requests at arrival); error
(any other HTTP error or a broken connection), timeout (no completion within
`request_timeout_s`), truncated (the stream ended before ``output_tokens`` tokens). The reason
is in ``detail``. None of them stops the run.

Schedulers: the server runs its own scheduler. Those a stock vLLM server can express are mapped
to per-request priorities for ``--scheduling-policy priority`` (lower value served first, ties
by arrival): see `request_priorities`.

Every request carries ``X-Request-Id: schedport-<salt>-<row>`` (`request_id`; the salt is
``summary["prompt_salt"]``), so a server's logs and its own request ids name the trace row.

Needs the ``validate`` extra (aiohttp): ``pip install 'schedport[validate]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import secrets
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from schedport.engine.runner import SimulationResult, resolve_engine, scaled
from schedport.engine.core.config import EngineConfig
from schedport.errors import SchedportError
from schedport.engine.core.latency import make_latency_model
from schedport.engine.core.metrics import REPLAY_STATUSES, request_table, summarize
from schedport.workload.trace import Trace

#: Schedulers a stock vLLM server expresses through per-request priorities.
EXPRESSIBLE = ("vllm-fcfs", "sjf", "spf", "edf", "ltr")

DEFAULT_MAX_LAG_S = 0.05
DEFAULT_REQUEST_TIMEOUT_S = 600.0
DEFAULT_TOKEN_RANGE = (1000, 2000)
_LEAD_S = 0.5          # head start between set-up and the first scheduled send


class EndpointError(SchedportError):
    """The server cannot be reached or does not speak the expected API."""


# --------------------------------------------------------------------------- priorities


def request_priorities(trace: Trace, scheduler: str, engine: EngineConfig | None = None,
                       seed: int = 0) -> np.ndarray | None:
    """Per-request priorities (lower = served first) that make a vLLM priority server run `scheduler`.

    ``vllm-fcfs``: None (no priority, the server's FCFS). ``sjf``: the true output length.
    ``spf``: the prompt length. ``edf``: the deadline the simulator's edf orders by
    (`schedulers.request_deadlines` under its `slo_profile` and `deadline` rule; by default
    arrival + TTFT SLO + TPOT SLO x (output tokens - 1)), in integer microseconds of the
    trace's time frame (`schedulers.deadline_priorities`, the integers the simulator's edf ranks
    by). ``ltr``: the rank of the predicted score the simulator's ltr uses for this trace and seed
    (same tau, same calibrated noise). The server orders its waiting queue by (priority, arrival)
    and never preempts for priority, so preemptive or guarded policies (ltr's swap preemption and starvation guard)
    are expressed only through their ranking; docs/validation.md says what that leaves out.
    A user's policy (``FILE.py:NAME``, ``module:NAME``, installed) is expressible when it is what
    vLLM's priority policy runs: continuous batching, no admission gate, a non-preemptive `Ordering`
    with `FIXED` keys and the worst-ranked as the memory-pressure victim; its priorities are the
    ranks of its keys at arrival (`user_priorities`).
    Any other scheduler is a one-line error listing the expressible ones.
    """
    from schedport.engine.policies.schedulers import (REGISTRY, deadline_priorities, predicted_scores,
                                                      request_deadlines, validate_scheduler_params)

    from schedport.engine.policies.plugins import installed_policies, is_spec

    if scheduler not in REGISTRY and (is_spec(scheduler) or scheduler in installed_policies()):
        return user_priorities(trace, scheduler, engine)
    if scheduler not in EXPRESSIBLE:
        known = f" (known to the simulator, but not expressible as priorities)" if scheduler in REGISTRY else ""
        raise SchedportError(f"scheduler '{scheduler}' cannot be replayed on a vLLM server{known}; "
                             f"expressible: {', '.join(EXPRESSIBLE)}")
    cfg = engine if engine is not None else resolve_engine(None)
    validate_scheduler_params(cfg)
    params = dict(REGISTRY[scheduler].params)
    params.update(cfg.scheduler_params.get(scheduler, {}))
    if scheduler == "vllm-fcfs":
        return None
    if scheduler == "sjf":
        return trace.output_tokens.astype(np.int64)
    if scheduler == "spf":
        if float(params.get("aging", 0.0)) > 0:
            raise SchedportError("spf with aging > 0 changes priorities while waiting; "
                                 "a vLLM server cannot express it")
        return trace.input_tokens.astype(np.int64)
    if scheduler == "edf":
        ttft, tpot = cfg.slo_profiles[params["slo_profile"]]
        deadline = request_deadlines(trace.arrival_s, trace.output_tokens, ttft, tpot, params["deadline"])
        return deadline_priorities(deadline)
    # ltr: ranks of the simulator's predicted scores (same seed and tau), ties by arrival.
    scores = predicted_scores(trace.output_tokens, float(params["tau"]), seed)
    order = np.lexsort((np.arange(len(trace)), scores))
    ranks = np.empty(len(trace), dtype=np.int64)
    ranks[order] = np.arange(len(trace))
    return ranks


def priority_inexpressible(policy) -> str:
    """Why a vLLM server's priority policy cannot run `policy` ('' when it can: continuous batching,
    no gate, a non-preemptive `Ordering` with `FIXED` keys and the worst-ranked as victim)."""
    from schedport.engine.policies.batching import Continuous
    from schedport.engine.policies.gates import AdmitAll
    from schedport.engine.policies.policy import FIXED, Ordering

    order = policy.order
    if policy.batching is not Continuous:
        return f"its batching mode is {policy.batching.__name__}, vLLM's is continuous"
    if policy.admission is not AdmitAll:
        return "it has an admission gate"
    if not (isinstance(order, type) and issubclass(order, Ordering)):
        return "its order is an engine queue with state of its own, not a key"
    if order.preemptive:
        return "it is preemptive; vLLM's priority policy never preempts for priority"
    if order.dynamics is not FIXED:
        return f"its keys move ({order.dynamics!r}); a priority is fixed at arrival"
    if order.victim != "worst":
        return f"its memory-pressure victim is {order.victim!r}; vLLM's priority policy preempts the worst-ranked"
    return ""


def user_priorities(trace: Trace, scheduler, engine: EngineConfig | None = None) -> np.ndarray:
    """The priorities that make vLLM's priority policy run a user's `scheduler`: each request's rank
    by the policy's key at its arrival (0 = first); a one-line error when it is not expressible."""
    from schedport.engine.core.latency import make_latency_model
    from schedport.engine.policies.plugins import get_scheduler
    from schedport.engine.modes import make_simulator

    policy = get_scheduler(scheduler)
    why = priority_inexpressible(policy)
    if why:
        raise SchedportError(f"scheduler {policy.name!r} cannot run on a vLLM server as priorities: {why}")
    cfg = engine if engine is not None else resolve_engine(None)
    sim = make_simulator(trace, policy, cfg, make_latency_model(cfg))
    keys = [sim.sched.ordering.key(r, r.arrival) for r in sim.requests]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    ranks = np.empty(len(keys), dtype=np.int64)
    ranks[order] = np.arange(len(keys))
    return ranks


def prompt_token_ids(n_tokens: int, request_index: int, salt: int,
                     token_range: tuple[int, int] = DEFAULT_TOKEN_RANGE) -> list[int]:
    """The prompt sent for one request: `n_tokens` token ids from `token_range` (half-open),
    a function of (salt, request_index) only."""
    lo, hi = token_range
    rng = np.random.Generator(np.random.PCG64([int(salt), int(request_index), 0x5E9]))
    return rng.integers(lo, hi, size=int(n_tokens)).tolist()


# --------------------------------------------------------------------------- stream timing


@dataclass
class StreamTimer:
    """Timestamps of one streaming response, fed line by line (server-sent events).

    Each ``data: {...}`` chunk whose ``choices`` carry output counts as tokens: the chunk's
    ``usage.completion_tokens`` when the server reports usage per chunk (exact even when a
    chunk carries several tokens), otherwise one per chunk. ``first_s`` / ``last_s`` are the
    arrival times of the first and last chunk carrying tokens.
    """

    first_s: float = math.nan
    last_s: float = math.nan
    tokens: int = 0
    chunks: int = 0
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None

    def feed(self, line: bytes | str, t: float) -> None:
        """Account for one line of the stream received at time `t`."""
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        line = line.strip()
        if not line.startswith("data:"):
            return                       # blank separators, comments, event names
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            self.error = f"unparseable stream chunk: {data[:80]!r}"
            return
        if not isinstance(obj, dict):
            self.error = f"unexpected stream chunk: {data[:80]!r}"
            return
        if "error" in obj and not obj.get("choices"):
            err = obj["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)[:200]
            return
        choices = obj.get("choices") or []
        usage = obj.get("usage") or None
        if not choices:
            return                       # the final usage-only chunk
        ch = choices[0]
        if ch.get("finish_reason"):
            self.finish_reason = ch["finish_reason"]
        count = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(count, int):
            new = count - self.tokens
        else:
            new = 1 if (ch.get("text") or ch.get("delta") or ch.get("token_ids")
                        or ch.get("finish_reason")) else 0
        if new <= 0:
            return
        self.chunks += 1
        self.tokens += new
        if math.isnan(self.first_s):
            self.first_s = t
        self.last_s = t


# --------------------------------------------------------------------------- the client


@dataclass
class _Outcome:
    send_s: float = math.nan
    status: str = "error"
    detail: str = ""
    timer: StreamTimer = field(default_factory=StreamTimer)


@dataclass
class ServerInfo:
    """What `/v1/models` says about the server: the model to ask for and its context limit."""

    model: str
    max_model_len: int | None


def server_root(endpoint: str) -> str:
    """The server root URL (accepts http://host:port, .../v1 or .../v1/completions)."""
    url = endpoint.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise EndpointError(f"endpoint {endpoint!r}: expected an http(s) URL such as http://127.0.0.1:8000")
    for suffix in ("/v1/completions", "/v1"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


def need_aiohttp():
    """The aiohttp module, or a one-line error naming the extra that installs it (the replay and
    the calibration talk HTTP to the server through it; the rest of schedport never needs it)."""
    try:
        import aiohttp
    except ImportError:
        raise SchedportError("replaying against a server needs the validate extra: "
                             "pip install 'schedport[validate]'") from None
    return aiohttp


async def fetch_server_info(session, base: str, model: str | None, timeout_s: float) -> ServerInfo:
    """The served model (`model`, or the first one listed) and its max_model_len, from the
    server's ``/v1/models``; an unreachable server, a wrong answer or an unknown model is a
    one-line `EndpointError`."""
    aiohttp = need_aiohttp()
    url = f"{base}/v1/models"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                raise EndpointError(f"{url}: HTTP {r.status} (is this an OpenAI-compatible server?)")
            body = await r.json(content_type=None)
    except aiohttp.ClientConnectorError as e:
        raise EndpointError(f"cannot reach {base}: {e.os_error.strerror if e.os_error else e} "
                            f"(is the server running?)") from None
    except asyncio.TimeoutError:
        raise EndpointError(f"{url}: no answer within {timeout_s:g} s") from None
    except (aiohttp.ClientError, ValueError) as e:
        raise EndpointError(f"{url}: {type(e).__name__}: {e}") from None
    data = body.get("data") if isinstance(body, dict) else None
    if isinstance(data, list) and not data:
        raise EndpointError(f"{url}: the server lists no model")
    if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
        raise EndpointError(f"{url}: not an OpenAI model list (expected {{\"data\": [{{\"id\": ...}}, ...]}}, "
                            f"got {str(body)[:80]})")
    ids = [m.get("id") for m in data]
    if model is None:
        model = ids[0]
    elif model not in ids:
        raise EndpointError(f"{url}: no model {model!r} (served: {', '.join(map(str, ids))})")
    entry = data[ids.index(model)]
    mml = entry.get("max_model_len")
    return ServerInfo(model=model, max_model_len=int(mml) if isinstance(mml, int) else None)


def completion_body(model: str, prompt: list[int], n_out: int, priority: int | None) -> dict:
    """The streamed ``/v1/completions`` request for one trace request: `prompt` as token ids, exactly
    `n_out` tokens (EOS ignored, greedy), usage reported with every chunk, and the vLLM priority
    the scheduler under replay gives it (None: no priority)."""
    body = {"model": model, "prompt": prompt, "max_tokens": int(n_out), "min_tokens": int(n_out),
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if priority is not None:
        body["priority"] = int(priority)
    return body


def request_id(salt: int, row: int) -> str:
    """The id a replay gives row `row` of an attempt with prompt salt `salt` (sent as the
    ``X-Request-Id`` header, so the server's logs and request ids name the trace row: vLLM
    makes it ``cmpl-<this>-0-<suffix>``)."""
    return f"schedport-{salt:016x}-{row}"


def parse_request_id(server_id: str) -> tuple[int, int] | None:
    """The (salt, row) a server-side request id carries, or None if it is not a replay's."""
    m = _REQUEST_ID.search(server_id)
    return (int(m.group(1), 16), int(m.group(2))) if m else None


_REQUEST_ID = re.compile(r"schedport-([0-9a-f]{16})-(\d+)(?:\D|$)")


async def _send(session, url: str, body: dict, want: int, t_zero: float, timeout_s: float,
                out: _Outcome, rid: str | None = None) -> None:
    """Send one request, timing its stream into `out` (never raises)."""
    aiohttp = need_aiohttp()
    clock = time.perf_counter
    out.send_s = clock() - t_zero
    timer = out.timer
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body, headers={"X-Request-Id": rid} if rid else None) as r:
                if r.status != 200:
                    text = (await r.text())[:300].replace("\n", " ")
                    out.status = "rejected" if r.status == 400 else "error"
                    out.detail = f"HTTP {r.status}: {text}"
                    return
                async for line in r.content:
                    timer.feed(line, clock() - t_zero)
                    if timer.error:
                        break
    except TimeoutError:
        out.status, out.detail = "timeout", f"not finished within {timeout_s:g} s"
        return
    except (aiohttp.ClientError, OSError) as e:
        out.status, out.detail = "error", f"{type(e).__name__}: {e}"[:300]
        return
    if timer.error:
        out.status, out.detail = "error", timer.error
    elif timer.tokens >= want:
        out.status = "completed"
        if timer.tokens > want:
            out.detail = f"received {timer.tokens} tokens for {want} requested"
    else:
        out.status = "truncated"
        out.detail = (f"stream ended after {timer.tokens} of {want} tokens"
                      f" (finish_reason {timer.finish_reason!r})")


def client_connector():
    """The HTTP connection pool for a replay and for probing the server: unbounded, and a fresh
    connection for every request. Reusing an idle connection races the server's keep-alive
    timeout (vLLM's API server: 5 s, VLLM_HTTP_TIMEOUT_KEEP_ALIVE): aiohttp's default 15 s lost a
    request now and then to "Server disconnected", and even a 2 s client timeout did under load,
    when a starved client or server overruns its timers (a calibration failed so in `make test`
    with both cores busy, and a replay's burst in `make test` with two busy loops). A loopback
    connect costs well under a millisecond, below the probes' resolution, and every replayed
    request pays it alike."""
    aiohttp = need_aiohttp()
    return aiohttp.TCPConnector(limit=0, force_close=True)


async def _replay_async(trace: Trace, base: str, model: str | None, priorities, salt: int,
                        token_range, timeout_s: float, on_progress) -> tuple[list[_Outcome], ServerInfo, float]:
    aiohttp = need_aiohttp()
    connector = client_connector()      # a connection per request, none reused
    # No session-wide deadline: aiohttp's default (5 min total) would cut long requests short
    # and report them as timeouts; request_timeout_s is the only deadline on a request.
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout()) as session:
        info = await fetch_server_info(session, base, model, timeout_s=30.0)
        url = f"{base}/v1/completions"
        n = len(trace)
        bodies = [completion_body(info.model, prompt_token_ids(trace.input_tokens[i], i, salt, token_range),
                        trace.output_tokens[i], None if priorities is None else priorities[i])
                  for i in range(n)]
        outs = [_Outcome() for _ in range(n)]
        a0 = float(trace.arrival_s[0]) if n else 0.0
        rel = (trace.arrival_s - a0).tolist()
        clock = time.perf_counter
        t_zero = clock() + _LEAD_S
        tasks = []
        done = 0

        def finished(_):
            nonlocal done
            done += 1
            if on_progress is not None:
                on_progress(done, n)

        for i in range(n):
            wait = t_zero + rel[i] - clock()
            if wait > 0:
                await asyncio.sleep(wait)
            task = asyncio.create_task(_send(session, url, bodies[i], int(trace.output_tokens[i]),
                                             t_zero, timeout_s, outs[i], request_id(salt, i)))
            task.add_done_callback(finished)
            tasks.append(task)
        await asyncio.gather(*tasks)
    return outs, info, a0


@contextlib.contextmanager
def no_gc_pauses():
    """No cyclic garbage collection while replaying: a full collection of a process that has
    imported pandas and scipy takes long enough to delay sends and chunk reads; reference
    counting frees the replay's own garbage, and collection resumes afterwards."""
    was = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was:
            gc.enable()


class ReplayResult(SimulationResult):
    """The outcome of one replay: `requests` (one row per request), `summary`, the time `scale`.

    `lag_ok` says whether the client kept to the schedule (99th-percentile send lag within
    the bound); `server` is what `/v1/models` reported.
    """

    def __init__(self, requests: pd.DataFrame, summary: dict, scale: float, lag_ok: bool,
                 server: ServerInfo):
        super().__init__(requests, summary, scale)
        self.lag_ok = lag_ok
        self.server = server


def replay(trace: Trace, endpoint: str, *, engine: EngineConfig | str | None = None,
           scheduler: str = "vllm-fcfs", load: float | None = None, time_scale: float | None = None,
           seed: int = 0, model: str | None = None,
           request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, max_lag_s: float = DEFAULT_MAX_LAG_S,
           token_range: tuple[int, int] = DEFAULT_TOKEN_RANGE, retries: int = 0,
           on_progress: Callable[[int, int], None] | None = None,
           log: Callable[[str], None] = lambda s: None) -> ReplayResult:
    """Replay `trace` against the server at `endpoint` under `scheduler`; measure every request.

    A run whose client fell behind the schedule (`lag_ok` False) is discarded and run again, up
    to `retries` more times, with fresh prompts: on a shared or virtualised machine the whole
    system occasionally pauses for a few hundred milliseconds, which delays sends and stalls the
    server alike. The returned run is the last attempt; ``summary["attempts"]`` counts them.

    `engine` is the server's engine config (from `schedport calibrate`): `load` is relative to
    its capacity, exactly as in `simulate`, so both see the same arrivals; it also gives EDF's
    SLO profile, ltr's tau and the alone-time that normalises slowdown. `time_scale` applies a
    precomputed scale factor instead of `load`. Unreachable servers raise `EndpointError`;
    per-request failures are recorded, never raised.
    """
    cfg = resolve_engine(engine)
    if not (request_timeout_s > 0 and math.isfinite(request_timeout_s)):
        raise SchedportError(f"--request-timeout must be a positive number of seconds, got {request_timeout_s}")
    if not (max_lag_s > 0):
        raise SchedportError(f"--max-lag must be a positive number of seconds, got {max_lag_s}")
    lo, hi = token_range
    if not (0 <= lo < hi):
        raise SchedportError(f"token range must satisfy 0 <= low < high, got {token_range}")
    trace, scale = scaled(trace, cfg, load=load, time_scale=time_scale)
    prio = request_priorities(trace, scheduler, cfg, seed)
    if retries < 0:
        raise SchedportError(f"--retries must be >= 0, got {retries}")
    base = server_root(endpoint)
    for attempt in range(1, retries + 2):
        salt = secrets.randbits(63)
        with no_gc_pauses():
            outs, info, a0 = asyncio.run(_replay_async(trace, base, model, prio, salt, token_range,
                                                       request_timeout_s, on_progress))
        res = _result(trace, cfg, outs, info, a0, scale, max_lag_s, scheduler)
        res.summary["prompt_salt"] = salt
        res.summary["attempts"] = attempt
        if res.lag_ok or attempt == retries + 1:
            return res
        log(f"client send lag p99 {1e3 * res.summary['send_lag_p99_s']:.0f} ms > {1e3 * max_lag_s:.0f} ms: "
            f"discarding the run and replaying again ({attempt + 1}/{retries + 1})")
    raise AssertionError("unreachable")


def _result(trace: Trace, cfg: EngineConfig, outs: Sequence[_Outcome], info: ServerInfo, a0: float,
            scale: float, max_lag_s: float, scheduler: str) -> ReplayResult:
    """Turn the measured outcomes into the request table and summary of `simulate`. A trace's
    warm-up (docs/corpus.md, "Warm caches") is sent like every request and flagged in the table's
    ``warmup`` column; the summary, as `simulate`'s, is the measured requests' alone (the send-lag
    figures, which judge the replay itself, keep every request)."""
    n = len(trace)
    status = np.array([o.status for o in outs], dtype=object)
    send = np.array([o.send_s for o in outs], dtype=np.float64) + a0
    first = np.array([o.timer.first_s for o in outs], dtype=np.float64) + a0
    last = np.array([o.timer.last_s for o in outs], dtype=np.float64) + a0
    done = status == "completed"
    first = np.where(status == "rejected", np.nan, first)
    finish = np.where(done, last, np.nan)
    cid = trace.client_id if trace.client_id is not None else np.full(n, None, dtype=object)
    table = request_table(arrival_s=send, input_tokens=trace.input_tokens,
                          output_tokens=trace.output_tokens, client_id=cid, status=status,
                          first_token_s=first, finish_s=finish, preemptions=np.zeros(n, dtype=np.int64),
                          extra_statuses=REPLAY_STATUSES)
    lag = send - trace.arrival_s
    table["scheduled_s"] = trace.arrival_s
    table["send_lag_s"] = lag
    table["tokens_received"] = np.array([o.timer.tokens for o in outs], dtype=np.int64)
    table["detail"] = pd.Series([o.detail for o in outs], dtype=object)

    lat = make_latency_model(cfg)
    # as in simulate: alone on the engine, plus the fixed per-request overhead
    alone = (lat.alone_time(trace.input_tokens, trace.output_tokens) + cfg.request_overhead_s
             if n else np.zeros(0))
    w = trace.warmup
    span = trace.measured().span_s
    fin = finish[w:][np.isfinite(finish[w:])]
    origin = float(send[w]) if w else a0
    horizon = cfg.horizon_factor * (span if span > 0 else
                                    max(float(fin.max() - origin) if fin.size else 1.0, 1e-9))
    lag_p = np.percentile(lag, [50, 99]) if n else [math.nan, math.nan]
    lag_ok = bool(n == 0 or lag_p[1] <= max_lag_s)
    counters = {
        "preemptions": None, "iterations": None,
        "n_error": int(np.count_nonzero(status[w:] == "error")),
        "n_timeout": int(np.count_nonzero(status[w:] == "timeout")),
        "n_truncated": int(np.count_nonzero(status[w:] == "truncated")),
        "send_lag_p50_s": float(lag_p[0]), "send_lag_p99_s": float(lag_p[1]),
        "send_lag_max_s": float(np.max(lag)) if n else math.nan,
        "max_lag_s": float(max_lag_s), "client_lag_ok": lag_ok,
        "load_scale": scale, "scheduler": scheduler, "model": info.model,
    }
    summary = summarize(table.iloc[w:] if w else table, horizon_s=horizon, slo_profiles=cfg.slo_profiles,
                        alone_s=alone[w:], counters=counters)
    summary["preemptions"] = None     # not observable from the client
    if w:
        table["warmup"] = np.arange(n) < w
    return ReplayResult(table, summary, scale, lag_ok, info)
