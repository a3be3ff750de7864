"""The requests that measure a server: timed streams, held slots, and the `Prober` that sends them."""

from __future__ import annotations

import asyncio
import secrets
import time

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
        work per token (see `running_cap.look_at_running_cap`)."""
        body = self.body(n_in, n_out)
        body["stream"] = False
        body.pop("stream_options", None)       # vLLM refuses stream options without a stream
        return body


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
