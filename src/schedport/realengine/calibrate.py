"""Calibrate the simulator's engine to a running server: limits from its metrics, latency by probing.

`schedport calibrate --endpoint URL --out engine.toml` measures the server it is pointed at and
writes an engine config that `simulate`, `replay --load` and `validate` read. Nothing else may
load the server while it runs (it says so when it sees other requests running).

What it learns and how (docs/validation.md has the details and the limits):
- ``max_model_len`` from ``/v1/models``; ``block_size`` and ``num_gpu_blocks`` from the
  ``vllm:cache_config_info`` gauge of the Prometheus ``/metrics`` endpoint.
- ``max_num_seqs``: many small requests at once while polling ``vllm:num_requests_running``;
  the plateau reached while others are still waiting is the running-sequence cap.
- ``max_num_batched_tokens``: several long prompts at once, counting engine steps from the
  ``vllm:iteration_tokens_total`` histogram; tokens per full step bound the budget from below,
  the histogram's buckets from above, and the estimate is the power of two in between (vLLM's
  defaults are powers of two). Any limit can be given instead (``--max-num-seqs`` and friends).
- Latency: prefill-only requests (``max_tokens = 1``) of several prompt lengths, one at a time,
  give TTFT = request overhead + the prefill's steps; decode batches of several sizes and
  context lengths give the steady inter-token time = one decode step; prompts injected into a
  running decode batch give what a prefill chunk adds to a step that also decodes (the mixed
  steps a loaded server runs). Non-negative least squares (relative errors, so 5 ms and 500 ms
  observations weigh alike) gives the linear model's ``a, b, c, d, e`` and the per-request
  overhead from the first two kinds, then ``f`` from the mixed probes (`fit_linear`); R² and the
  largest error are written as comments beside them.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from schedport.errors import SchedportError
from schedport.engine.core.config import load_engine_config
from schedport.engine.runner import atomic_write, resolve_engine, simulate
from schedport.realengine.replay import (EndpointError, ServerInfo, StreamTimer, client_connector, completion_body,
                                         fetch_server_info, need_aiohttp, no_gc_pauses, prompt_token_ids, server_root)
from schedport.workload.trace import Trace

#: The linear model's parameters in fit order (request_overhead_s first; f last, as `fit_linear`
#: fits it in a second stage).
PARAMS = ("request_overhead_s", "a", "b", "c", "d", "e", "f")

#: Tokens each decode probe generates: its step time is read over the last three quarters of
#: them, so longer probes average more of a noisy machine's jitter (128: about 1 s per probe).
DECODE_PROBE_TOKENS = 128

#: Prompt lengths injected into a decode batch by the mixed-step probes (each capped at a
#: quarter and three quarters of the token budget, so that one chunk and the decodes fit a step).
MIXED_PROMPT_TOKENS = (128, 384)

#: A mixed probe is implausible, and left out of the fit, when the prefill it measured inside a
#: decode step took more than this many times the model's time for the same prompt alone
#: (measured: 1.0x to 2x).
MIXED_PLAUSIBLE = 4.0

#: A decoding stream's token counts as emitted by an injected prompt's step when it arrived no
#: earlier than this before the prompt's first token (the server writes one step's outputs to
#: the streams one after another).
MIXED_SLACK_S = 0.002


# --------------------------------------------------------------------------- Prometheus text


_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition as (name, labels, value)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        out.append((m.group("name"), labels, value))
    return out


def _metric(samples, name: str, **match) -> float | None:
    """Sum of the samples of `name` whose labels include `match` (None when absent)."""
    vals = [v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in match.items())]
    return float(sum(vals)) if vals else None


# --------------------------------------------------------------------------- observations


@dataclass
class Observation:
    """One probe: what was sent, the time measured, and its row of the linear model."""

    kind: str                 # "prefill", "decode" or "mixed" (a chunk's cost inside a decode step)
    label: str
    seconds: float
    features: tuple[float, ...]   # aligned with PARAMS


def prefill_features(prompt: int, budget: int) -> tuple[float, ...]:
    """Model row of a lone prompt of `prompt` tokens: overhead + its chunked prefill steps."""
    steps, p, kv, pairs, done = 0, 0, 0, 0, 0
    while done < prompt:
        c = min(budget, prompt - done)
        steps += 1
        p += c
        kv += done + c
        pairs += c * done + c * (c + 1) // 2
        done += c
    return (1.0, float(steps), float(p), 0.0, float(kv), float(pairs), 0.0)


def decode_features(batch: int, kv_tokens: float) -> tuple[float, ...]:
    """Model row of one decode step of `batch` sequences reading `kv_tokens` in all."""
    return (0.0, 1.0, 0.0, float(batch), float(kv_tokens), 0.0, 0.0)


def mixed_delta_features(prompt: int) -> tuple[float, ...]:
    """Model row of what one fresh `prompt`-token chunk adds to a step that also decodes.

    The difference between a mixed step (the chunk plus a decode batch) and the same decode
    step alone: the chunk's tokens, its attention reads (itself) and pairs, and its tokens again
    for the mixed-step surcharge ``f``; no fixed step cost.
    """
    p = float(prompt)
    return (0.0, 0.0, p, 0.0, p, float(prompt * (prompt + 1) // 2), p)


@dataclass
class Fit:
    """The fitted coefficients with their quality on the probes."""

    coef: dict[str, float]
    r2: float
    max_abs_rel_err: float
    median_abs_rel_err: float
    predicted: np.ndarray
    excluded: list[str] = field(default_factory=list)   # labels of probes left out as implausible


def fit_linear(obs: list[Observation]) -> Fit:
    """Non-negative least squares on relative errors: every coefficient >= 0, `a` > 0.

    In two stages. The lone prefills and pure decodes give every coefficient but `f`; the mixed
    probes then give `f` alone, from what they measured beyond that model (never below 0). A
    mixed probe that a noisy moment made too short could otherwise pull `b` and `e` down and
    spoil the prefill model that everything else rests on. A mixed probe that measured more
    than `MIXED_PLAUSIBLE` times the model's time for its prompt prefilled alone is left out
    (`Fit.excluded`) and not scored: a pause of the machine lands in its span whole (seen: a
    128-token prompt "adding" 298 ms to a decode step where 15-35 ms is usual).
    """
    from scipy.optimize import nnls

    base = [o for o in obs if o.kind != "mixed"]
    mixed = [o for o in obs if o.kind == "mixed"]
    n_base = len(PARAMS) - 1                       # every coefficient but f
    if len(base) < n_base:
        raise SchedportError(f"calibration needs at least {n_base} prefill and decode probes, got {len(base)}")
    A = np.array([o.features for o in obs], dtype=np.float64)
    y = np.array([o.seconds for o in obs], dtype=np.float64)
    if not (np.isfinite(y).all() and (y > 0).all()):
        raise SchedportError("calibration: a probe returned no usable time (see the server log)")
    is_base = np.array([o.kind != "mixed" for o in obs])
    Ab, yb = A[is_base][:, :n_base], y[is_base]
    scale = Ab.max(axis=0)
    scale[scale == 0] = 1.0
    xb, _ = nnls((Ab / scale) / yb[:, None], np.ones_like(yb), maxiter=10_000)
    x = np.append(xb / scale, 0.0)
    used = is_base.copy()
    excluded = []
    for i, o in enumerate(obs):
        if o.kind == "mixed":
            lone = x[1] + float(A[i, 2:n_base] @ x[2:n_base])      # a + b*P + d*P + e*pairs
            if y[i] <= MIXED_PLAUSIBLE * lone:
                used[i] = True
            else:
                excluded.append(o.label)
    fit_mixed = used & ~is_base
    if fit_mixed.any():
        # relative least squares for f alone on the mixed rows' excess over the base model
        Am, ym = A[fit_mixed], y[fit_mixed]
        excess = (ym - Am[:, :n_base] @ x[:n_base]) / ym
        u = Am[:, n_base] / ym
        x[n_base] = max(0.0, float(u @ excess) / float(u @ u)) if float(u @ u) > 0 else 0.0
    pred = A @ x
    rel = np.abs(pred[used] - y[used]) / y[used]
    ss_res = float(((pred[used] - y[used]) ** 2).sum())
    ss_tot = float(((y[used] - y[used].mean()) ** 2).sum())
    coef = dict(zip(PARAMS, (float(v) for v in x)))
    if not coef["a"] > 0:
        # The simulator needs a positive per-step time; the smallest decode step bounds it.
        coef["a"] = float(min(o.seconds for o in obs if o.kind == "decode") if any(
            o.kind == "decode" for o in obs) else y.min()) * 0.5
    return Fit(coef, 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan, float(rel.max()),
               float(np.median(rel)), pred, excluded)


# --------------------------------------------------------------------------- probing


@dataclass
class Calibration:
    """Everything `calibrate` learned: server limits, probes, fit, and where each limit came from."""

    server: ServerInfo
    endpoint: str
    limits: dict[str, int]
    sources: dict[str, str]
    observations: list[Observation] = field(default_factory=list)
    fit: Fit | None = None

    def engine_toml(self) -> str:
        """The engine config text, fit quality and provenance in comments."""
        f = self.fit
        lines = [
            "# Engine config calibrated by `schedport calibrate` against a running server.",
            f"# endpoint: {self.endpoint}   model: {self.server.model}",
            f"# measured: {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
            f"# latency fit over {len(self.observations) - len(f.excluded)} probes: R^2 = {f.r2:.4f}, "
            f"median |error| {100 * f.median_abs_rel_err:.1f}%, max |error| {100 * f.max_abs_rel_err:.1f}%",
            "",
            "[engine]",
        ]
        for key in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            lines.append(f"{key} = {self.limits[key]}    # {self.sources[key]}")
        lines += ["", "[latency]", 'model = "linear"']
        notes = {"request_overhead_s": "s per request outside the engine loop (HTTP, input/output processing)",
                 "a": "s per step", "b": "s per prefill token", "c": "s per decoding sequence",
                 "d": "s per KV token read by attention", "e": "s per prefill attention (query, key) pair",
                 "f": "extra s per prefill token in a step that also decodes"}
        for key in PARAMS:
            lines.append(f"{key} = {f.coef[key]!r}    # {notes[key]}")
        lines += ["", "# probe, measured s, model s, error"]
        for o, p in zip(self.observations, f.predicted):
            err = 100 * (p - o.seconds) / o.seconds
            lines.append(f"#   {o.kind:<7} {o.label:<28} {o.seconds:.5f}  {p:.5f}  {err:+.1f}%"
                         + ("  (left out: implausible, see fit_linear)" if o.label in f.excluded else ""))
        return "\n".join(lines) + "\n"


async def _metrics(session, base: str, timeout_s: float = 10.0) -> list | None:
    aiohttp = need_aiohttp()
    try:
        async with session.get(f"{base}/metrics", timeout=aiohttp.ClientTimeout(total=min(10.0, timeout_s))) as r:
            if r.status != 200:
                return None
            return parse_prometheus(await r.text())
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None


#: The longest one probe request may take by default (`calibrate --request-timeout`).
DEFAULT_REQUEST_TIMEOUT_S = 300.0


async def _stream(session, url: str, body: dict, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> StreamTimer:
    """Send one request and time its stream; a failure is an EndpointError (probes must succeed)."""
    aiohttp = need_aiohttp()
    timer = StreamTimer()
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body) as r:
                if r.status != 200:
                    text = (await r.text())[:200].replace("\n", " ")
                    raise EndpointError(f"{url}: probe refused: HTTP {r.status}: {text}")
                async for line in r.content:
                    timer.feed(line, time.perf_counter() - t0)
    except TimeoutError:
        raise EndpointError(f"{url}: a probe did not finish within {timeout_s:g} s "
                            "(--request-timeout)") from None
    except aiohttp.ClientError as e:
        raise EndpointError(f"{url}: probe failed: {type(e).__name__}: {e}") from None
    if timer.error:
        raise EndpointError(f"{url}: probe stream error: {timer.error}")
    return timer


class _Prober:
    """Sends the probes; `seed` keeps prompts distinct so a prefix cache never shortcuts one."""

    def __init__(self, session, base: str, info: ServerInfo, token_range, log,
                 timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S):
        self.session, self.base, self.info = session, base, info
        self.timeout_s = timeout_s       # the longest any one probe request may take
        self.metrics_timeout_s = min(10.0, timeout_s)   # the longest one /metrics poll may take
        self.url = f"{base}/v1/completions"
        self.token_range = token_range
        self.log = log
        self.serial = 0
        self.salt = secrets.randbits(63)     # fresh prompts each calibration: no prefix-cache hits

    def body(self, n_in: int, n_out: int) -> dict:
        self.serial += 1
        ids = prompt_token_ids(n_in, self.serial, self.salt, self.token_range)
        return completion_body(self.info.model, ids, n_out, None)

    async def ttft(self, n_in: int) -> float:
        t = await _stream(self.session, self.url, self.body(n_in, 1), self.timeout_s)
        return t.first_s

    async def decode_step(self, batch: int, context: int, n_out: int) -> float:
        """One decode step's time with `batch` requests decoding together.

        With the server's metrics: the batch is sent twice, with `n_out // 4` and `n_out` tokens,
        and the step time is the *extra* inter-token time of the longer run over its extra gaps,
        from the server's own `vllm:inter_token_latency_seconds` (sum and count). The ramp while
        the batch's prefills join is the same in both runs and cancels, and a pause of the API
        server or the client, which bunches the chunks a client sees, does not enter.
        Without metrics: per request the mean gap over its middle tokens, median over requests.
        """
        short = max(4, n_out // 4)
        m0 = await self._itl()
        if m0 is not None:
            await self._batch(batch, context, short)
            m1 = await self._itl()
            await self._batch(batch, context, n_out)
            m2 = await self._itl()
            if m1 is not None and m2 is not None:
                extra_n = (m2[1] - m1[1]) - (m1[1] - m0[1])
                extra_s = (m2[0] - m1[0]) - (m1[0] - m0[0])
                if extra_n > 0 and extra_s > 0:
                    return extra_s / extra_n
        times = await self._batch(batch, context, n_out)
        lo, hi = n_out // 4, n_out - 2
        per_req = [(t[hi] - t[lo]) / (hi - lo) for t in times if len(t) > hi]
        if not per_req:
            raise EndpointError(f"{self.url}: decode probe streams were shorter than {n_out} tokens")
        return float(np.median(per_req))

    async def mixed_delta(self, batch: int, context: int, prompt: int, n_out: int,
                          injections: int = 4) -> float | None:
        """What a fresh `prompt`-token prefill adds to a step in which `batch` requests decode.

        While the batch decodes, `injections` one-token requests of `prompt` tokens are sent one
        after another; each is prefilled in one step together with the decodes, and that step
        emits its first token and a token of every decoding request. So in each decoding stream
        the gap that ends with the injected request's first token is the mixed step, and its
        excess over the stream's median gap is what the prefill added. The median over streams
        and injections is returned: a pause of the machine or a bunched chunk spoils one gap, not
        the estimate, and the baseline is the same run's, so drift does not enter. None when the
        decodes ended before the injections were done (too few tokens).
        """
        times, done_at, firsts = await self._injected_batch(batch, context, n_out, prompt, injections)
        if any(len(t) < 3 or t[-1] <= done_at for t in times):
            return None
        extras = []
        for first in firsts:
            per_stream = []
            for t in times:
                k = int(np.searchsorted(t, first - MIXED_SLACK_S))  # the stream's token from that step
                if 1 <= k < len(t):
                    per_stream.append((t[k] - t[k - 1]) - float(np.median(np.diff(t))))
            if per_stream:
                extras.append(float(np.median(per_stream)))
        return float(np.median(extras)) if extras else None

    async def _injected_batch(self, batch: int, context: int, n_out: int, prompt: int,
                              injections: int) -> tuple[list[np.ndarray], float, list[float]]:
        """A decode batch with one-token prompts injected one at a time once every stream has
        tokens flowing; returns the streams' token times, when the last injection finished and
        when each injection's (only) token arrived, all from the same origin."""
        started = [asyncio.Event() for _ in range(batch)]
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(_stream_times(self.session, self.url, self.body(context, n_out),
                                                   started=ev, t0=t0, timeout_s=self.timeout_s))
                 for ev in started]
        try:
            try:
                await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)),
                                       timeout=min(120.0, self.timeout_s))
            except TimeoutError:
                raise EndpointError(f"{self.url}: a probe's tokens did not start within "
                                    f"{min(120.0, self.timeout_s):g} s") from None
            firsts = []
            for _ in range(injections):
                sent = time.perf_counter() - t0
                timer = await _stream(self.session, self.url, self.body(prompt, 1), self.timeout_s)
                firsts.append(sent + timer.first_s)
            done_at = time.perf_counter() - t0
            return list(await asyncio.gather(*tasks)), done_at, firsts
        finally:
            for t in tasks:
                t.cancel()

    async def _batch(self, batch: int, context: int, n_out: int) -> list[np.ndarray]:
        return await asyncio.gather(*[_stream_times(self.session, self.url, self.body(context, n_out),
                                                    timeout_s=self.timeout_s) for _ in range(batch)])

    async def _itl(self) -> tuple[float, float] | None:
        """(sum, count) of the server's inter-token latency histogram, None without metrics."""
        await asyncio.sleep(0.2)          # let the server record the last outputs
        samples = await _metrics(self.session, self.base, self.timeout_s)
        if samples is None:
            return None
        total = _metric(samples, "vllm:inter_token_latency_seconds_sum")
        count = _metric(samples, "vllm:inter_token_latency_seconds_count")
        return None if total is None or count is None else (total, count)

    def hold_body(self, n_in: int, n_out: int) -> dict:
        """A request that only occupies a slot of the server: not streamed, so the client does no
        work per token (see `running_plateau`)."""
        body = self.body(n_in, n_out)
        body["stream"] = False
        body.pop("stream_options", None)       # vLLM refuses stream options without a stream
        return body

    async def running_plateau(self, n: int, metrics_poll_s: float = 0.05,
                              deadline_s: float = 20.0) -> "_Plateau":
        """Start `n` long small requests and watch the server's gauges until the running count
        has plateaued, with a queue behind it or with all `n` taken in (or `deadline_s` has
        passed, or every probe has ended); then cancel them and wait until the server reports
        them gone. The cap is the plateau only where a queue persisted behind it, or where all
        `n` were in the server at once (`_observe_max_num_seqs`).

        What is read: ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``. vLLM (v1)
        sets both from the scheduler stats that the engine core attaches to the outputs of
        *every* engine step (``Scheduler.update_from_output`` -> ``make_stats``; the API server's
        ``AsyncLLM`` output handler -> ``PrometheusStatLogger.record``), not on an interval
        (only the "Running: N reqs" log line is every 10 s): while the probes run, each poll sees
        the scheduler as of its last step. The look waits on those gauges, as long as it takes.

        Two things keep it independent of how busy the machine is. The probes are not streamed
        (`hold_body`): a streamed probe of this length sends the client one chunk per token,
        and eight of them on a tiny model sent about 3,000 a second, more than a client with a
        few percent of a core could parse; its /metrics polls, on the same event loop, then
        waited behind the tokens past their timeout (52 s for a 10 s timeout with two busy
        loops on the 2 cores), and the look ended at its first failed poll having seen nothing,
        while the server's own log said 8 running and 53 waiting. And a poll that fails or times
        out is counted (`_Plateau.polls`) and the look goes on polling until its deadline.
        """
        n_out = max(1, min(4000, (self.info.max_model_len or 4096) - 9))
        look = _Plateau(n)
        before = await _metrics(self.session, self.base, self.metrics_timeout_s)
        idle = None if before is None else _in_server(before)     # what others run meanwhile
        t_start = time.perf_counter()

        async def hold(body: dict) -> None:
            try:
                await _hold(self.session, self.url, body)
                look.finished += 1
            except EndpointError as e:
                look.failed += 1
                look.first_error = look.first_error or str(e)

        tasks = [asyncio.create_task(hold(self.hold_body(8, n_out))) for _ in range(n)]
        try:
            deadline = t_start + deadline_s
            stable = queued = 0
            while time.perf_counter() < deadline and not all(t.done() for t in tasks):
                await asyncio.sleep(metrics_poll_s)
                s = await self._poll(look)
                if s is None:
                    continue                 # unanswered: counted; the deadline decides
                run = int(_metric(s, "vllm:num_requests_running") or 0)
                wait = int(_metric(s, "vllm:num_requests_waiting") or 0)
                if run > look.best:
                    look.best, stable = run, 0
                else:
                    stable += 1
                # a cap: a queue that persists while the running count stays at its maximum (one
                # poll could catch a request between its arrival and the next engine step)
                queued = queued + 1 if (wait > 0 and run == look.best) else 0
                look.waited = look.waited or queued >= 10
                look.seen = max(look.seen, run + wait)
                look.most_waiting = max(look.most_waiting, wait)
                # taken in: running, waiting or already answered. A probe can end before the last
                # one arrives (a starved front end passed the 64th on after the first eight had
                # generated all their tokens): then running + waiting never reaches n, and only
                # this says that no more are coming. It ends the look; it is no evidence of a cap.
                look.taken = max(look.taken, run + wait + look.finished)
                if stable >= 10 and (look.waited or look.taken >= n):
                    break                    # a plateau with a queue behind it, or all n in
        finally:
            look.elapsed_s = time.perf_counter() - t_start
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if look.polls_answered:
            look.left = await self._drain(metrics_poll_s, idle or 0)
        else:
            look.left = None                 # no gauge to wait on
        return look

    async def _poll(self, look: "_Plateau") -> list | None:
        """One /metrics poll of a look, counted in `look` (answered or not)."""
        look.polls += 1
        s = await _metrics(self.session, self.base, self.metrics_timeout_s)
        look.polls_answered += s is not None
        return s

    async def _drain(self, poll_s: float, idle: int) -> int | None:
        """Wait until the server reports no more requests running or waiting than `idle` (what
        it ran before the look: the cancelled probes aborted), at most as long as a probe
        request may take; the excess it still reports then (None: /metrics did not answer).
        The next probes must find the server as it was: left-over probes would be counted as
        theirs, or slow them down."""
        left = None
        deadline = time.perf_counter() + self.timeout_s
        while True:
            s = await _metrics(self.session, self.base, self.metrics_timeout_s)
            if s is not None:
                left = max(0, _in_server(s) - idle)
                if left == 0:
                    return 0
            if time.perf_counter() >= deadline:
                return left
            await asyncio.sleep(max(poll_s, 0.05))


