"""The running-sequence look of `calibrate` against a fake server that accumulates vLLM's histograms.

Why it exists: with two busy loops on the 2 cores, vLLM's API server answered every probe of the
look but only 1 of 5 ``/metrics`` polls in 207 s while they ran, so a look that watched the
``num_requests_running`` gauge during the load saw nothing. The look now reads what the server
accumulated (the queue-time histogram, engine steps, generated tokens), once before the burst and
once after it. The fake's engine steps on a clock and refuses /metrics while it has work (the
starved server), and records each finished request's queue and inference times as vLLM does.
"""

from __future__ import annotations

import asyncio
import math
import time

import aiohttp
import pytest
from aiohttp import web

from schedport.realengine.calibration.limits import Limits
from schedport.realengine.calibration.probes import Prober
from schedport.realengine.calibration.prometheus import parse_prometheus
from schedport.realengine.calibration.running_cap import (Accumulated, accumulated, hold_tokens, observe_max_num_seqs,
                                                          read_cap)
from schedport.realengine.replay import EndpointError, ServerInfo, client_connector
from test_replay import FakeServer, Received

CAP = 8
#: vLLM 0.32's buckets of its request-phase histograms (queue, inference, ...)
QUEUE_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)


class _Request:
    def __init__(self, n_out: int, now: float) -> None:
        self.n_out, self.done, self.queued_at = n_out, 0, now
        self.admitted_at = math.nan
        self.answered = asyncio.Event()


class AccumulatingServer(FakeServer):
    """`FakeServer` plus unstreamed completions run by a tiny engine that steps every `step_s`:
    first come, first admitted into `cap` slots, one token per running request per step, and a
    ``/metrics`` with vLLM's accumulated request queue / inference times, engine-step count and
    generated tokens. `busy_metrics`: /metrics answers HTTP 503 while any request is in the server
    (a starved API server). `intake_s`: the front end passes one arrived request to the engine per
    that many seconds. `preempt`: the engine reports preemptions. `refuse`: every completion
    gets HTTP 400. `refuse_idle`: that many /metrics requests made while it is idle are refused too.
    """

    def __init__(self, *, cap: int = CAP, step_s: float = 0.002, busy_metrics: bool = True,
                 intake_s: float = 0.0, preempt: bool = False, refuse: bool = False, refuse_idle: int = 0) -> None:
        super().__init__()
        self.cap, self.step_s, self.busy_metrics, self.intake_s = cap, step_s, busy_metrics, intake_s
        self.preempt, self.refuse, self.refuse_idle = preempt, refuse, refuse_idle
        self.front: list[_Request] = []
        self.waiting: list[_Request] = []
        self.running: list[_Request] = []
        self.queue_times: list[float] = []
        self.inference_s = 0.0
        self.steps = self.generated = 0
        self.metrics_refused = 0
        self.max_model_len = 512
        self.engine_task = None

    def _routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._held_completions)

    async def _engine(self) -> None:
        last_intake = 0.0
        while True:
            await asyncio.sleep(self.step_s)
            now = time.perf_counter()
            if self.front and now - last_intake >= self.intake_s:
                self.waiting.append(self.front.pop(0))
                self.waiting[-1].queued_at, last_intake = now, now
                if not self.intake_s:
                    self.waiting += self.front
                    for r in self.front:
                        r.queued_at = now
                    self.front.clear()
            while self.waiting and len(self.running) < self.cap:
                r = self.waiting.pop(0)
                r.admitted_at = now
                self.queue_times.append(now - r.queued_at)
                self.running.append(r)
            if not self.running:
                continue
            self.steps += 1
            for r in list(self.running):
                r.done += 1
                self.generated += 1
                if r.done >= r.n_out:
                    self.running.remove(r)
                    self.inference_s += now - r.admitted_at
                    r.answered.set()

    @property
    def active(self) -> int:
        return len(self.front) + len(self.waiting) + len(self.running)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.busy_metrics and self.active:
            self.metrics_refused += 1
            return web.Response(status=503, text="busy")
        if self.refuse_idle > 0:
            self.refuse_idle -= 1
            return web.Response(status=503, text="still busy")
        done = len(self.queue_times)
        lines = [f'vllm:num_requests_running{{model_name="fake"}} {float(len(self.running))}',
                 f'vllm:num_requests_waiting{{model_name="fake"}} {float(len(self.waiting))}',
                 f'vllm:num_preemptions_total{{model_name="fake"}} {float(self.preempt * done)}',
                 f'vllm:generation_tokens_total{{model_name="fake"}} {float(self.generated)}',
                 f'vllm:iteration_tokens_total_count{{model_name="fake"}} {float(self.steps)}',
                 f'vllm:request_inference_time_seconds_sum{{model_name="fake"}} {self.inference_s}',
                 f'vllm:request_inference_time_seconds_count{{model_name="fake"}} {float(done)}']
        for b in QUEUE_BOUNDS:
            within = sum(q <= b for q in self.queue_times)
            lines.append(f'vllm:request_queue_time_seconds_bucket{{le="{b}",model_name="fake"}} {float(within)}')
        lines += [f'vllm:request_queue_time_seconds_bucket{{le="+Inf",model_name="fake"}} {float(done)}',
                  f'vllm:request_queue_time_seconds_count{{model_name="fake"}} {float(done)}',
                  f'vllm:request_queue_time_seconds_sum{{model_name="fake"}} {sum(self.queue_times)}']
        return web.Response(text="\n".join(lines) + "\n")

    async def _held_completions(self, request: web.Request) -> web.StreamResponse:
        if self.refuse:
            return web.json_response({"object": "error", "message": "no"}, status=400)
        if self.engine_task is None:
            self.engine_task = asyncio.create_task(self._engine())
        body = await request.json()
        self.records.append(Received(time.perf_counter(), body))
        req = _Request(int(body["max_tokens"]), time.perf_counter())
        self.front.append(req)
        await req.answered.wait()
        return web.json_response({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})


