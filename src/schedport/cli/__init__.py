"""The `schedport` command line.

Every command exits 0 on success and, on bad input, prints one line `error: ...` naming the
file, row/key and reason and exits 2 — never a traceback. That holds for usage errors (an
unknown option, a value of the wrong type) and for I/O failures (a full disk, a read-only
file system) too; output locations are checked before any work starts (`schedport.common.outputs`).
Help is rendered plainly (flags shown as flags, not as `<bool>` options).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from schedport.errors import SchedportError
from schedport.common.guard import claim_file
from schedport.common.outputs import cause, output_file
from schedport.cli.params import out_path_parser  # re-exported: the command modules import it from here

try:  # typer >= 0.2x vendors click; its exceptions are not click's
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - typer on top of an installed click
    from click import exceptions as _click_errors

#: The commands as `schedport --help` lists them: the study's pipeline, then the tools for one trace
#: or policy, then those that need a real server.
COMMAND_ORDER = ("corpus", "run", "analyze", "explain", "report", "simulate", "schedulers", "example", "trace",
                 "calibrate", "replay", "validate", "conformance")


class _PipelineOrder(TyperGroup):
    """The top-level group, listing its commands in `COMMAND_ORDER` (any other after them)."""

    def list_commands(self, ctx) -> list[str]:
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(super().list_commands(ctx), key=lambda name: rank.get(name, len(rank)))


class _Argument(TyperArgument):
    """A positional argument shown by its metavar alone (`FILE`), as options are, without typer's
    `<type>` beside it."""

    def display_type_rich(self, ctx) -> None:
        return None


class _Command(TyperCommand):
    """A command whose positional arguments are shown as `_Argument`s: one placeholder style."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for p in self.params:
            if type(p) is TyperArgument:
                p.__class__ = _Argument


app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, cls=_PipelineOrder,
                  help="Do LLM-serving scheduler rankings carry over across workloads, loads and metrics?")
trace_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Convert and check request traces.")
app.add_typer(trace_app, name="trace")


def _print_version(value: bool) -> None:
    """`--version`: print the package's version (`schedport.__about__`, a leaf module) and stop."""
    if value:
        from schedport.__about__ import __version__

        typer.echo(f"schedport {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, expose_value=False,
                                 help="Print schedport's version and exit."),
) -> None:
    # the options of `schedport` itself, before any command; the app's help is the Typer's
    pass


def _register() -> None:
    """Attach the stages' commands, each defined in its own module of this package (corpus,
    run, analyze, conformance, explain)."""
    from schedport.cli.analyze import analyze_command, report_command
    from schedport.cli.conformance import conformance_command
    from schedport.cli.corpus import corpus_app
    from schedport.cli.explain import explain_command
    from schedport.cli.study import run_command

    app.add_typer(corpus_app, name="corpus", help="Build, verify and list the frozen window corpus.")
    app.command("run", short_help="Run the study's simulations, resumable, then analyse them.")(run_command)
    app.command("analyze", short_help="Map where scheduler rankings hold and where they flip.")(analyze_command)
    app.command("conformance", short_help="Check the engine against vLLM's real scheduler, step for step.")(
        conformance_command)
    app.command("explain", short_help="Explain why a ranking flips, one traffic feature at a time.")(
        explain_command)
    app.command("report", short_help="Rewrite report.html and the study page from portability.json.")(
        report_command)


class _Console:
    """rich's Console for the commands' output, created on first use: importing rich at start-up
    would slow `schedport --help` and every command that prints plainly."""

    _console = None

    def __getattr__(self, name: str):
        if _Console._console is None:
            from rich.console import Console

            _Console._console = Console()
        return getattr(_Console._console, name)


out = _Console()

#: The largest `schedport example` trace: its columns take about 32 bytes a request while built.
MAX_EXAMPLE_REQUESTS = 100_000_000


_out_path = out_path_parser


