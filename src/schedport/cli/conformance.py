"""`schedport conformance`: the engine against vLLM's real v1 scheduler, step for step
(`schedport.realengine.conformance`; docs/validation.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer

from schedport.errors import SchedportError
from schedport.common.atomic import atomic_write_text
from schedport.common.guard import claim_file, json_with_keys
from schedport.common.outputs import output_file

# The engine, the traces and rich are imported in the command, so that `schedport --help` starts at
# once; these are the keys of `schedport.realengine.conformance.VLLM_POLICY` (a test checks it).
VLLM_SCHEDULERS = ("vllm-fcfs", "sjf", "spf", "edf")


def conformance_command(
    corpus: Path = typer.Option(Path("corpus"), "--corpus", metavar="DIR",
                                help="Corpus directory for the standard cases "
                                "(built from the public data if missing)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", metavar="DIR",
                                            help="Public data directory, used only to "
                                            "build a missing corpus."),
    trace: Optional[Path] = typer.Option(None, "--trace", metavar="FILE",
                                         help="Check your own trace instead of the standard "
                                         "cases (with --scheduler and --load)."),
    scheduler: str = typer.Option("vllm-fcfs", "--scheduler", metavar="LIST",
                                  help="With --trace: comma-separated schedulers "
                                  f"({', '.join(VLLM_SCHEDULERS)}, or your own FILE.py:NAME when it is a fixed, "
                                  "non-preemptive key: vLLM's priorities)."),
    load: Optional[float] = typer.Option(None, "--load", metavar="RHO",
                                         help="With --trace: offered load rho (default: the "
                                         "trace's own time axis)."),
    engine: Optional[Path] = typer.Option(None, "--engine", metavar="FILE",
                                          help="Engine config TOML (defaults: docs/engine.md)."),
    cases: Optional[str] = typer.Option(None, "--cases", metavar="LIST",
                                        help="Run only the standard cases whose name contains "
                                        "one of these comma-separated strings."),
    mode: str = typer.Option("exact,fast", "--mode", metavar="LIST",
                             help="Simulator modes to compare: exact, fast or both."),
    vllm_python: Optional[Path] = typer.Option(None, "--vllm-python", metavar="FILE", help="Interpreter with vLLM "
                                               "(default: $SCHEDPORT_VLLM_PYTHON or ./.venv-vllm)."),
    out: Optional[Path] = typer.Option(None, "--out", metavar="FILE", help="Also write the per-case results as JSON."),
) -> None:
    """Check the engine against vLLM's real v1 scheduler, step for step (docs/validation.md).

    Exits 0 when every case is bit-identical in every mode, 1 when some case differs, 2 on
    bad input."""
    from rich.console import Console

    from schedport.engine.core.config import load_engine_config
    from schedport.engine.runner import scaled
    from schedport.realengine.conformance import (Case, format_divergence, format_table, run_conformance,
                                                  standard_cases, vllm_policy)
    from schedport.workload import corpus as corpus_lib
    from schedport.workload.trace import load_trace

    con = Console()
    modes = tuple(m.strip() for m in mode.split(",") if m.strip())
    if not modes or any(m not in ("exact", "fast") for m in modes):
        raise SchedportError(f"--mode: must be exact, fast or exact,fast, got {mode!r}")
    cfg = load_engine_config(engine)
    if out is not None and out.is_dir():
        raise SchedportError(f"--out {out}: is a directory, not a file")
    if out is not None:   # a file this command wrote, or a new one; never inside a corpus or a store
        claim_file(out, made_by=json_with_keys("vllm_version", "results"), command="schedport conformance --out",
                   inputs=[corpus, trace])
        output_file(out)
    if trace is not None:
        if load is not None and not (load > 0 and math.isfinite(load)):
            raise SchedportError(f"--load must be a positive finite number, got {load}")
        tr = scaled(load_trace(trace), cfg, load=load)[0]
        names = [s.strip() for s in scheduler.split(",") if s.strip()]
        for s in names:
            vllm_policy(s)     # a one-line error for a scheduler vLLM's policies cannot run
        todo = [Case(f"{s}/{trace.name}" + (f"/rho{load}" if load else ""), tr, s, cfg) for s in names]
    else:
        if not corpus.exists():
            con.print(f"corpus {corpus} not found: building it from the public data first", markup=False)
            corpus_lib.build_corpus(spec=None, data_dir=data_dir, out=corpus)
        todo = standard_cases(corpus_lib.load_corpus(corpus), cfg)
        if cases:
            keys = [c.strip() for c in cases.split(",") if c.strip()]
            todo = [c for c in todo if any(k in c.name for k in keys)]
            if not todo:
                raise SchedportError(f"--cases {cases!r}: no standard case matches")
    results = run_conformance(todo, vllm_python, modes,
                              progress=lambda m: con.print(m, markup=False, soft_wrap=True))
    version = results[0].vllm_version if results else "?"
    con.print(f"vLLM {version}: {sum(r.agrees for r in results)} of {len(results)} case runs identical",
              markup=False)
    for line in format_table(results):
        con.print(line, markup=False, soft_wrap=True)
    for r in results:
        for line in format_divergence(r):
            con.print(line, markup=False, soft_wrap=True)
    if out is not None:
        try:
            atomic_write_text(out, json.dumps({"vllm_version": version, "results": [r.to_dict() for r in results]},
                                              indent=1))
        except OSError as e:
            raise SchedportError(f"--out {out}: cannot write: {e.strerror or e}") from None
    if not all(r.agrees for r in results):
        raise typer.Exit(1)
