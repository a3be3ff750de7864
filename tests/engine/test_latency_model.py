"""Tests for schedport.engine.core.latency: bit identity, monotonicity, calibration table, exact arithmetic."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedport.engine.core.config import EngineConfig, engine_config_from_dict
from schedport.engine.core.latency import (
    CALIBRATED_COEFFS,
    DEFAULT_CPU_OVERHEAD_S,
    LINEAR_DEFAULTS,
    CalibratedLatency,
    LatencyModel,
    LinearLatency,
    ScaledCalibratedLatency,
    ScaledLinearLatency,
    make_latency_model,
)
from _paths import REPO

CALIB_DIR = REPO.parent / "shared" / "calibration" / "vidur-a100-llama3-8b"

MODELS = {
    "calibrated-default": CalibratedLatency(),
    "calibrated-gpu-only": CalibratedLatency(cpu_overhead_s=0.0, lm_head=False),
    "linear-default": LinearLatency(**LINEAR_DEFAULTS),
    "linear-custom": LinearLatency(0.0031, 1.7e-5, 3.3e-5, 7.1e-8),
    # with the quadratic prefill-attention term (CPU-like magnitudes)
    "linear-quadratic": LinearLatency(0.0031, 1.7e-5, 3.3e-5, 7.1e-8, 2.3e-10),
    # the engine variants' perturbations (docs/engine.md §3.6)
    "calibrated-scaled": ScaledCalibratedLatency(prefill_scale=1.1, decode_scale=0.9, attention_scale=1.07),
    "calibrated-scaled-gpu-only": ScaledCalibratedLatency(cpu_overhead_s=0.0, lm_head=False, decode_scale=1.13),
    "linear-scaled": ScaledLinearLatency(0.0031, 1.7e-5, 3.3e-5, 7.1e-8, 2.3e-10, 6e-5, prefill_scale=0.9,
                                         decode_scale=1.1, attention_scale=1.2),
}
model_names = st.sampled_from(sorted(MODELS))
chunks_st = st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 16384)), max_size=4)


def test_models_satisfy_protocol():
    for m in MODELS.values():
        assert isinstance(m, LatencyModel)


# --------------------------------------------------------------------------- bit identity
@settings(max_examples=400, deadline=None)
@given(name=model_names, n=st.integers(0, 512), data=st.data())
def test_decode_times_bit_identical_to_iteration_time(name, n, data):
    m = MODELS[name]
    if n == 0:
        kvs = [0]
    else:
        kvs = data.draw(st.lists(st.integers(n, n * 16384), min_size=1, max_size=20))
    arr = np.array(kvs, dtype=np.int64)
    vec = m.decode_times(n, arr)
    assert vec.dtype == np.float64 and vec.shape == arr.shape
    for i, kv in enumerate(kvs):
        scalar = m.iteration_time((), n, kv)
        assert isinstance(scalar, float)
        assert vec[i] == scalar and math.copysign(1, vec[i]) == math.copysign(1, scalar), (name, n, kv)
        # also via the engine's own fast path: a one-element array
        assert float(m.decode_times(n, np.array([kv]))[0]) == scalar
        assert m.iteration_time((), n, int(arr[i])) == scalar


@settings(max_examples=300, deadline=None)
@given(name=model_names, n=st.integers(1, 512), k_max=st.integers(1, 40), data=st.data())
def test_decode_steps_add_iteration_times_bit_for_bit(name, n, k_max, data):
    """A run of decode steps timed at once gives the sums of one iteration_time per step, and
    stops before the first step that would start at or after the limit."""
    m = MODELS[name]
    kv0 = data.draw(st.integers(n, n * 16384))
    t0 = data.draw(st.floats(0.0, 1e6))
    limit = data.draw(st.floats(t0, t0 + 2.0) | st.just(math.inf))
    starts, ends = m.decode_steps(n, kv0, t0, k_max, limit)
    t, want_s, want_e = t0, [], []
    for j in range(k_max):
        if j and t >= limit:
            break
        want_s.append(t)
        t = t + m.iteration_time((), n, kv0 + n * j)
        want_e.append(t)
    assert starts == want_s and ends == want_e


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bit_identity_at_split_and_quantum_edges(name):
    m = MODELS[name]
    for n in (1, 2, 63, 64, 65, 127, 128, 129, 256):
        kvs = np.array([n, 512 * n - 1, 512 * n, 512 * n + 1, 8192 * n], dtype=np.int64)
        vec = m.decode_times(n, kvs)
        assert [float(v) for v in vec] == [m.iteration_time((), n, int(k)) for k in kvs]


# --------------------------------------------------------------------------- monotonicity
@settings(max_examples=300, deadline=None)
@given(name=model_names, chunks=chunks_st, n=st.integers(0, 256), mean=st.integers(1, 8192),
       i=st.integers(0, 3), dc=st.integers(1, 2048), dk=st.integers(1, 4096), dkv=st.integers(1, 100000))
def test_more_work_is_never_faster(name, chunks, n, mean, i, dc, dk, dkv):
    """A perturbed model whose prefill and decode scales differ splits a step's time between the
    phases by their tokens, so work of the cheaper phase joining a step can make it a little
    cheaper: at most 0.05% of the step (docs/engine.md §3.6); every other model exactly never."""
    m = MODELS[name]
    kv = n * mean
    scales = getattr(m, "scales", {})
    base = m.iteration_time(chunks, n, kv)
    if scales.get("prefill_scale", 1.0) != scales.get("decode_scale", 1.0):
        base *= 1 - 5e-4
    assert base > 0
    if chunks:
        j = i % len(chunks)
        c, k = chunks[j]
        longer = list(chunks)
        longer[j] = (c + dc, k)
        assert m.iteration_time(longer, n, kv) >= base  # bigger chunk
        deeper = list(chunks)
        deeper[j] = (c, k + dk)
        assert m.iteration_time(deeper, n, kv) >= base  # more history
    assert m.iteration_time(chunks + [(dc, dk)], n, kv) >= base  # one more prefill
    if n:
        assert m.iteration_time(chunks, n, kv + dkv) >= base  # more KV read, same batch
    # one more decoding sequence at the same mean context
    assert m.iteration_time(chunks, n + 1, kv + mean) >= base


def test_documented_non_monotone_case_is_small():
    """Adding a short decode can move the mean context below 512 and switch FlashInfer off
    the split-KV path: the step gets at most 32 x (t0_long - t0_short) faster (docs/engine.md)."""
    m = CalibratedLatency()
    worst = 0.0
    for n in (1, 2, 4, 8):
        for kv in range(512 * n, 512 * n + 64):
            worst = max(worst, m.iteration_time((), n, kv) - m.iteration_time((), n + 1, kv + 1))
    bound = 32 * (CALIBRATED_COEFFS["decode_t0_long_ms"] - CALIBRATED_COEFFS["decode_t0_short_ms"]) * 1e-3
    assert 0 < worst <= bound < 0.4e-3


# --------------------------------------------------------------------------- calibration table
# calibration.md section 5: (prefill tok, decode seqs, mean ctx) -> total (Vidur scope) ms,
# and the "+ LM head + emb" column.
SECTION5 = [
    (0, 1, 512, 11.12, 11.75),
    (0, 64, 1024, 16.23, 17.01),
    (0, 256, 2048, 62.72, 64.04),
    (2048, 0, 0, 150.36, 151.12),
    (512, 64, 1024, 49.56, 50.36),
    (8192, 0, 0, 661.99, 663.12),
]


@pytest.mark.parametrize("P,B,L,total,with_lm", SECTION5)
def test_reproduces_calibration_table(P, B, L, total, with_lm):
    chunks = ((P, 0),) if P else ()
    gpu = CalibratedLatency(cpu_overhead_s=0.0, lm_head=False).iteration_time(chunks, B, B * L) * 1e3
    assert gpu == pytest.approx(total, rel=0.005)
    # the LM-head estimate (our fit) plus the profiled embedding (<= 0.5 ms, not modelled)
    lm = CalibratedLatency(cpu_overhead_s=0.0, lm_head=True).iteration_time(chunks, B, B * L) * 1e3
    assert lm == pytest.approx(with_lm, rel=0.01)
    # the default adds exactly the CPU overhead
    dflt = CalibratedLatency().iteration_time(chunks, B, B * L)
    assert dflt == pytest.approx(lm * 1e-3 + DEFAULT_CPU_OVERHEAD_S, rel=1e-12)


@pytest.mark.skipif(not (CALIB_DIR / "calibration.json").exists(), reason="shared calibration files absent")
def test_embedded_coefficients_agree_with_calibration_json():
    cj = json.loads((CALIB_DIR / "calibration.json").read_text())
    rec = cj["linear_ops"]["recommended"]
    att = cj["attention"]
    pairs = [
        (CALIBRATED_COEFFS["nonattn_T0_ms"], rec["T0_ms"]),
        (CALIBRATED_COEFFS["nonattn_a_ms"], rec["a_ms"]),
        (CALIBRATED_COEFFS["nonattn_b_ms_per_token"], rec["b_ms_per_token"]),
        (CALIBRATED_COEFFS["decode_t0_short_ms"], att["decode"]["t0_small_ms"]),
        (CALIBRATED_COEFFS["decode_t0_long_ms"], att["decode"]["t0_split_ms"]),
        (CALIBRATED_COEFFS["decode_bw_bytes_per_s"] / 1e12, att["decode"]["BW_eff_TBps"]),
        (CALIBRATED_COEFFS["prefill_t0_ms"], att["prefill_fresh_k0"]["t0_ms"]),
        (CALIBRATED_COEFFS["prefill_eta_max"], att["prefill_fresh_k0"]["eta_max"]),
        (CALIBRATED_COEFFS["prefill_c_half_tokens"], att["prefill_fresh_k0"]["c_half_tokens"]),
        (CALIBRATED_COEFFS["prefill_eta_hist"], att["prefill_with_history"]["eta_hist"]),
        (CALIBRATED_COEFFS["prefill_delta_ms_per_token"] * 1e3, att["prefill_with_history"]["delta_us_per_token"]),
    ]
    for ours, theirs in pairs:
        assert ours == pytest.approx(theirs, rel=0.01)


@pytest.mark.skipif(not (CALIB_DIR / "mlp.csv").exists(), reason="shared calibration files absent")
def test_fit_tool_check_passes():
    r = subprocess.run([sys.executable, str(REPO / "tools" / "fit_calibration.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "embedded constants agree" in r.stdout


# --------------------------------------------------------------------------- linear model
def test_linear_exact_arithmetic():
    m = LinearLatency(0.01, 0.0, 0.0, 0.0)
    for args in (((), 1, 1), (((8000, 0),), 0, 0), (((5, 7), (9, 0)), 200, 90000)):
        assert m.iteration_time(*args) == 0.01
    assert list(m.decode_times(3, np.array([3, 4000]))) == [0.01, 0.01]
    m = LinearLatency(0.5, 0.25, 0.125, 0.0625)  # powers of two: every product exact
    # prefill 100 + 20 tokens; kv_read = 1000 (decode) + (50 + 100) + (0 + 20)
    assert m.iteration_time(((100, 50), (20, 0)), 10, 1000) == 0.5 + 0.25 * 120 + 0.125 * 10 + 0.0625 * 1170
    assert m.prefill_time(64) == 0.5 + 0.25 * 64 + 0.0625 * 64
    d = m.describe()
    assert d["model"] == "linear" and d["a_s"] == 0.5


def test_linear_rejects_bad_coefficients():
    with pytest.raises(ValueError):
        LinearLatency(0.0, 0, 0, 0)
    with pytest.raises(ValueError):
        LinearLatency(0.01, -1e-9, 0, 0)
    with pytest.raises(ValueError):
        LinearLatency(float("nan"), 0, 0, 0)
    with pytest.raises(ValueError, match="e must be >= 0"):
        LinearLatency(0.01, 0, 0, 0, -1e-12)
    with pytest.raises(ValueError, match="e must be >= 0"):
        LinearLatency(0.01, 0, 0, 0, float("nan"))


def attention_pairs(c: int, k: int) -> int:
    """(query, key) pairs of causal attention for c new tokens after k cached ones, by counting."""
    return sum(k + i for i in range(1, c + 1))


def test_linear_e_term_exact_arithmetic():
    m = LinearLatency(0.5, 0.25, 0.125, 0.0625, 2.0**-10)  # powers of two: every product exact
    chunks = ((100, 50), (20, 0))
    pairs = attention_pairs(100, 50) + attention_pairs(20, 0)
    assert pairs == 100 * 50 + 100 * 101 // 2 + 20 * 21 // 2 == 10260
    four = 0.5 + 0.25 * 120 + 0.125 * 10 + 0.0625 * 1170
    assert m.iteration_time(chunks, 10, 1000) == four + 2.0**-10 * 10260
    assert m.prefill_time(64) == 0.5 + 0.25 * 64 + 0.0625 * 64 + 2.0**-10 * (64 * 65 // 2)
    # decode-only steps never involve e
    assert m.iteration_time((), 10, 1000) == 0.5 + 0.125 * 10 + 0.0625 * 1000
    # the pair count is an exact integer even where c*(c+1)/2 in floats would not be
    big = LinearLatency(1.0, 0.0, 0.0, 0.0, 1.0)
    c, k = 2**27 + 1, 2**26 + 3
    assert big.iteration_time(((c, k),), 0, 0) == 1.0 + float(c * k + c * (c + 1) // 2)


@settings(max_examples=300, deadline=None)
@given(chunks=chunks_st, n=st.integers(0, 256), kv=st.integers(0, 4_000_000),
       coeffs=st.tuples(st.floats(1e-4, 0.1), st.floats(0, 1e-3), st.floats(0, 1e-3), st.floats(0, 1e-6)),
       e=st.floats(1e-13, 1e-8))
def test_linear_e_zero_is_the_four_term_model_bit_for_bit(chunks, n, kv, coeffs, e):
    """e = 0 reproduces the four-term formula exactly; e > 0 adds exactly e * pairs after it,
    and only when there are prefill chunks (decode-only steps are unchanged)."""
    a, b, c, d = coeffs
    kv = max(kv, n)
    p = sum(ch for ch, _ in chunks)
    kv_read = kv + sum(k + ch for ch, k in chunks)
    four_term = a + b * p + c * n + d * kv_read          # the model's original arithmetic
    assert LinearLatency(a, b, c, d).iteration_time(chunks, n, kv) == four_term
    assert LinearLatency(a, b, c, d, 0.0).iteration_time(chunks, n, kv) == four_term
    with_e = LinearLatency(a, b, c, d, e)
    pairs = sum(ch * k + ch * (ch + 1) // 2 for ch, k in chunks)
    assert with_e.iteration_time(chunks, n, kv) == (four_term + e * pairs if chunks else four_term)
    if n:
        assert float(with_e.decode_times(n, np.array([kv]))[0]) == LinearLatency(a, b, c, d).iteration_time((), n, kv)
    # alone time with e = 0: the four-term closed form, bit for bit
    I, N = np.array([1, 77, 4096]), np.array([5, 1, 300])
    m = N - 1
    old = (a + b * I + d * I) + m * (a + c) + d * (m * I + m * (m + 1) // 2)
    assert np.array_equal(LinearLatency(a, b, c, d).alone_time(I, N), old)


@settings(max_examples=200, deadline=None)
@given(chunks=chunks_st, n=st.integers(0, 256), kv=st.integers(0, 4_000_000),
       coeffs=st.tuples(st.floats(1e-4, 0.1), st.floats(0, 1e-3), st.floats(0, 1e-3), st.floats(0, 1e-6),
                        st.floats(0, 1e-8)),
       f=st.floats(1e-9, 1e-3))
def test_linear_f_charges_prefill_tokens_of_mixed_steps_only(chunks, n, kv, coeffs, f):
    """f > 0 adds exactly f * prefill tokens, last, and only to a step that has both prefill
    chunks and decodes; pure prefill and decode-only steps keep their bits."""
    a, b, c, d, e = coeffs
    kv = max(kv, n)
    without = LinearLatency(a, b, c, d, e)
    with_f = LinearLatency(a, b, c, d, e, f)
    p = sum(ch for ch, _ in chunks)
    base = without.iteration_time(chunks, n, kv)
    assert with_f.iteration_time(chunks, n, kv) == (base + f * p if (n and p) else base)
    assert with_f.iteration_time(chunks, 0, 0) == without.iteration_time(chunks, 0, 0)
    if n:
        assert np.array_equal(with_f.decode_times(n, np.array([kv, kv + n])),
                              without.decode_times(n, np.array([kv, kv + n])))
    I, N = np.array([1, 77, 4096]), np.array([5, 1, 300])
    assert np.array_equal(with_f.alone_time(I, N), without.alone_time(I, N))   # alone: never mixed


def test_linear_f_must_be_non_negative():
    with pytest.raises(ValueError, match="f must be >= 0"):
        LinearLatency(0.01, 0.0, 0.0, 0.0, 0.0, -1e-6)


def test_linear_e_can_express_quadratic_cpu_prefill():
    """The measured CPU TTFTs (512 -> 74 ms, 1024 -> 178 ms, 2047 -> 726 ms) grow faster than
    linearly.  Fitted by relative least squares, a + e*pairs follows all three within 10 %;
    the best fit of what the four-term model can do for a prefill alone, a + (b + d)*P, is off
    by about 30 % and needs a negative a."""
    P = np.array([512, 1024, 2047])
    T = np.array([0.074, 0.178, 0.726])
    X = np.column_stack([np.ones(3), P * (P + 1) / 2])
    a, e = np.linalg.lstsq(X / T[:, None], np.ones(3), rcond=None)[0]
    assert a > 0 and e > 0
    m = LinearLatency(a, 0.0, 0.0, 0.0, e)
    for p, t in zip(P, T):
        assert m.prefill_time(int(p)) == pytest.approx(t, rel=0.10)
    X4 = np.column_stack([np.ones(3), P])
    a4, b4 = np.linalg.lstsq(X4 / T[:, None], np.ones(3), rcond=None)[0]
    assert a4 < 0 or max(abs((a4 + b4 * P) / T - 1)) > 0.2


def test_linear_describe_and_repr_include_e():
    m = LinearLatency(0.01, 1e-5, 2e-5, 3e-8, 4e-10)
    d = m.describe()
    json.dumps(d)
    assert d["e_s_per_prefill_attention_pair"] == 4e-10 and "c*(c+1)/2" in d["form"]
    back = eval(repr(m), {"LinearLatency": LinearLatency})
    assert (back.a, back.b, back.c, back.d, back.e) == (m.a, m.b, m.c, m.d, m.e)
    assert LinearLatency(0.01, 0, 0, 0).e == 0.0


def test_linear_defaults_track_calibrated_model():
    """The fitted defaults approximate the default calibrated model on typical decode steps."""
    cal, lin = CalibratedLatency(), LinearLatency(**LINEAR_DEFAULTS)
    for B, L in ((1, 512), (16, 1024), (64, 1024), (128, 2048), (256, 1024)):
        assert lin.iteration_time((), B, B * L) == pytest.approx(cal.iteration_time((), B, B * L), rel=0.15)


# --------------------------------------------------------------------------- alone time
def loop_alone(m, I, N):
    t = m.iteration_time(((I, 0),), 0, 0)
    for j in range(1, N):
        t += m.iteration_time((), 1, I + j)
    return t


@pytest.mark.parametrize("name", sorted(MODELS))
def test_alone_time_equals_loop_sum(name):
    m = MODELS[name]
    I = np.array([1, 5, 63, 64, 65, 300, 500, 505, 510, 511, 512, 513, 2000, 8000, 100])
    N = np.array([1, 7, 1, 2, 3, 500, 20, 7, 2, 1, 1, 9, 300, 192, 1000])
    got = m.alone_time(I, N)
    assert got.shape == I.shape and got.dtype == np.float64
    for i in range(len(I)):
        assert got[i] == pytest.approx(loop_alone(m, int(I[i]), int(N[i])), rel=1e-12, abs=0)


@settings(max_examples=60, deadline=None)
@given(name=model_names, I=st.integers(1, 4096), N=st.integers(1, 700))
def test_alone_time_property(name, I, N):
    m = MODELS[name]
    assert m.alone_time(np.array([I]), np.array([N]))[0] == pytest.approx(loop_alone(m, I, N), rel=1e-12)


def test_alone_time_input_checks():
    m = CalibratedLatency()
    assert m.alone_time(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).shape == (0,)
    assert m.alone_time(np.array([10.0]), np.array([3.0]))[0] == pytest.approx(loop_alone(m, 10, 3))
    with pytest.raises(ValueError):
        m.alone_time(np.array([0]), np.array([1]))
    with pytest.raises(ValueError):
        m.alone_time(np.array([1, 2]), np.array([1]))
    with pytest.raises(ValueError):
        m.alone_time(np.array([1.5]), np.array([1]))


# --------------------------------------------------------------------------- misc
def test_prefill_time_and_describe():
    m = CalibratedLatency()
    assert m.prefill_time(2048) == m.iteration_time(((2048, 0),), 0, 0)
    assert 0.15 < m.prefill_time(2048) < 0.16
    d = m.describe()
    json.dumps(d)
    assert d["model"] == "calibrated" and d["cpu_overhead_s"] == DEFAULT_CPU_OVERHEAD_S
    assert "7d47513363ec447a741ac5e47241580b47724fbf" in d["provenance"]["profile"]
    assert d["gqa_batching_factor"] == 1.0


def test_make_latency_model_from_config():
    m = make_latency_model(EngineConfig())
    assert isinstance(m, CalibratedLatency) and m.cpu_overhead_s == DEFAULT_CPU_OVERHEAD_S and m.lm_head
    m = make_latency_model(engine_config_from_dict({"latency": {"model": "linear", "a": 0.01}}))
    assert isinstance(m, LinearLatency) and (m.a, m.b, m.c, m.d, m.e) == (0.01, 0.0, 0.0, 0.0, 0.0)
    m = make_latency_model(engine_config_from_dict({"latency": {"model": "linear", "a": 0.01, "e": 1e-9}}))
    assert (m.a, m.e) == (0.01, 1e-9)
    m = make_latency_model(engine_config_from_dict({"latency": {"cpu_overhead_s": 0}}))
    assert m.iteration_time((), 1, 512) == pytest.approx(11.12e-3 + 0.689e-3, rel=0.005)


def test_calibrated_rejects_negative_overhead():
    with pytest.raises(ValueError):
        CalibratedLatency(cpu_overhead_s=-1e-3)


def test_chunked_prefill_costs_more_than_one_shot():
    """Splitting a prompt into chunks never makes the total cheaper (history re-read)."""
    m = CalibratedLatency()
    one = m.prefill_time(4096)
    chunks = sum(m.iteration_time(((512, 512 * i),), 0, 0) for i in range(8))
    assert chunks > one


# --------------------------------------------------------------------------- perturbations (§3.6)
@settings(max_examples=200, deadline=None)
@given(chunks=chunks_st, n=st.integers(0, 256), kv_per=st.integers(1, 4096),
       sp=st.floats(0.5, 2.0), sd=st.floats(0.5, 2.0), sa=st.floats(0.5, 2.0))
def test_scales_split_the_calibrated_step_into_prefill_and_decode_work(chunks, n, kv_per, sp, sd, sa):
    """A decode-only step's GPU time is multiplied by decode_scale, a prefill-only one's by
    prefill_scale, the CPU overhead by neither; a mixed step lies between the two, and attention
    alone moves with attention_scale."""
    base, gpu = CalibratedLatency(), CalibratedLatency(cpu_overhead_s=0.0)
    m = ScaledCalibratedLatency(prefill_scale=sp, decode_scale=sd)
    cpu = DEFAULT_CPU_OVERHEAD_S
    kv = n * kv_per
    if n:
        assert m.iteration_time((), n, kv) - cpu == pytest.approx(sd * gpu.iteration_time((), n, kv), rel=1e-12)
    if chunks:
        got = m.iteration_time(chunks, 0, 0) - cpu
        assert got == pytest.approx(sp * gpu.iteration_time(chunks, 0, 0), rel=1e-12)
    if chunks and n:
        lo, hi = sorted((sp, sd))
        t = gpu.iteration_time(chunks, n, kv)
        assert lo * t * (1 - 1e-12) <= m.iteration_time(chunks, n, kv) - cpu <= hi * t * (1 + 1e-12)
    att = ScaledCalibratedLatency(attention_scale=sa)
    no_att = CalibratedLatency(coeffs={**CALIBRATED_COEFFS, "decode_t0_short_ms": 0.0, "decode_t0_long_ms": 0.0,
                                       "decode_bw_bytes_per_s": math.inf, "prefill_t0_ms": 0.0,
                                       "prefill_eta_max": math.inf, "prefill_eta_hist": math.inf,
                                       "prefill_delta_ms_per_token": 0.0})
    attention = base.iteration_time(chunks, n, kv) - no_att.iteration_time(chunks, n, kv)
    moved = att.iteration_time(chunks, n, kv) - base.iteration_time(chunks, n, kv)
    assert moved == pytest.approx((sa - 1) * attention, rel=1e-9, abs=1e-15)


def test_scaled_linear_model_scales_its_token_terms_only():
    a, b, c, d, e, f = 0.01, 2e-5, 3e-5, 1e-7, 2e-10, 5e-6
    m = ScaledLinearLatency(a, b, c, d, e, f, prefill_scale=1.1, decode_scale=0.9, attention_scale=1.2)
    assert m.iteration_time((), 8, 4000) == pytest.approx(a + 0.9 * c * 8 + 1.2 * 0.9 * d * 4000, rel=1e-12)
    pairs = 100 * (2 * 50 + 100 + 1) // 2
    want = a + 1.1 * b * 100 + 1.2 * 1.1 * d * 150 + 1.1 * 1.2 * e * pairs
    assert m.iteration_time(((100, 50),), 0, 0) == pytest.approx(want, rel=1e-12)
    assert m.iteration_time(((100, 50),), 8, 4000) == pytest.approx(
        want + 0.9 * c * 8 + 1.2 * 0.9 * d * 4000 + 1.1 * f * 100, rel=1e-12)


def test_default_scales_build_the_unscaled_models():
    """At 1.0 the config builds the very models of before (their arithmetic untouched), and
    writes no scale key, so every store's engine hash stays what it was."""
    cfg = EngineConfig()
    assert type(make_latency_model(cfg)) is CalibratedLatency
    assert "prefill_scale" not in cfg.to_dict()["latency"]
    one = engine_config_from_dict({"latency": {"prefill_scale": 1.0, "decode_scale": 1, "attention_scale": 1.0}})
    assert one.config_hash() == cfg.config_hash()
    lin = engine_config_from_dict({"latency": {"model": "linear"}})
    assert type(make_latency_model(lin)) is LinearLatency
    scaled = engine_config_from_dict({"latency": {"decode_scale": 1.1}})
    assert type(make_latency_model(scaled)) is ScaledCalibratedLatency
    assert scaled.to_dict()["latency"]["decode_scale"] == 1.1 and scaled.config_hash() != cfg.config_hash()
    back = engine_config_from_dict(scaled.to_dict())
    assert back.config_hash() == scaled.config_hash()


@pytest.mark.parametrize("key", ["prefill_scale", "decode_scale", "attention_scale"])
@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "1.1", True])
def test_bad_scale_is_one_line(key, bad):
    from schedport.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^x\.toml: \[latency\] {key}: must be a number > 0") as e:
        engine_config_from_dict({"latency": {key: bad}}, source="x.toml")
    assert "\n" not in str(e.value)
