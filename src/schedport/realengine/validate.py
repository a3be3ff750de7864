"""Hold the simulator to a real engine: simulate and replay the same runs, compare what they rank.

For each window x region x scheduler, `validate` simulates the window with the calibrated engine
and replays the same scaled arrivals (same seed) against the real server, then compares them
per request (TTFT/E2E error), per run (each metric's relative error), and per condition (does the
simulator rank the schedulers as the real engine does?). Its last word is the study's check:
every pairwise ranking the simulation predicts — stable across conditions, or flipping between
them — marked held or not held on the real engine (`schedport.analysis.validation_stats`).

A run's two halves are stored under ``OUT/runs/<window>/<region>/<scheduler>/{sim,real}/`` (repeated
replays in ``real-2/``, ``real-3/``...) with a
``cell.json`` naming the trace, engine, scale and seed, so an interrupted validation resumes
where it stopped (a real replay costs wall-clock time) and refuses to mix runs of another
engine or trace. Within a condition the schedulers run in a seeded shuffled order, so a slow
drift of the machine does not always favour the scheduler that runs first.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from schedport.__about__ import __version__
from schedport.analysis.validation_stats import (load_validation, median_request_table, median_summary,
                                                 rank_agreement, repeat_spread, request_errors, run_errors)
from schedport.engine.runner import atomic_write, load_scale, resolve_engine, simulate
from schedport.common.values import json_safe
from schedport.errors import SchedportError
from schedport.realengine import replay as replay_client   # looked up at call time: tests stand in for it
from schedport.workload.trace import Trace

#: Metrics compared per run and ranked per condition (all lower-is-better but throughput).
RUN_METRICS = ("ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s", "e2e_mean_s", "e2e_p99_s",
               "throughput_rps")
RANK_METRICS = ("ttft_mean_s", "e2e_mean_s", "ttft_p99_s", "e2e_p99_s")
DEFAULT_SCHEDULERS = ("vllm-fcfs", "sjf", "spf", "edf")
#: The share of a replay's requests (those the server did not reject as invalid) that must
#: complete for the replay to measure the server (`replay`'s own rule: not more than half fail).
MIN_COMPLETED = 0.5
CELL_KIND = "schedport-validation-cell"


@dataclass(frozen=True)
class NamedTrace:
    """A trace to validate on and the name its runs are filed under."""

    name: str
    trace: Trace


def corpus_traces(corpus_dir: str | Path, n_windows: int, sources: Sequence[str] | None = None) -> list[NamedTrace]:
    """`n_windows` windows of a built corpus, taken round-robin over its sources in manifest order
    (only `sources`, when given)."""
    from schedport.workload.corpus import load_corpus

    if n_windows < 1:
        raise SchedportError(f"--windows must be at least 1, got {n_windows}")
    corpus = load_corpus(corpus_dir)
    if sources is not None:
        missing = [s for s in sources if s not in corpus.sources]
        if missing:
            raise SchedportError(f"{corpus_dir}: has no source {', '.join(missing)} (the --predicted check's); "
                                 f"its sources: {', '.join(corpus.sources)}")
    by_source = {s: corpus.select(s) for s in corpus.sources if sources is None or s in sources}
    picked = []
    depth = 0
    while len(picked) < n_windows and any(depth < len(v) for v in by_source.values()):
        for s in by_source:
            if depth < len(by_source[s]) and len(picked) < n_windows:
                picked.append(by_source[s][depth])
        depth += 1
    return [NamedTrace(w.window_id, corpus.trace(w.window_id)) for w in picked]


def predicted_check(portability: dict, where: str = "portability.json") -> dict:
    """The study's real-engine check as the analysis predicts it (``simulator.predicted``, docs/
    validation.md): the strongest cross-source reversal and the most stable ranking whose schedulers
    a real server can run (`replay.EXPRESSIBLE`), each with its survival across the engine variants,
    and the schedulers, regions and sources a validation of exactly those two needs. A one-line
    `SchedportError` when the analysis has no simulator block or no such pair."""
    sim = portability.get("simulator") if isinstance(portability, dict) else None
    if not isinstance(sim, dict):
        raise SchedportError(f"{where}: has no simulator block; run `schedport run --variants uncertainty` and "
                             f"analyse that store first (docs/engine.md §3.6)")
    ok = set(replay_client.EXPRESSIBLE)

    def runnable(side: str) -> str | None:
        return next((x for x in side.split(" = ") if x in ok), None)

    rev = None
    for r in sim.get("reversals") or []:
        a, b = (runnable(side) for side in r["scheduler_pair"].split(" vs "))
        if a and b:
            rev = {**r, "run_a": a, "run_b": b}
            break
    stable = [x for x in sim.get("stable") or [] if x["winner"] in ok and x["loser"] in ok]
    stab = max(stable, key=lambda x: (x["survival"] or 0.0, x["strength"])) if stable else None
    if rev is None and stab is None:
        raise SchedportError(f"{where}: neither a reversal nor a stable ranking between schedulers a real server "
                             f"can run ({', '.join(replay_client.EXPRESSIBLE)})")
    rho = {r["name"]: r["rho"] for r in (portability.get("parameters") or {}).get("regions", [])}
    picks = [x for x in (rev, stab) if x]
    regions = {x["region"]: rho[x["region"]] for x in picks}
    scheds = list(dict.fromkeys(([rev["run_a"], rev["run_b"]] if rev else [])
                                + ([stab["winner"], stab["loser"]] if stab else [])))
    sources = list(dict.fromkeys(([rev["source_a"], rev["source_b"]] if rev else [])
                                 + (list(stab["effects"]) if stab else [])))
    named = sim.get("predicted") or {}
    strongest = named.get("strongest_reversal")
    note = ("" if rev is None or strongest is None or strongest["scheduler_pair"] == rev["scheduler_pair"] else
            f"the strongest reversal ({strongest['scheduler_pair']}) has a scheduler a real server cannot run; "
            f"this is the strongest one it can")
    return {"reversal": rev, "stable_ranking": stab, "schedulers": scheds, "regions": regions, "sources": sources,
            "note": note}


def head(trace: Trace, n: int | None) -> Trace:
    """The first `n` requests of `trace` (all when None): a window too long to replay in full
    keeps its local burst shape this way. A window's warm-up is kept whole in front of its first
    `n` measured requests (docs/corpus.md, "Warm caches"), as are its block ids."""
    if n is None or n >= len(trace) - trace.warmup:
        return trace
    if n < 2:
        raise SchedportError(f"--max-requests must be at least 2, got {n}")
    return trace.take(np.arange(trace.warmup + n))


def _cell_meta(nt: NamedTrace, cfg, region: str, rho: float, scale: float, scheduler: str, seed: int) -> dict:
    return {"kind": CELL_KIND, "trace": nt.name, "trace_sha256": nt.trace.content_sha256(),
            "engine_sha256": cfg.config_hash(), "region": region, "load": rho, "scale": scale,
            "scheduler": scheduler, "seed": seed}


@dataclass
class _Cell:
    """One (trace, region, scheduler): its directory, identity, simulation and real replays."""

    path: Path
    meta: dict
    old_meta: dict | None
    scale: float
    sim: object
    real: list = field(default_factory=list)


def _open_cell(out: Path, nt: NamedTrace, cfg, region: str, rho: float, sched: str, seed: int) -> _Cell:
    """The cell's directory checked against what it was run with, and its simulation."""
    path = out / "runs" / _safe(nt.name) / _safe(region) / sched
    scale = load_scale(nt.trace, rho, cfg)
    meta = _cell_meta(nt, cfg, region, rho, scale, sched, seed)
    old = _read_json(path / "cell.json")
    if old is not None and {k: old.get(k) for k in meta} != meta:
        changed = ", ".join(k for k in meta if old.get(k) != meta[k])
        raise SchedportError(f"{path / 'cell.json'}: this cell was run with another {changed} (a time scale "
                             f"moves with the capacity definition); use a new --out or remove {path}")
    sim = simulate(nt.trace, sched, engine=cfg, seed=seed, time_scale=scale)
    return _Cell(path, meta, old, scale, sim)