@pytest.fixture
def serve():
    started = []

    def start(**kw) -> AccumulatingServer:
        s = AccumulatingServer(**kw)
        s.start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def _observe(server: AccumulatingServer, timeout_s: float = 60.0, logs: list | None = None) -> Limits:
    async def run():
        async with aiohttp.ClientSession(connector=client_connector(), timeout=aiohttp.ClientTimeout()) as session:
            prober = Prober(session, server.url, ServerInfo("fake", 512), (1000, 2000), lambda m: None, timeout_s)
            lim = Limits({})
            lim.put("max_model_len", 512, "test")
            log = (lambda m: logs.append(m)) if logs is not None else (lambda m: None)
            await observe_max_num_seqs(lim, prober, samples=[], base=server.url, log=log)
            return lim

    return asyncio.run(run())


def test_the_cap_is_read_although_metrics_never_answer_during_the_load(serve):
    """The starved server: /metrics refused while the probes run, answered before and after. The
    cap is read off what it accumulated: 8 of 16 probes admitted at once, 8 waited a lifetime."""
    server = serve(busy_metrics=True)
    logs = []
    lim = _observe(server, logs=logs)
    assert lim.limits["max_num_seqs"] == CAP, logs
    assert lim.sources["max_num_seqs"] == "observed: 8 of 16 probes admitted at once, the rest waited"
    assert server.metrics_refused == 0, "the look polled /metrics while its probes ran"
    assert server.active == 0 and len(server.records) == 16


def test_a_reading_the_server_answers_late_is_waited_for(serve):
    """Right after the load, a starved server may still refuse /metrics: the look asks again (for
    as long as a probe may take) instead of giving up on its only reading."""
    server = serve(refuse_idle=3)
    lim = _observe(server)
    assert lim.limits["max_num_seqs"] == CAP and server.refuse_idle == 0


def test_the_probes_cost_the_client_nothing_per_token(serve):
    """The probes hold the server's slots without streaming, from a one-token prompt, so no token
    is written to the client and a step's tokens are the requests running in it."""
    server = serve()
    _observe(server)
    assert all(r.body.get("stream") is False and "stream_options" not in r.body for r in server.records)
    assert all(len(r.body["prompt"]) == 1 and r.body["ignore_eos"] for r in server.records)
    assert len({r.body["prompt"][0] for r in server.records}) > 1


def test_a_burst_no_probe_waited_in_is_followed_by_a_larger_one(serve):
    """A cap of 20: all 16 probes of the first burst run at once (none waits), so 64 follow, of
    which 20 are admitted at once."""
    server = serve(cap=20)
    logs = []
    lim = _observe(server, logs=logs)
    assert lim.limits["max_num_seqs"] == 20, logs
    assert len(server.records) == 16 + 64 and "none of 16 waited" in logs[0], logs


