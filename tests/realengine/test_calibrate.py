"""Calibration's pure parts: Prometheus parsing, model rows, the fit, the written config."""

from __future__ import annotations

import numpy as np
import pytest

from schedport.realengine.calibrate import (PARAMS, Calibration, Observation, decode_features, fit_linear,
                                            mixed_delta_features, parse_prometheus, prefill_features)
from schedport.realengine.calibration.probes import Prober as _Prober
from schedport.engine.core.config import load_engine_config
from schedport.engine.core.latency import LinearLatency
from schedport.realengine.replay import ServerInfo

METRICS = '''# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",engine="0",num_gpu_blocks="4096",note="a \\"quoted\\" value"} 1.0
vllm:iteration_tokens_total_bucket{engine="0",le="2048.0",model_name="m"} 10.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 12.0
garbage line without value
python_info{implementation="CPython"} 1.0
'''


def test_parse_prometheus_labels_and_values():
    s = parse_prometheus(METRICS)
    names = [n for n, _, _ in s]
    assert "vllm:num_requests_running" in names and "garbage" not in names
    cache = next(lab for n, lab, _ in s if n == "vllm:cache_config_info")
    assert cache["block_size"] == "128" and cache["num_gpu_blocks"] == "4096"
    buckets = [(lab["le"], v) for n, lab, v in s if n.endswith("_bucket")]
    assert buckets == [("2048.0", 10.0), ("+Inf", 12.0)]


def test_prefill_features_follow_chunking():
    # 300 tokens with a 128-token budget: chunks 128, 128, 44
    f = dict(zip(PARAMS, prefill_features(300, 128)))
    assert f["request_overhead_s"] == 1 and f["a"] == 3 and f["b"] == 300 and f["c"] == 0
    assert f["d"] == 128 + 256 + 300
    pairs = 128 * 129 // 2 + (128 * 128 + 128 * 129 // 2) + (44 * 256 + 44 * 45 // 2)
    assert f["e"] == pairs == 300 * 301 // 2


def test_prefill_features_match_the_latency_model():
    """The fit's row for a lone prompt prices it exactly as the simulator's linear model does."""
    lat = LinearLatency(0.004, 7e-5, 2e-4, 3e-7, e=2e-7)
    coef = np.array([0.0, 0.004, 7e-5, 2e-4, 3e-7, 2e-7, 0.0])
    for L, budget in ((1, 2048), (700, 2048), (5000, 2048), (300, 128)):
        chunks, done = [], 0
        while done < L:
            c = min(budget, L - done)
            chunks.append((c, done))
            done += c
        want = sum(lat.iteration_time([ch], 0, 0) for ch in chunks)
        assert np.dot(coef, prefill_features(L, budget)) == pytest.approx(want, rel=1e-12)
    assert np.dot(coef, decode_features(8, 4000)) == pytest.approx(lat.iteration_time([], 8, 4000), rel=1e-12)