@app.command(short_help="Simulate one trace under one scheduler.")
def simulate(
    trace: Path = typer.Option(..., "--trace", metavar="FILE", help="Canonical trace (CSV or Parquet)."),
    scheduler: str = typer.Option(..., "--scheduler", metavar="NAME",
                                  help="Policy name (see `schedport schedulers`), or your "
                                  "own as FILE.py:NAME or module:NAME (docs/own-scheduler.md)."),
    out_dir: Path = typer.Option(..., "--out", metavar="DIR",
                                 parser=_out_path, help="Directory for requests.parquet and summary.json."),
    engine: Optional[Path] = typer.Option(None, "--engine", metavar="FILE",
                                          help="Engine config TOML (defaults: docs/engine.md)."),
    load: Optional[float] = typer.Option(None, "--load", metavar="RHO",
                                         help="Scale time to offered load RHO vs capacity."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed for the policy's randomness (e.g. ltr's predictor)."),
    exact: bool = typer.Option(False, "--exact/--fast", help="--exact steps every iteration (the oracle; "
                               "slower); --fast, the default, fast-forwards with bit-identical results."),
    horizon: Optional[float] = typer.Option(None, "--horizon", metavar="SECONDS",
                                            help="Stop the simulation at S seconds."),
    region_def: Optional[str] = typer.Option(
        None, "--region-def", metavar="TEXT",
        help="What --load is relative to, as in `run`: 'sustainable' (the default), 'drain' or "
             "'slo[:PROFILE[:TARGET]]'."),
) -> None:
    """Simulate one trace under one scheduler; write per-request results and the run summary."""
    from schedport import api

    _say_reading(trace)
    t0 = time.perf_counter()
    res = api.simulate(trace, scheduler, engine=engine, load=load, seed=seed, exact=exact, horizon_s=horizon,
                       progress=_StepProgress("simulate"), region_def=region_def, out_dir=out_dir)
    s = res.summary
    wall = time.perf_counter() - t0
    out.print(f"{scheduler}: {s['n_completed']}/{s['n_requests']} completed, {s['n_rejected']} rejected, "
              f"TTFT p50 {_f(s['ttft_p50_s'])} s p99 {_f(s['ttft_p99_s'])} s, "
              f"TPOT p50 {_f(s['tpot_p50_s'])} s, {s['iterations']} iterations, "
              f"{s['preemptions']} preemptions  [{wall:.2f} s wall]")
    out.print(f"wrote {out_dir / 'requests.parquet'} and {out_dir / 'summary.json'}")
    why = api.unserved(res, trace)
    if why:
        raise SchedportError(why)


