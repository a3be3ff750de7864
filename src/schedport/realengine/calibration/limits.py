"""The engine limits of a calibration: those the server reports, those a command line gives, and the
token budget estimated from the server's engine-step counts."""

from __future__ import annotations

import asyncio
import math

from schedport.realengine.calibration.probes import Prober, stream_request
from schedport.realengine.calibration.prometheus import fetch_metrics, int_label, metric
from schedport.realengine.replay import EndpointError, ServerInfo


class Limits:
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


def reported_limits(lim: Limits, info: ServerInfo, samples, base: str, log) -> None:
    """max_model_len, block_size and num_gpu_blocks: from /v1/models and /metrics (or the command
    line); a one-line error names the option to give for one the server does not report."""
    lim.put("max_model_len", info.max_model_len, "from /v1/models")
    if samples is not None:
        busy = metric(samples, "vllm:num_requests_running") or 0
        if busy:
            log(f"warning: {int(busy)} requests already running; other load skews the calibration")
        cache = [lab for n, lab, _ in samples if n == "vllm:cache_config_info"]
        if cache:
            lim.put("block_size", int_label(cache[0], "block_size"), "from /metrics cache_config_info")
            lim.put("num_gpu_blocks", int_label(cache[0], "num_gpu_blocks"), "from /metrics cache_config_info")
    for key in ("max_model_len", "block_size", "num_gpu_blocks"):
        if key not in lim.limits:
            lim.put(key, None, "")
            if key not in lim.limits:
                raise EndpointError(f"{base}: the server does not report {key} "
                                    f"(no /metrics cache_config_info); give --{key.replace('_', '-')}")


async def probe_token_budget(prober: Prober, session, base: str, mml: int, max_seqs: int) -> tuple[int, str]:
    """Estimate max_num_batched_tokens from engine-step counts of a burst of long prompts."""
    def hist(samples):
        count = metric(samples, "vllm:iteration_tokens_total_count")
        total = metric(samples, "vllm:iteration_tokens_total_sum")
        buckets = {}
        for n, lab, v in samples:
            if n == "vllm:iteration_tokens_total_bucket" and lab.get("le") not in (None, "+Inf"):
                le = float(lab["le"])
                buckets[le] = buckets.get(le, 0.0) + v
        return count, total, buckets

    before = await fetch_metrics(session, base, prober.timeout_s)
    L = mml - 1
    m = max(2, min(max_seqs, 8))
    await asyncio.gather(*[stream_request(session, prober.url, prober.body(L, 1), prober.timeout_s) for _ in range(m)])
    await asyncio.sleep(0.3)
    after = await fetch_metrics(session, base, prober.timeout_s)
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