def _in_server(samples) -> int:
    """Requests running + waiting by the server's gauges."""
    return int((_metric(samples, "vllm:num_requests_running") or 0)
               + (_metric(samples, "vllm:num_requests_waiting") or 0))


@dataclass
class _Plateau:
    """What one look at the running-sequence cap saw (`_Prober.running_plateau`)."""

    n: int                       # probes sent
    best: int = 0                # the most running at once
    waited: bool = False         # a queue persisted while that many ran
    seen: int = 0                # the most running + waiting at once (n once all are in at once)
    taken: int = 0               # the most running + waiting + answered (n once all have arrived)
    most_waiting: int = 0
    finished: int = 0            # probes the server answered in full during the look
    failed: int = 0
    first_error: str | None = None
    polls: int = 0               # /metrics polls made, and how many of them were answered
    polls_answered: int = 0
    elapsed_s: float = 0.0
    left: int | None = 0         # requests the server still reported after the look (None: unknown)

    def describe(self) -> str:
        """One line: what was sent, what came back, what the gauges showed, and for how long."""
        ended = f"{self.finished} answered in full, {self.failed} failed"
        if self.first_error:
            ended += f" (first: {self.first_error})"
        return (f"{self.n} probes sent ({ended}); /metrics answered {self.polls_answered} of "
                f"{self.polls} polls, showing at most {self.best} running, {self.most_waiting} "
                f"waiting and {self.seen} in all at once, {self.taken} of the {self.n} taken in "
                f"(answered ones counted); over {self.elapsed_s:.0f} s")


