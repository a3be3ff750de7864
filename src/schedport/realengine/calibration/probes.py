"""The requests that measure a server: timed streams, held slots, and the `Prober` that sends them."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass

import numpy as np

from schedport.realengine.calibration.prometheus import fetch_metrics, metric
from schedport.realengine.replay import (EndpointError, ServerInfo, StreamTimer, completion_body, need_aiohttp,
                                         prompt_token_ids)

#: A decoding stream's token counts as emitted by an injected prompt's step when it arrived no
#: earlier than this before the prompt's first token (the server writes one step's outputs to
#: the streams one after another).
MIXED_SLACK_S = 0.002

#: The longest one probe request may take by default (`calibrate --request-timeout`).
DEFAULT_REQUEST_TIMEOUT_S = 300.0


async def stream_request(session, url: str, body: dict, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> StreamTimer:
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


class Prober:
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
        t = await stream_request(self.session, self.url, self.body(n_in, 1), self.timeout_s)
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
        tasks = [asyncio.create_task(stream_times(self.session, self.url, self.body(context, n_out),
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
                timer = await stream_request(self.session, self.url, self.body(prompt, 1), self.timeout_s)
                firsts.append(sent + timer.first_s)
            done_at = time.perf_counter() - t0
            return list(await asyncio.gather(*tasks)), done_at, firsts
        finally:
            for t in tasks:
                t.cancel()

    async def _batch(self, batch: int, context: int, n_out: int) -> list[np.ndarray]:
        return await asyncio.gather(*[stream_times(self.session, self.url, self.body(context, n_out),
                                                    timeout_s=self.timeout_s) for _ in range(batch)])

    async def _itl(self) -> tuple[float, float] | None:
        """(sum, count) of the server's inter-token latency histogram, None without metrics."""
        await asyncio.sleep(0.2)          # let the server record the last outputs
        samples = await fetch_metrics(self.session, self.base, self.timeout_s)
        if samples is None:
            return None
        total = metric(samples, "vllm:inter_token_latency_seconds_sum")
        count = metric(samples, "vllm:inter_token_latency_seconds_count")
        return None if total is None or count is None else (total, count)

    def hold_body(self, n_in: int, n_out: int) -> dict:
        """A request that only occupies a slot of the server: not streamed, so the client does no
        work per token (see `running_plateau`)."""
        body = self.body(n_in, n_out)
        body["stream"] = False
        body.pop("stream_options", None)       # vLLM refuses stream options without a stream
        return body

    async def running_plateau(self, n: int, metrics_poll_s: float = 0.05,
                              deadline_s: float = 20.0) -> "Plateau":
        """Start `n` long small requests and watch the server's gauges until the running count
        has plateaued, with a queue behind it or with all `n` taken in (or `deadline_s` has
        passed, or every probe has ended); then cancel them and wait until the server reports
        them gone. The cap is the plateau only where a queue persisted behind it, or where all
        `n` were in the server at once (`observe_max_num_seqs`).

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
        out is counted (`Plateau.polls`) and the look goes on polling until its deadline.
        """
        n_out = max(1, min(4000, (self.info.max_model_len or 4096) - 9))
        look = Plateau(n)
        before = await fetch_metrics(self.session, self.base, self.metrics_timeout_s)
        idle = None if before is None else in_server(before)     # what others run meanwhile
        t_start = time.perf_counter()

        async def hold(body: dict) -> None:
            try:
                await hold_request(self.session, self.url, body)
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
                run = int(metric(s, "vllm:num_requests_running") or 0)
                wait = int(metric(s, "vllm:num_requests_waiting") or 0)
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

    async def _poll(self, look: "Plateau") -> list | None:
        """One /metrics poll of a look, counted in `look` (answered or not)."""
        look.polls += 1
        s = await fetch_metrics(self.session, self.base, self.metrics_timeout_s)
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
            s = await fetch_metrics(self.session, self.base, self.metrics_timeout_s)
            if s is not None:
                left = max(0, in_server(s) - idle)
                if left == 0:
                    return 0
            if time.perf_counter() >= deadline:
                return left
            await asyncio.sleep(max(poll_s, 0.05))


def in_server(samples) -> int:
    """Requests running + waiting by the server's gauges."""
    return int((metric(samples, "vllm:num_requests_running") or 0)
               + (metric(samples, "vllm:num_requests_waiting") or 0))


@dataclass
class Plateau:
    """What one look at the running-sequence cap saw (`Prober.running_plateau`)."""

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


async def hold_request(session, url: str, body: dict) -> None:
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


async def stream_times(session, url: str, body: dict, started: asyncio.Event | None = None,
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
