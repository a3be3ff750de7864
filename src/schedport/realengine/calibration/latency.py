"""The latency probes: their plan (prompt lengths, decode batches, mixed steps), shuffled and
repeated, and the observations the fit reads."""

from __future__ import annotations

import numpy as np

from schedport.realengine.calibration.fit import (Observation, decode_features, mixed_delta_features,
                                                  prefill_features)
from schedport.realengine.calibration.probes import Prober
from schedport.realengine.replay import EndpointError

#: Tokens each decode probe generates: its step time is read over the last three quarters of
#: them, so longer probes average more of a noisy machine's jitter (128: about 1 s per probe).
DECODE_PROBE_TOKENS = 128

#: Prompt lengths injected into a decode batch by the mixed-step probes (each capped at a
#: quarter and three quarters of the token budget, so that one chunk and the decodes fit a step).
MIXED_PROMPT_TOKENS = (128, 384)


async def latency_probes(prober: Prober, limits: dict[str, int], repeats: int, seed: int,
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
            t = await probe_once(prober, kind, x, y, n_out, contexts[0], mml)
        except EndpointError as e:        # one more try: a single request can fail by chance
            log(f"{kind} probe failed ({e}); trying it once more")
            t = await probe_once(prober, kind, x, y, n_out, contexts[0], mml)
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


async def probe_once(prober: Prober, kind: str, x: int, y: int, n_out: int, mixed_context: int,
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
