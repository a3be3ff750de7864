"""`schedport conformance`: the engine against vLLM's real v1 scheduler, step for step
(`schedport.api.conformance`, which picks the cases and runs them; docs/validation.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

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

    from schedport import api
    from schedport.realengine.conformance import format_divergence, format_table

    con = Console()
    res = api.conformance(corpus, trace=trace, schedulers=scheduler, load=load, engine=engine, cases=cases,
                          modes=mode, vllm_python=vllm_python, data_dir=data_dir, out=out, console=con)
    con.print(f"vLLM {res.vllm_version}: {sum(r.agrees for r in res.results)} of {len(res.results)} case runs "
              f"identical", markup=False)
    for line in format_table(list(res.results)):
        con.print(line, markup=False, soft_wrap=True)
    for r in res.results:
        for line in format_divergence(r):
            con.print(line, markup=False, soft_wrap=True)
    if not res.agrees:
        raise typer.Exit(1)
