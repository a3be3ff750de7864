"""Corpus build speed, and the per-source statistics table for the README.

    python benchmarks/bench_corpus.py [--data-dir DIR] [--out DIR] [--spec FILE] [--repeats 1]

Builds the corpus (default: the packaged 120-window study) from the data directory into a
temporary folder (or --out) in a fresh process state, timing the whole build (reading the
public files, cutting or generating every window, writing the parquet files and the
manifest), then times `verify_corpus`. Target: <= 60 s for the study on a 2-core machine.
With --repeats N > 1 the later builds reuse the parsed files the adapters cache in-process
(the "warm" time, as a second build in the same session sees).

Then prints a Markdown table of per-source statistics: for each source (Azure split into its
conversation and code hours) the number of windows, and the mean over its windows of each
window's request count, mean rate, index of dispersion of per-second arrivals, and input and
output token mean / p50 / p99.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from schedport.workload.corpus import build_corpus, verify_corpus


def stats_table(corpus) -> str:
    """Markdown table: per source (and Azure part), means over windows of per-window statistics."""
    groups: dict[str, list] = {}
    for w in corpus.windows:
        key = w.source + (f" ({w.meta['label']})" if w.meta.get("label") else "")
        groups.setdefault(key, []).append(w.meta)
    cols = [("windows", None), ("requests", "n_requests"), ("rate req/s", "mean_rate_rps"),
            ("dispersion", "index_of_dispersion"), ("in mean", "input_mean"),
            ("in p50", "input_p50"), ("in p99", "input_p99"), ("out mean", "output_mean"),
            ("out p50", "output_p50"), ("out p99", "output_p99")]
    lines = ["| source | " + " | ".join(c for c, _ in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for name, metas in groups.items():
        cells = []
        for _, key in cols:
            if key is None:
                cells.append(str(len(metas)))
                continue
            v = float(np.mean([m[key] for m in metas]))
            cells.append(f"{v:.2f}" if key in ("mean_rate_rps", "index_of_dispersion")
                         else f"{v:,.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default=None, help="keep the corpus here (default: a temp dir)")
    ap.add_argument("--spec", default=None)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "corpus"
        times = []
        corpus = None
        for i in range(max(1, args.repeats)):
            t0 = time.perf_counter()
            corpus = build_corpus(args.spec, args.data_dir, out,
                                  progress=(lambda m: print(f"  {m}")) if i == 0 else None)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        problems = verify_corpus(out)
        t_verify = time.perf_counter() - t0
        assert corpus is not None
        print(f"build: {len(corpus.windows)} windows in {times[0]:.1f} s (cold, target <= 60 s)"
              + (f"; warm rebuilds {', '.join(f'{t:.1f}' for t in times[1:])} s" if len(times) > 1 else ""))
        print(f"verify: {'ok' if not problems else f'{len(problems)} problems'} in {t_verify:.1f} s")
        print(f"corpus_sha256 {corpus.corpus_sha256}")
        print((corpus.reproduction or {}).get("message", ""))
        print()
        print(stats_table(corpus))
        modeled = [s for s, v in corpus.manifest["sources"].items() if v.get("modeled")]
        if modeled:
            print()
            print(f"{', '.join(modeled)}: {corpus.manifest['sources'][modeled[0]]['label']}, "
                  "not the real BurstGPT trace.")


if __name__ == "__main__":
    main()
