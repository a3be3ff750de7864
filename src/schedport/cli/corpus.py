"""`schedport corpus build | verify | list | check-model`: the frozen window corpus from the command line.

The library is `schedport.workload.corpus` (build, verify, the manifest); ``list --regions`` adds
each window's capacity and per-region time-scale factor, measured by the engine and cached by the
study's capacity cache (`schedport.study.regions`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from schedport.cli.params import out_path_parser
from schedport.common.atomic import atomic_write_text
from schedport.common.guard import claim_file, json_with_keys
from schedport.common.outputs import output_dir, output_file, writing
from schedport.errors import SchedportError

# The library modules (numpy, pandas, the engine) are imported in each command, so that `schedport
# --help` starts at once; this default is `schedport.workload.corpus.DEFAULT_OUT` (a test checks it).
DEFAULT_OUT = Path("corpus")

corpus_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                         help="Build, verify and list the frozen corpus of workload windows.")


@corpus_app.command("build", short_help="Build the corpus and compare it with the frozen hashes.")
def build_cmd(
    spec: Optional[Path] = typer.Option(None, "--spec", metavar="FILE",
                                        help="Corpus spec TOML (default: the packaged 120-window study)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", metavar="DIR",
                                            help="Where the public files are (default: $SCHEDPORT_DATA, "
                                                 "../shared/datasets, the user cache)."),
    out: Path = typer.Option(DEFAULT_OUT, "--out", metavar="DIR", parser=out_path_parser,
                             help="Corpus directory to write (replaced atomically)."),
) -> None:
    """Build the corpus: cut every window, write windows/*.parquet and manifest.json, compare with the frozen hashes."""
    from schedport.workload.corpus import MODELED_ADAPTER, build_corpus, source_label

    output_dir(out, create=False)  # before reading (or downloading) any public file
    t0 = time.perf_counter()
    corpus = build_corpus(spec, data_dir, out, progress=typer.echo)
    dt = time.perf_counter() - t0
    counts = ", ".join(f"{s} {sum(1 for w in corpus.windows if w.source == s)}" for s in corpus.sources)
    typer.echo(f"built {len(corpus.windows)} windows ({counts}) in {dt:.1f} s -> {out}")
    typer.echo(f"corpus_sha256 {corpus.corpus_sha256}")
    rep = corpus.reproduction or {}
    for r in rep.get("sources", {}).values():
        typer.echo(f"  {r['message']}")
    typer.echo(rep.get("message", ""))
    for s in corpus.sources:
        if corpus.manifest["sources"].get(s, {}).get("modeled"):
            typer.echo(f"note: {s} is {source_label(MODELED_ADAPTER)}, not the real BurstGPT trace")


@corpus_app.command("verify", short_help="Recompute every hash of a corpus; exit 2 on any change.")
def verify_cmd(
    corpus_dir: Path = typer.Option(DEFAULT_OUT, "--corpus", metavar="DIR", help="Corpus directory."),
) -> None:
    """Recompute every hash; exit 2 with one line per problem if anything changed or is missing."""
    from schedport.workload.corpus import compare_expected, load_corpus, verify_corpus

    problems = verify_corpus(corpus_dir)
    if problems:
        for p in problems:
            typer.echo(f"FAIL {p}", err=True)
        typer.echo(f"error: corpus {corpus_dir} does not verify: {len(problems)} problem(s)", err=True)
        raise typer.Exit(2)
    corpus = load_corpus(corpus_dir)
    counts = ", ".join(f"{s} {sum(1 for w in corpus.windows if w.source == s)}" for s in corpus.sources)
    typer.echo(f"ok: {len(corpus.windows)} windows ({counts}) verified, corpus_sha256 "
               f"{corpus.corpus_sha256}")
    typer.echo(compare_expected(corpus.manifest)["message"])


@corpus_app.command("check-model", short_help="Hold the modeled BurstGPT against real BurstGPT rows.")
def check_model_cmd(
    rows: Optional[list[Path]] = typer.Option(None, "--rows", metavar="FILE",
                                              help="Real BurstGPT CSV (repeatable; default: the data mirror's "
                                                   "burstgpt-slices)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", metavar="DIR",
                                            help="Where the public files are (default: $SCHEDPORT_DATA, "
                                                 "../shared/datasets, the user cache)."),
    seed: int = typer.Option(0, "--seed", help="Virtual trace of the modeled sample."),
    json_out: Optional[Path] = typer.Option(None, "--json", metavar="FILE", help="Also write the result as JSON."),
) -> None:
    """Compare the modeled BurstGPT's Conversation stream with real rows: quantiles, KS, rank correlation,
    shares, sessions, verdict."""
    import json

    from schedport.workload.modelcheck import check_model

    if json_out is not None:   # a file this command wrote, or a new one; never one of its inputs
        claim_file(json_out, made_by=json_with_keys("verdict", "rule", "lengths", "real", "modeled"),
                   command="schedport corpus check-model --json", inputs=rows or [], option="--json")
        output_file(json_out, option="--json")
    res = check_model(rows, data_dir=data_dir, seed=seed)
    r = res.real
    typer.echo(f"real: {', '.join(f['name'] for f in r['files'])}: {r['conversation_rows']} Conversation rows "
               f"({r['conversation_kept']} with tokens), {r['api_rows']} API rows; modeled: v{res.modeled['version']}, "
               f"{res.modeled['kept']} Conversation requests ({res.modeled['days']} days, seed {res.modeled['seed']})")
    typer.echo(f"{'model':<8} {'length':<6} {'real p10/p50/p90/p99':<26} {'modeled p10/p50/p90/p99':<26} "
               f"{'KS':>6} {'bound':>6}  ok")
    for c in res.lengths:
        q = lambda v: "/".join(f"{x:.0f}" for x in v)  # noqa: E731
        typer.echo(f"{c.model:<8} {c.length:<6} {q(c.real_q):<26} {q(c.modeled_q):<26} {c.ks:6.3f} {c.bound:6.3f}  "
                   f"{'yes' if c.ok else 'NO'}")
    for c in res.intervals:
        typer.echo(f"{c.name} ({c.model}): real {c.real:.3f} [95% bootstrap {c.lo:.3f}, {c.hi:.3f}], modeled "
                   f"{c.modeled:.3f}  {'yes' if c.ok else 'NO'}")
    s = res.sessions
    if s.get("available"):
        rps, gap = s["requests_per_session"], s["inter_turn_gap_s"]
        typer.echo(f"sessions: {s['n_sessions']} over {s['n_rows']} rows; requests per session mean {rps['mean']:.2f}, "
                   f"median {rps['p50']:g}, p90 {rps['p90']:g}, max {rps['max']}, single {rps['single_share']:.0%}; "
                   f"inter-turn gap p10/p50/p90 {gap['p10']:.0f}/{gap['p50']:.0f}/{gap['p90']:.0f} s ({s['modeled']})")
    for n in res.notes:
        typer.echo(f"note: {n}")
    typer.echo(f"verdict: {res.verdict} (rule: {res.rule})")
    if json_out is not None:
        with writing(json_out):
            atomic_write_text(json_out, json.dumps(res.as_dict(), indent=1) + "\n")


def _fmt(v, nd: int = 1) -> str:
    if v is None:
        return "n/a"
    return f"{v:.{nd}f}"


@corpus_app.command("list", short_help="One line per window with its statistics.")
def list_cmd(
    corpus_dir: Path = typer.Option(DEFAULT_OUT, "--corpus", metavar="DIR", help="Corpus directory."),
    regions: bool = typer.Option(False, "--regions",
                                 help="Also show each window's capacity and time-scale factor per region."),
    engine: Optional[Path] = typer.Option(None, "--engine", metavar="FILE",
                                          help="Engine config TOML for --regions (default engine otherwise)."),
) -> None:
    """One line per window with its statistics (and, with --regions, capacity and scale factors)."""
    from schedport.engine.core.config import load_engine_config
    from schedport.study.regions import REGIONS, capacity_cache
    from schedport.workload.corpus import MODELED_ADAPTER, load_corpus, source_label

    corpus = load_corpus(corpus_dir)
    width = max(len(w.window_id) for w in corpus.windows)
    swidth = max(len(w.source) for w in corpus.windows)
    head = (f"{'window':<{width}}  {'source':<{swidth}}  {'n':>5}  {'dur_s':>7}  {'rate':>7}  "
            f"{'IoD':>6}  {'in_mean':>7} {'in_p50':>6} {'in_p99':>7}  {'out_mean':>8} "
            f"{'out_p50':>7} {'out_p99':>7}  {'dropped':>7}")
    regs: dict[str, float] = {}
    cache = cfg = None
    if regions:
        regs = dict(REGIONS)
        cfg = load_engine_config(engine)
        cache = capacity_cache(Path(corpus_dir) / "capacity-cache.json")
        head += f"  {'cap_rps':>8}" + "".join(f"  {n[:10]:>10}" for n in regs)
    typer.echo(head)
    for w in corpus.windows:
        m = w.meta
        line = (f"{w.window_id:<{width}}  {w.source:<{swidth}}  {m.get('n_requests', 0):>5}  "
                f"{_fmt(m.get('duration_s')):>7}  {_fmt(m.get('mean_rate_rps'), 3):>7}  "
                f"{_fmt(m.get('index_of_dispersion'), 2):>6}  {_fmt(m.get('input_mean'), 0):>7} "
                f"{_fmt(m.get('input_p50'), 0):>6} {_fmt(m.get('input_p99'), 0):>7}  "
                f"{_fmt(m.get('output_mean'), 0):>8} {_fmt(m.get('output_p50'), 0):>7} "
                f"{_fmt(m.get('output_p99'), 0):>7}  {m.get('n_dropped', 0):>7}")
        if regions:
            line += _region_cells(corpus, w, cfg, cache, regs)
        typer.echo(line)
    if cache is not None:
        try:
            cache.save()
        except OSError:
            pass
    for s in corpus.sources:
        if corpus.manifest.get("sources", {}).get(s, {}).get("modeled"):
            typer.echo(f"note: {s} is {source_label(MODELED_ADAPTER)}, not the real BurstGPT trace")
    if regions:
        typer.echo("region columns: time-scale factor bringing the window to that offered load rho "
                   f"({', '.join(f'{n} {r:g}' for n, r in regs.items())}); >1 stretches time (lighter)")


def _region_cells(corpus, w, cfg, cache, regs: dict[str, float]) -> str:
    """Capacity and per-region time-scale cells of one window (a `schedport.workload.corpus.Corpus`
    and its `Window`; "n/a" where undefined)."""
    from schedport.study.regions import time_scale

    tr = corpus.trace(w.window_id)
    try:
        cap = cache.capacity(tr, cfg, w.sha256)
        factors = [time_scale(tr, cap, rho) for rho in regs.values()]
    except SchedportError:
        return f"  {'n/a':>8}" + "".join(f"  {'n/a':>10}" for _ in regs)
    return f"  {cap:>8.3f}" + "".join(f"  {f:>10.4g}" for f in factors)
