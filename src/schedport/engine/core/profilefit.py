"""Fit deployment profiles (`schedport.engine.core.deployments`) from Vidur's published profiles.

Reads ``../shared/calibration/vidur-profiles`` (its README gives the columns, the MIT licence and
the citation: Agrawal et al., "Vidur", MLSys 2024, microsoft/vidur@7d47513), each file checked
against the directory's ``SHA256SUMS`` as the corpus checks its traces, every problem a one-line
`ProfileError` naming the file (missing, corrupt, a missing column, no rows for the TP degree).

The latency model is `CalibratedLatency`'s form, built the way the A100 calibration was
(``tools/fit_calibration.py``, docs/engine.md §3.1):

* **non-attention** (fit): ``max(T0, a + b*q(n))`` by least squares on relative error to
  ``num_layers`` x the per-layer sum of the ``*.median`` operator times (Vidur's model_time scope:
  no embedding) at the deployment's TP degree, duplicate ``num_tokens`` rows averaged. For
  TP > 1 each layer also runs two all-reduces of ``n * hidden * dtype`` bytes (after the attention
  output projection and after the MLP down projection, as Megatron-style TP does and Vidur
  models); their time is the measured all-reduce profile at that size (log-log interpolation of
  the median over sizes), added to the layer before the fit.
* **LM head** (fit to a proxy): ``(vocab / (2*ffn))`` x the profiled ``mlp_up_proj`` median at S
  sequences, S = 1..1024, the same proxy as the A100's.
* **attention and KV write** (assumed transfer): the A100 fit's efficiencies carried to the
  deployment's GPU with its data-sheet figures -- decode bandwidth ``BW_A100fit * HBM_gpu /
  HBM_A100``, prefill over the GPU's dense BF16 peak with the A100's eta curve, the KV write at
  the A100's assumed 1.6 TB/s scaled the same way -- with the heads split over the TP workers.
  Vidur's attention profiles are not mirrored, so this part has no fit error of its own.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from schedport.engine.core.deployments import DEPLOYMENT_SPECS, GPUS, MODELS, fitted_names
from schedport.engine.core.latency import CALIBRATED_COEFFS
from schedport.errors import SchedportError
from schedport.workload.datadir import sha256_file

__all__ = ["ProfileError", "NONATTN_OPS", "read_sums", "verified_csv", "fit_roofline", "allreduce_ms",
           "fit_deployment", "fit_all", "rel_err"]

#: Vidur's model_time scope: the per-layer operators summed (the embedding is left out).
NONATTN_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
               "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
#: GEMM tile quantum of the token count above 64 tokens (docs/engine.md §3.1).
QUANT = 64
#: The A100 the default calibration's attention efficiencies were fit on.
REFERENCE_GPU = "a100"


class ProfileError(SchedportError):
    """A profile file is missing, corrupt or lacks what the fit needs (one line)."""


def rel_err(pred, obs) -> tuple[float, float]:
    """(max, mean) absolute relative error in percent."""
    e = np.abs(np.asarray(pred, dtype=float) / np.asarray(obs, dtype=float) - 1.0) * 100
    return float(e.max()), float(e.mean())


def _q(n: np.ndarray) -> np.ndarray:
    return np.where(n <= QUANT, n, QUANT * np.ceil(n / QUANT))


def _sig(x: float, digits: int = 6) -> float:
    return x if x == 0 or not math.isfinite(x) else float(f"{x:.{digits - 1}e}")


def read_sums(data_dir: Path) -> dict[str, str]:
    """``SHA256SUMS`` of the profile directory: relative path -> sha256 (one-line error if absent)."""
    path = Path(data_dir) / "SHA256SUMS"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise ProfileError(f"{path}: cannot read the profiles' checksums ({why})") from None
    sums = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[0]) != 64:
            raise ProfileError(f"{path}: line {i}: not '<sha256>  <path>'")
        sums[parts[1].lstrip("*").removeprefix("./")] = parts[0]
    return sums


def verified_csv(data_dir: Path, rel: str, sums: dict[str, str], columns: tuple[str, ...]):
    """Read profile file `rel` after checking its sha256 against `sums`; (DataFrame, sha256).
    One-line `ProfileError` for a missing file, a checksum mismatch, a file not listed in the
    sums, unreadable CSV or a missing column."""
    import pandas as pd

    path = Path(data_dir) / rel
    if rel not in sums:
        raise ProfileError(f"{path}: not listed in {Path(data_dir) / 'SHA256SUMS'}")
    if not path.is_file():
        raise ProfileError(f"{path}: missing (the Vidur profiles: ../shared/calibration/vidur-profiles, README.md)")
    h = sha256_file(path)
    if h != sums[rel]:
        raise ProfileError(f"{path}: sha256 {h[:12]}... does not match SHA256SUMS ({sums[rel][:12]}...); "
                           "the file is corrupt or not Vidur's")
    try:
        df = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as e:
        raise ProfileError(f"{path}: unreadable CSV ({type(e).__name__})") from None
    for col in columns:
        if col not in df.columns:
            raise ProfileError(f"{path}: missing column {col!r}")
    for col in columns:
        # every column the fit reads is a time, a size or a count: a finite number > 0
        vals = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float)
        bad = ~(np.isfinite(vals) & (vals > 0))
        if bad.any():
            i = int(np.argmax(bad))
            raise ProfileError(f"{path}: line {i + 2}: column {col!r}: {str(df[col].iloc[i])!r} is not a finite "
                               "number > 0")
        df[col] = vals
    return df, h


def fit_roofline(n: np.ndarray, y: np.ndarray) -> tuple[tuple[float, float, float], tuple[float, float]]:
    """Fit ``max(T0, a + b*q(n))`` to (n, y) by least squares on relative error, the form and
    method of the A100 calibration's non-attention fit; ((T0, a, b), (max, mean) error %)."""
    from scipy.optimize import least_squares

    n = np.asarray(n, dtype=float)
    y = np.asarray(y, dtype=float)
    big = n >= n.max() / 2
    b0 = float(np.polyfit(n[big], y[big], 1)[0]) if big.sum() > 1 else float(y[-1] / n[-1])
    t00 = float(y[n <= 16].mean()) if (n <= 16).any() else float(y.min())
    a00 = max(t00 / 3, 1e-3)
    r = least_squares(lambda p: np.maximum(p[0], p[1] + p[2] * _q(n)) / y - 1, [t00, a00, b0],
                      x_scale=[t00, a00, max(b0, 1e-6)])
    t0, a, b = (float(v) for v in r.x)
    return (t0, a, b), rel_err(np.maximum(t0, a + b * _q(n)), y)


