"""Replay against an OpenAI-compatible streaming server, checked against a fake one (no vLLM needed).

The fake is a small `aiohttp.web` app run on 127.0.0.1 (ephemeral port) in a background thread
with its own event loop, because `replay()` runs `asyncio.run` itself. It streams completions
the way vLLM does (one SSE chunk per token, cumulative usage when continuous usage stats are
asked for, a usage-only chunk, then ``[DONE]``), rejects over-long requests with HTTP 400,
records every body it receives with its receive time, and misbehaves on request: a mode is
chosen per request by the prompt length (see `FakeServer.modes`).
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import pandas as pd
import pytest
from aiohttp import web

from schedport.engine.core.config import load_engine_config
from schedport.errors import SchedportError
from schedport.engine.core.metrics import REQUEST_COLUMNS
from schedport.realengine.replay import (
    EXPRESSIBLE,
    EndpointError,
    StreamTimer,
    server_root,
    prompt_token_ids,
    replay,
    request_priorities,
)
from schedport.engine.policies.schedulers import predicted_scores
from schedport.workload.trace import Trace, save_trace

REPLAY_COLUMNS = [*REQUEST_COLUMNS, "scheduled_s", "send_lag_s", "tokens_received", "detail"]
DELAY_S = 0.004          # the fake server's time per output token


# --------------------------------------------------------------------------- the fake server


@dataclass
class Received:
    t: float             # time.perf_counter() when the handler started
    body: dict
    first_sent: float = math.nan    # when the first / last token chunk was written
    last_sent: float = math.nan
    peer: tuple | None = None       # the client's (host, port): one per TCP connection

    @property
    def prompt(self) -> tuple[int, ...]:
        return tuple(self.body["prompt"])


class FakeServer:
    """A vLLM-like `/v1/models` + streaming `/v1/completions`, with switchable misbehaviour.

    ``modes`` maps a prompt length to one of: ``http500`` (HTTP 500 with a JSON error),
    ``stall`` (one token, then nothing), ``stall0`` (nothing at all, not even headers),
    ``truncate`` (half the tokens, finish_reason "stop", then a clean end of stream),
    ``abort`` (half the tokens, then the connection is dropped mid-body), ``errchunk``
    (half the tokens, then an ``{"error": ...}`` chunk as vLLM sends on an engine failure),
    ``chunk3`` (three tokens per chunk, usage jumping by 3), ``nousage`` (no per-chunk usage).
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.configure()

    def configure(self, *, delay: float = DELAY_S, modes: dict[int, str] | None = None,
                  models_status: int = 200, models: list[dict] | None = None, hold_until: int = 0,
                  head_delay: float = 0.0, tail_delay: float = 0.0, all_status: int = 0) -> None:
        """`hold_until` N: no response starts before N requests have arrived. `head_delay` /
        `tail_delay`: extra seconds before the first token / after the last one."""
        self.delay = delay
        self.hold_until, self.head_delay, self.tail_delay = hold_until, head_delay, tail_delay
        self.all_status = all_status   # answer every completion with this HTTP status (0: normally)
        self.all_in = None
        self.modes = dict(modes or {})
        self.models_status = models_status
        self.models = [{"id": "fake", "object": "model", "max_model_len": 512}] if models is None else models
        self.max_model_len = 512
        self.records: list[Received] = []

    # ------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        self.stop = asyncio.Event()
        app = web.Application()
        self._routes(app)
        # handler_cancellation: a stalled handler ends when the client gives up on it
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}"

    def _routes(self, app: web.Application) -> None:
        """The server's endpoints (a subclass adds its own)."""
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)

    def close(self) -> None:
        async def _stop():
            self.stop.set()
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    # ------------------------------------------------------------- handlers

    async def _models(self, request: web.Request) -> web.Response:
        if self.models_status != 200:
            return web.json_response({"object": "error", "message": "down"}, status=self.models_status)
        return web.json_response({"object": "list", "data": self.models})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        t = time.perf_counter()
        body = await request.json()
        rec = Received(t, body, peer=request.transport.get_extra_info("peername"))
        self.records.append(rec)
        if self.hold_until:
            if self.all_in is None:
                self.all_in = asyncio.Event()
            if len(self.records) >= self.hold_until:
                self.all_in.set()
            await self.all_in.wait()
        if self.all_status:
            return web.json_response({"object": "error", "message": "not implemented"}, status=self.all_status)
        prompt, n_out = body["prompt"], int(body["max_tokens"])
        n_in = len(prompt)
        if n_in + n_out > self.max_model_len:
            return web.json_response(
                {"object": "error", "type": "BadRequestError", "code": 400, "param": None,
                 "message": f"This model's maximum context length is {self.max_model_len} tokens. "
                            f"However, you requested {n_in + n_out} tokens."}, status=400)
        mode = self.modes.get(n_in, "ok")
        if mode == "http500":
            return web.json_response({"object": "error", "type": "InternalServerError", "code": 500,
                                      "message": "internal failure"}, status=500)
        if mode == "stall0":
            await self.stop.wait()
        opts = body.get("stream_options") or {}
        per_chunk_usage = bool(opts.get("continuous_usage_stats")) and mode != "nousage"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(obj) -> None:
            await resp.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")

        def usage(k: int) -> dict:
            return {"prompt_tokens": n_in, "completion_tokens": k, "total_tokens": n_in + k}

        step = 3 if mode == "chunk3" else 1
        limit = {"stall": 1, "truncate": n_out // 2, "abort": n_out // 2, "errchunk": n_out // 2}.get(mode, n_out)
        sent = 0
        await asyncio.sleep(self.head_delay)
        while sent < limit:
            k = min(step, limit - sent)
            await asyncio.sleep(self.delay * k)
            sent += k
            finish = "length" if sent == n_out else ("stop" if mode == "truncate" and sent == limit else None)
            chunk = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": body["model"],
                     "choices": [{"index": 0, "text": " tok" * k, "logprobs": None,
                                  "finish_reason": finish, "stop_reason": None}]}
            if per_chunk_usage:
                chunk["usage"] = usage(sent)
            await send(chunk)
            rec.last_sent = time.perf_counter()
            if math.isnan(rec.first_sent):
                rec.first_sent = rec.last_sent
        if mode == "stall":
            await self.stop.wait()
        if mode == "abort":
            request.transport.close()          # drop the connection mid-body
            return resp
        await asyncio.sleep(self.tail_delay)
        if mode == "errchunk":
            await send({"error": {"object": "error", "message": "engine died", "type": "InternalServerError",
                                  "code": 500}})
        elif opts.get("include_usage"):
            await send({"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": body["model"],
                        "choices": [], "usage": usage(sent)})
        await send(b"[DONE]")
        await resp.write_eof()
        return resp