def _synthetic(coef, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    obs = []
    for L in (1, 16, 64, 256, 1024, 2047, 4000):
        f = prefill_features(L, 2048)
        obs.append(Observation("prefill", f"prompt {L}", float(np.dot(coef, f)) * (1 + noise * rng.standard_normal()), f))
    for b in (1, 2, 4, 8, 16, 32):
        for ctx in (16, 1024):
            f = decode_features(b, b * ctx)
            obs.append(Observation("decode", f"batch {b} ctx {ctx}", float(np.dot(coef, f)) * (1 + noise * rng.standard_normal()), f))
    for p in (128, 384):
        f = mixed_delta_features(p)
        obs.append(Observation("mixed", f"prompt {p} + 4 decodes", float(np.dot(coef, f)) * (1 + noise * rng.standard_normal()), f))
    return obs


def test_fit_recovers_known_coefficients():
    true = np.array([0.007, 0.004, 7e-5, 2e-4, 3e-7, 2e-7, 6e-5])
    fit = fit_linear(_synthetic(true))
    got = np.array([fit.coef[k] for k in PARAMS])
    assert np.allclose(got, true, rtol=1e-4)
    assert fit.r2 == pytest.approx(1.0) and fit.max_abs_rel_err < 1e-6


def test_fit_is_non_negative_and_reports_noise():
    true = np.array([0.0, 0.004, 7e-5, 0.0, 3e-7, 0.0, 0.0])
    fit = fit_linear(_synthetic(true, noise=0.05, seed=3))
    assert all(v >= 0 for v in fit.coef.values()) and fit.coef["a"] > 0
    assert 0.01 < fit.max_abs_rel_err < 0.3 and fit.r2 > 0.9


def test_mixed_probes_cannot_spoil_the_prefill_model():
    """A mixed probe measured too short (below the lone-prefill model: a noisy moment) leaves
    every other coefficient as the prefill and decode probes alone give it, and f at 0; one
    measured long is carried by f alone."""
    true = np.array([0.007, 0.004, 7e-5, 2e-4, 3e-7, 2e-7, 0.0])
    obs = _synthetic(true)
    base = fit_linear([o for o in obs if o.kind != "mixed"])
    short = [o if o.kind != "mixed" else Observation("mixed", o.label, o.seconds * 0.1, o.features) for o in obs]
    fit = fit_linear(short)
    assert fit.coef["f"] == 0.0
    assert all(fit.coef[k] == base.coef[k] for k in PARAMS if k != "f")
    long_ = [o if o.kind != "mixed" else Observation("mixed", o.label, o.seconds * 1.5, o.features) for o in obs]
    fit = fit_linear(long_)
    assert fit.coef["f"] > 0 and all(fit.coef[k] == base.coef[k] for k in PARAMS if k != "f")


def test_an_implausible_mixed_probe_is_left_out_and_not_scored(tmp_path):
    """A pause lands whole in a mixed probe's span (seen: 298 ms for a 128-token prompt where
    15-35 ms is usual): such a probe is left out of f and of the fit's scores, and marked."""
    true = np.array([0.007, 0.004, 7e-5, 2e-4, 3e-7, 2e-7, 6e-5])
    obs = _synthetic(true)
    paused = [o if o.label != "prompt 128 + 4 decodes" else
              Observation("mixed", o.label, 0.298, o.features) for o in obs]
    fit = fit_linear(paused)
    assert fit.excluded == ["prompt 128 + 4 decodes"]
    assert fit.coef["f"] == pytest.approx(6e-5, rel=1e-6)          # from the 384-token probe
    assert fit.r2 == pytest.approx(1.0) and fit.max_abs_rel_err < 1e-6
    limits = {"block_size": 16, "num_gpu_blocks": 4096, "max_num_seqs": 8,
              "max_num_batched_tokens": 2048, "max_model_len": 4096}
    cal = Calibration(ServerInfo("m", 4096), "http://x", limits, {k: "test" for k in limits}, paused, fit)
    text = cal.engine_toml()
    assert f"fit over {len(paused) - 1} probes" in text and text.count("left out: implausible") == 1


def test_fit_needs_enough_probes_and_positive_times():
    from schedport.errors import SchedportError

    obs = _synthetic(np.array([0.007, 0.004, 7e-5, 2e-4, 3e-7, 2e-7, 6e-5]))
    with pytest.raises(SchedportError, match="at least"):
        fit_linear(obs[:3])
    obs[0] = Observation("prefill", "bad", float("nan"), obs[0].features)
    with pytest.raises(SchedportError, match="no usable time"):
        fit_linear(obs)


def test_engine_toml_is_a_valid_engine_config(tmp_path):
    obs = _synthetic(np.array([0.007, 0.004, 7e-5, 2e-4, 3e-7, 2e-7, 6e-5]))
    limits = {"block_size": 128, "num_gpu_blocks": 4096, "max_num_seqs": 8,
              "max_num_batched_tokens": 2048, "max_model_len": 4096}
    cal = Calibration(ServerInfo("m", 4096), "http://x", limits, {k: "test" for k in limits}, obs, fit_linear(obs))
    path = tmp_path / "engine.toml"
    path.write_text(cal.engine_toml())
    cfg = load_engine_config(path)
    assert cfg.max_num_seqs == 8 and cfg.num_gpu_blocks == 4096 and cfg.block_size == 128
    assert cfg.latency_model == "linear"
    assert cfg.linear_a == pytest.approx(0.004, rel=1e-4) and cfg.request_overhead_s == pytest.approx(0.007, rel=1e-4)
    text = path.read_text()
    assert "R^2 = 1.0000" in text and text.count("#   prefill") == 7 and text.count("#   decode") == 12
    assert text.count("#   mixed") == 2 and cfg.linear_f == pytest.approx(6e-5, rel=1e-4)


def test_mixed_delta_features_are_a_mixed_step_minus_its_decode_step():
    """The fitted row of a prefill inside a decode step prices exactly what the simulator adds."""
    lat = LinearLatency(0.004, 7e-5, 2e-4, 3e-7, e=2e-7, f=6e-5)
    coef = np.array([0.0, 0.004, 7e-5, 2e-4, 3e-7, 2e-7, 6e-5])
    for prompt, batch, kv in ((128, 4, 4 * 80), (384, 3, 3 * 700)):
        want = lat.iteration_time([(prompt, 0)], batch, kv) - lat.iteration_time([], batch, kv)
        assert np.dot(coef, mixed_delta_features(prompt)) == pytest.approx(want, rel=1e-9)


class _ScriptedProber(_Prober):
    """A prober whose decode batch is synthetic token times: steps of `dt`, each injection's
    step longer by `extra` in every stream, and optionally one machine pause in one of them."""

    def __init__(self, dt=0.005, extra=0.030, pause=0.0, end_early=False):
        self.dt, self.extra, self.pause, self.end_early = dt, extra, pause, end_early

    async def _injected_batch(self, batch, context, n_out, prompt, injections):
        gaps = np.full(n_out - 1, self.dt)
        gaps[10:10 + injections] += self.extra          # gap i ends with token i + 1
        gaps[11] += self.pause
        t = 0.1 + np.concatenate([[0.0], np.cumsum(gaps)])
        times = [t + 0.0003 * i for i in range(batch)]  # streams written one after another
        firsts = [float(t[11 + j]) + 0.0005 for j in range(injections)]
        done_at = t[-1] + 1.0 if self.end_early else firsts[-1]
        return times, done_at, firsts


@pytest.mark.parametrize("pause", [0.0, 0.5])
def test_mixed_delta_reads_the_mixed_steps_gap(pause):
    """The gap ending with each injected prompt's first token, over the stream's median gap;
    the median over injections shrugs off a pause that lands in one of them."""
    import asyncio

    got = asyncio.run(_ScriptedProber(pause=pause).mixed_delta(4, 16, 128, 64, injections=4))
    assert got == pytest.approx(0.030, rel=1e-6)


def test_mixed_delta_is_none_when_the_decodes_end_before_the_injections():
    import asyncio

    assert asyncio.run(_ScriptedProber(end_early=True).mixed_delta(4, 16, 128, 64)) is None