def allreduce_ms(net, tp: int, sizes_bytes: np.ndarray) -> np.ndarray:
    """Median all-reduce time (ms) over `tp` workers on one node at each size, log-log interpolated
    from the measured profile `net` (sizes outside the profile take its end values)."""
    sel = net[(net["num_workers"] == tp) & (net["devices_per_node"] == tp)]
    g = sel.groupby("size")["time_stats.all_reduce.median"].mean()
    xs = np.log(g.index.to_numpy(dtype=float))
    ys = np.log(g.to_numpy(dtype=float))
    return np.exp(np.interp(np.log(np.maximum(np.asarray(sizes_bytes, dtype=float), 1.0)), xs, ys))


def fit_deployment(data_dir: str | Path, name: str, sums: dict[str, str] | None = None) -> dict:
    """Fit deployment `name` from the profiles in `data_dir`: its coefficients (in
    `CalibratedLatency`'s keys), their labels, the fit errors and the files' provenance."""
    data_dir = Path(data_dir)
    sums = read_sums(data_dir) if sums is None else sums
    spec = DEPLOYMENT_SPECS[name]
    m, gpu, ref = MODELS[spec["model"]], GPUS[spec["gpu"]], GPUS[REFERENCE_GPU]
    tp, L = spec["tp"], m["num_layers"]
    rel = f"compute/{spec['gpu']}/{m['profile']}/mlp.csv"
    cols = tuple(f"time_stats.{op}.median" for op in NONATTN_OPS) + ("num_tokens", "num_tensor_parallel_workers")
    mlp, mlp_sha = verified_csv(data_dir, rel, sums, cols)
    rows = mlp[mlp["num_tensor_parallel_workers"] == tp]
    if rows.empty:
        raise ProfileError(f"{data_dir / rel}: no rows with num_tensor_parallel_workers = {tp}")
    layer = sum(rows[f"time_stats.{op}.median"] for op in NONATTN_OPS)
    files = {rel: mlp_sha}
    rows = rows.assign(layer=layer)
    g = rows.groupby("num_tokens")[["layer", "time_stats.mlp_up_proj.median"]].mean()
    n = g.index.to_numpy(dtype=float)
    per_layer = g["layer"].to_numpy()
    ar_note = "none (TP = 1)"
    if tp > 1:
        nrel = f"network/{spec['topology']}/all_reduce.csv"
        net, net_sha = verified_csv(data_dir, nrel, sums, ("time_stats.all_reduce.median", "num_workers",
                                                            "devices_per_node", "size"))
        if not ((net["num_workers"] == tp) & (net["devices_per_node"] == tp)).any():
            raise ProfileError(f"{data_dir / nrel}: no rows with num_workers = devices_per_node = {tp}")
        files[nrel] = net_sha
        ar = allreduce_ms(net, tp, n * m["hidden"] * m["dtype_bytes"])
        per_layer = per_layer + 2 * ar
        ar_note = (f"2 per layer of n*{m['hidden']}*{m['dtype_bytes']} B, {spec['topology']} at {tp} workers "
                   f"on one node: {ar[0]:.4f} ms at n = {int(n[0])}, {ar[-1]:.4f} ms at n = {int(n[-1])}")
    y = L * per_layer
    (t0, a, b), err = fit_roofline(n, y)
    # LM head proxy: the vocab-wide GEMM against the profiled gate+up GEMM (both split over TP).
    ratio = m["vocab"] / (2 * m["ffn"])
    sel = n <= 1024
    (h0, ha, hb), herr = fit_roofline(n[sel], g["time_stats.mlp_up_proj.median"].to_numpy()[sel] * ratio)
    cal = CALIBRATED_COEFFS
    bw_ratio = gpu["hbm_bytes_per_s"] / ref["hbm_bytes_per_s"]
    kv_read = 2 * (m["num_kv_heads"] // tp) * m["head_dim"] * m["dtype_bytes"]
    coeffs = {
        "nonattn_T0_ms": _sig(t0), "nonattn_a_ms": _sig(a), "nonattn_b_ms_per_token": _sig(b),
        "token_quantum": QUANT,
        "decode_t0_short_ms": cal["decode_t0_short_ms"], "decode_t0_long_ms": cal["decode_t0_long_ms"],
        "decode_split_ctx": cal["decode_split_ctx"],
        "decode_bw_bytes_per_s": _sig(cal["decode_bw_bytes_per_s"] * bw_ratio),
        "prefill_t0_ms": cal["prefill_t0_ms"], "prefill_eta_max": cal["prefill_eta_max"],
        "prefill_c_half_tokens": cal["prefill_c_half_tokens"], "prefill_eta_hist": cal["prefill_eta_hist"],
        "prefill_delta_ms_per_token": cal["prefill_delta_ms_per_token"],
        "peak_flops": gpu["bf16_dense_flops"],
        "kvwrite_t0_ms": cal["kvwrite_t0_ms"], "kvwrite_bytes_per_token": 2 * kv_read,
        "kvwrite_bw_bytes_per_s": _sig(cal["kvwrite_bw_bytes_per_s"] * bw_ratio),
        "lm_head_T0_ms": _sig(h0), "lm_head_a_ms": _sig(ha), "lm_head_b_ms_per_seq": _sig(hb),
    }
    a100 = "the A100 calibration's fit (docs/engine.md §3.1), carried over unchanged"
    labels = {
        "nonattn_T0_ms": "fit", "nonattn_a_ms": "fit", "nonattn_b_ms_per_token": "fit",
        "token_quantum": "assumed (the A100 calibration's GEMM tile quantum)",
        "decode_t0_short_ms": f"assumed: {a100}", "decode_t0_long_ms": f"assumed: {a100}",
        "decode_split_ctx": "assumed: FlashInfer's split-KV threshold, as on the A100",
        "decode_bw_bytes_per_s": f"assumed: the A100 fit's {cal['decode_bw_bytes_per_s'] / ref['hbm_bytes_per_s']:.4f} "
                                 f"of data-sheet bandwidth x {gpu['hbm_bytes_per_s'] / 1e9:g} GB/s (data sheet)",
        "prefill_t0_ms": f"assumed: {a100}", "prefill_eta_max": f"assumed: {a100}",
        "prefill_c_half_tokens": f"assumed: {a100}", "prefill_eta_hist": f"assumed: {a100}",
        "prefill_delta_ms_per_token": f"assumed: {a100}",
        "peak_flops": f"data sheet: {gpu['bf16_dense_flops'] / 1e12:g} TFLOP/s BF16 dense",
        "kvwrite_t0_ms": "assumed (as on the A100, calibration.md §3)",
        "kvwrite_bytes_per_token": f"arithmetic: 2 x 2 x {m['num_kv_heads']}/{tp} KV heads x {m['head_dim']} x "
                                   f"{m['dtype_bytes']} B per layer per GPU (the A100's 8192 B rule)",
        "kvwrite_bw_bytes_per_s": "assumed: the A100's assumed 1.6 TB/s x the data-sheet bandwidth ratio",
        "lm_head_T0_ms": "fit (to a proxy)", "lm_head_a_ms": "fit (to a proxy)",
        "lm_head_b_ms_per_seq": "fit (to a proxy)",
    }
    return {
        "name": name, "model": spec["model"], "model_label": m["label"], "gpu": spec["gpu"],
        "gpu_label": gpu["label"], "tp": tp, "topology": spec["topology"],
        "coeffs": coeffs, "labels": labels,
        "fit": {"nonattn_points": int(len(n)), "n_range": [int(n.min()), int(n.max())],
                "nonattn_err_pct": [round(err[0], 2), round(err[1], 2)],
                "lm_head_points": int(sel.sum()), "lm_head_err_pct": [round(herr[0], 2), round(herr[1], 2)],
                "allreduce": ar_note,
                "attention": "not fit: Vidur's attention profiles are not mirrored; the A100 fit's errors "
                             "(docs/engine.md §3.1) hold on the A100 only"},
        "provenance": {"source": "Vidur (Agrawal et al., MLSys 2024), microsoft/vidur@7d47513, data/profiling/",
                       "files": files, "datasheet": gpu["datasheet"],
                       "memory": gpu["memory_note"]},
    }


def fit_all(data_dir: str | Path) -> dict:
    """Every profiled deployment (`fitted_names`) fit from `data_dir` (what deployments.json embeds)."""
    sums = read_sums(Path(data_dir))
    return {"schema": 1, "deployments": {name: fit_deployment(data_dir, name, sums) for name in fitted_names()}}
