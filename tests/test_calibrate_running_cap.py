"""The running-sequence look of `calibrate` against a fake server with vLLM's queue gauges.

Why it exists: with two busy loops on the 2 cores, `calibrate` against the real vLLM CPU server
failed with "only 0 of 64 probe requests reached the server" while the server's own log said 8
running and 53 waiting. The probes streamed one chunk per token, thousands a second, which the
starved client could not read; its /metrics poll, on the same event loop, timed out behind them,
and one unanswered poll ended the look having seen nothing. The fake reproduces that without a
busy machine: it answers the first polls late (past the poll timeout) or not at all, and it
notices a cancelled request only a while after the client went away, as vLLM does.
"""

from __future__ import annotations

import asyncio
import math
import time

import aiohttp
import pytest
from aiohttp import web

from schedport.realengine.calibration.limits import Limits as _Limits
from schedport.realengine.calibration.probes import Prober as _Prober
from schedport.realengine.calibration.running_cap import observe_max_num_seqs as _observe_max_num_seqs
from schedport.realengine.replay import EndpointError, ServerInfo, client_connector
from test_replay import FakeServer, Received

CAP = 4


class GaugedServer(FakeServer):
    """`FakeServer` (vLLM-like streaming completions) plus a ``/metrics`` with
    ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``, and unstreamed completions
    run by a tiny engine: first come, first admitted into `cap` slots, the rest waiting.

    The engine steps once per /metrics request, so what the gauges show depends on the polls,
    not on the clock: a running request is answered `finish_after` steps after its admission
    (0: never; it is held until the client cancels it); `intake` > 0: the front end passes at
    most that many arrived requests to the engine per step (the others are in neither gauge, as
    in vLLM before the engine core has them). `bad_polls`: that many first /metrics
    polls are answered ``"503"`` (HTTP 503) or ``"late"`` (after `late_s`, past the client's poll
    timeout). `abort_s`: a cancelled request leaves the gauges that long after the client went
    away. `refuse`: every completion gets HTTP 400.
    """

    def __init__(self, *, cap: int = CAP, bad_polls: int = 0, bad: str = "503", late_s: float = 2.0,
                 abort_s: float = 1.0, finish_after: int = 0, intake: int = 0, refuse: bool = False) -> None:
        super().__init__()
        self.cap, self.bad_polls, self.bad, self.late_s = cap, bad_polls, bad, late_s
        self.abort_s, self.finish_after, self.intake, self.refuse = abort_s, finish_after, intake, refuse
        self.front: list[asyncio.Event] = []              # arrived, not yet with the engine
        self.running: dict[asyncio.Event, int] = {}     # request -> step it was admitted at
        self.waiting: list[asyncio.Event] = []
        self.steps = 0
        self.metrics_hits = 0     # /metrics requests received, answered or not
        self.max_model_len = 512

    @property
    def active(self) -> int:
        """Requests the gauges count."""
        return len(self.running) + len(self.waiting) + len(self.front)

    def _routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._gauged_completions)

    def _schedule(self, step: bool = False) -> None:
        if step or not self.intake:
            k = len(self.front) if not self.intake else self.intake
            self.waiting += self.front[:k]
            del self.front[:k]
        if self.finish_after:
            for req, at in list(self.running.items()):
                if self.steps - at >= self.finish_after:
                    del self.running[req]
                    req.set()
        while self.waiting and len(self.running) < self.cap:
            self.running[self.waiting.pop(0)] = self.steps

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics_hits += 1
        self.steps += 1
        self._schedule(step=True)
        if self.metrics_hits <= self.bad_polls:
            if self.bad == "503":
                return web.Response(status=503, text="busy")
            await asyncio.sleep(self.late_s)
        text = (f'vllm:num_requests_running{{engine="0",model_name="fake"}} {float(len(self.running))}\n'
                f'vllm:num_requests_waiting{{engine="0",model_name="fake"}} {float(len(self.waiting))}\n')
        return web.Response(text=text)

    async def _gauged_completions(self, request: web.Request) -> web.StreamResponse:
        if self.refuse:
            return web.json_response({"object": "error", "message": "no"}, status=400)
        body = await request.json()
        if body.get("stream"):
            return await self._completions(request)
        self.records.append(Received(time.perf_counter(), body))
        req = asyncio.Event()
        self.front.append(req)
        self._schedule()
        try:
            await req.wait()
            return web.json_response({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        except asyncio.CancelledError:
            # the gauges drop a cancelled request only once the server has noticed and aborted it
            self.loop.call_later(self.abort_s, self._abort, req)
            raise

    def _abort(self, req: asyncio.Event) -> None:
        self.running.pop(req, None)
        for queue in (self.waiting, self.front):
            if req in queue:
                queue.remove(req)
        self._schedule()


async def _look(server: GaugedServer, n: int, deadline_s: float, metrics_timeout_s: float = 0.2):
    async with aiohttp.ClientSession(connector=client_connector(), timeout=aiohttp.ClientTimeout()) as session:
        prober = _Prober(session, server.url, ServerInfo("fake", 512), (1000, 2000), lambda m: None, 30.0)
        prober.metrics_timeout_s = metrics_timeout_s
        return await prober.running_plateau(n, deadline_s=deadline_s)


@pytest.fixture
def serve():
    started = []

    def start(**kw) -> GaugedServer:
        s = GaugedServer(**kw)
        s.start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


@pytest.mark.parametrize("bad", ["503", "late"])
def test_unanswered_polls_do_not_end_the_look(serve, bad):
    """The first /metrics polls fail (HTTP 503) or answer past the poll timeout, as a starved
    client's did: the look polls on and finds the cap with a queue behind it."""
    server = serve(bad_polls=3, bad=bad)
    look = asyncio.run(_look(server, n=16, deadline_s=60.0))
    assert (look.best, look.waited, look.seen) == (CAP, True, 16), look
    assert server.metrics_hits > 3 + 10 and look.polls > look.polls_answered > 0, look
    assert look.failed == 0 and look.first_error is None


def test_the_probes_cost_the_client_nothing_per_token(serve):
    """The probes hold the server's slots without streaming: no token is written to them, so
    the client has nothing to read however fast the server decodes."""
    server = serve()
    look = asyncio.run(_look(server, n=16, deadline_s=60.0))
    assert look.best == CAP and len(server.records) == 16
    assert all(r.body.get("stream") is False and "stream_options" not in r.body for r in server.records)
    assert all(math.isnan(r.first_sent) for r in server.records)


def test_the_look_returns_once_the_server_reports_its_probes_gone(serve):
    """The server drops a cancelled probe from its gauges a second after the client left (vLLM
    aborts it in the engine later): the look waits for that, so the next probes find it empty."""
    server = serve(abort_s=1.0)
    look = asyncio.run(_look(server, n=16, deadline_s=60.0))
    assert look.best == CAP and look.left == 0
    assert server.active == 0


def test_the_look_ends_at_a_plateau_with_a_queue_while_probes_are_answered(serve):
    """Probes can end during the look (a starved front end passed the 64th on after the first
    eight had generated all their tokens): the look ends at the plateau with its queue behind
    it, not once every probe has been answered (the last of them need 32 engine steps here)."""
    server = serve(finish_after=8, intake=1)
    look = asyncio.run(_look(server, n=16, deadline_s=60.0))
    assert (look.best, look.waited) == (CAP, True), look
    assert look.finished < 16 and look.failed == 0, look


@pytest.mark.parametrize("case", ["metrics never answer", "probes refused"])
def test_a_cap_it_cannot_see_is_one_line_saying_what_was_seen(serve, case):
    """With --request-timeout 1, both looks end within it; the error says how many probes were
    sent and how they ended, how many polls were answered and what the gauges showed."""
    server = serve(bad_polls=10**9) if case == "metrics never answer" else serve(refuse=True)

    async def run():
        async with aiohttp.ClientSession(connector=client_connector(), timeout=aiohttp.ClientTimeout()) as session:
            prober = _Prober(session, server.url, ServerInfo("fake", 512), (1000, 2000), lambda m: None, 1.0)
            await _observe_max_num_seqs(_Limits({}), prober, samples=[], base=server.url, log=lambda m: None)

    with pytest.raises(EndpointError) as e:
        asyncio.run(run())
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith("give --max-num-seqs"), msg
    assert "up to 1 s (--request-timeout): neither" in msg and "; 64 probes sent (" in msg, msg
    if case == "metrics never answer":
        assert "/metrics answered 0 of" in msg and "0 failed" in msg, msg
    else:
        assert "64 failed (first: " in msg and "HTTP 400" in msg and "at most 0 running" in msg, msg


def test_a_server_that_never_queues_gives_no_cap(serve):
    """The front end hands the engine one probe per step and each is answered two steps after
    its admission: never more than 2 of the 4 slots run, nothing waits, yet all 16 are taken in
    and answered. The look ends once all are in, but a plateau without a queue and without all
    16 in the server at once is no cap: one line says so instead of writing max_num_seqs = 2."""
    server = serve(finish_after=2, intake=1)

    async def run():
        async with aiohttp.ClientSession(connector=client_connector(), timeout=aiohttp.ClientTimeout()) as session:
            prober = _Prober(session, server.url, ServerInfo("fake", 512), (1000, 2000), lambda m: None, 60.0)
            lim = _Limits({})
            await _observe_max_num_seqs(lim, prober, samples=[], base=server.url, log=lambda m: None)
            return lim

    with pytest.raises(EndpointError, match=r"could not be observed.*at most [12] running, 0 waiting"):
        asyncio.run(run())