def _real_dir(cell: Path, rep: int) -> Path:
    """Where repeat `rep` (0-based) of a cell's replay lives: ``real``, ``real-2``, ``real-3``..."""
    return cell / ("real" if rep == 0 else f"real-{rep + 1}")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise SchedportError(f"{path}: unreadable ({e}); remove it to rerun that cell") from None


def _safe(name: str) -> str:
    return "".join(c if (c.isalnum() or c in "-_.=") else "_" for c in name)


def validate(endpoint: str, traces: Sequence[NamedTrace], out_dir: str | Path, *,
             engine, schedulers: Sequence[str] = DEFAULT_SCHEDULERS,
             regions: dict[str, float] | None = None, seed: int = 0, model: str | None = None,
             threshold: float = 0.05, request_timeout_s: float = 600.0, max_lag_s: float = 0.05,
             retries: int = 2, repeats: int = 1, speed_probe: Callable[[], float] | None = None,
             min_completed: float = MIN_COMPLETED, log: Callable[[str], None] = lambda s: None,
             predicted: dict | None = None) -> dict:
    """Simulate and replay every (trace, region, scheduler); write and return ``validation.json``.

    `engine` is the server's calibrated engine config; `regions` maps names to offered load
    rho (default: light, moderate, high). With `repeats` > 1 every cell is replayed that many
    times, in rounds (all cells once, then all again, each round in a fresh shuffled order),
    so a slow drift of the machine spreads over every scheduler; the real side of each
    comparison is then the median of the repeats, and their spread is reported as the real
    engine's own run-to-run error. `speed_probe` (e.g. `schedport.realengine.calibrate.speed_index` bound
    to the server and engine) is read before every replay and stored with it as
    ``speed_index``: the machine's speed at that moment against its calibration. Finished
    replays found in `out_dir` are reused when their `cell.json` matches (so a validation can
    be resumed, or extended with more repeats); a mismatch is a one-line error.

    ``completion`` in the result says whether every replay completed at least `min_completed`
    of its requests (`completion_check`); a validation that fails it compares the simulator
    with timeouts and errors, not with the server, and the command exits non-zero.
    """
    if not (isinstance(min_completed, (int, float)) and 0 < min_completed <= 1):
        raise SchedportError(f"--min-completed must be a share in (0, 1], got {min_completed}")
    cfg = resolve_engine(engine)
    regions = dict(regions or {"light": 0.3, "moderate": 0.6, "high": 0.8})
    _check_request(traces, schedulers, repeats)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(seed))
    cells: dict[tuple[str, str, str], _Cell] = {}
    server = None
    total = len(traces) * len(regions) * len(schedulers) * repeats
    k = 0
    for rep in range(repeats):
        for nt in traces:
            for region, rho in regions.items():
                order = list(schedulers)
                rng.shuffle(order)
                for sched in order:
                    k += 1
                    c = cells.get((nt.name, region, sched))
                    if c is None:
                        c = cells[(nt.name, region, sched)] = _open_cell(out, nt, cfg, region, rho, sched, seed)
                    rdir = _real_dir(c.path, rep)
                    real_summary = _read_json(rdir / "summary.json") if c.old_meta is not None else None
                    tag = f"[{k}/{total}] {nt.name} {region} (rho {rho:g}) {sched}"
                    if repeats > 1:
                        tag += f", repeat {rep + 1}/{repeats}"
                    if real_summary is None:
                        index = speed_probe() if speed_probe is not None else None
                        log(f"{tag}: replaying {len(nt.trace)} requests over {nt.trace.span_s * c.scale:.0f} s"
                            + (f" (machine speed index {index:.2f})" if index is not None else ""))
                        res = replay_client.replay(nt.trace, endpoint, engine=cfg, scheduler=sched, time_scale=c.scale,
                                     seed=seed, model=model, request_timeout_s=request_timeout_s,
                                     max_lag_s=max_lag_s, retries=retries, log=log)
                        if index is not None:
                            res.summary["speed_index"] = index
                        c.path.mkdir(parents=True, exist_ok=True)
                        if c.old_meta is None:
                            atomic_write(c.path / "cell.json",
                                          lambda p: Path(p).write_text(json.dumps(c.meta, indent=2)))
                            c.old_meta = c.meta
                        if not (c.path / "sim" / "summary.json").exists():
                            c.sim.save(c.path / "sim")
                        res.save(rdir)          # summary.json last: it marks the replay done
                        real_table, real_summary = res.requests, res.summary
                        server = {"model": res.server.model, "max_model_len": res.server.max_model_len}
                    else:
                        log(f"{tag}: done before, reused")
                        real_table = pd.read_parquet(rdir / "requests.parquet")
                        server = server or {"model": real_summary.get("model")}
                    c.real.append((real_summary, real_table))
    run_records, rows = [], []
    for (name, region, sched), c in cells.items():
        record, row = _summarise_cell(name, region, sched, c)
        run_records.append(record)
        rows.append(row)
    runs = pd.DataFrame(rows)
    agreement = rank_agreement(runs, RANK_METRICS, threshold=threshold)
    validation = {
        "schedport_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "endpoint": endpoint,
        "server": server or {},
        "engine": cfg.to_dict(),
        "engine_sha256": cfg.config_hash(),
        "schedulers": list(schedulers),
        "regions": regions,
        "traces": [{"name": t.name, "sha256": t.trace.content_sha256(), "n_requests": len(t.trace)}
                   for t in traces],
        "seed": seed,
        "repeats": repeats,
        "threshold": threshold,
        "runs": run_records,
        "agreement": agreement,
        "lag_ok": all(r["client_lag_ok"] for r in run_records),
        "speed_index": _index_summary(cells.values()),
        "completion": completion_check(cells, min_completed),
    }
    if predicted is not None:      # the pair the analysis predicted (`predicted_check`), to read the runs against
        validation["predicted"] = predicted
    text = json.dumps(json_safe(validation), indent=2, allow_nan=False) + "\n"
    atomic_write(out / "validation.json", lambda p: Path(p).write_text(text))
    from schedport.report.validation import write_validation_html  # matplotlib: loaded when a page is written

    write_validation_html(load_validation(json.loads(text)), out / "validation.html")
    return json.loads(text)