@pytest.fixture(scope="module")
def server():
    s = FakeServer()
    s.start()
    yield s
    s.close()


@pytest.fixture
def fake(server):
    server.configure()
    yield server
    server.configure()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def by_index(trace: Trace, records: list[Received]) -> dict[int, Received]:
    """Match each received body to its trace row by prompt length (unique in these traces)."""
    want = {int(n): i for i, n in enumerate(trace.input_tokens)}
    assert len(want) == len(trace), "test traces give every request its own prompt length"
    got = {}
    for r in records:
        i = want[len(r.prompt)]
        assert i not in got, f"request {i} received twice"
        got[i] = r
    return got


# --------------------------------------------------------------------------- StreamTimer


def _chunk(text="x", finish=None, usage=None, choices=True) -> str:
    obj = {"id": "c", "object": "text_completion",
           "choices": [{"index": 0, "text": text, "finish_reason": finish}] if choices else []}
    if usage is not None:
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": usage, "total_tokens": 3 + usage}
    return "data: " + json.dumps(obj) + "\n"


def test_timer_counts_tokens_from_cumulative_usage():
    tm = StreamTimer()
    for k in range(1, 5):
        tm.feed(_chunk(usage=k, finish="length" if k == 4 else None).encode(), 1.0 + k)
        tm.feed(b"\n", 1.0 + k)
    tm.feed(_chunk(choices=False, usage=4), 9.0)    # usage-only chunk: no tokens, no time
    tm.feed(b"data: [DONE]\n", 9.5)
    assert (tm.tokens, tm.chunks, tm.first_s, tm.last_s) == (4, 4, 2.0, 5.0)
    assert tm.finish_reason == "length" and tm.done and tm.error is None


def test_timer_counts_one_token_per_chunk_without_usage():
    tm = StreamTimer()
    for k in range(3):
        tm.feed(_chunk(text=f"t{k}"), 0.5 * k)
    tm.feed(_chunk(text="", finish="length"), 7.0)  # a last chunk that only finishes still counts
    tm.feed(_chunk(choices=False, usage=4), 8.0)
    assert (tm.tokens, tm.first_s, tm.last_s) == (4, 0.0, 7.0)
    tm2 = StreamTimer()
    tm2.feed(_chunk(text=""), 1.0)                   # empty text, no finish: nothing received
    assert tm2.tokens == 0 and math.isnan(tm2.first_s)


def test_timer_multi_token_chunks_and_repeated_usage():
    tm = StreamTimer()
    tm.feed(_chunk(usage=3), 1.0)
    tm.feed(_chunk(usage=3, text=""), 1.5)          # usage did not move: no new token, no time
    tm.feed(_chunk(usage=7), 2.0)
    tm.feed(_chunk(usage=8, finish="length"), 3.0)
    assert (tm.tokens, tm.chunks, tm.first_s, tm.last_s) == (8, 3, 1.0, 3.0)