@app.command(short_help="Replay a trace against a real streaming server, open loop.")
def replay(
    endpoint: str = typer.Option(..., "--endpoint", metavar="URL",
                                 help="OpenAI-compatible server, e.g. http://127.0.0.1:8000."),
    trace: Path = typer.Option(..., "--trace", metavar="FILE", help="Canonical trace (CSV or Parquet)."),
    out_dir: Path = typer.Option(..., "--out", metavar="DIR",
                                 parser=_out_path, help="Directory for requests.parquet and summary.json."),
    engine: Path = typer.Option(..., "--engine", metavar="FILE",
                                help="The server's engine config (from `schedport calibrate`)."),
    scheduler: str = typer.Option("vllm-fcfs", "--scheduler", metavar="NAME",
                                  help="vllm-fcfs, sjf, spf, edf or ltr (as priorities)."),
    load: Optional[float] = typer.Option(None, "--load", metavar="RHO",
                                         help="Scale time to offered load RHO vs the engine's capacity."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed for prompts and ltr's predictor."),
    model: Optional[str] = typer.Option(None, "--model", metavar="NAME",
                                        help="Model id to request (default: the first served)."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", metavar="SECONDS",
                                          help="Seconds before a request counts as timed out."),
    max_lag: float = typer.Option(0.05, "--max-lag", metavar="SECONDS",
                                  help="Bound on the 99th-percentile send lag (s); beyond it the run fails."),
    retries: int = typer.Option(2, "--retries", metavar="N",
                                help="Replays of a run whose send lag broke the bound before failing."),
) -> None:
    """Replay a trace against a real streaming server, open loop; write the same files as simulate."""
    from schedport import api

    t0 = time.perf_counter()
    res = api.replay(endpoint, trace, out_dir, engine=engine, scheduler=scheduler, load=load, seed=seed, model=model,
                     request_timeout_s=request_timeout, max_lag_s=max_lag, retries=retries, log=out.print,
                     on_progress=_CountProgress("replay"))
    s = res.summary
    out.print(f"{scheduler} on {res.server.model}: {s['n_completed']}/{s['n_requests']} completed, "
              f"{s['n_rejected']} rejected, {s['n_error']} errors, {s['n_timeout']} timeouts, "
              f"{s['n_truncated']} truncated; TTFT p50 {_f(s['ttft_p50_s'])} s p99 {_f(s['ttft_p99_s'])} s, "
              f"TPOT p50 {_f(s['tpot_p50_s'])} s; send lag p99 {s['send_lag_p99_s'] * 1e3:.1f} ms  "
              f"[{time.perf_counter() - t0:.1f} s wall]")
    out.print(f"wrote {out_dir / 'requests.parquet'} and {out_dir / 'summary.json'}")
    failed = api.replay_failure(res, endpoint)
    if failed:
        raise SchedportError(failed)
    if not res.lag_ok:
        raise SchedportError(f"the client fell behind the schedule: send lag p99 "
                             f"{s['send_lag_p99_s'] * 1e3:.1f} ms > --max-lag {max_lag * 1e3:.0f} ms; "
                             f"the measurements are written but do not replay the trace faithfully")


@app.command(short_help="Fit the simulator's latency model and limits to a real server.")
def calibrate(
    endpoint: str = typer.Option(..., "--endpoint", metavar="URL",
                                 help="OpenAI-compatible vLLM server, e.g. http://127.0.0.1:8000."),
    out_path: Path = typer.Option(..., "--out", metavar="FILE", parser=_out_path, help="Engine config TOML to write."),
    model: Optional[str] = typer.Option(None, "--model", metavar="NAME", help="Model id (default: the first served)."),
    repeats: int = typer.Option(5, "--repeats", metavar="N", help="Repetitions per probe (the median is fitted)."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed of the probes' shuffled order."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", metavar="N",
                                               help="Known running-sequence cap (skip its probe)."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens", metavar="N",
                                                         help="Known token budget."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", metavar="N", help="Known context limit."),
    block_size: Optional[int] = typer.Option(None, "--block-size", metavar="N", help="Known KV block size."),
    num_gpu_blocks: Optional[int] = typer.Option(None, "--num-gpu-blocks", metavar="N",
                                                 help="Known number of KV blocks."),
    request_timeout: float = typer.Option(300.0, "--request-timeout", metavar="SECONDS",
                                          help="Seconds any one probe request may take before the calibration "
                                               "fails (the model list: at most 30)."),
) -> None:
    """Probe a running server and fit the simulator's linear latency model and engine limits to it."""
    from schedport import api

    t0 = time.perf_counter()
    cal = api.calibrate(endpoint, out_path, model=model, repeats=repeats, seed=seed, request_timeout_s=request_timeout,
                        log=out.print, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                        max_model_len=max_model_len, block_size=block_size, num_gpu_blocks=num_gpu_blocks)
    f = cal.fit
    out.print("limits: " + ", ".join(f"{k}={v}" for k, v in cal.limits.items()))
    out.print("latency: " + ", ".join(f"{k}={v:.3g}" for k, v in f.coef.items())
              + f"; R^2 {f.r2:.4f}, median |error| {100 * f.median_abs_rel_err:.1f}%, "
                f"max {100 * f.max_abs_rel_err:.1f}%  [{time.perf_counter() - t0:.0f} s]")
    out.print(f"wrote {out_path}")


@app.command(short_help="Simulate and replay the same runs; compare their rankings.")
def validate(
    endpoint: str = typer.Option(..., "--endpoint", metavar="URL",
                                 help="The real server (vLLM with --scheduling-policy priority)."),
    engine: Path = typer.Option(..., "--engine", metavar="FILE",
                                help="The server's engine config (from `schedport calibrate`)."),
    out_dir: Path = typer.Option(..., "--out", metavar="DIR",
                                 parser=_out_path, help="Directory for runs/, validation.json and validation.html."),
    trace: Optional[list[Path]] = typer.Option(None, "--trace", metavar="FILE",
                                               help="Trace file(s) to validate on (repeatable)."),
    corpus: Optional[Path] = typer.Option(None, "--corpus", metavar="DIR", help="A built corpus to take windows from."),
    windows: int = typer.Option(3, "--windows", metavar="N",
                                help="With --corpus: how many windows (round-robin over sources)."),
    max_requests: Optional[int] = typer.Option(None, "--max-requests", metavar="N",
                                               help="Replay only each window's first N requests."),
    schedulers: str = typer.Option("vllm-fcfs,sjf,spf,edf", "--schedulers", metavar="LIST",
                                   help="Comma-separated, expressible ones."),
    regions: str = typer.Option("light,moderate,high", "--regions", metavar="LIST",
                                help="Region names or name=rho, comma-separated."),
    seed: int = typer.Option(0, "--seed", metavar="N"),
    model: Optional[str] = typer.Option(None, "--model", metavar="NAME", help="Model id (default: the first served)."),
    threshold: float = typer.Option(0.05, "--threshold", metavar="NUMBER",
                                    help="Relative difference below which two runs tie."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", metavar="SECONDS",
                                          help="Seconds before a request times out."),
    max_lag: float = typer.Option(0.05, "--max-lag", metavar="SECONDS",
                                  help="Bound on the 99th-percentile send lag (s)."),
    retries: int = typer.Option(2, "--retries", metavar="N", help="Replays of a run whose send lag broke the bound."),
    repeats: int = typer.Option(1, "--repeats", metavar="N", help="Replays per run, in rounds; the median is compared "
                                "and the spread reported as the real engine's noise."),
    speed_probe: bool = typer.Option(True, "--speed-probe/--no-speed-probe",
                                     help="Before each replay, time a lone prompt against the engine config."),
    predicted: Optional[Path] = typer.Option(
        None, "--predicted", metavar="FILE",
        help="An analysis (portability.json) of a store run with --variants: validate exactly its strongest "
        "reversal and most stable ranking (their schedulers, regions and, with --corpus, sources); "
        "docs/validation.md."),
    min_completed: float = typer.Option(0.5, "--min-completed", metavar="NUMBER",
                                        help="Share of each replay's requests (not rejected by the server) that "
                                             "must complete; below it the validation fails."),
) -> None:
    """Simulate and replay the same runs on a real server; report errors and which rankings hold."""
    from schedport import api
    from schedport.analysis.validation_stats import summary_table_lines

    check = None
    if predicted is not None:
        check = api.read_predicted(predicted, corpus)
        for what, x in (("reversal", check["reversal"]), ("stable ranking", check["stable_ranking"])):
            if x:
                out.print(f"predicted {what}: {x['scheduler_pair']} on {x['metric']} at {x['region']}, survives "
                          f"{x['n_survived']} of {x['n_variants']} engine variants", markup=False, soft_wrap=True)
        if check["note"]:
            out.print(check["note"], markup=False, soft_wrap=True)
    res = api.validate(endpoint, engine, out_dir, traces=trace, corpus=corpus, windows=windows,
                       max_requests=max_requests, schedulers=schedulers, regions=regions, seed=seed, model=model,
                       threshold=threshold, request_timeout_s=request_timeout, max_lag_s=max_lag, retries=retries,
                       repeats=repeats, speed_probe=speed_probe, predicted=check, min_completed=min_completed,
                       log=out.print)
    for line in summary_table_lines(res.validation):
        typer.echo(line)
    out.print(f"wrote {res.validation_json} and {res.validation_html}")
    if not res.lag_ok:
        raise SchedportError("the client fell behind the schedule in at least one replay (see client_lag_ok "
                             "in validation.json); those runs do not replay the trace faithfully")


def _say_reading(path, big: int = 100 * 2**20) -> None:
    """One line on stderr before reading a large input, so a long read is not silence."""
    try:
        size = Path(path).stat().st_size
    except OSError:
        return
    if Path(path).is_file() and size >= big:
        typer.echo(f"reading {path} ({size / 2**30:.2f} GiB)...", err=True)


class _StepProgress:
    """Progress lines on stderr for a long simulation: none in its first 2 s, then one every 5 s."""

    FIRST_S, EVERY_S = 2.0, 5.0

    def __init__(self, label: str):
        self.label, self.t0 = label, time.monotonic()
        self.next = self.t0 + self.FIRST_S

    def __call__(self, now: float, arrived: int, total: int) -> None:
        t = time.monotonic()
        if t < self.next:
            return
        self.next = t + self.EVERY_S
        typer.echo(f"{self.label}: simulated {now:.1f} s, {arrived:,}/{total:,} requests arrived, "
                   f"{t - self.t0:.0f} s elapsed", err=True)


class _CountProgress(_StepProgress):
    """Progress lines on stderr for a long replay: requests finished so far."""

    def __call__(self, done: int, total: int) -> None:
        t = time.monotonic()
        if t < self.next and done < total:
            return
        if done == total and t - self.t0 < self.FIRST_S:
            return
        self.next = t + self.EVERY_S
        typer.echo(f"{self.label}: {done:,}/{total:,} requests finished, {t - self.t0:.0f} s elapsed", err=True)


def _f(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


@app.command(short_help="List the scheduling policies, or check your own.", cls=_Command)
def schedulers(
    check: Optional[list[str]] = typer.Argument(
        None, metavar="POLICY",
        help="Your own policies (FILE.py:NAME, module:NAME or NAME) to load and check: each is simulated on the "
             "example trace at rho 0.5, 1 and 1.6, fast and stepping every iteration, and must agree bit for bit."),
    engine: Optional[Path] = typer.Option(None, "--engine", metavar="FILE", help="Engine config TOML for the check."),
) -> None:
    """List the scheduling policies, one line each (built-in, then installed); or check your own."""
    from schedport.engine.policies.plugins import installed_policies, load_entry_point
    from schedport.engine.policies.schedulers import REGISTRY

    if check:
        from schedport import api

        for spec in check:
            res = api.check_policy(spec, engine=engine)
            typer.echo(f"{res.name}  {res.summary}  [{res.origin}]")
            typer.echo(res.check.summary())
        return
    eps = installed_policies()
    width = max(len(n) for n in [*REGISTRY, *eps])
    for name, p in REGISTRY.items():
        typer.echo(f"{name:<{width}}  {p.summary}")
    for name, ep in sorted(eps.items()):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "a package"
        try:
            summary = load_entry_point(ep).summary
        except SchedportError as e:
            summary = f"cannot be loaded: {e}"
        typer.echo(f"{name:<{width}}  {summary}  [installed: {dist}, {ep.value}]")


@app.command(short_help="Write the bundled synthetic example trace.")
def example(
    out_path: Path = typer.Option(Path("example-trace.csv"), "--out", metavar="FILE",
                                  parser=_out_path, help="Where to write the trace."),
    n: int = typer.Option(1000, "--requests", metavar="N", help="Number of requests."),
    seed: int = typer.Option(0, "--seed", metavar="N"),
) -> None:
    """Write the bundled synthetic example trace (project-generated, two clients)."""
    from schedport.workload.examples import make_example_trace
    from schedport.workload.trace import save_trace

    if n < 1:
        raise SchedportError(f"--requests must be at least 1, got {n}")
    if n > MAX_EXAMPLE_REQUESTS:
        raise SchedportError(f"--requests must be at most {MAX_EXAMPLE_REQUESTS:,} (about 3 GB of trace in memory), "
                             f"got {n:,}")
    from schedport.api import is_trace_file

    claim_file(out_path, made_by=is_trace_file, command="schedport example")
    output_file(out_path)
    save_trace(make_example_trace(n, seed), out_path)
    out.print(f"wrote {n} requests to {out_path}")


@trace_app.command("convert", short_help="Turn a public trace file into the canonical trace.", cls=_Command)
def trace_convert(
    inputs: list[Path] = typer.Argument(..., metavar="FILE", help="Input file(s) or folder (servegen)."),
    fmt: str = typer.Option(..., "--from", metavar="TEXT",
                            help="azure | burstgpt | servegen | jsonl | mooncake | canonical"),
    out_path: Path = typer.Option(..., "--out", metavar="FILE",
                                  parser=_out_path, help="Canonical CSV or Parquet to write."),
    start: Optional[float] = typer.Option(None, "--start", metavar="SECONDS",
                                          help="Window start, seconds from the file start."),
    duration: Optional[float] = typer.Option(None, "--duration", metavar="SECONDS", help="Window length in seconds."),
    rows: Optional[int] = typer.Option(None, "--rows", metavar="N", help="Take N requests from the start."),
    slot: Optional[int] = typer.Option(None, "--slot", metavar="N", help="servegen: 600 s slot start (seconds)."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="servegen: generation seed."),
    rate_scale: float = typer.Option(1.0, "--rate-scale", metavar="NUMBER",
                                     help="servegen: multiply every client's rate."),
    prefix: Optional[str] = typer.Option(None, "--prefix", metavar="MODE",
                                         help="burstgpt: 'sessions' derives the prefix identity from the "
                                              "sessions (an assumption; docs/corpus.md)."),
) -> None:
    """Turn a public trace file into the canonical trace, reporting what was dropped and why."""
    from schedport import api

    for p in inputs:
        _say_reading(p)
    res = api.convert_trace(list(inputs), fmt, out_path, start_s=start, duration_s=duration, rows=rows, slot_s=slot,
                            seed=seed, rate_scale=rate_scale, prefix=prefix)
    dropped = ", ".join(f"{k}={v}" for k, v in res.dropped.items() if v) or "none"
    out.print(f"wrote {res.n_requests} requests to {out_path}; dropped: {dropped}")
    if res.prefix:
        p = res.prefix
        out.print(f"prefix identity derived from sessions (assumed): {p['assumption']}, in blocks of "
                  f"{p['block_tokens']} tokens; {p['in_sessions']} of {p['requests']} requests in the files are in "
                  f"sessions; {p['contradicting']} of {p['requests']} requests "
                  f"({100 * p['contradicting_share']:.1f}%) contradict it and share nothing")
    if res.skipped:
        names = [s.split(":")[0] for s in res.skipped]
        out.print(f"skipped {len(names)}: {', '.join(names)} (see `sources.read(...).skipped` for why)")


@trace_app.command("check", cls=_Command)
def trace_check(path: Path = typer.Argument(..., metavar="FILE", help="Canonical trace to validate.")) -> None:
    """Validate a canonical trace and print its statistics."""
    from schedport import api

    _say_reading(path)
    t = api.trace_stats(path)
    out.print(f"{path}: {t.n_requests} requests over {t.span_s:.1f} s ({t.rate_rps:.2f} req/s); "
              f"input mean {t.input_mean:.0f} p99 {t.input_p99:.0f}; "
              f"output mean {t.output_mean:.0f} p99 {t.output_p99:.0f}")


def _fail(msg: str, code: int = 2) -> None:
    print(f"error: {' '.join(str(msg).split())}", file=sys.stderr)
    sys.exit(code)


def main() -> None:
    """Console entry point: run the app, turning user errors into one line and exit code 2.

    Usage errors (click's), user errors (`SchedportError`) and operating-system I/O errors
    (a full disk, a read-only file system, a missing permission) all end as one line
    ``error: ...`` on stderr; Ctrl-C ends with ``interrupted`` and exit code 130.
    """
    _register()
    try:
        rv = app(standalone_mode=False)
    except _click_errors.NoArgsIsHelpError as e:
        e.show()
        sys.exit(2)
    except _click_errors.UsageError as e:
        hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        _fail(e.format_message() + hint, e.exit_code)
    except _click_errors.ClickException as e:
        _fail(e.format_message(), e.exit_code)
    except SchedportError as e:
        _fail(str(e), e.exit_code)
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        _fail(f"{where}{cause(e)}", 2)
    except MemoryError:
        _fail("out of memory: the input is larger than this machine can hold; use a smaller selection", 2)
    except (KeyboardInterrupt, typer.Abort):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
