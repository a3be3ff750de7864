"""Hold the simulator to a real engine: simulate and replay the same runs, compare what they rank.

For each window x region x scheduler, `validate` simulates the window with the calibrated engine
and replays the same scaled arrivals (same seed) against the real server, then compares them
per request (TTFT/E2E error), per run (each metric's relative error), and per condition (does the
simulator rank the schedulers as the real engine does?). Its last word is the study's check:
every pairwise ranking the simulation predicts — stable across conditions, or flipping between
them — marked held or not held on the real engine (`schedport.validation_stats`).

A run's two halves are stored under ``OUT/runs/<window>/<region>/<scheduler>/{sim,real}/`` with a
``cell.json`` naming the trace, engine, scale and seed, so an interrupted validation resumes
where it stopped (a real replay costs wall-clock time) and refuses to mix runs of another
engine or trace. Within a condition the schedulers run in a seeded shuffled order, so a slow
drift of the machine does not always favour the scheduler that runs first.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from schedport import __version__
from schedport.api import _atomic_write, _resolve_engine, load_scale, simulate
from schedport.errors import SchedportError
from schedport.trace import Trace

#: Metrics compared per run and ranked per condition (all lower-is-better but throughput).
RUN_METRICS = ("ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s", "e2e_mean_s", "e2e_p99_s",
               "throughput_rps")
RANK_METRICS = ("ttft_mean_s", "e2e_mean_s", "ttft_p99_s", "e2e_p99_s")
DEFAULT_SCHEDULERS = ("vllm-fcfs", "sjf", "spf", "edf")
CELL_KIND = "schedport-validation-cell"


@dataclass(frozen=True)
class NamedTrace:
    """A trace to validate on and the name its runs are filed under."""

    name: str
    trace: Trace


def corpus_traces(corpus_dir: str | Path, n_windows: int) -> list[NamedTrace]:
    """`n_windows` windows of a built corpus, taken round-robin over its sources in manifest order."""
    from schedport.corpus import load_corpus

    if n_windows < 1:
        raise SchedportError(f"--windows must be at least 1, got {n_windows}")
    corpus = load_corpus(corpus_dir)
    by_source = {s: corpus.select(s) for s in corpus.sources}
    picked = []
    depth = 0
    while len(picked) < n_windows and any(depth < len(v) for v in by_source.values()):
        for s in corpus.sources:
            if depth < len(by_source[s]) and len(picked) < n_windows:
                picked.append(by_source[s][depth])
        depth += 1
    return [NamedTrace(w.window_id, corpus.trace(w.window_id)) for w in picked]


def head(trace: Trace, n: int | None) -> Trace:
    """The first `n` requests of `trace` (all when None): a window too long to replay in full
    keeps its local burst shape this way."""
    if n is None or n >= len(trace):
        return trace
    if n < 2:
        raise SchedportError(f"--max-requests must be at least 2, got {n}")
    cid = None if trace.client_id is None else trace.client_id[:n]
    return Trace(trace.arrival_s[:n], trace.input_tokens[:n], trace.output_tokens[:n], cid, trace.name)


def _cell_meta(nt: NamedTrace, cfg, region: str, rho: float, scale: float, scheduler: str, seed: int) -> dict:
    return {"kind": CELL_KIND, "trace": nt.name, "trace_sha256": nt.trace.content_sha256(),
            "engine_sha256": cfg.config_hash(), "region": region, "load": rho, "scale": scale,
            "scheduler": scheduler, "seed": seed}


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
             retries: int = 2, log: Callable[[str], None] = lambda s: None) -> dict:
    """Simulate and replay every (trace, region, scheduler); write and return ``validation.json``.

    `engine` is the server's calibrated engine config; `regions` maps names to offered load
    rho (default: light, moderate, high). Finished cells found in `out_dir` are reused when
    their `cell.json` matches; a mismatch is a one-line error.
    """
    from schedport.replay import EXPRESSIBLE, replay
    from schedport.validation_stats import rank_agreement, request_errors, run_errors

    cfg = _resolve_engine(engine)
    regions = dict(regions or {"light": 0.3, "moderate": 0.6, "high": 0.8})
    if not traces:
        raise SchedportError("validate needs at least one trace (--trace or --corpus)")
    names = [t.name for t in traces]
    if len(set(names)) != len(names):
        raise SchedportError(f"two traces share the name {next(n for n in names if names.count(n) > 1)!r}")
    bad = [s for s in schedulers if s not in EXPRESSIBLE]
    if bad:
        raise SchedportError(f"scheduler '{bad[0]}' cannot be replayed on a vLLM server; "
                             f"expressible: {', '.join(EXPRESSIBLE)}")
    if len(schedulers) < 2:
        raise SchedportError("validate compares rankings: give at least two schedulers")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(seed))
    rows = []
    run_records = []
    server = None
    total = len(traces) * len(regions) * len(schedulers)
    k = 0
    for nt in traces:
        for region, rho in regions.items():
            scale = load_scale(nt.trace, rho, cfg)
            order = list(schedulers)
            rng.shuffle(order)
            for sched in order:
                k += 1
                cell = out / "runs" / _safe(nt.name) / _safe(region) / sched
                meta = _cell_meta(nt, cfg, region, rho, scale, sched, seed)
                old = _read_json(cell / "cell.json")
                if old is not None and {k2: old.get(k2) for k2 in meta} != meta:
                    raise SchedportError(f"{cell / 'cell.json'}: this cell was run with another trace, "
                                         f"engine or seed; use a new --out or remove {cell}")
                sim = simulate(nt.trace, sched, engine=cfg, seed=seed, time_scale=scale)
                real_summary = _read_json(cell / "real" / "summary.json") if old is not None else None
                if real_summary is None:
                    log(f"[{k}/{total}] {nt.name} {region} (rho {rho:g}) {sched}: replaying "
                        f"{len(nt.trace)} requests over {nt.trace.span_s * scale:.0f} s")
                    res = replay(nt.trace, endpoint, engine=cfg, scheduler=sched, time_scale=scale, seed=seed,
                                 model=model, request_timeout_s=request_timeout_s, max_lag_s=max_lag_s,
                                 retries=retries, log=log)
                    cell.mkdir(parents=True, exist_ok=True)
                    _atomic_write(cell / "cell.json", lambda p: Path(p).write_text(json.dumps(meta, indent=2)))
                    sim.save(cell / "sim")
                    res.save(cell / "real")          # summary.json last: it marks the cell done
                    real_table, real_summary = res.requests, res.summary
                    server = {"model": res.server.model, "max_model_len": res.server.max_model_len}
                else:
                    log(f"[{k}/{total}] {nt.name} {region} {sched}: done before, reused")
                    real_table = pd.read_parquet(cell / "real" / "requests.parquet")
                    server = server or {"model": real_summary.get("model")}
                req_err = request_errors(sim.requests, real_table)
                run_err = run_errors(sim.summary, real_summary, RUN_METRICS)
                record = {"window": nt.name, "region": region, "load": rho, "scheduler": sched,
                          "scale": scale, "n_requests": len(nt.trace),
                          "client_lag_ok": bool(real_summary.get("client_lag_ok", False)),
                          "send_lag_p99_s": real_summary.get("send_lag_p99_s"),
                          "attempts": real_summary.get("attempts", 1),
                          "sim": {m: sim.summary.get(m) for m in RUN_METRICS + ("n_completed",)},
                          "real": {m: real_summary.get(m) for m in RUN_METRICS + ("n_completed", "n_error",
                                                                                 "n_timeout", "n_truncated")},
                          "request_errors": req_err, "run_errors": run_err}
                run_records.append(record)
                row = {"window": nt.name, "region": region, "scheduler": sched}
                for m in RUN_METRICS:
                    row[f"sim_{m}"] = _num(sim.summary.get(m))
                    row[f"real_{m}"] = _num(real_summary.get(m))
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
        "threshold": threshold,
        "runs": run_records,
        "agreement": agreement,
        "lag_ok": all(r["client_lag_ok"] for r in run_records),
    }
    text = json.dumps(_jsonable(validation), indent=2, allow_nan=False) + "\n"
    _atomic_write(out / "validation.json", lambda p: Path(p).write_text(text))
    from schedport.validation_stats import write_validation_html

    write_validation_html(json.loads(text), out / "validation.html")
    return json.loads(text)


def _num(v) -> float:
    return math.nan if v is None else float(v)


def _jsonable(o):
    """`o` with numpy scalars as Python ones and NaN/inf as None (the JSON files' rule)."""
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, (bool, np.bool_)):
        return bool(o)
    if isinstance(o, (int, np.integer)):
        return int(o)
    if isinstance(o, (float, np.floating)):
        return float(o) if math.isfinite(float(o)) else None
    return o
