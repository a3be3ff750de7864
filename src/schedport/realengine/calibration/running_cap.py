"""The running-sequence cap (``max_num_seqs``) of a server, read from what it accumulated under a burst.

How: `n` requests of a one-token prompt and `HOLD_TOKENS` output tokens each (EOS ignored, not
streamed) are sent at once and waited for; the server's ``/metrics`` is read once before the
burst and once after it has been answered, and only the difference is used. Nothing is polled
while the burst runs: on a starved machine vLLM's API server answered every probe but only 1 of
5 ``/metrics`` polls in 207 s during the load (it did answer once the load was over).

What vLLM (v1; 0.32's Prometheus export) accumulates, and what it tells:
- ``vllm:request_queue_time_seconds``, a histogram observed once per finished request: the time
  from the engine core queueing it to first scheduling it. Measured inside the engine, it does
  not depend on how slowly the API server passes requests on. A probe admitted at once waits at
  most a step; a probe the cap kept out waits until a running one finishes, about a probe's whole
  lifetime. So the probes under a bucket bound well below that lifetime were admitted at once,
  and when some probes waited, their number is the cap.
- ``vllm:request_inference_time_seconds``: its mean is that lifetime (admission to last token),
  which picks the bucket bound (`split_bound`: the largest at most half of it).
- ``vllm:generation_tokens`` over ``vllm:iteration_tokens_total``'s count (engine steps that
  emitted tokens, one observation per step): the mean number of requests decoding per step. No
  step runs more than the cap, so a count above it refutes the reading.
- ``vllm:num_preemptions``: a preempted probe ran out of KV cache, not into the cap.

The reading is exact when every probe reaches the engine before the first probe finishes (the
probes are long for that; a probe arriving later to a free slot would be counted as admitted at
once). When none waited, the cap is at least what ran at once: a larger burst follows (16, 64,
256, 1,024 probes). A cap it cannot read is one line saying what the server accumulated.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from schedport.realengine.calibration.limits import Limits
from schedport.realengine.calibration.probes import Prober, hold_request
from schedport.realengine.calibration.prometheus import fetch_metrics, metric
from schedport.realengine.replay import EndpointError

#: Output tokens of each probe of the look: long enough that every probe is in the server before
#: the first one ends (a tiny model on 2 CPU cores: about 2.7 s), short enough for a 16-probe
#: look of two waves to take seconds, not minutes.
HOLD_TOKENS = 512

#: Probes of the first look, then four times as many while none of them waited.
FIRST_BURST, LAST_BURST = 16, 1024


@dataclass(frozen=True)
class Accumulated:
    """What the server's counters and histograms gained over one look (after minus before)."""

    finished: int                       # requests the server finished (queue-time observations)
    queued_within: dict[float, int]     # bucket bound (s) -> finished requests queued no longer
    lifetime_s: float                   # mean time from admission to last token
    steps: int                          # engine steps that emitted tokens
    generated: int                      # tokens generated
    preempted: int                      # preemptions

    @property
    def mean_running(self) -> float:
        """Requests decoding per engine step, on average (no step runs more than the cap)."""
        return self.generated / self.steps if self.steps else 0.0

    def describe(self) -> str:
        """One line: what the server accumulated."""
        queued = ", ".join(f"{c} within {b:g} s" for b, c in sorted(self.queued_within.items())[:6])
        return (f"the server finished {self.finished}, queued {queued}; they lived {self.lifetime_s:.2f} s "
                f"on average; {self.steps} engine steps generated {self.generated} tokens "
                f"({self.mean_running:.2f} per step); {self.preempted} preempted")


def accumulated(before, after) -> Accumulated | None:
    """The difference between two /metrics readings; None when the server does not export the
    queue-time histogram or the step counts (not a vLLM v1 server)."""
    names = ("vllm:request_queue_time_seconds_count", "vllm:request_inference_time_seconds_sum",
             "vllm:iteration_tokens_total_count", "vllm:generation_tokens_total")
    if any(metric(after, name) is None for name in names):
        return None

    def gained(name: str) -> float:
        return (metric(after, name) or 0.0) - (metric(before, name) or 0.0)

    finished = round(gained("vllm:request_queue_time_seconds_count"))
    lived = gained("vllm:request_inference_time_seconds_sum")
    queued_after, queued_before = _buckets(after), _buckets(before)
    return Accumulated(
        finished=finished,
        queued_within={b: round(c - queued_before.get(b, 0.0)) for b, c in queued_after.items()},
        lifetime_s=lived / finished if finished else 0.0,
        steps=round(gained("vllm:iteration_tokens_total_count")),
        generated=round(gained("vllm:generation_tokens_total")),
        preempted=round(gained("vllm:num_preemptions_total")))