async def _hold(session, url: str, body: dict) -> None:
    """Send one unstreamed request and wait for its whole answer; a refusal or a broken
    connection is an EndpointError. No deadline of its own: its caller cancels it."""
    aiohttp = need_aiohttp()
    try:
        async with session.post(url, json=body) as r:
            if r.status != 200:
                text = (await r.text())[:200].replace("\n", " ")
                raise EndpointError(f"{url}: probe refused: HTTP {r.status}: {text}")
            await r.read()
    except aiohttp.ClientError as e:
        raise EndpointError(f"{url}: probe failed: {type(e).__name__}: {e}") from None


async def _stream_times(session, url: str, body: dict, started: asyncio.Event | None = None,
                        t0: float | None = None, after: int = 4,
                        timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> np.ndarray:
    """Arrival time of each token of one stream (a chunk's time for every token it carries),
    from `t0` (perf_counter; default: when it is sent). `started` is set once `after` tokens came.
    A stream not finished within `timeout_s` is an `EndpointError`."""
    times: list[float] = []
    timer = StreamTimer()
    aiohttp = need_aiohttp()
    if t0 is None:
        t0 = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=body) as r:
                if r.status != 200:
                    text = (await r.text())[:200].replace("\n", " ")
                    raise EndpointError(f"{url}: probe refused: HTTP {r.status}: {text}")
                async for line in r.content:
                    before = timer.tokens
                    timer.feed(line, time.perf_counter() - t0)
                    times.extend([timer.last_s] * (timer.tokens - before))
                    if started is not None and len(times) >= after:
                        started.set()
    except TimeoutError:
        raise EndpointError(f"{url}: a probe did not finish within {timeout_s:g} s "
                            "(--request-timeout)") from None
    except aiohttp.ClientError as e:
        raise EndpointError(f"{url}: probe failed: {type(e).__name__}: {e}") from None
    finally:
        if started is not None:       # also on failure, so that nobody waits for it
            started.set()
    return np.asarray(times)