def test_timer_ignores_comments_blank_lines_and_event_names():
    tm = StreamTimer()
    for line in (": keep-alive\n", "\n", "\r\n", "event: message\n", "id: 4\n", "retry: 10\n"):
        tm.feed(line, 1.0)
    assert tm.tokens == 0 and tm.error is None and not tm.done and math.isnan(tm.first_s)
    tm.feed("data:" + _chunk(usage=1)[5:].strip() + "\r\n", 2.0)   # no space after the colon
    assert tm.tokens == 1 and tm.first_s == 2.0
    tm.feed("data: [DONE]", 3.0)
    assert tm.done and tm.last_s == 2.0


@pytest.mark.parametrize("line,fragment", [
    ("data: {not json\n", "unparseable stream chunk"),
    ("data: [1, 2]\n", "unexpected stream chunk"),
    ('data: {"error": {"message": "engine died", "code": 500}}\n', "engine died"),
    ('data: {"error": "plain text"}\n', "plain text"),
])
def test_timer_bad_chunks_are_errors(line, fragment):
    tm = StreamTimer()
    tm.feed(_chunk(usage=1), 1.0)
    tm.feed(line.encode(), 2.0)
    assert tm.error is not None and fragment in tm.error
    assert tm.tokens == 1 and tm.last_s == 1.0


# --------------------------------------------------------------------------- priorities


@pytest.fixture(scope="module")
def mix() -> Trace:
    rng = np.random.default_rng(3)
    n = 40
    return Trace.from_arrays(np.sort(rng.uniform(10.0, 30.0, n)), rng.integers(1, 900, n),
                             rng.integers(1, 400, n))


def engine_toml(tmp_path: Path, text: str):
    p = tmp_path / "engine.toml"
    p.write_text(text)
    return load_engine_config(p)


def test_priorities_fcfs_sjf_spf(mix):
    assert request_priorities(mix, "vllm-fcfs") is None
    sjf = request_priorities(mix, "sjf")
    spf = request_priorities(mix, "spf")
    assert sjf.dtype == np.int64 and np.array_equal(sjf, mix.output_tokens)
    assert spf.dtype == np.int64 and np.array_equal(spf, mix.input_tokens)


def test_priorities_edf_are_the_simulator_deadlines_in_us(mix, tmp_path):
    """The last-token deadline arrival + TTFT SLO + TPOT SLO x (N - 1) of the configured profile."""
    edf = request_priorities(mix, "edf", load_engine_config(None))
    assert edf.dtype == np.int64
    n1 = mix.output_tokens - 1
    assert np.array_equal(edf, np.round((mix.arrival_s + 2.0 + 0.1 * n1) * 1e6).astype(np.int64))
    strict = request_priorities(mix, "edf", engine_toml(tmp_path, '[scheduler.edf]\nslo_profile = "strict"\n'))
    assert np.array_equal(strict, np.round((mix.arrival_s + 0.5 + 0.05 * n1) * 1e6).astype(np.int64))
    first = request_priorities(mix, "edf", engine_toml(tmp_path, '[scheduler.edf]\ndeadline = "first-token"\n'))
    assert np.array_equal(first, np.round((mix.arrival_s + 2.0) * 1e6).astype(np.int64))
    with pytest.raises(SchedportError, match=r"\[scheduler\.edf\] deadline: must be"):
        request_priorities(mix, "edf", engine_toml(tmp_path, '[scheduler.edf]\ndeadline = "soon"\n'))


def test_priorities_ltr_are_ranks_of_the_simulator_scores(mix, tmp_path):
    got = request_priorities(mix, "ltr", seed=4)
    scores = predicted_scores(mix.output_tokens, 0.52, 4)
    want = np.empty(len(mix), dtype=np.int64)
    want[np.argsort(scores, kind="stable")] = np.arange(len(mix))
    assert np.array_equal(got, want) and got.dtype == np.int64
    assert sorted(got.tolist()) == list(range(len(mix)))
    assert np.array_equal(got, request_priorities(mix, "ltr", seed=4))
    other = request_priorities(mix, "ltr", seed=5)
    assert sorted(other.tolist()) == list(range(len(mix))) and not np.array_equal(got, other)
    # the engine's tau is used: a perfect predictor ranks by true length, ties by arrival
    exact = request_priorities(mix, "ltr", engine_toml(tmp_path, "[scheduler.ltr]\ntau = 1.0\n"))
    assert np.array_equal(np.argsort(exact), np.lexsort((np.arange(len(mix)), mix.output_tokens)))


@pytest.mark.parametrize("name,known", [("srpt", True), ("fastserve", True), ("sarathi", True),
                                        ("fifo", False)])
def test_priorities_inexpressible_schedulers(mix, name, known):
    with pytest.raises(SchedportError) as e:
        request_priorities(mix, name)
    msg = str(e.value)
    assert f"'{name}'" in msg and "expressible: " + ", ".join(EXPRESSIBLE) in msg
    assert ("known to the simulator" in msg) == known


def test_priorities_spf_with_aging_refused(mix, tmp_path):
    with pytest.raises(SchedportError, match="aging"):
        request_priorities(mix, "spf", engine_toml(tmp_path, "[scheduler.spf]\naging = 0.5\n"))
    cfg = engine_toml(tmp_path, "[scheduler.spf]\naging = 0.0\n")
    assert np.array_equal(request_priorities(mix, "spf", cfg), mix.input_tokens)