def _buckets(samples) -> dict[float, float]:
    """The queue-time histogram's cumulative counts by finite bucket bound (summed over engines)."""
    out: dict[float, float] = {}
    for n, lab, v in samples:
        if n == "vllm:request_queue_time_seconds_bucket" and lab.get("le") not in (None, "+Inf"):
            out[float(lab["le"])] = out.get(float(lab["le"]), 0.0) + v
    return out


def split_bound(acc: Accumulated) -> float | None:
    """The queue-time bucket bound that parts the probes admitted at once from those that waited:
    the largest at most half their mean lifetime (None: they lived too short for any bound)."""
    fit = [b for b in acc.queued_within if b <= acc.lifetime_s / 2]
    return max(fit) if fit else None


@dataclass(frozen=True)
class CapReading:
    """What one look concluded: `cap` when some probes waited, `at_least` when none did and most ran
    at once, or neither (`why` says what was seen)."""

    cap: int | None = None
    at_least: int | None = None
    why: str = ""


def read_cap(n: int, acc: Accumulated | None) -> CapReading:
    """The running-sequence cap that `n` probes, all answered, left in the server's accumulated
    metrics `acc` (see the module's docstring for the inference)."""
    if acc is None:
        return CapReading(why="/metrics has no vllm:request_queue_time_seconds, "
                              "vllm:iteration_tokens_total or vllm:generation_tokens_total")
    seen = acc.describe()
    if acc.finished != n:
        return CapReading(why=f"{n} probes sent but {seen}: other requests ran, or some were not finished")
    if acc.preempted:
        return CapReading(why=f"probes were preempted (the KV cache, not the cap, held them back): {seen}")
    bound = split_bound(acc)
    if bound is None:
        return CapReading(why=f"the probes lived too short to tell a wait from an admission: {seen}")
    admitted = acc.queued_within[bound]
    if admitted < n:
        if admitted < 1 or acc.mean_running > admitted + 0.5:
            return CapReading(why=f"{admitted} of {n} admitted within {bound:g} s, yet more ran per step: {seen}")
        return CapReading(cap=admitted, why=f"{admitted} of {n} admitted within {bound:g} s, the rest waited "
                                            f"(mean lifetime {acc.lifetime_s:.2f} s)")
    if acc.mean_running > n / 2:
        return CapReading(at_least=n, why=f"none of {n} waited; {acc.mean_running:.1f} ran per step")
    return CapReading(why=f"none of {n} waited, but never more than a few ran at once (the server took "
                          f"them in slower than it answered them): {seen}")


@dataclass
class CapLook:
    """One look at the running-sequence cap: what was sent, how it ended, what the server kept."""

    n: int
    answered: int = 0
    failed: int = 0
    first_error: str | None = None
    elapsed_s: float = 0.0
    acc: Accumulated | None = None
    reading: CapReading = CapReading()

    def describe(self) -> str:
        """One line: the probes and how they ended, then the reading."""
        ended = f"{self.answered} answered, {self.failed} failed"
        if self.first_error:
            ended += f" (first: {self.first_error})"
        return f"{self.n} probes sent ({ended}) over {self.elapsed_s:.0f} s; {self.reading.why}"


