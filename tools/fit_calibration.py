#!/usr/bin/env python3
"""Recompute schedport's calibrated latency coefficients from the shared calibration files.

Reads ``../shared/calibration/vidur-a100-llama3-8b`` (relative to the repository root,
override with ``--dir``):

* ``mlp.csv`` -- Vidur's raw non-attention profile for Llama-3-8B on an A100
  (microsoft/vidur@7d47513363ec447a741ac5e47241580b47724fbf; Agrawal et al., MLSys 2024).
  Its sha256 is checked against ``SHA256SUMS``.
* ``attention_decode_samples.csv`` / ``attention_prefill_samples.csv`` -- rows sampled
  from Vidur's FlashInfer attention profile.
* ``calibration.json`` -- only to *compare* our fit with its recommended values and to
  reproduce its section-5 prediction table; nothing is copied from it except the
  assumed constants it documents (KV-write cost, 312 TFLOP/s peak, 512-token split-KV
  threshold).

Every fit is least squares on *relative* error (scipy.optimize.least_squares /
lsq_linear), so short and long batches weigh alike.  The script prints each coefficient
with its fit error and its difference from calibration.json, the section-5 table
reproduced by `schedport.engine.core.latency.CalibratedLatency`, the fitted defaults of the linear
model, and finally the Python literals embedded in ``src/schedport/engine/core/latency.py``.

``--check`` exits non-zero if the embedded constants differ from a fresh fit by more
than 0.1 % (use it in CI after touching either side).

Usage:  .venv/bin/python tools/fit_calibration.py [--dir DIR] [--check]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, lsq_linear

from schedport.engine.core.profilefit import fit_roofline
from schedport.workload.datadir import sha256_file

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO.parent / "shared" / "calibration" / "vidur-a100-llama3-8b"

NUM_LAYERS = 32
HQ, HEAD_DIM, KV_HEADS, DTYPE = 32, 128, 8, 2
KV_READ_BYTES = 2 * KV_HEADS * HEAD_DIM * DTYPE  # 4096 B per token per layer
PEAK = 312e12  # A100 dense bf16/fp16 tensor-core peak (Vidur device_sku_config)
SPLIT_CTX = 512  # FlashInfer split-KV threshold on mean context (calibration.md section 3)
QUANT = 64
# Assumed KV-write constants (calibration.md section 3; not measurable from the profile).
KVWRITE_T0_MS, KVWRITE_BYTES, KVWRITE_BW = 0.003, 8192, 1.6e12
NONATTN_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
               "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
LM_HEAD_RATIO = 128256 / 28672  # vocab / (2*ffn): LM-head GEMM vs the gate+up GEMM, same K


def sig(x: float, digits: int = 6) -> float:
    """Round to `digits` significant digits (for the embedded literal)."""
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits - 1}e}")


def rel_err(pred: np.ndarray, obs: np.ndarray) -> tuple[float, float]:
    """(max, mean) absolute relative error in percent."""
    e = np.abs(np.asarray(pred) / np.asarray(obs) - 1.0) * 100
    return float(e.max()), float(e.mean())


def q(n):
    """Token count rounded up to the GEMM tile quantum above 64 tokens."""
    n = np.asarray(n, dtype=float)
    return np.where(n <= QUANT, n, QUANT * np.ceil(n / QUANT))


def verify(d: Path) -> dict[str, str]:
    """Check mlp.csv against SHA256SUMS; return the sha256 of every input file."""
    sums = {}
    for line in (d / "SHA256SUMS").read_text().splitlines():
        if line.strip():
            h, name = line.split()
            sums[name.lstrip("*")] = h
    out = {}
    for name in ("mlp.csv", "attention_decode_samples.csv", "attention_prefill_samples.csv"):
        h = sha256_file(d / name)
        if name in sums and sums[name] != h:
            sys.exit(f"{d / name}: sha256 {h} does not match SHA256SUMS ({sums[name]})")
        out[name] = h
    return out


def fit_nonattn(d: Path) -> tuple[dict, dict, pd.DataFrame]:
    """Fit max(T0, a + b*q(n)) to 32 x per-layer median op sums of mlp.csv (TP=1)."""
    m = pd.read_csv(d / "mlp.csv")
    m = m[m["num_tensor_parallel_workers"] == 1]
    m = m.assign(total=NUM_LAYERS * sum(m[f"time_stats.{op}.median"] for op in NONATTN_OPS))
    g = m.groupby("num_tokens")[["total", "time_stats.mlp_up_proj.median"]].mean()
    n = g.index.to_numpy(dtype=float)
    y = g["total"].to_numpy()

    (t0, a, b), _ = fit_roofline(n, y)     # the fit the deployment profiles use too
    pred = np.maximum(t0, a + b * q(n))
    small = n <= 8192
    rep = {"rows_tp1": int(len(m)), "distinct_n": int(len(n)), "err_all": rel_err(pred, y),
           "err_le_8192": rel_err(pred[small], y[small])}
    # Alternatives, reported only.
    r2 = least_squares(lambda p: (p[0] + p[1] * n) / y - 1, [7.0, 0.066])
    rep["alt_a_plus_bn"] = (list(r2.x), rel_err(r2.x[0] + r2.x[1] * n, y))
    return {"nonattn_T0_ms": t0, "nonattn_a_ms": a, "nonattn_b_ms_per_token": b}, rep, g


def fit_decode(d: Path, nonattn: dict) -> tuple[dict, dict]:
    """Fit per-layer decode attention t = t0(L) + B*L*4096/BW to the decode samples."""
    s = pd.read_csv(d / "attention_decode_samples.csv")
    B = s["batch_size"].to_numpy(dtype=float)
    L = s["kv_cache_size"].to_numpy(dtype=float)
    y = s["attn_decode_ms_per_layer"].to_numpy()
    long_ = L >= SPLIT_CTX
    byte_ms = B * L * KV_READ_BYTES * 1e3  # bytes -> ms once divided by BW in B/s

    def model(p):
        t0s, t0l, inv_tbps = p  # inv_tbps: 1/(BW in TB/s)
        return np.where(long_, t0l, t0s) + byte_ms * inv_tbps * 1e-12

    r = least_squares(lambda p: model(p) / y - 1, [0.008, 0.02, 0.6], x_scale=[0.01, 0.02, 0.6])
    t0s, t0l, inv = r.x
    pred = model(r.x)
    lin = np.maximum(nonattn["nonattn_T0_ms"], nonattn["nonattn_a_ms"] + nonattn["nonattn_b_ms_per_token"] * q(B))
    kvw = NUM_LAYERS * (KVWRITE_T0_MS + B * KVWRITE_BYTES / KVWRITE_BW * 1e3)
    it_pred = lin + NUM_LAYERS * pred + kvw
    it_obs = lin + NUM_LAYERS * y + kvw
    rep = {"rows": int(len(s)), "B_range": (int(B.min()), int(B.max())), "L_range": (int(L.min()), int(L.max())),
           "err_per_layer": rel_err(pred, y), "err_decode_only_iteration": rel_err(it_pred, it_obs)}
    return {"decode_t0_short_ms": t0s, "decode_t0_long_ms": t0l, "decode_bw_bytes_per_s": 1e12 / inv}, rep


def fit_prefill(d: Path) -> tuple[dict, dict]:
    """Fit fresh-prompt prefill (efficiency curve) and the history term to the prefill samples."""
    s = pd.read_csv(d / "attention_prefill_samples.csv").drop_duplicates()
    # Fresh prompts: k = 0.  The (416, 0) row is the k = 0 anchor of the chunked-prefill
    # sweep (416-token chunks over growing history); it is left out here, as in
    # calibration.json's 54-row fit, and the effect of keeping it is printed.
    fresh_all = s[s["kv_cache_size"] == 0]
    fresh = fresh_all[fresh_all["prefill_chunk_size"] != 416]

    def fit_fresh(df):
        c = df["prefill_chunk_size"].to_numpy(dtype=float)
        y = df["attn_prefill_ms_per_layer"].to_numpy()
        flops = 4 * HQ * HEAD_DIM * c * c / 2

        def model(p):
            t0, eta, ch = p
            return t0 + flops / (eta * PEAK) * 1e3 * (1 + ch / c)

        r = least_squares(lambda p: model(p) / y - 1, [0.008, 0.58, 1090.0], x_scale=[0.01, 0.5, 1000.0])
        return r.x, rel_err(model(r.x), y), len(df)

    (t0, eta, ch), err, nrows = fit_fresh(fresh)
    (t0b, etab, chb), errb, nrowsb = fit_fresh(fresh_all)

    hist = s[(s["kv_cache_size"] > 0) & (s["prefill_chunk_size"] >= 384)]
    c = hist["prefill_chunk_size"].to_numpy(dtype=float)
    k = hist["kv_cache_size"].to_numpy(dtype=float)
    y = hist["attn_prefill_ms_per_layer"].to_numpy()
    base = t0 + 4 * HQ * HEAD_DIM * c * c / 2 / (eta * PEAK) * 1e3 * (1 + ch / c)
    hflops = 4 * HQ * HEAD_DIM * c * k

    def hmodel(p):
        inv_eta, delta_us = p
        return base + hflops * inv_eta / PEAK * 1e3 + delta_us * 1e-3 * c

    r = least_squares(lambda p: hmodel(p) / y - 1, [1 / 0.54, 0.11])
    inv_eta, delta_us = r.x
    # c = 64 rows: not fitted, reported as a check.
    chk = s[(s["kv_cache_size"] > 0) & (s["prefill_chunk_size"] == 64)]
    c6 = chk["prefill_chunk_size"].to_numpy(dtype=float)
    k6 = chk["kv_cache_size"].to_numpy(dtype=float)
    p6 = (t0 + 4 * HQ * HEAD_DIM * c6 * c6 / 2 / (eta * PEAK) * 1e3 * (1 + ch / c6)
          + 4 * HQ * HEAD_DIM * c6 * k6 * inv_eta / PEAK * 1e3 + delta_us * 1e-3 * c6)
    rep = {"fresh_rows": nrows, "err_fresh": err,
           "with_416_row": {"rows": nrowsb, "t0_ms": t0b, "eta_max": etab, "c_half": chb, "err": errb},
           "hist_rows": int(len(hist)), "err_hist": rel_err(hmodel(r.x), y),
           "check_c64": rel_err(p6, chk["attn_prefill_ms_per_layer"].to_numpy())}
    return {"prefill_t0_ms": t0, "prefill_eta_max": eta, "prefill_c_half_tokens": ch,
            "prefill_eta_hist": 1 / inv_eta, "prefill_delta_ms_per_token": delta_us * 1e-3}, rep


def fit_lm_head(g: pd.DataFrame) -> tuple[dict, dict]:
    """Fit max(T0, a + b*q(S)) to the LM-head proxy (vocab/2ffn x profiled gate+up GEMM), S <= 1024."""
    S = g.index.to_numpy(dtype=float)
    y = g["time_stats.mlp_up_proj.median"].to_numpy() * LM_HEAD_RATIO
    sel = S <= 1024
    S, y = S[sel], y[sel]

    (t0, a, b), err = fit_roofline(S, y)
    return ({"lm_head_T0_ms": t0, "lm_head_a_ms": a, "lm_head_b_ms_per_seq": b}, {"rows": int(len(S)), "err": err})


def linear_grid(capacity_tokens: int) -> list[tuple[tuple, int, int, str]]:
    """'Typical batches' for the linear-model fit: (prefill_chunks, n_decode, decode_kv, group)."""
    rows = []
    for B in (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256):
        for L in (128, 256, 512, 1024, 2048, 4096):
            if B * L <= capacity_tokens:
                rows.append(((), B, B * L, "decode-only"))
    for c in (16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192):
        rows.append((((c, 0),), 0, 0, "prefill-only"))
    for c in (128, 256, 512, 1024, 2048):
        for k in (0, 2048):
            for B in (4, 16, 64, 128, 256):
                for L in (512, 2048):
                    if B * L + c + k <= capacity_tokens:
                        rows.append((((c, k),), B, B * L, "mixed"))
    return rows


def fit_linear(model, capacity_tokens: int) -> tuple[dict, dict]:
    """Relative-error least squares of a + b*P + c*n_decode + d*kv_read to `model` on the grid."""
    grid = linear_grid(capacity_tokens)
    X, y, groups = [], [], []
    for chunks, nd, kv, grp in grid:
        p = sum(c for c, _ in chunks)
        kv_read = kv + sum(k + c for c, k in chunks)
        X.append([1.0, p, nd, kv_read])
        y.append(model.iteration_time(chunks, nd, kv))
        groups.append(grp)
    X = np.array(X, dtype=float)
    y = np.array(y)
    groups = np.array(groups)
    A = X / y[:, None]
    r = lsq_linear(A, np.ones_like(y), bounds=([1e-6, 0, 0, 0], [np.inf] * 4))
    a, b, c, d = r.x
    pred = X @ r.x
    rep = {"rows": int(len(y)), "err_all": rel_err(pred, y)}
    for grp in ("decode-only", "prefill-only", "mixed"):
        sel = groups == grp
        rep[f"err_{grp}"] = rel_err(pred[sel], y[sel])
    return {"a": a, "b": b, "c": c, "d": d}, rep


def pct(ours: float, theirs: float) -> str:
    return f"{(ours / theirs - 1) * 100:+.2f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="calibration directory")
    ap.add_argument("--check", action="store_true",
                    help="fail if the constants embedded in schedport.engine.core.latency differ from this fit "
                         "by > 0.1%%")
    args = ap.parse_args(argv)
    d: Path = args.dir
    hashes = verify(d)
    calib = json.loads((d / "calibration.json").read_text())

    print(f"# inputs in {d}")
    for name, h in hashes.items():
        print(f"  {name}: sha256 {h}")
    print("  (mlp.csv matches SHA256SUMS)")

    nonattn, rep_n, g = fit_nonattn(d)
    rec = calib["linear_ops"]["recommended"]
    print(f"\n## non-attention, 32 layers, TP=1 ({rep_n['rows_tp1']} rows, {rep_n['distinct_n']} distinct n)")
    print("   form: max(T0, a + b*q(n)), q(n) = n if n <= 64 else 64*ceil(n/64)")
    for key, ref in (("nonattn_T0_ms", rec["T0_ms"]), ("nonattn_a_ms", rec["a_ms"]),
                     ("nonattn_b_ms_per_token", rec["b_ms_per_token"])):
        print(f"   {key} = {nonattn[key]:.6g}   (calibration.json {ref}: {pct(nonattn[key], ref)})")
    print("   rel. error n=1..32768 max %.1f%% mean %.2f%%; n<=8192 max %.1f%% mean %.2f%%"
          % (*rep_n["err_all"], *rep_n["err_le_8192"]))
    (aa, bb), e = rep_n["alt_a_plus_bn"]
    print(f"   (alternative a + b*n: a={aa:.4f} b={bb:.5f}, max {e[0]:.1f}% mean {e[1]:.2f}%)")

    dec, rep_d = fit_decode(d, nonattn)
    cd = calib["attention"]["decode"]
    print(f"\n## decode attention per layer ({rep_d['rows']} rows, B {rep_d['B_range']}, L {rep_d['L_range']})")
    print("   form: t0(L) + B*L*4096 B / BW, t0 long when mean L >= 512")
    print(f"   t0_short = {dec['decode_t0_short_ms'] * 1e3:.3f} us, t0_long = {dec['decode_t0_long_ms'] * 1e3:.3f} us, "
          f"BW = {dec['decode_bw_bytes_per_s'] / 1e12:.4f} TB/s")
    print(f"   vs calibration.json: t0_short {pct(dec['decode_t0_short_ms'], cd['t0_small_ms'])}, "
          f"t0_long {pct(dec['decode_t0_long_ms'], cd['t0_split_ms'])}, "
          f"BW {pct(dec['decode_bw_bytes_per_s'] / 1e12, cd['BW_eff_TBps'])}")
    print("   rel. error per layer max %.1f%% mean %.1f%%; decode-only iteration max %.1f%% mean %.1f%%"
          % (*rep_d["err_per_layer"], *rep_d["err_decode_only_iteration"]))

    pre, rep_p = fit_prefill(d)
    print(f"\n## prefill attention per layer")
    print(f"   fresh (k=0, {rep_p['fresh_rows']} rows): t0 = {pre['prefill_t0_ms'] * 1e3:.3f} us, "
          f"eta_max = {pre['prefill_eta_max']:.4f}, c_half = {pre['prefill_c_half_tokens']:.1f}; "
          "max %.1f%% mean %.1f%%" % rep_p["err_fresh"])
    w = rep_p["with_416_row"]
    print(f"   (keeping the (416,0) row, {w['rows']} rows: t0 = {w['t0_ms'] * 1e3:.3f} us, "
          f"eta_max = {w['eta_max']:.4f}, "
          f"c_half = {w['c_half']:.1f}; max {w['err'][0]:.1f}% mean {w['err'][1]:.1f}%)")
    print(f"   history (k>0, {rep_p['hist_rows']} rows): eta_hist = {pre['prefill_eta_hist']:.4f}, "
          f"delta = {pre['prefill_delta_ms_per_token'] * 1e3:.4f} us/token; max %.1f%% mean %.1f%%" % rep_p["err_hist"])
    print("   check, c=64 rows (not fitted): max %.1f%% mean %.1f%%" % rep_p["check_c64"])
    cf, chh = calib["attention"]["prefill_fresh_k0"], calib["attention"]["prefill_with_history"]
    print(f"   vs calibration.json: t0 {pct(pre['prefill_t0_ms'], cf['t0_ms'])}, "
          f"eta_max {pct(pre['prefill_eta_max'], cf['eta_max'])}, "
          f"c_half {pct(pre['prefill_c_half_tokens'], cf['c_half_tokens'])}, "
          f"eta_hist {pct(pre['prefill_eta_hist'], chh['eta_hist'])}, "
          f"delta {pct(pre['prefill_delta_ms_per_token'] * 1e3, chh['delta_us_per_token'])}")

    lm, rep_l = fit_lm_head(g)
    print(f"\n## LM head estimate ({LM_HEAD_RATIO:.4f} x mlp_up_proj median, S = 1..1024, {rep_l['rows']} rows)")
    print(f"   max(T0, a + b*q(S)): T0 = {lm['lm_head_T0_ms']:.4f} ms, a = {lm['lm_head_a_ms']:.4f} ms, "
          f"b = {lm['lm_head_b_ms_per_seq'] * 1e3:.4f} us/seq; max %.1f%% mean %.1f%%" % rep_l["err"])
    lmref = calib["optional_vllm_extras_not_in_vidur"]["lm_head"]
    for S in (1, 64, 256):
        ours = max(lm["lm_head_T0_ms"], lm["lm_head_a_ms"] + lm["lm_head_b_ms_per_seq"] * float(q(S)))
        print(f"   S={S}: {ours:.3f} ms vs calibration.json {lmref[f'S{S}_ms']} ms ({pct(ours, lmref[f'S{S}_ms'])})")

    coeffs = {
        **{k: sig(v) for k, v in nonattn.items()}, "token_quantum": QUANT,
        **{k: sig(v) for k, v in dec.items()}, "decode_split_ctx": SPLIT_CTX,
        **{k: sig(v) for k, v in pre.items()}, "peak_flops": PEAK,
        "kvwrite_t0_ms": KVWRITE_T0_MS, "kvwrite_bytes_per_token": KVWRITE_BYTES, "kvwrite_bw_bytes_per_s": KVWRITE_BW,
        **{k: sig(v) for k, v in lm.items()},
    }
    # Keep the literal's key order identical to latency.py's.
    from schedport.engine.core import latency

    coeffs = {k: coeffs[k] for k in latency.CALIBRATED_COEFFS}

    # Reproduce calibration.md section 5 ("total (Vidur scope)": no CPU, no LM head).
    print("\n## calibration.md section 5, 'total (Vidur scope)' reproduced (cpu 0, LM head off)")
    gpu = latency.CalibratedLatency(cpu_overhead_s=0.0, lm_head=False, coeffs=coeffs)
    worst = 0.0
    for row in calib["predictions_ms"]:
        P, Bd, Lc = row["prefill_tokens"], row["decode_seqs"], row["mean_ctx"]
        chunks = ((P, 0),) if P else ()
        ours = gpu.iteration_time(chunks, Bd, Bd * Lc) * 1e3
        ref = row["total_gpu_vidur_scope_ms"]
        worst = max(worst, abs(ours / ref - 1))
        print(f"   prefill {P:5d} decode {Bd:3d} ctx {Lc:5d}: ours {ours:8.2f} ms, "
              f"table {ref:8.2f} ms ({pct(ours, ref)})")
    print(f"   worst difference {worst * 100:.2f}%")

    default = latency.CalibratedLatency(cpu_overhead_s=latency.DEFAULT_CPU_OVERHEAD_S, lm_head=True, coeffs=coeffs)
    cap_tokens = 28437 * 16
    lin, rep_lin = fit_linear(default, cap_tokens)
    print("\n## linear defaults: fit of the default calibrated model "
          f"(cpu {latency.DEFAULT_CPU_OVERHEAD_S * 1e3:g} ms, "
          f"LM head on) over {rep_lin['rows']} typical batches")
    print(f"   a = {lin['a'] * 1e3:.4f} ms, b = {lin['b'] * 1e6:.4f} us/prefill token, "
          f"c = {lin['c'] * 1e6:.4f} us/decode seq, d = {lin['d'] * 1e9:.4f} ns/KV token")
    for key in ("err_all", "err_decode-only", "err_prefill-only", "err_mixed"):
        print(f"   {key}: max {rep_lin[key][0]:.1f}% mean {rep_lin[key][1]:.1f}%")

    lin_lit = {k: sig(v) for k, v in lin.items()}
    report_lit = {"rows": rep_lin["rows"]}
    for key in ("err_all", "err_decode-only", "err_prefill-only", "err_mixed"):
        name = key.replace("err_", "").replace("-", "_")
        report_lit[f"{name}_max_rel_err_pct"] = round(rep_lin[key][0], 1)
        report_lit[f"{name}_mean_rel_err_pct"] = round(rep_lin[key][1], 1)

    print("\n## literals for src/schedport/engine/core/latency.py")
    print("CALIBRATED_COEFFS = {")
    for k, v in coeffs.items():
        print(f"    {k!r}: {v!r},")
    print("}")
    print("LINEAR_DEFAULTS = " + repr(lin_lit))
    print("LINEAR_FIT_REPORT = " + repr(report_lit))

    if args.check:
        bad = []
        for k, v in coeffs.items():
            e = latency.CALIBRATED_COEFFS[k]
            if abs(e - v) > 1e-3 * abs(v):
                bad.append(f"{k}: embedded {e} vs fit {v}")
        for k, v in lin_lit.items():
            e = latency.LINEAR_DEFAULTS[k]
            if abs(e - v) > 1e-3 * abs(v) + 1e-15:
                bad.append(f"linear {k}: embedded {e} vs fit {v}")
        if bad:
            print("\nCHECK FAILED:\n  " + "\n  ".join(bad))
            return 1
        print("\ncheck: embedded constants agree with this fit (<= 0.1%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