class _Limits:
    """The engine limits of a calibration as they are found, each with where it came from: a
    value given on the command line (`overrides`) wins over one the server reports or one probed."""

    def __init__(self, overrides: dict):
        self.overrides = overrides
        self.limits: dict[str, int] = {}
        self.sources: dict[str, str] = {}

    def put(self, key: str, value, source: str) -> None:
        """Record `key` = `value` (from `source`) unless the command line gave it."""
        if key in self.overrides and self.overrides[key] is not None:
            self.limits[key], self.sources[key] = int(self.overrides[key]), "given on the command line"
        elif value is not None:
            self.limits[key], self.sources[key] = int(value), source


def _reported_limits(lim: _Limits, info: ServerInfo, samples, base: str, log) -> None:
    """max_model_len, block_size and num_gpu_blocks: from /v1/models and /metrics (or the command
    line); a one-line error names the option to give for one the server does not report."""
    lim.put("max_model_len", info.max_model_len, "from /v1/models")
    if samples is not None:
        busy = _metric(samples, "vllm:num_requests_running") or 0
        if busy:
            log(f"warning: {int(busy)} requests already running; other load skews the calibration")
        cache = [lab for n, lab, _ in samples if n == "vllm:cache_config_info"]
        if cache:
            lim.put("block_size", _int_label(cache[0], "block_size"), "from /metrics cache_config_info")
            lim.put("num_gpu_blocks", _int_label(cache[0], "num_gpu_blocks"), "from /metrics cache_config_info")
    for key in ("max_model_len", "block_size", "num_gpu_blocks"):
        if key not in lim.limits:
            lim.put(key, None, "")
            if key not in lim.limits:
                raise EndpointError(f"{base}: the server does not report {key} "
                                    f"(no /metrics cache_config_info); give --{key.replace('_', '-')}")