async def look_at_running_cap(prober: Prober, n: int, n_out: int = HOLD_TOKENS) -> CapLook:
    """Send `n` probes of `n_out` tokens at once, wait until every one is answered (at most the
    request timeout, then they are cancelled), and read the cap off /metrics read before and
    after (`read_cap`)."""
    look = CapLook(n)
    before = await _read_metrics(prober)
    t0 = time.perf_counter()

    async def hold(body: dict) -> None:
        try:
            await hold_request(prober.session, prober.url, body)
            look.answered += 1
        except EndpointError as e:
            look.failed += 1
            look.first_error = look.first_error or str(e)

    tasks = [asyncio.create_task(hold(prober.hold_body(1, n_out))) for _ in range(n)]
    try:
        await asyncio.wait(tasks, timeout=prober.timeout_s)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        look.elapsed_s = time.perf_counter() - t0
    if look.answered < n:
        look.reading = CapReading(why="a probe failed" if look.failed else
                                  f"not every probe was answered within {prober.timeout_s:g} s (--request-timeout)")
        await _settle(prober)
        return look
    # the server records a finished request's times as it hands the answer out; a pause covers the last
    await asyncio.sleep(0.5)
    after = await _read_metrics(prober)
    if before is None or after is None:
        look.reading = CapReading(why=f"/metrics did not answer {'before' if before is None else 'after'} the "
                                      f"probes within {prober.timeout_s:g} s (--request-timeout)")
        return look
    look.acc = accumulated(before, after)
    look.reading = read_cap(n, look.acc)
    return look


async def _read_metrics(prober: Prober) -> list | None:
    """/metrics, tried again for as long as a probe may take (--request-timeout): a starved server
    answers late, but the look needs this reading (None: it never answered)."""
    deadline = time.perf_counter() + prober.timeout_s
    while True:
        samples = await fetch_metrics(prober.session, prober.base, prober.timeout_s)
        if samples is not None or time.perf_counter() >= deadline:
            return samples
        await asyncio.sleep(1.0)


async def _settle(prober: Prober) -> None:
    """After cancelled probes: wait (at most a probe's timeout) until the server reports nothing
    running or waiting, so the next probes find it as it was."""
    deadline = time.perf_counter() + prober.timeout_s
    while time.perf_counter() < deadline:
        s = await fetch_metrics(prober.session, prober.base, prober.metrics_timeout_s)
        if s is not None and not ((metric(s, "vllm:num_requests_running") or 0)
                                  + (metric(s, "vllm:num_requests_waiting") or 0)):
            return
        await asyncio.sleep(0.2)


def hold_tokens(lim: Limits, n: int) -> int:
    """Output tokens per probe: `HOLD_TOKENS`, less where the model is shorter or where `n` probes
    of that length would not fit the KV cache together (then they would be preempted)."""
    tokens = min(HOLD_TOKENS, lim.limits["max_model_len"] - 2)
    blocks, size = lim.limits.get("num_gpu_blocks"), lim.limits.get("block_size")
    if blocks and size:
        per_probe = blocks // n              # blocks each probe may hold
        tokens = min(tokens, per_probe * size - 2)
    return tokens


async def observe_max_num_seqs(lim: Limits, prober: Prober, samples, base: str, log) -> None:
    """The running-sequence cap, from what bursts of 16, 64, 256, 1,024 probes left in the server's
    accumulated metrics (the module's docstring says how); one line naming --max-num-seqs where no
    burst shows it."""
    if lim.overrides.get("max_num_seqs") is not None:
        lim.put("max_num_seqs", None, "")
        return
    if samples is None:
        raise EndpointError(f"{base}: no /metrics endpoint to observe the running-sequence cap; "
                            f"give --max-num-seqs")
    n = FIRST_BURST
    while True:
        n_out = hold_tokens(lim, n)
        if n_out < 16:
            raise EndpointError(f"{base}: {n} probes of 16 tokens would not fit the KV cache together, "
                                f"so the running-sequence cap cannot be read; give --max-num-seqs")
        look = await look_at_running_cap(prober, n, n_out)
        log(f"max_num_seqs probe: {look.describe()}")
        if look.reading.cap is not None:
            lim.put("max_num_seqs", look.reading.cap,
                    f"observed: {look.reading.cap} of {n} probes admitted at once, the rest waited")
            return
        if look.reading.at_least is None:
            raise EndpointError(f"{base}: the running-sequence cap could not be read: {look.describe()}; "
                                f"give --max-num-seqs")
        if n >= LAST_BURST:
            lim.put("max_num_seqs", n, f"at least {n} (none of {n} probes waited)")
            return
        n *= 4