def _check_request(traces: Sequence[NamedTrace], schedulers: Sequence[str], repeats: int) -> None:
    """Refuse, before any replay, a validation that cannot compare rankings on a vLLM server."""
    if not traces:
        raise SchedportError("validate needs at least one trace (--trace or --corpus)")
    names = [t.name for t in traces]
    if len(set(names)) != len(names):
        raise SchedportError(f"two traces share the name {next(n for n in names if names.count(n) > 1)!r}")
    bad = [s for s in schedulers if s not in replay_client.EXPRESSIBLE]
    if bad:
        raise SchedportError(f"scheduler '{bad[0]}' cannot be replayed on a vLLM server; "
                             f"expressible: {', '.join(replay_client.EXPRESSIBLE)}")
    if len(schedulers) < 2:
        raise SchedportError("validate compares rankings: give at least two schedulers")
    if repeats < 1:
        raise SchedportError(f"--repeats must be at least 1, got {repeats}")


def _summarise_cell(name: str, region: str, sched: str, c: "_Cell") -> tuple[dict, dict]:
    """One cell's record for ``validation.json`` (simulated vs the median real run, errors,
    spread over repeats) and its row of the runs table the rank agreement is computed on."""
    summaries = [s for s, _ in c.real]
    real = median_summary(summaries, RUN_METRICS + ("n_completed", "speed_index"))
    for key in ("n_error", "n_timeout", "n_truncated"):      # the worst repeat's count
        vals = [s.get(key) for s in summaries if s.get(key) is not None]
        real[key] = max(vals) if vals else None
    req_err = request_errors(c.sim.requests, median_request_table([t for _, t in c.real]))
    record = {"window": name, "region": region, "load": c.meta["load"], "scheduler": sched,
              "scale": c.scale, "n_requests": len(c.sim.requests),
              "client_lag_ok": all(bool(s.get("client_lag_ok", False)) for s in summaries),
              "send_lag_p99_s": max((s.get("send_lag_p99_s") or 0.0) for s in summaries),
              "attempts": sum(s.get("attempts", 1) for s in summaries),
              "repeats": len(summaries),
              "sim": {m: c.sim.summary.get(m) for m in RUN_METRICS + ("n_completed",)},
              "real": real,
              "request_errors": req_err, "run_errors": run_errors(c.sim.summary, real, RUN_METRICS)}
    if len(summaries) > 1:
        record["real_spread"] = repeat_spread(summaries, RUN_METRICS)
        record["real_repeats"] = [{"client_lag_ok": bool(s.get("client_lag_ok", False)),
                                   "send_lag_p99_s": s.get("send_lag_p99_s"),
                                   "speed_index": s.get("speed_index"),
                                   **{m: s.get(m) for m in RUN_METRICS}} for s in summaries]
    row = {"window": name, "region": region, "scheduler": sched}
    for m in RUN_METRICS:
        row[f"sim_{m}"] = _num(c.sim.summary.get(m))
        row[f"real_{m}"] = _num(real.get(m))
        vals = [_num(s.get(m)) for s in summaries]
        vals = [x for x in vals if math.isfinite(x)]
        if len(vals) > 1:
            row[f"real_lo_{m}"], row[f"real_hi_{m}"] = min(vals), max(vals)
    return record, row


