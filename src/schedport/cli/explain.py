"""`schedport explain`: why does a ranking flip? (typer lives only in schedport.cli)

The command parses its options, calls `schedport.api.explain` (which checks them, runs
`schedport.analysis.explain`, writes the file and prints nothing) and says what it found: the
JSON, or the verdict sentence and the run counts when it wrote a file; with ``--list``, the
reversals and their numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from schedport.cli.params import out_path_parser

# `schedport.analysis.explain` (numpy, pandas, scipy) is imported in the command, so that `schedport
# --help` starts at once; these are its DEFAULT_BOOT and the names of its FEATURES (a test checks them).
DEFAULT_BOOT = 1000
FEATURES = ("arrival", "burstiness", "input", "output", "coupling", "clients", "clients_removed")

__all__ = ["explain_command"]


def explain_command(
    results: Path = typer.Option(..., "--results", metavar="DIR", parser=out_path_parser,
                                 help="Results store written by `schedport run` (read only)."),
    reversal: Optional[int] = typer.Option(None, "--reversal", metavar="N",
                                           help="Number of a study-form reversal, strongest "
                                                                    "first (see --list; needs portability.json)."),
    pair: Optional[str] = typer.Option(None, "--pair", metavar="LIST",
                                       help="Scheduler pair A,B (with --metric, --region, --sources)."),
    metric: Optional[str] = typer.Option(None, "--metric", metavar="NAME",
                                         help="Metric of the comparison, e.g. ttft_p99_s."),
    region: Optional[str] = typer.Option(None, "--region", metavar="NAME",
                                         help="Region of the comparison, e.g. severe."),
    sources: Optional[str] = typer.Option(None, "--sources", metavar="LIST", help="The two sources X,Y compared."),
    out: Optional[Path] = typer.Option(None, "--out", metavar="FILE",
                                       help="Write the explanation JSON here (default: print it)."),
    list_only: bool = typer.Option(False, "--list", help="List the study form's reversals with their numbers "
                                                         "and stop."),
    corpus: Optional[Path] = typer.Option(None, "--corpus", metavar="DIR",
                                          help="Corpus directory (default: the one the store "
                                                                 "names)."),
    cache: Optional[Path] = typer.Option(None, "--cache", metavar="DIR",
                                         help="Variant windows and finished runs (default: "
                                                               "RESULTS/explain); reruns skip finished runs."),
    features: Optional[str] = typer.Option(None, "--features", metavar="LIST",
                                           help=f"Comma-separated features (default: all that "
                                                                    f"apply): {', '.join(FEATURES)}."),
    workers: Optional[int] = typer.Option(None, "--workers", metavar="N",
                                          help="Worker processes or local Ray CPUs (default: "
                                                                  "all cores)."),
    executor: str = typer.Option("local", "--executor", metavar="TEXT", help="local (process pool) or ray."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", metavar="TEXT",
                                              help="Existing Ray cluster (with --executor "
                                                                          "ray)."),
    n_boot: int = typer.Option(DEFAULT_BOOT, "--boot", metavar="N",
                               help="Window resamples for the intervals (the analysis's "
                                                            "default)."),
    seed: int = typer.Option(0, "--seed", metavar="N",
                             help="Bootstrap seed (the analysis's default, so resamples match)."),
) -> None:
    """Explain why a ranking flips: run the pair on hybrid windows that each take one traffic feature from the
    other source, and name the feature whose transplant reproduces the flip."""
    from schedport import api

    flist = [f.strip() for f in features.split(",") if f.strip()] if features is not None else None
    try:
        res = api.explain(results, reversal=reversal, pair=pair, metric=metric, region=region, sources=sources,
                          out=out, list_only=list_only, corpus_dir=corpus, cache_dir=cache, features=flist,
                          executor=executor, workers=workers, ray_address=ray_address, n_boot=n_boot, seed=seed)
    except KeyboardInterrupt:
        typer.echo("interrupted: every finished run is kept in the explain cache; rerun the same command to "
                   "resume", err=True)
        raise
    if list_only:
        revs = res.reversals
        if revs and "survival" in revs[0]:
            typer.echo(f"robust first: numbered by how many of the {revs[0]['n_variants']} engine variants each "
                       f"reversal survives, then by strength")
        for d in revs:
            surv = f"  [{d['class']}: {d['n_survived']}/{d['n_variants']} variants]" if "survival" in d else ""
            typer.echo(f"{d['id']:4d}  {d['metric']:<24} {d['pair']} @ {d['region']}: {d['source_a']} "
                       f"{d['effect_a']:+.3f}, {d['source_b']} {d['effect_b']:+.3f}{surv}")
        if not revs:
            typer.echo(f"{results}: the study form finds no cross-source reversal, so there is nothing to explain")
        return
    d = res.explanation
    if out is None:
        typer.echo(json.dumps(d, indent=1, allow_nan=False))
    else:
        typer.echo(d["verdict"]["sentence"])
        ri = d["run_info"]
        refused = ri.get("refused_cached_runs", 0)
        typer.echo(f"{ri['runs']} runs, {ri['capacities']} capacities, {ri['cached_runs']} cached, "
                   + (f"{refused} cached runs failed their checksum and were recomputed, " if refused else "")
                   + f"{ri['wall_s']:.1f} s; wrote {out}")