async def _observe_max_num_seqs(lim: _Limits, prober: _Prober, samples, base: str, log) -> None:
    """The running-sequence cap: the plateau of num_requests_running under 64, 256, 1024 probes."""
    if lim.overrides.get("max_num_seqs") is not None:
        lim.put("max_num_seqs", None, "")
        return
    if samples is None:
        raise EndpointError(f"{base}: no /metrics endpoint to observe the running-sequence cap; "
                            f"give --max-num-seqs")
    n = 64
    while True:
        look = await prober.running_plateau(n, deadline_s=min(20.0, prober.timeout_s))
        log(f"max_num_seqs probe: {look.describe()}; some waiting: {look.waited}")
        _warn_left(look, log)
        if not look.waited and look.seen < n:
            # not every probe was seen in the server's queues at once (a busy machine): a
            # plateau below n without a queue is no evidence of a cap; look once more, as long
            # as one probe request may take (--request-timeout), not a fixed wall-clock time: a
            # starved server is slow, not wrong, and the look ends once all n have arrived
            look = await prober.running_plateau(n, deadline_s=prober.timeout_s)
            log(f"max_num_seqs probe again: {look.describe()}; some waiting: {look.waited}")
            _warn_left(look, log)
            if not look.waited and look.seen < n:
                raise EndpointError(f"{base}: the running-sequence cap could not be observed in a "
                                    f"look of up to {prober.timeout_s:g} s (--request-timeout): neither "
                                    f"a queue behind the plateau nor all {n} in the server at once; "
                                    f"{look.describe()}; give --max-num-seqs")
        if look.waited or look.best < n:
            lim.put("max_num_seqs", look.best, f"observed plateau of num_requests_running ({n} sent)")
            return
        if n >= 1024:
            lim.put("max_num_seqs", look.best, f"at least {look.best} (all {n} probes ran at once)")
            return
        n *= 4


