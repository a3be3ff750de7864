"""How well a window's warm-up warms the prefix cache (tools/warmup_hit_rate.py, docs/corpus.md "Warm caches").

The hit rate of a window's measured requests, run with their warm-up, against the hit rate the
same requests get in a run of the full trace: under 5 points. The engine-independent reference (a
cache that never evicts, `seen_prefix_tokens`) is checked by hand and on the Mooncake trace; the
engine's own cache is measured on two Mooncake windows at two loads.
"""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest

from _paths import MIRROR, REPO
from schedport.errors import ConfigError
from schedport.workload import corpus as cp
from schedport.workload.prefix import seen_prefix_tokens
from schedport.workload.trace import Trace

MOONCAKE = MIRROR / "mooncake-fast25" / "conversation_trace.jsonl"
needs_mooncake = pytest.mark.skipif(not MOONCAKE.is_file(), reason="Mooncake mirror not present")


def _tool():
    spec = importlib.util.spec_from_file_location("warmup_hit_rate", REPO / "tools" / "warmup_hit_rate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Six requests with ids of 16-token blocks (the engine's block size, so one id = one engine block):
# 0: [1 2 3]      48 tokens, nothing seen before                 -> 0
# 1: [1 2 4]      48 tokens, shares blocks 1 2                   -> 32
# 2: [5]          16 tokens, new                                 -> 0
# 3: [1 2 3]      48 tokens, all seen: capped at 47 -> 2 blocks  -> 32
# 4: [1 2 4 6]    60 tokens, 3 seen, block 4 (12 tokens) partial -> 48
# 5: [5 7]        32 tokens, shares block 5                      -> 16
IDS = [[1, 2, 3], [1, 2, 4], [5], [1, 2, 3], [1, 2, 4, 6], [5, 7]]
FULL = Trace.from_arrays(np.arange(6.0), [48, 48, 16, 48, 60, 32], [1] * 6, hash_ids=IDS, hash_block_size=16)


def test_seen_prefix_tokens_by_hand():
    assert seen_prefix_tokens(FULL).tolist() == [0, 32, 0, 32, 48, 16]


def test_hit_rate_gap_by_hand():
    tool = _tool()
    # the window is requests 3..5 with request 2 as its warm-up: request 3 (and 4) lose what 0 and 1 gave them
    window = FULL.take(np.arange(2, 6))
    window = Trace.from_arrays(window.arrival_s, window.input_tokens, window.output_tokens,
                               hash_ids=window.hash_id_lists(), hash_block_size=16, warmup=1)
    r = tool.hit_rate_gap(window, FULL, tool.reference_cached_tokens)
    # window run: 3 -> 0 (nothing of 1 2 3 seen), 4 -> 32 (1 2 from request 3), 5 -> 16
    prompt = 48 + 60 + 32
    assert r["n_measured"] == 3 and r["n_warmup"] == 1
    assert r["hit_window"] == pytest.approx((0 + 32 + 16) / prompt)
    assert r["hit_full"] == pytest.approx((32 + 48 + 16) / prompt)
    assert r["gap_points"] == pytest.approx(100 * 48 / prompt)
    assert tool.locate(window, FULL) == 3
    with pytest.raises(ValueError, match="not a run of the full trace"):
        tool.locate(Trace.from_arrays([0.0], [48], [2], hash_ids=[[1, 2, 3]], hash_block_size=16), FULL)


@pytest.mark.data
@needs_mooncake
def test_mooncake_windows_with_the_default_warm_up_stay_within_5_points_of_a_never_evicting_cache(tmp_path):
    """The bound: a cache that forgets nothing keeps the most from before a window, so it needs the
    longest warm-up; with the default 600 s, every 5-minute window of the hour is within 5 points."""
    tool = _tool()
    spec = tmp_path / "m.toml"
    spec.write_text('name = "kimi"\n[[sources]]\nname = "mooncake-conversation"\nadapter = "mooncake"\n'
                    'files = ["mooncake-fast25/conversation_trace.jsonl"]\nwindows = { rule = "tile", count = 12 }\n')
    corpus = cp.build_corpus(spec, MIRROR, tmp_path / "c", download=False)
    full = tool._read_source(MOONCAKE)
    gaps = {}
    for w in corpus.windows[1:]:          # the first window has nothing before it, in either run
        r = tool.hit_rate_gap(corpus.trace(w.window_id), full, tool.reference_cached_tokens)
        gaps[w.window_id] = r["gap_points"]
    assert all(0 <= g < tool.LIMIT_POINTS for g in gaps.values()), json.dumps(gaps)
    assert max(gaps.values()) == pytest.approx(4.09, abs=0.01)   # the last window, the tightest


@needs_mooncake
def test_the_engines_prefix_cache_keeps_each_window_within_5_points(tmp_path):
    """The engine's own prefix cache (`[engine] enable_prefix_caching`, each request's
    ``cached_tokens``) on two Mooncake windows with their warm-up, at two loads: each window's hit
    rate within 5 points of the hit rate the whole trace, simulated at the same load, gives its requests."""
    from schedport.engine.capacity import load_scale
    from schedport.engine.core.config import engine_config_from_dict
    from schedport.engine.core.deployments import engine_overlay
    from schedport.engine.inputs import rescale
    from schedport.engine.runner import simulate

    dep = "llama3.1-8b-a100-128k"
    try:
        cfg = engine_config_from_dict({"engine": {**engine_overlay(dep), "enable_prefix_caching": True},
                                       "latency": {"deployment": dep}})
    except ConfigError as e:
        pytest.skip(f"the engine has no prefix cache yet ({e})")
    probe = simulate(Trace.from_arrays([0.0, 1.0], [64, 64], [1, 1], hash_ids=[[1], [1]], hash_block_size=64),
                     "vllm-fcfs", cfg)
    if "cached_tokens" not in probe.requests.columns:
        pytest.skip("the engine reports no cached_tokens per request")
    tool = _tool()
    spec = tmp_path / "m.toml"
    spec.write_text('name = "kimi"\n[[sources]]\nname = "mooncake-conversation"\nadapter = "mooncake"\n'
                    'files = ["mooncake-fast25/conversation_trace.jsonl"]\nwindows = { rule = "tile", count = 12 }\n')
    corpus = cp.build_corpus(spec, MIRROR, tmp_path / "c", download=False)
    full = tool._read_source(MOONCAKE)
    for wid in ("mooncake-conversation-06", "mooncake-conversation-11"):
        t = corpus.trace(wid)
        for rho in (0.3, 0.8):
            scale = load_scale(t, rho, cfg)
            r = tool.hit_rate_gap(rescale(t, scale), rescale(full, scale), tool.engine_cached_tokens(cfg))
            assert math.isfinite(r["gap_points"]) and abs(r["gap_points"]) < tool.LIMIT_POINTS, (wid, rho, r)