# --------------------------------------------------------------------------- prompts


def test_prompt_token_ids():
    p = prompt_token_ids(300, 4, 1)
    assert len(p) == 300 and all(isinstance(x, int) for x in p)
    assert min(p) >= 1000 and max(p) < 2000
    assert p == prompt_token_ids(300, 4, 1)
    assert p != prompt_token_ids(300, 5, 1) and p != prompt_token_ids(300, 4, 2)
    prompts = {tuple(prompt_token_ids(16, i, 0)) for i in range(200)}
    assert len(prompts) == 200
    q = prompt_token_ids(1000, 0, 0, token_range=(7, 9))
    assert set(q) == {7, 8}
    assert prompt_token_ids(1, 0, 0) and prompt_token_ids(0, 0, 0) == []


# --------------------------------------------------------------------------- end to end


def clean_trace() -> Trace:
    # 16 requests over 1.2 s in the trace's own time frame (starting at 3 s), with a burst
    # of three simultaneous arrivals; small prompts and outputs.
    rel = [0.0, 0.05, 0.12, 0.2, 0.2, 0.2, 0.35, 0.5, 0.52, 0.61, 0.7, 0.85, 0.9, 1.0, 1.1, 1.2]
    rng = np.random.default_rng(11)
    n = len(rel)
    return Trace.from_arrays(3.0 + np.array(rel), rng.choice(np.arange(5, 80), n, replace=False),
                             rng.integers(5, 13, n))


@pytest.fixture(scope="module")
def clean_run(server):
    # the lag bound is set far above anything a busy machine adds, so that no assertion below
    # depends on how fast this machine sends today (the bound is tested on its own below)
    trace = clean_trace()
    server.configure()
    res = replay(trace, server.url, engine=load_engine_config(None), seed=7, max_lag_s=60.0)
    return trace, res, list(server.records)