def _warn_left(look: _Plateau, log) -> None:
    """Say so when the server still ran cancelled probes after a look (see `_Prober._drain`)."""
    if look.left:
        log(f"warning: the server still reports {look.left} requests running or waiting after the "
            f"max_num_seqs probes were cancelled; the next probes may be skewed")


async def _latency_probes(prober: _Prober, limits: dict[str, int], repeats: int, seed: int,
                          log) -> list[Observation]:
    """Time the prefill, decode and mixed probes, every (probe, repetition) in one seeded shuffled
    order, so a slow drift of the machine's speed spreads over all probes instead of biasing one
    coefficient; one observation per probe, its median."""
    mml, budget = limits["max_model_len"], limits["max_num_batched_tokens"]
    lengths = sorted({L for L in (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
                      if L <= mml - 1} | {mml - 1})
    n_out = DECODE_PROBE_TOKENS
    contexts = sorted({16, max(16, min(mml // 4, mml - n_out - 1))})
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= limits["max_num_seqs"]]
    # mixed steps: a decode batch that leaves room for one more sequence, and prompts that
    # fit one chunk beside its decodes
    mixed_batch = min(4, limits["max_num_seqs"] - 1)
    mixed_prompts = sorted({p for p in (min(budget // 4, MIXED_PROMPT_TOKENS[0]),
                                        min(3 * budget // 4, MIXED_PROMPT_TOKENS[1]))
                            if 16 <= p <= min(budget - mixed_batch, mml - 1)}) if mixed_batch >= 1 else []
    specs = ([("prefill", L, 0) for L in lengths] + [("decode", b, ctx) for ctx in contexts for b in batches]
             + [("mixed", p, mixed_batch) for p in mixed_prompts])
    plan = [spec for spec in specs for _ in range(repeats)]
    np.random.Generator(np.random.PCG64(seed)).shuffle(plan)
    measured: dict[tuple, list[float]] = {spec: [] for spec in specs}
    for i, (kind, x, y) in enumerate(plan, 1):
        try:
            t = await _probe(prober, kind, x, y, n_out, contexts[0], mml)
        except EndpointError as e:        # one more try: a single request can fail by chance
            log(f"{kind} probe failed ({e}); trying it once more")
            t = await _probe(prober, kind, x, y, n_out, contexts[0], mml)
        if t is None:
            log(f"mixed probe (prompt {x}, batch {y}): the decodes ended before the injected "
                f"prompts ran; repetition dropped")
            continue
        measured[(kind, x, y)].append(t)
        if i % max(1, len(plan) // 10) == 0:
            log(f"latency probes: {i}/{len(plan)}")
    obs: list[Observation] = []
    for kind, x, y in specs:
        if not measured[(kind, x, y)]:
            continue
        sec = float(np.median(measured[(kind, x, y)]))
        if kind == "prefill":
            obs.append(Observation("prefill", f"prompt {x}", sec, prefill_features(x, budget)))
            log(f"prefill {x:>6} tokens: TTFT {1e3 * sec:.1f} ms")
        elif kind == "decode":
            mean_ctx = y + (n_out // 4 + n_out - 2) / 2.0
            obs.append(Observation("decode", f"batch {x} context {y}", sec,
                                   decode_features(x, x * mean_ctx)))
            log(f"decode batch {x:>3} context {y:>5}: step {1e3 * sec:.2f} ms")
        elif sec > 0:
            obs.append(Observation("mixed", f"prompt {x} + {y} decodes", sec, mixed_delta_features(x)))
            log(f"mixed: a {x}-token prefill adds {1e3 * sec:.1f} ms to a {y}-sequence decode step")
        else:
            log(f"mixed: a {x}-token prefill added no measurable time to a decode step "
                f"({1e3 * sec:.1f} ms); not fitted")
    return obs


async def _calibrate_async(endpoint: str, model: str | None, overrides: dict, repeats: int,
                           token_range, log, seed: int = 0,
                           timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> Calibration:
    aiohttp = need_aiohttp()
    base = server_root(endpoint)
    async with aiohttp.ClientSession(connector=client_connector(),
                                     timeout=aiohttp.ClientTimeout()) as session:   # probes time themselves
        info = await fetch_server_info(session, base, model, timeout_s=min(30.0, timeout_s))
        samples = await _metrics(session, base, timeout_s)
        lim = _Limits(overrides)
        _reported_limits(lim, info, samples, base, log)
        prober = _Prober(session, base, info, token_range, log, timeout_s)
        await prober.ttft(16)                          # warm-up, not measured
        await _observe_max_num_seqs(lim, prober, samples, base, log)
        # --- the token budget
        if overrides.get("max_num_batched_tokens") is not None:
            lim.put("max_num_batched_tokens", None, "")
        elif samples is None:
            raise EndpointError(f"{base}: no /metrics endpoint to observe the token budget; "
                                f"give --max-num-batched-tokens")
        else:
            budget, how = await _probe_budget(prober, session, base, lim.limits["max_model_len"],
                                              lim.limits["max_num_seqs"])
            lim.put("max_num_batched_tokens", budget, how)
        obs = await _latency_probes(prober, lim.limits, repeats, seed, log)
    cal = Calibration(info, base, lim.limits, lim.sources, obs)
    cal.fit = fit_linear(obs)
    for label in cal.fit.excluded:
        log(f"mixed probe {label}: over {MIXED_PLAUSIBLE:g}x the time of its prompt alone "
            f"(a pause of the machine?); left out of the fit")
    return cal


async def _probe(prober: _Prober, kind: str, x: int, y: int, n_out: int, mixed_context: int,
                 mml: int) -> float | None:
    """One latency probe: ("prefill", prompt, 0), ("decode", batch, context) or ("mixed", prompt, batch)."""
    if kind == "prefill":
        return await prober.ttft(x)
    if kind == "decode":
        return await prober.decode_step(x, y, n_out)
    for tokens in (2 * n_out, 4 * n_out):       # longer decodes if the injections outlasted them
        if tokens + mixed_context > mml:
            break
        t = await prober.mixed_delta(y, mixed_context, x, tokens)
        if t is not None:
            return t
    return None


def _int_label(labels: dict, key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, ValueError):
        return None


async def _probe_budget(prober: _Prober, session, base: str, mml: int, max_seqs: int) -> tuple[int, str]:
    """Estimate max_num_batched_tokens from engine-step counts of a burst of long prompts."""
    def hist(samples):
        count = _metric(samples, "vllm:iteration_tokens_total_count")
        total = _metric(samples, "vllm:iteration_tokens_total_sum")
        buckets = {}
        for n, lab, v in samples:
            if n == "vllm:iteration_tokens_total_bucket" and lab.get("le") not in (None, "+Inf"):
                le = float(lab["le"])
                buckets[le] = buckets.get(le, 0.0) + v
        return count, total, buckets

    before = await _metrics(session, base, prober.timeout_s)
    L = mml - 1
    m = max(2, min(max_seqs, 8))
    await asyncio.gather(*[_stream(session, prober.url, prober.body(L, 1), prober.timeout_s) for _ in range(m)])
    await asyncio.sleep(0.3)
    after = await _metrics(session, base, prober.timeout_s)
    c0, s0, b0 = hist(before)
    c1, s1, b1 = hist(after)
    if c0 is None or c1 is None:
        raise EndpointError(f"{base}: /metrics has no vllm:iteration_tokens_total; give --max-num-batched-tokens")
    steps = int(round(c1 - c0))
    prompt_tokens = m * L
    if steps <= m:
        # One counted step per prompt: either each prompt fit in one step, or (vLLM 0.32) steps
        # that only advance a prefill chunk are not counted at all. The metrics cannot tell.
        raise EndpointError(f"{base}: the token budget cannot be read off /metrics ({m} prompts of {L} "
                            f"tokens counted {steps} engine steps); give --max-num-batched-tokens")
    lower = math.ceil(prompt_tokens / max(steps, 1))
    # Largest per-step token count seen in the burst (histogram bucket bounds).
    upper = None
    for le in sorted(b1):
        if b1[le] - b0.get(le, 0.0) >= steps - 0.5:
            upper = int(le)
            break
    budget = 1 << max(0, (lower - 1).bit_length())
    if upper is not None and budget > upper:
        budget = upper
    return budget, (f"estimated: {m} prompts of {L} tokens took {steps} engine steps "
                    f"(>= {lower} tokens per step); nearest power of two")


def calibrate(endpoint: str, out: str | Path | None = None, *, model: str | None = None, repeats: int = 5,
              overrides: dict | None = None, token_range: tuple[int, int] = (1000, 2000), seed: int = 0,
              request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
              log: Callable[[str], None] = lambda s: None) -> Calibration:
    """Probe the server at `endpoint`, fit the linear latency model, and (if `out`) write the config.

    `overrides` maps engine keys (max_num_seqs, max_num_batched_tokens, max_model_len,
    block_size, num_gpu_blocks) to values that replace what would be probed. Each latency probe
    runs `repeats` times and its median is fitted; all repetitions run in one order shuffled
    with `seed`, because the speed of a shared or virtualised machine drifts (seen here: the
    same decode probe 3.6 ms in one calibration and 5.6 ms in another an hour later) and probes
    taken in sequence would turn that drift into a wrong slope. The written file is read back
    with the engine-config loader, so what it holds is a valid engine. No probe request may take
    longer than `request_timeout_s` (nor the server's model list longer than 30 s, or than that):
    a server that accepts and never answers is a one-line `EndpointError` that soon.
    """
    if repeats < 1:
        raise SchedportError(f"--repeats must be at least 1, got {repeats}")
    if not (isinstance(request_timeout_s, (int, float)) and math.isfinite(request_timeout_s)
            and request_timeout_s > 0):
        raise SchedportError(f"--request-timeout must be a positive number of seconds, got {request_timeout_s}")
    with no_gc_pauses():
        cal = asyncio.run(_calibrate_async(endpoint, model, dict(overrides or {}), repeats, token_range, log,
                                           seed, request_timeout_s))
    if out is not None:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda p: Path(p).write_text(cal.engine_toml()))
        load_engine_config(path)
    return cal


def speed_index(endpoint: str, engine, *, prompt_tokens: int = 256, n: int = 3, model: str | None = None,
                token_range: tuple[int, int] = (1000, 2000)) -> float:
    """How fast the server runs *now* against its engine config: the measured TTFT of a lone
    `prompt_tokens`-token prompt (median of `n`) over the simulated one. 1.0 is the calibrated
    speed; 1.3 means the machine is 30% slower than when it was calibrated.

    A shared or virtualised machine drifts (seen here: the same 512-token prefill 75 ms, then
    100 ms ten minutes later). `validate` takes this reading before every replay, so a run's
    error can be read beside the machine's speed at that moment.
    """
    cfg = resolve_engine(engine)
    prompt_tokens = max(1, min(prompt_tokens, cfg.max_model_len - 1))
    one = Trace(np.zeros(1), np.array([prompt_tokens]), np.array([1]))
    modelled = float(simulate(one, "vllm-fcfs", engine=cfg).requests["ttft_s"].iloc[0])

    async def measure() -> float:
        aiohttp = need_aiohttp()
        base = server_root(endpoint)
        async with aiohttp.ClientSession(connector=client_connector(), timeout=aiohttp.ClientTimeout()) as session:
            info = await fetch_server_info(session, base, model, timeout_s=30.0)
            salt = secrets.randbits(63)
            url = f"{base}/v1/completions"
            times = []
            for i in range(n):
                body = completion_body(info.model, prompt_token_ids(prompt_tokens, i, salt, token_range), 1, None)
                times.append((await _stream(session, url, body, timeout_s=60.0)).first_s)
            return float(np.median(times))

    with no_gc_pauses():
        return asyncio.run(measure()) / modelled
