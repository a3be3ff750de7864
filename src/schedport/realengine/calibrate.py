"""Calibrate the simulator's engine to a running server: limits from its metrics, latency by probing.

`schedport calibrate --endpoint URL --out engine.toml` measures the server it is pointed at and
writes an engine config that `simulate`, `replay --load` and `validate` read. Nothing else may
load the server while it runs (it says so when it sees other requests running).

What it learns and how (docs/validation.md has the details and the limits):
- ``max_model_len`` from ``/v1/models``; ``block_size`` and ``num_gpu_blocks`` from the
  ``vllm:cache_config_info`` gauge of the Prometheus ``/metrics`` endpoint.
- ``max_num_seqs``: a burst of long one-token-prompt requests; the server's accumulated queue-time
  histogram, read once after the burst (never polled during it), shows how many were admitted at
  once while the others waited: the running-sequence cap (`calibration.running_cap`).
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
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from schedport.errors import SchedportError
from schedport.engine.core.config import load_engine_config
from schedport.engine.runner import atomic_write, resolve_engine, simulate
from schedport.realengine.calibration.fit import (MIXED_PLAUSIBLE, PARAMS, Fit, Observation, decode_features,
                                                  fit_linear, mixed_delta_features, prefill_features)
from schedport.realengine.calibration.latency import DECODE_PROBE_TOKENS, MIXED_PROMPT_TOKENS, latency_probes
from schedport.realengine.calibration.limits import Limits, probe_token_budget, reported_limits
from schedport.realengine.calibration.probes import DEFAULT_REQUEST_TIMEOUT_S, Prober, stream_request
from schedport.realengine.calibration.prometheus import fetch_metrics, parse_prometheus
from schedport.realengine.calibration.running_cap import observe_max_num_seqs
from schedport.realengine.replay import (EndpointError, ServerInfo, client_connector, completion_body,
                                         fetch_server_info, need_aiohttp, no_gc_pauses, prompt_token_ids, server_root)
from schedport.workload.trace import Trace

__all__ = ["DECODE_PROBE_TOKENS", "DEFAULT_REQUEST_TIMEOUT_S", "MIXED_PLAUSIBLE", "MIXED_PROMPT_TOKENS", "PARAMS",
           "Calibration", "Fit", "Observation", "calibrate", "decode_features", "fit_linear", "mixed_delta_features",
           "parse_prometheus", "prefill_features", "speed_index"]


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


async def _calibrate_async(endpoint: str, model: str | None, overrides: dict, repeats: int,
                           token_range, log, seed: int = 0,
                           timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> Calibration:
    aiohttp = need_aiohttp()
    base = server_root(endpoint)
    async with aiohttp.ClientSession(connector=client_connector(),
                                     timeout=aiohttp.ClientTimeout()) as session:   # probes time themselves
        info = await fetch_server_info(session, base, model, timeout_s=min(30.0, timeout_s))
        samples = await fetch_metrics(session, base, timeout_s)
        lim = Limits(overrides)
        reported_limits(lim, info, samples, base, log)
        prober = Prober(session, base, info, token_range, log, timeout_s)
        await prober.ttft(16)                          # warm-up, not measured
        await observe_max_num_seqs(lim, prober, samples, base, log)
        # --- the token budget
        if overrides.get("max_num_batched_tokens") is not None:
            lim.put("max_num_batched_tokens", None, "")
        elif samples is None:
            raise EndpointError(f"{base}: no /metrics endpoint to observe the token budget; "
                                f"give --max-num-batched-tokens")
        else:
            budget, how = await probe_token_budget(prober, session, base, lim.limits["max_model_len"],
                                              lim.limits["max_num_seqs"])
            lim.put("max_num_batched_tokens", budget, how)
        obs = await latency_probes(prober, lim.limits, repeats, seed, log)
    cal = Calibration(info, base, lim.limits, lim.sources, obs)
    cal.fit = fit_linear(obs)
    for label in cal.fit.excluded:
        log(f"mixed probe {label}: over {MIXED_PLAUSIBLE:g}x the time of its prompt alone "
            f"(a pause of the machine?); left out of the fit")
    return cal


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
                times.append((await stream_request(session, url, body, timeout_s=60.0)).first_s)
            return float(np.median(times))

    with no_gc_pauses():
        return asyncio.run(measure()) / modelled