def test_replay_sends_each_request_exactly_as_sized(clean_run):
    trace, res, records = clean_run
    got = by_index(trace, records)
    assert sorted(got) == list(range(len(trace)))
    prompts = {r.prompt for r in records}          # distinct per request: no shared prefix to cache
    assert len(prompts) == len(trace) and all(1000 <= t < 2000 for p in prompts for t in p)
    for i, r in got.items():
        b = r.body
        assert len(b["prompt"]) == trace.input_tokens[i]
        assert b["max_tokens"] == b["min_tokens"] == trace.output_tokens[i]
        assert b["ignore_eos"] is True and b["stream"] is True and b["model"] == "fake"
        assert b["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        assert "priority" not in b                   # vllm-fcfs: the server's own order


def test_replay_opens_a_connection_per_request(clean_run):
    """No request reuses an idle connection: one that does races the server's keep-alive timeout
    and can be lost to "Server disconnected" (vLLM's API server closes idle connections after
    5 s, and a starved machine overruns its timers). The trace's requests are spaced so that
    most start after earlier ones finished, where a pooling client would reuse their connections."""
    _, _, records = clean_run
    assert len({r.peer for r in records}) == len(records)


def test_replay_is_open_loop(fake):
    """The server holds every answer until all requests have arrived: an open-loop client sends
    them all regardless and completes them; a client that waited for a response before sending
    the next would never complete one (its first request times out). Decided by the server's
    state, not by how closely this machine kept the schedule."""
    trace = clean_trace()
    fake.configure(hold_until=len(trace))
    res = replay(trace, fake.url, engine=load_engine_config(None), seed=7, max_lag_s=60.0,
                 request_timeout_s=120.0)
    assert len(fake.records) == len(trace)
    assert (res.requests.status == "completed").all(), res.requests.detail.tolist()
    # every first token came after the last request was sent
    assert res.requests.first_token_s.min() > res.requests.arrival_s.max()


def test_replay_request_table(clean_run):
    trace, res, _ = clean_run
    df = res.requests
    assert list(df.columns) == REPLAY_COLUMNS
    assert len(df) == len(trace) and (df.status == "completed").all()
    assert (df.detail == "").all()
    assert np.array_equal(df.tokens_received, trace.output_tokens)
    assert np.array_equal(df.scheduled_s, trace.arrival_s)
    assert np.array_equal(df.input_tokens, trace.input_tokens)
    assert np.allclose(df.arrival_s, df.scheduled_s + df.send_lag_s)
    assert (df.send_lag_s >= 0).all()
    # the server sleeps DELAY_S before every token, so the first one cannot come sooner (a lower
    # bound that a slower machine only makes looser)
    assert np.allclose(df.ttft_s, df.first_token_s - df.arrival_s)
    assert (df.ttft_s > 0.9 * DELAY_S).all()
    assert np.allclose(df.e2e_s, df.finish_s - df.arrival_s)
    assert (df.e2e_s >= df.ttft_s).all() and (df.preemptions == 0).all()


def test_replay_tpot_is_the_server_token_time(fake):
    """TPOT is (last token - first token) / (N - 1), timed from those two chunks.

    The server waits HEAD s before the first token and TAIL s after the last one, so timing from
    the send or to the usage chunk / [DONE] would add at least HEAD / (N - 1) = 27 ms to a
    request's TPOT (N <= 12 here), against a true TPOT of about DELAY_S. The median |client -
    server| must stay under a third of that: a busy machine would have to delay the delivery of
    the first or last token of most requests by 9 ms x (N - 1) to break it.
    """
    head = tail = 0.3
    trace = clean_trace()
    fake.configure(head_delay=head, tail_delay=tail)
    res = replay(trace, fake.url, engine=load_engine_config(None), seed=7, max_lag_s=60.0)
    got = by_index(trace, fake.records)
    tpot = res.requests.tpot_s.to_numpy()
    server = np.array([(got[i].last_sent - got[i].first_sent) / (trace.output_tokens[i] - 1)
                       for i in range(len(trace))])
    # every gap is a sleep of DELAY_S, which never returns early
    assert np.isfinite(tpot).all() and (server > 0.999 * DELAY_S).all()
    wrong = head / (trace.output_tokens.max() - 1)
    assert float(np.median(np.abs(tpot - server))) < wrong / 3, (tpot, server)


def test_replay_summary(clean_run):
    trace, res, _ = clean_run
    s = res.summary
    assert s["n_requests"] == s["n_completed"] == len(trace)
    assert s["n_rejected"] == s["n_error"] == s["n_timeout"] == s["n_truncated"] == 0
    assert 0 <= s["send_lag_p50_s"] <= s["send_lag_p99_s"] <= s["send_lag_max_s"] < 60.0
    assert s["client_lag_ok"] is True and res.lag_ok
    assert s["max_lag_s"] == 60.0 and s["load_scale"] == 1.0 and res.scale == 1.0
    assert s["scheduler"] == "vllm-fcfs" and s["model"] == "fake"
    assert s["preemptions"] is None and s["iterations"] is None
    assert res.server.model == "fake" and res.server.max_model_len == 512
    json.dumps(s, allow_nan=False)


def test_replay_sends_sjf_priorities(server):
    server.configure()
    rel = np.array([0.0, 0.03, 0.06, 0.09, 0.12, 0.15])
    trace = Trace.from_arrays(rel, [10, 20, 30, 40, 50, 60], [9, 4, 7, 5, 8, 6])
    res = replay(trace, server.url, scheduler="sjf", seed=1)
    got = by_index(trace, server.records)
    assert {i: r.body["priority"] for i, r in got.items()} == {i: int(trace.output_tokens[i]) for i in range(6)}
    assert (res.requests.status == "completed").all() and res.summary["scheduler"] == "sjf"


def test_prompts_differ_between_runs(fake):
    # a second replay of the same trace must not be servable from the first one's prefix cache
    trace = Trace.from_arrays([0.0], [40], [2])
    a = replay(trace, fake.url)
    b = replay(trace, fake.url)
    sa, sb = a.summary["prompt_salt"], b.summary["prompt_salt"]
    assert sa != sb
    assert [r.prompt for r in fake.records] == [tuple(prompt_token_ids(40, 0, sa)), tuple(prompt_token_ids(40, 0, sb))]


# Each misbehaving request is told apart by its prompt length.
MODES = {21: "http500", 22: "stall", 23: "truncate", 24: "chunk3", 25: "nousage",
         26: "abort", 27: "errchunk", 28: "stall0"}


@pytest.fixture(scope="module")
def bad_run(server):
    server.configure(modes=MODES)
    inputs = [10, 600, 21, 22, 23, 24, 25, 26, 27, 28, 11]
    outputs = [6, 8, 8, 8, 10, 10, 7, 8, 8, 8, 5]
    trace = Trace.from_arrays(np.linspace(0.0, 0.5, len(inputs)), inputs, outputs)
    # the stalled requests end only at the timeout; 6 s is 150x what a well-behaved one here takes
    # (about 40 ms), so a pause of a busy machine cannot turn a completed request into a timeout
    res = replay(trace, server.url, request_timeout_s=6.0, seed=3)
    return trace, res, list(server.records)


def test_replay_status_mapping(bad_run):
    trace, res, records = bad_run
    df = res.requests.set_index("input_tokens")
    assert len(records) == len(trace)
    expect = {10: "completed", 600: "rejected", 21: "error", 22: "timeout", 23: "truncated",
              24: "completed", 25: "completed", 26: "error", 27: "error", 28: "timeout", 11: "completed"}
    assert df.status.to_dict() == expect
    assert list(res.requests.columns) == REPLAY_COLUMNS

    rej = df.loc[600]       # 600 + 8 > max_model_len 512: HTTP 400, like the simulator's rejection
    assert rej.detail.startswith("HTTP 400") and "maximum context length" in rej.detail
    assert math.isnan(rej.first_token_s) and math.isnan(rej.finish_s) and rej.tokens_received == 0
    assert df.loc[21].detail.startswith("HTTP 500") and "internal failure" in df.loc[21].detail
    assert df.loc[27].detail == "engine died" and df.loc[27].tokens_received == 4
    assert df.loc[26].tokens_received == 4 and df.loc[26].detail

    stall = df.loc[22]      # got its first token, then nothing
    assert stall.detail == "not finished within 6 s" and stall.tokens_received == 1
    assert stall.ttft_s > 0 and math.isnan(stall.finish_s) and math.isnan(stall.e2e_s)
    assert df.loc[28].tokens_received == 0 and math.isnan(df.loc[28].first_token_s)

    trunc = df.loc[23]
    assert trunc.tokens_received == 5 < trunc.output_tokens
    assert "after 5 of 10 tokens" in trunc.detail and "'stop'" in trunc.detail
    assert trunc.ttft_s > 0 and math.isnan(trunc.finish_s) and math.isnan(trunc.tpot_s)

    for n_in in (24, 25, 10, 11):   # several tokens per chunk, or no usage: still counted exactly
        row = df.loc[n_in]
        assert row.tokens_received == row.output_tokens and row.detail == ""
        assert row.e2e_s >= row.ttft_s > 0 and row.tpot_s > 0


def test_replay_failure_counts(bad_run):
    trace, res, _ = bad_run
    s = res.summary
    assert (s["n_completed"], s["n_rejected"], s["n_error"], s["n_timeout"], s["n_truncated"]) == (4, 1, 3, 2, 1)
    assert s["n_unfinished"] == 6 and s["n_requests"] == len(trace)
    json.dumps(s, allow_nan=False)


def test_request_timeout_is_the_only_deadline(server, monkeypatch):
    # aiohttp gives every session a default total timeout (5 minutes); a request that takes
    # longer but stays within request_timeout_s must still complete. Shrink that default so
    # that a violation shows within a test's time.
    monkeypatch.setattr(aiohttp.client, "DEFAULT_TIMEOUT", aiohttp.ClientTimeout(total=0.1, sock_connect=30))
    server.configure(delay=0.01)
    trace = Trace.from_arrays([0.0, 0.01], [10, 12], [25, 25])
    # 60 s: far beyond the 0.25 s these take, so only the 0.1 s default could cut them short
    res = replay(trace, server.url, request_timeout_s=60.0)
    assert res.requests.status.tolist() == ["completed", "completed"], res.requests.detail.tolist()
    assert (res.requests.e2e_s > 0.2).all()


def test_replay_model_choice(fake):
    fake.models = [{"id": "first", "max_model_len": 4096}, {"id": "second", "max_model_len": 256},
                   {"id": "third"}]
    trace = Trace.from_arrays([0.0], [10], [3])
    res = replay(trace, fake.url + "/v1/", model="second")
    assert fake.records[0].body["model"] == "second"
    assert res.server.model == "second" and res.server.max_model_len == 256
    assert res.summary["model"] == "second" and res.requests.status.tolist() == ["completed"]


# --------------------------------------------------------------------------- bad endpoints


def tiny() -> Trace:
    return Trace.from_arrays([0.0, 0.1], [5, 6], [3, 3])


def test_unreachable_endpoint():
    port = closed_port()
    with pytest.raises(EndpointError, match=rf"cannot reach http://127\.0\.0\.1:{port}\b.*server running"):
        replay(tiny(), f"http://127.0.0.1:{port}")


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://127.0.0.1:8000", "http://", "", "not a url"])
def test_malformed_endpoint(url):
    with pytest.raises(EndpointError, match="expected an http.s. URL"):
        replay(tiny(), url)


@pytest.mark.parametrize("url,base", [
    ("http://h:1", "http://h:1"), ("http://h:1/", "http://h:1"), ("http://h:1/v1", "http://h:1"),
    ("https://h/v1/completions", "https://h"), (" http://h:1/v1/completions/ ", "http://h:1"),
])
def test_endpoint_forms(url, base):
    assert server_root(url) == base


def test_models_endpoint_failing(fake):
    fake.models_status = 500
    with pytest.raises(EndpointError, match=r"/v1/models: HTTP 500"):
        replay(tiny(), fake.url)
    assert fake.records == []


def test_models_endpoint_empty(fake):
    fake.models = []
    with pytest.raises(EndpointError, match="lists no model"):
        replay(tiny(), fake.url)
    assert fake.records == []


def test_model_not_served(fake):
    with pytest.raises(EndpointError, match=r"no model 'llama' \(served: fake\)"):
        replay(tiny(), fake.url, model="llama")
    assert fake.records == []


@pytest.mark.parametrize("kw,fragment", [
    (dict(request_timeout_s=0.0), "--request-timeout"), (dict(request_timeout_s=math.inf), "--request-timeout"),
    (dict(max_lag_s=0.0), "--max-lag"), (dict(token_range=(5, 5)), "token range"),
    (dict(load=0.5, time_scale=2.0), "not both"),
])
def test_bad_arguments(kw, fragment):
    with pytest.raises(SchedportError, match=fragment):
        replay(tiny(), "http://127.0.0.1:9", **kw)


# --------------------------------------------------------------------------- the command line


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def cli_here(monkeypatch, capsys, *args) -> Ran:
    """`schedport ...` through the console entry point, in this process (so against the fake
    server of this process, without a second interpreter's start-up). `_register` only adds the
    corpus/run/analyze commands, which `replay` does not need."""
    from schedport import cli as cli_mod

    monkeypatch.setattr(cli_mod, "_register", lambda: None)
    monkeypatch.setattr(sys, "argv", ["schedport", *map(str, args)])
    with pytest.raises(SystemExit) as e:
        cli_mod.main()
    got = capsys.readouterr()
    code = e.value.code
    return Ran(0 if code is None else code, got.out, got.err)


def one_line_error(p) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    # progress lines of a replay that ran for seconds may precede the error, as `run`'s do
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("replay: ")]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture
def cli_inputs(tmp_path):
    tr = tmp_path / "trace.csv"
    save_trace(Trace.from_arrays([0.0, 0.04, 0.08, 0.1, 0.15], [8, 9, 10, 11, 12], [4, 5, 6, 4, 5]), tr)
    eng = tmp_path / "engine.toml"
    eng.write_text("# the defaults of docs/engine.md\n")
    return tr, eng