def completion_check(cells: dict, min_completed: float) -> dict:
    """Whether every replay measured the server: at least `min_completed` of the requests the
    server did not reject completed (and at least one did). Returns ``{min_completed, ok,
    n_replays, n_short, worst}``, `worst` naming the replay with the smallest completed share."""
    worst, n_short, n = None, 0, 0
    for (name, region, sched), c in cells.items():
        for rep, (s, _) in enumerate(c.real, start=1):
            n += 1
            total = int(s.get("n_requests") or 0)
            done = int(s.get("n_completed") or 0)
            valid = total - int(s.get("n_rejected") or 0)
            share = done / valid if valid > 0 else 0.0
            short = done == 0 or share < min_completed
            n_short += short
            if worst is None or share < worst["share"]:
                worst = {"window": name, "region": region, "scheduler": sched, "repeat": rep,
                         "n_requests": total, "n_completed": done, "n_timeout": s.get("n_timeout"),
                         "n_error": s.get("n_error"), "share": share}
    return {"min_completed": min_completed, "ok": n_short == 0, "n_replays": n, "n_short": n_short,
            "worst": worst}


def completion_error(validation: dict, endpoint: str) -> str | None:
    """The one-line reason a validation measured failures rather than the server, or None."""
    comp = validation.get("completion") or {}
    if comp.get("ok", True):
        return None
    w = comp["worst"]
    return (f"{endpoint}: {comp['n_short']} of {comp['n_replays']} replays completed less than "
            f"{100 * comp['min_completed']:g}% of their requests (worst: {w['window']} {w['region']} "
            f"{w['scheduler']}, {w['n_completed']} of {w['n_requests']} completed, {w['n_timeout']} timeouts, "
            f"{w['n_error']} errors); validation.json is written, but it compares the simulator with "
            f"failures, not with the server (--request-timeout, --min-completed)")


def _index_summary(cells) -> dict | None:
    """The machine speed index over every replay: median, min, max and count (None unprobed)."""
    v = np.array([s.get("speed_index") for c in cells for s, _ in c.real if s.get("speed_index") is not None],
                 dtype=np.float64)
    if v.size == 0:
        return None
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}


def _num(v) -> float:
    return math.nan if v is None else float(v)
