"""Synthetic results stores for the analysis and report tests (no simulation needed).

A value is base_m * window_factor * region_factor * (1 + spacing * quality_k)^(+-1) * noise, so
scheduler k's true quality is fixed (lower index = better) unless `spacing` is 0 (no true
differences). `plant` rewrites chosen cells after generation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

SCHEDULERS13 = ["edf", "fastserve", "hrrn", "ltr", "orca", "sarathi", "sjf", "slo-admission", "spf", "srpt",
                "static", "vllm-fcfs", "vtc"]
REGIONS6 = [("light", 0.3), ("moderate", 0.6), ("high", 0.8), ("near-saturation", 0.95), ("overload", 1.2),
            ("severe", 1.6)]
SOURCES3 = ["azure", "bailian", "burstgpt-modeled"]
SLO = ("strict", "standard", "relaxed")
# (name, base, direction): +1 higher is better
METRICS_FULL = (
    [("ttft_mean_s", 0.5, -1), ("ttft_p50_s", 0.3, -1), ("ttft_p90_s", 1.0, -1), ("ttft_p99_s", 2.0, -1),
     ("tpot_mean_s", 0.03, -1), ("tpot_p50_s", 0.025, -1), ("tpot_p99_s", 0.08, -1), ("e2e_mean_s", 6.0, -1),
     ("e2e_p99_s", 20.0, -1), ("norm_latency_mean_s", 0.05, -1), ("slowdown_mean", 2.0, -1),
     ("slowdown_jain", 0.6, 1), ("client_jain", 0.8, 1), ("throughput_rps", 4.0, 1),
     ("output_tokens_per_s", 800.0, 1), ("completed_within_horizon", 900.0, 1), ("n_rejected", 5.0, -1),
     ("preemptions", 20.0, -1)]
    + [(f"slo_attainment_{p}", 0.7, 1) for p in SLO] + [(f"goodput_{p}_rps", 3.0, 1) for p in SLO]
)
METRICS_MAIN = [m for m in METRICS_FULL if m[0] in (
    "ttft_p99_s", "tpot_p99_s", "e2e_mean_s", "goodput_standard_rps", "slo_attainment_standard", "slowdown_jain")]
MANIFEST = {"corpus_sha256": "c0ffee" * 10 + "abcd", "engine_config": {"engine": {"block_size": 16}},
            "engine_hash": "e" * 16, "package_version": "0.1.0", "git_commit": "deadbeef", "selectors": {},
            "started": "2026-01-01T00:00:00Z", "finished": "2026-01-01T01:00:00Z", "status": "complete"}


def make_runs(*, sources=SOURCES3, n_windows=8, regions=REGIONS6[:3], schedulers=SCHEDULERS13[:5],
              seeds=(0,), metrics=METRICS_MAIN, spacing=0.2, noise=0.02, seed=0,
              order=None, distinct_metrics=True) -> pd.DataFrame:
    """A runs table; `order(source, region_idx, metric) -> quality per scheduler` overrides the default.

    With little noise every metric would rank the schedulers identically in every window, which
    the analysis treats as one metric measured several times; `distinct_metrics` makes each metric
    after the first its own ranking by swapping the two worst schedulers' values in one window
    (a different (source, region, window) cell per metric).
    """
    rng = np.random.default_rng(seed)
    rows = []
    K = len(schedulers)
    for s in sources:
        wf = rng.lognormal(0, 0.5, n_windows)
        for w in range(n_windows):
            for ri, (rname, rho) in enumerate(regions):
                for k, sc in enumerate(schedulers):
                    for sd in seeds:
                        row = {"source": s, "window_id": w, "region": rname, "scheduler": sc, "seed": sd,
                               "rho": rho, "time_scale": 1.0 / rho}
                        for name, base, d in metrics:
                            qual = order(s, ri, name)[k] if order else k
                            f = (1 + spacing * qual) ** (-d)
                            v = base * wf[w] * (1 + ri) ** (-d) * f * rng.lognormal(0, noise)
                            row[name] = v
                        rows.append(row)
    df = pd.DataFrame(rows)
    if distinct_metrics and K >= 2:
        a, b = (schedulers[-2], schedulers[-1])
        cells = [(s, r[0], w) for s in sources for r in regions for w in range(n_windows)]
        for i, (name, _, _) in enumerate(metrics[1:]):
            s, r, w = cells[i % len(cells)]
            at = (df.source == s) & (df.region == r) & (df.window_id == w)
            ia, ib = at & (df.scheduler == a), at & (df.scheduler == b)
            va, vb = df.loc[ia, name].to_numpy(), df.loc[ib, name].to_numpy()
            df.loc[ia, name], df.loc[ib, name] = vb, va
    return df


def write_store(path: Path, runs: pd.DataFrame, manifest: dict | None = MANIFEST, parts: int = 2) -> Path:
    """Write `runs` as DIR/runs/ (a Parquet dataset in `parts` files) and DIR/manifest.json."""
    path = Path(path)
    (path / "runs").mkdir(parents=True, exist_ok=True)
    for i, chunk in enumerate(np.array_split(np.arange(len(runs)), parts)):
        if len(chunk):
            runs.iloc[chunk].to_parquet(path / "runs" / f"part-{i}.parquet", index=False)
    if manifest is not None:
        (path / "manifest.json").write_text(json.dumps(manifest))
    return path