def test_cli_replay_unreachable(cli_inputs, tmp_path):
    # a real `schedport` process: exit code 2, one `error:` line, no traceback
    tr, eng = cli_inputs
    port = closed_port()
    out = tmp_path / "out"
    msg = one_line_error(cli("replay", "--endpoint", f"http://127.0.0.1:{port}", "--trace", tr,
                             "--engine", eng, "--out", out))
    assert f"cannot reach http://127.0.0.1:{port}" in msg
    assert not out.exists()


@pytest.mark.parametrize("endpoint,extra,fragment", [
    ("127.0.0.1:8000", [], "expected an http(s) URL"),
    ("http://127.0.0.1:9", ["--scheduler", "srpt"], "cannot be replayed"),
    ("http://127.0.0.1:9", ["--request-timeout", "0"], "--request-timeout"),
])
def test_cli_replay_bad_arguments(monkeypatch, capsys, cli_inputs, tmp_path, endpoint, extra, fragment):
    tr, eng = cli_inputs
    out = tmp_path / "out"
    msg = one_line_error(cli_here(monkeypatch, capsys, "replay", "--endpoint", endpoint, "--trace", tr,
                                  "--engine", eng, "--out", out, *extra))
    assert fragment in msg and not out.exists()


def read_back(out: Path, n: int) -> tuple[pd.DataFrame, dict]:
    df = pd.read_parquet(out / "requests.parquet")
    assert list(df.columns) == REPLAY_COLUMNS and len(df) == n
    s = json.loads((out / "summary.json").read_text())
    assert s["n_requests"] == n
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []   # no temporaries left
    return df, s