@pytest.mark.parametrize("case", ["probes refused", "probes preempted"])
def test_a_cap_it_cannot_read_is_one_line_saying_what_was_seen(serve, case):
    """Refused probes, or probes the KV cache preempted: one line with how the probes ended and
    what the server accumulated, naming --max-num-seqs."""
    server = serve(refuse=True) if case == "probes refused" else serve(preempt=True)
    with pytest.raises(EndpointError) as e:
        _observe(server)
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith("give --max-num-seqs"), msg
    assert "16 probes sent (" in msg, msg
    if case == "probes refused":
        assert "16 failed (first: " in msg and "HTTP 400" in msg, msg
    else:
        assert "preempted" in msg and "16 answered" in msg, msg


def test_a_probe_never_answered_ends_the_look_at_the_request_timeout(serve):
    """A server that takes probes in but never runs them: the look gives up after the request
    timeout (1 s here), not later, with one line."""
    server = serve(cap=0)
    t = time.perf_counter()
    with pytest.raises(EndpointError, match=r"not every probe was answered within 1 s \(--request-timeout\)"):
        _observe(server, timeout_s=1.0)
    assert time.perf_counter() - t < 10.0


def _acc(**kw) -> Accumulated:
    base = dict(finished=16, queued_within={0.3: 8, 0.5: 8, 0.8: 8, 1.0: 8, 1.5: 8, 2.0: 16},
                lifetime_s=2.7, steps=1025, generated=8192, preempted=0)
    base.update(kw)
    return Accumulated(**base)


def test_read_cap_on_what_a_real_server_accumulated():
    """The difference vLLM 0.32 (tiny model, 2 cores, max_num_seqs 8) accumulated over 16 probes of
    512 tokens: 8 queued under 0.3 s, 8 between 2 and 5 s; 1,025 steps for 8,192 tokens."""
    reading = read_cap(16, _acc())
    assert reading.cap == 8 and reading.at_least is None, reading
    assert read_cap(16, _acc(queued_within={0.3: 16, 0.5: 16}, steps=520)).at_least == 16


@pytest.mark.parametrize("kw, words", [
    (dict(finished=17), "other requests ran"),
    (dict(preempted=3), "preempted"),
    (dict(lifetime_s=0.4), "lived too short"),
    (dict(generated=16 * 512, steps=600), "yet more ran per step"),
    (dict(queued_within={0.3: 16, 1.0: 16}, steps=8000), "never more than a few ran at once"),
])
def test_read_cap_refuses_what_does_not_show_a_cap(kw, words):
    """Each reading that a cap does not explain is refused with what was seen."""
    reading = read_cap(16, _acc(**kw))
    assert reading.cap is None and reading.at_least is None and words in reading.why, reading


def test_accumulated_is_after_minus_before_and_none_without_the_histograms():
    before = parse_prometheus('vllm:request_queue_time_seconds_bucket{le="0.3",engine="0"} 5\n'
                              'vllm:request_queue_time_seconds_count{engine="0"} 5\n'
                              'vllm:request_inference_time_seconds_sum{engine="0"} 10\n'
                              'vllm:iteration_tokens_total_count{engine="0"} 100\n'
                              'vllm:generation_tokens_total{engine="0"} 400\n')
    after = parse_prometheus('vllm:request_queue_time_seconds_bucket{le="0.3",engine="0"} 9\n'
                             'vllm:request_queue_time_seconds_bucket{le="+Inf",engine="0"} 21\n'
                             'vllm:request_queue_time_seconds_count{engine="0"} 21\n'
                             'vllm:request_inference_time_seconds_sum{engine="0"} 42\n'
                             'vllm:iteration_tokens_total_count{engine="0"} 300\n'
                             'vllm:generation_tokens_total{engine="0"} 1400\n'
                             'vllm:num_preemptions_total{engine="0"} 0\n')
    acc = accumulated(before, after)
    assert acc == Accumulated(16, {0.3: 4}, 2.0, 200, 1000, 0), acc
    assert accumulated(before, parse_prometheus('vllm:num_requests_running 0\n')) is None
    assert "/metrics has no vllm:request_queue_time_seconds" in read_cap(16, None).why


def test_hold_tokens_fit_the_model_and_the_kv_cache():
    lim = Limits({})
    for key, value in (("max_model_len", 2048), ("block_size", 16), ("num_gpu_blocks", 1024)):
        lim.put(key, value, "test")
    assert hold_tokens(lim, 16) == 512                    # 64 blocks each: room for 1,024 tokens
    assert hold_tokens(lim, 256) == 4 * 16 - 2            # 4 blocks each
    lim.put("max_model_len", 100, "test")
    assert hold_tokens(lim, 16) == 98
