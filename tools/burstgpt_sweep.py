"""Sensitivity of the BurstGPT claims to what stays guessed in the modeled BurstGPT, and before/after.

    python tools/burstgpt_sweep.py summary STORE_OR_PORTABILITY [...]      # the figures of analysed studies
    python tools/burstgpt_sweep.py sweep --base STORE --scratch DIR [--windows N] [--n-boot B] [--workers W]

`summary` prints, per analysed study (a results store's ``portability.json``): the cross-source
Kendall tau per source pair (mean over the main metrics), the two BurstGPT claims (the lowest
BurstGPT pair's tau with its interval and verdict; reversals per main metric with how many have
BurstGPT on one side) and every claim's verdict.

`sweep` rebuilds only the modeled source under each point of `POINTS` (corpus spec options
``api_share``, ``api_arrival_cv``, ``api_response_median``; docs/corpus.md), runs the study's
schedulers and regions on its windows (``schedport run --sources burstgpt-modeled``), puts those
cells beside the base store's Azure and Bailian cells (unchanged: their windows do not depend on the
modeled source) and analyses the whole table (`compute_portability`, without the robustness
multiverse). It prints and writes ``DIR/sweep.json`` and ``DIR/sweep.md``: per point the API share
measured in the windows, the two claims, and how far the modeled source's mean ranks move from the
point ``published`` (mean and largest absolute change over schedulers, main metrics and regions).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

POINTS = [
    ("published", {"api_share": "published"}),
    ("api_share=0", {"api_share": 0.0}),
    ("api_share=0.25", {"api_share": 0.25}),
    ("api_share=0.5", {"api_share": 0.5}),
    ("api_share=0.75", {"api_share": 0.75}),
    ("api_cv=1.0", {"api_arrival_cv": 1.0}),
    ("api_cv=2.0", {"api_arrival_cv": 2.0}),
    ("api_resp_median=60", {"api_response_median": 60}),
    ("api_resp_median=150", {"api_response_median": 150}),
]


def _portability(p: str | Path) -> dict:
    from schedport.analysis.reader import read_portability

    return read_portability(p)


def summarize(res: dict) -> dict:
    """The figures the issue asks for, from one ``portability.json`` dict."""
    sf = res["study_form"]
    pairs: dict[str, list[float]] = {}
    for e in sf["cross_source_tau"]:
        if e.get("value") is not None:
            pairs.setdefault(f"{e['source_a']} vs {e['source_b']}", []).append(e["value"])
    claims = {c["id"]: c for c in sf["claims"]}
    rev = []
    for r in sf["reversals"]:
        bg = sum(v["n_reversals"] for k, v in r["by_source_pair"].items() if "burstgpt" in k)
        rev.append({"metric": r["metric"], "n_reversals": r["n_reversals"], "n_comparisons": r["n_comparisons"],
                    "share": r["share"], "with_burstgpt": bg})
    low = claims.get("burstgpt_low", {})
    return {"tau_by_pair": {k: float(np.mean(v)) for k, v in pairs.items()},
            "burstgpt_low": {"value": low.get("value"), "ci_low": low.get("ci_low"), "ci_high": low.get("ci_high"),
                             "verdict": low.get("verdict")},
            "reversals": rev, "verdicts": {k: c.get("verdict") for k, c in claims.items()}}


def _mean_ranks(res: dict, source: str) -> pd.Series:
    main = set(res["headline"]["main_metrics"])
    rk = pd.DataFrame(res["rankings"])
    rk = rk[(rk["source"] == source) & rk["metric"].isin(main)]
    return rk.set_index(["metric", "region", "scheduler"])["mean_rank"]


def _fmt_summary(name: str, s: dict) -> str:
    taus = ", ".join(f"{k} {v:.3f}" for k, v in s["tau_by_pair"].items())
    low = s["burstgpt_low"]
    rev = "; ".join(f"{r['metric']} {r['n_reversals']}/{r['n_comparisons']} ({r['with_burstgpt']} with BurstGPT)"
                    for r in s["reversals"])
    ver = ", ".join(f"{k} {v}" for k, v in s["verdicts"].items())
    lo = "n/a" if low["value"] is None else f"{low['value']:.3f} [{low['ci_low']:.3f}, {low['ci_high']:.3f}]"
    return (f"{name}\n  tau: {taus}\n  lowest BurstGPT pair: {lo} {low['verdict']}\n  reversals: {rev}\n"
            f"  verdicts: {ver}")


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")


def sweep(base: Path, scratch: Path, windows: int | None, n_boot: int, workers: int) -> list[dict]:
    """Run every point of `POINTS` against the base store (see the module docstring)."""
    from schedport.analysis.portability import compute_portability
    from schedport.analysis.store_loading import load_store
    from schedport.workload.corpus import load_corpus

    base_df, manifest = load_store(base)
    keep = base_df[~base_df["source"].astype(str).str.startswith("burstgpt")]
    out, ranks0 = [], None
    for name, opts in POINTS:
        d = scratch / name.replace("=", "-")
        spec = d / "spec.toml"
        d.mkdir(parents=True, exist_ok=True)
        o = ", ".join(f"{k} = {json.dumps(v)}" for k, v in opts.items())
        spec.write_text('schema = 1\nname = "burstgpt-sweep"\n[[sources]]\nname = "burstgpt-modeled"\n'
                        'adapter = "burstgpt-modeled"\nseed = 20240131\n'
                        f'options = {{ {o} }}\n'
                        'windows = { rule = "stratified", count = 40, days = 61, rows = 1000 }\n')
        py = [sys.executable, "-m", "schedport.cli"]
        _run([*py, "corpus", "build", "--spec", str(spec), "--out", str(d / "corpus")])
        sel = ["--windows", str(windows)] if windows else []
        _run([*py, "run", "--corpus", str(d / "corpus"), "--out", str(d / "store"), "--sources", "burstgpt-modeled",
              "--no-analyze", "--workers", str(workers), *sel])
        df, _ = load_store(d / "store")
        df = pd.concat([keep, df], ignore_index=True)
        df["corpus_sha256"] = manifest.get("corpus_sha256")
        res = compute_portability(df, manifest, n_boot=n_boot, robustness=False)
        corpus = load_corpus(d / "corpus")
        wins = [w for w in corpus.windows][: windows or None]
        cid = np.concatenate([corpus.trace(w.window_id).client_id for w in wins])
        s = summarize(res)
        s["point"], s["options"] = name, opts
        s["api_share_in_windows"] = float(np.mean([c.endswith("/API log") for c in cid]))
        r = _mean_ranks(res, "burstgpt-modeled")
        if ranks0 is None:
            ranks0 = r
        diff = (r - ranks0.reindex(r.index)).abs()
        s["mean_rank_shift"] = {"mean_abs": float(diff.mean()), "max_abs": float(diff.max())}
        print(_fmt_summary(f"{name} (API share in windows {s['api_share_in_windows']:.2f}, mean-rank shift "
                           f"{s['mean_rank_shift']['mean_abs']:.2f} mean / "
                           f"{s['mean_rank_shift']['max_abs']:.2f} max)", s),
              flush=True)
        out.append(s)
    (scratch / "sweep.json").write_text(json.dumps(out, indent=1))
    (scratch / "sweep.md").write_text(markdown(out))
    return out


def markdown(points: list[dict]) -> str:
    """The sweep as a Markdown table (one row per point)."""
    metrics = [r["metric"] for r in points[0]["reversals"]]
    head = ("| point | API share in windows | tau azure-burstgpt | tau bailian-burstgpt | lowest BurstGPT pair "
            "[95% CI] | claim | reversals with BurstGPT / all (" + ", ".join(metrics)
            + ") | mean-rank shift mean / max |\n|---|---:|---:|---:|---|---|---|---:|\n")
    rows = []
    for s in points:
        t = s["tau_by_pair"]
        ab = next((v for k, v in t.items() if k.startswith("azure") and "burstgpt" in k), float("nan"))
        bb = next((v for k, v in t.items() if k.startswith("bailian") and "burstgpt" in k), float("nan"))
        lo = s["burstgpt_low"]
        ci = "n/a" if lo["value"] is None else f"{lo['value']:.3f} [{lo['ci_low']:.3f}, {lo['ci_high']:.3f}]"
        rev = ", ".join(f"{r['with_burstgpt']}/{r['n_reversals']}" for r in s["reversals"])
        rows.append(f"| {s['point']} | {s['api_share_in_windows']:.2f} | {ab:.3f} | {bb:.3f} | {ci} | "
                    f"{lo['verdict']}; reversals {s['verdicts'].get('reversals')} | {rev} | "
                    f"{s['mean_rank_shift']['mean_abs']:.2f} / {s['mean_rank_shift']['max_abs']:.2f} |")
    return head + "\n".join(rows) + "\n"


def main() -> None:
    """Command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s1 = sub.add_parser("summary")
    s1.add_argument("paths", nargs="+")
    s2 = sub.add_parser("sweep")
    s2.add_argument("--base", type=Path, required=True)
    s2.add_argument("--scratch", type=Path, required=True)
    s2.add_argument("--windows", type=int, default=None)
    s2.add_argument("--n-boot", type=int, default=200)
    s2.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    if a.cmd == "summary":
        for p in a.paths:
            print(_fmt_summary(str(p), summarize(_portability(p))))
    else:
        sweep(a.base, a.scratch, a.windows, a.n_boot, a.workers)


if __name__ == "__main__":
    main()