def test_cli_replay_writes_both_files(fake, monkeypatch, capsys, cli_inputs, tmp_path):
    tr, eng = cli_inputs
    out = tmp_path / "out"
    p = cli_here(monkeypatch, capsys, "replay", "--endpoint", fake.url, "--trace", tr, "--engine", eng,
                 "--out", out, "--scheduler", "spf", "--max-lag", "60")  # a bound no stall reaches: the lag check has its own test below
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "spf on fake: 5/5 completed" in " ".join(p.stdout.split())   # rich wraps at 80 columns
    df, s = read_back(out, 5)
    assert (df.status == "completed").all() and df.tokens_received.tolist() == [4, 5, 6, 4, 5]
    assert df.input_tokens.tolist() == [8, 9, 10, 11, 12] and df.detail.tolist() == [""] * 5
    assert s["client_lag_ok"] is True and s["scheduler"] == "spf" and s["n_completed"] == 5
    assert sorted(r.body["priority"] for r in fake.records) == [8, 9, 10, 11, 12]


def test_cli_replay_lag_over_bound_still_writes(fake, monkeypatch, capsys, cli_inputs, tmp_path):
    tr, eng = cli_inputs
    out = tmp_path / "out"
    p = cli_here(monkeypatch, capsys, "replay", "--endpoint", fake.url, "--trace", tr, "--engine", eng,
                 "--out", out, "--max-lag", "1e-9")
    msg = one_line_error(p)
    assert "send lag p99" in msg and "--max-lag" in msg
    df, s = read_back(out, 5)
    assert s["client_lag_ok"] is False and s["max_lag_s"] == 1e-9
    assert (df.status == "completed").all()


