"""`schedport explain`: why does a ranking flip? (typer lives only in schedport.cli)

The command checks its options, calls `schedport.analysis.explain` (which returns the
explanation and prints nothing) and says what it found: the JSON, or the verdict sentence and the
run counts when it wrote a file.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Optional

import typer

from schedport.errors import SchedportError
from schedport.common.atomic import atomic_write_text
from schedport.common.guard import claim_dir, claim_file, dir_lock, json_with_keys
from schedport.common.outputs import io_error, output_file
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
    from schedport.analysis.explain import check_results_dir, explain, ranked_reversals, read_portability

    check_results_dir(results)
    if out is not None and out.exists() and out.is_dir():
        raise SchedportError(f"--out: {out} is a directory; give a file name (FILE.json)")
    if seed < 0:
        raise SchedportError(f"--seed must be >= 0, got {seed}")
    if n_boot < 1:
        raise SchedportError(f"--boot must be at least 1, got {n_boot}")
    if features is not None and not features.strip():
        raise SchedportError("--features: empty; give feature names, or leave the option out for all")
    if out is not None:
        claim_file(out, made_by=json_with_keys("verdict", "run_info"), command="schedport explain --out",
                   inputs=[results, corpus])
        output_file(out)
    if cache is not None:
        claim_dir(cache, {"explain"}, option="--cache", allow_other=False, inputs=[corpus], own=results)
    if list_only:
        revs = ranked_reversals(read_portability(results, hint=" first", store=results))
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
    flist = [f.strip() for f in features.split(",") if f.strip()] if features else None
    # the default cache is the store's own folder (RESULTS/explain): the store's lock while it is written
    hold = (dir_lock(results, "another schedport command (a run, or an analysis) is writing this results store "
                              "right now; wait for it to finish") if cache is None else contextlib.nullcontext())
    try:
        with hold:
            d = explain(results, reversal=reversal, pair=pair, metric=metric, region=region, sources=sources,
                        corpus_dir=corpus, cache_dir=cache, features=flist, executor=executor, workers=workers,
                        ray_address=ray_address, n_boot=n_boot, seed=seed)
    except KeyboardInterrupt:
        typer.echo("interrupted: every finished run is kept in the explain cache; rerun the same command to "
                   "resume", err=True)
        raise
    text = json.dumps(d, indent=1, allow_nan=False)
    if out is None:
        typer.echo(text)
    else:
        try:
            atomic_write_text(out, text + "\n")
        except OSError as e:
            raise io_error(out, e) from None
        typer.echo(d["verdict"]["sentence"])
        ri = d["run_info"]
        refused = ri.get("refused_cached_runs", 0)
        typer.echo(f"{ri['runs']} runs, {ri['capacities']} capacities, {ri['cached_runs']} cached, "
                   + (f"{refused} cached runs failed their checksum and were recomputed, " if refused else "")
                   + f"{ri['wall_s']:.1f} s; wrote {out}")