def test_run_over_the_lag_bound_is_replayed_then_reported(fake):
    # an impossible bound: every attempt is over it, so all retries are used and the last is returned
    trace = Trace.from_arrays([0.0, 0.05], [30, 31], [2, 2])
    said = []
    res = replay(trace, fake.url, max_lag_s=1e-9, retries=2, log=said.append)
    assert res.summary["attempts"] == 3 and res.lag_ok is False
    assert len(fake.records) == 6 and len({r.prompt for r in fake.records}) == 6   # fresh prompts each time
    assert len(said) == 2 and all("replaying again" in s for s in said)
    # within the bound, one attempt
    fake.records.clear()
    ok = replay(trace, fake.url, retries=2)
    assert ok.summary["attempts"] == 1 and len(fake.records) == 2


def test_speed_index_is_measured_over_modelled_ttft_of_a_lone_prompt(fake, tmp_path):
    from schedport.realengine.calibrate import speed_index

    fake.configure(delay=0.05)
    engine = engine_toml(tmp_path, '[engine]\nmax_model_len = 512\nmax_num_batched_tokens = 512\n'
                                   '[latency]\nmodel = "linear"\na = 0.01\nb = 0\nc = 0\nd = 0\n')
    idx = speed_index(fake.url, engine, prompt_tokens=256, n=3)
    # the fake server answers after 50 ms (+ loopback HTTP) where the engine prices 10 ms: at
    # least 5 (a sleep never returns early), whatever the machine adds
    assert idx >= 5.0 * 0.999
    assert [len(r.body["prompt"]) for r in fake.records] == [256, 256, 256]
    assert all(r.body["max_tokens"] == 1 for r in fake.records)
    assert len({r.prompt for r in fake.records}) == 3      # fresh prompts: no prefix-cache shortcut
    # it is the measured time over the modelled one: a server 10x slower gives at least 50,
    # which the faster one could only reach if its median answer took 9x its sleep in transit
    fake.configure(delay=0.5)
    assert speed_index(fake.url, engine, prompt_tokens=256, n=3) >= 50.0 * 0.999 > idx
    with pytest.raises(SchedportError, match="cannot reach"):
        speed_index(f"http://127.0.0.1:{closed_port()}", engine)


# --------------------------------------------------------------------------- failures are loud


def test_cli_replay_against_a_server_that_fails_every_request_exits_nonzero(fake, monkeypatch, capsys,
                                                                             cli_inputs, tmp_path):
    tr, eng = cli_inputs
    fake.configure(all_status=501)
    out = tmp_path / "out"
    p = cli_here(monkeypatch, capsys, "replay", "--endpoint", fake.url, "--trace", tr, "--engine", eng,
                 "--out", out)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    last = [ln for ln in p.stderr.splitlines() if ln.strip()][-1]
    assert last.startswith("error: ") and "0 of 5 requests completed and 5 failed" in last and "HTTP 501" in last
    df, s = read_back(out, 5)          # the measurements are still written, for a look
    assert s["n_completed"] == 0


def test_cli_replay_models_list_that_is_not_a_list_is_one_line(fake, monkeypatch, capsys, cli_inputs, tmp_path):
    tr, eng = cli_inputs
    fake.configure(models="notalist")
    p = cli_here(monkeypatch, capsys, "replay", "--endpoint", fake.url, "--trace", tr, "--engine", eng,
                 "--out", tmp_path / "out")
    assert "not an OpenAI model list" in one_line_error(p)


def test_cli_replay_reports_progress_on_long_runs(fake, monkeypatch, capsys, cli_inputs, tmp_path):
    from schedport import cli as cli_mod

    tr, eng = cli_inputs
    monkeypatch.setattr(cli_mod._StepProgress, "FIRST_S", 0.0)
    monkeypatch.setattr(cli_mod._StepProgress, "EVERY_S", 0.0)
    p = cli_here(monkeypatch, capsys, "replay", "--endpoint", fake.url, "--trace", tr, "--engine", eng,
                 "--out", tmp_path / "out", "--max-lag", "60")
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("replay: ")]
    assert lines and lines[-1].startswith("replay: 5/5 requests finished"), p.stderr


def test_replay_sends_a_warm_up_but_measures_only_the_window(fake):
    """A trace's warm-up (docs/corpus.md, "Warm caches") is sent like every request, flagged in the
    table, and left out of the summary, as `simulate` leaves it out."""
    base = clean_trace()
    warm = Trace.from_arrays(base.arrival_s, base.input_tokens, base.output_tokens, warmup=3)
    res = replay(warm, fake.url, engine=load_engine_config(None), seed=7, max_lag_s=60.0)
    assert len(fake.records) == len(warm)                     # the warm-up reached the server
    df = res.requests
    assert df["warmup"].tolist() == [True] * 3 + [False] * (len(warm) - 3)
    s = res.summary
    assert s["n_requests"] == s["n_completed"] == len(warm) - 3
    m = df[~df["warmup"]]
    assert s["ttft_mean_s"] == pytest.approx(m["ttft_s"].mean(), rel=1e-12)
    assert s["horizon_s"] == pytest.approx(1.5 * warm.measured().span_s, rel=1e-12)
