"""The sweep: schedulers x windows x regions x seeds, resumable, on a process pool or Ray.

`run_sweep` is the engine of ``schedport run``:

1. Read the corpus (``DIR/manifest.json`` + ``DIR/windows/*.parquet``) and select the
   cells: ``schedulers x windows x regions x seeds`` (``--windows N`` keeps N windows of each
   source, taken in turn from its parts, `selection.spread_windows`; ``--seeds N`` runs seeds 0..N-1).
2. Open the results store (`schedport.study.store`): refuse a store of another corpus or engine
   config, a corrupt or foreign directory; collect the cells already finished.
3. Measure each selected window's capacity once (in parallel, same executor), cached in
   ``OUT/capacity.json`` by (window sha256, engine hash) and reused on later runs.
4. Run the missing cells in chunks -- one chunk = one window x one scheduler x all its
   selected regions and seeds -- so a task carries the trace once and runs several
   simulations (per-task overhead well under 1%), while chunks stay small enough to balance
   load over the workers and to lose little on a kill. The driver alone writes the store:
   finished cells are flushed as one Parquet part every `FLUSH_SECONDS` seconds or
   `FLUSH_CELLS` cells, so a crash loses at most those.

Per cell: ``time_scale = offered / (capacity * rho)`` (the formula of
`schedport.engine.runner.load_scale`, capacity from the cache) and
``api.simulate(trace, scheduler, engine=cfg, seed=seed, time_scale=time_scale)``; the
stored row is the cell key, rho, time_scale, capacity and the run summary. Simulation is
deterministic, so every executor and worker count gives bit-identical rows.

A scheduler may be a user's own (``--schedulers vllm-fcfs,las.py:LAS``; `schedport.engine.policies.plugins`):
the selection loads it once, the store records its version (`ResultsStore.adopt_policies` refuses
cells of another), and every task carries its `PolicySource`, source text included, so a worker --
local or on a Ray node -- runs exactly the code the driver hashed.

Executors: ``local`` is a `ProcessPoolExecutor` over ``--workers`` processes (default: all
cores; one worker runs in-process); ``ray`` submits the same chunks as Ray tasks to an
existing cluster (``--ray-address``) or to a local instance with ``--workers`` CPUs. Each
window's trace goes to the Ray object store once, so cluster nodes need no shared file
system -- only the same schedport version installed (checked at start).

``--quick`` selects `QUICK`: 5 schedulers (vllm-fcfs, sarathi, sjf, vtc, slo-admission:
cheap to simulate, and batching, ordering, fairness and admission all represented), the
first 4 windows of each source, taken in turn from its parts (Azure: 2 conv, 2 code; enough for
the analysis's per-window statistics), 3
regions (moderate, near-saturation, overload: below, at and past the knee), 1 seed --
180 runs on the 3-source corpus: on a busy 2-core machine (load average 8) 17 s of sweep and
about 15 s of analysis and start-up, plus 37 s for the corpus build on a fresh clone. Explicit
selectors override it.

Ctrl-C (or SIGTERM) stops cleanly: running tasks are cancelled, every finished cell is
flushed, the manifest says "interrupted", and the command exits 130; rerunning resumes.

This module is the run loop; the selection is `schedport.study.selection`, the workers' tasks
`schedport.study.tasks`, the executors `schedport.study.executors` and the progress display
`schedport.study.progress` (their public names are re-exported here). The command is
`schedport.cli.study`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from schedport.common.outputs import writing
from schedport.engine.core.config import EngineConfig, load_engine_config
from schedport.engine.inputs import check_clock, check_metrics_horizon, check_time_scale, rescale
from schedport.engine.core.latency import make_latency_model
from schedport.engine.policies.plugins import check_scheduler_tables, from_source
from schedport.errors import SchedportError
from schedport.study.executors import EXECUTORS, make_executor  # noqa: F401  (re-exported)
from schedport.study.progress import PROGRESS_SECONDS, PlainProgress, fmt_wall, progress_display  # noqa: F401
from schedport.study.regions import LEGACY_DRAIN, capacity_cache, offered_rate, parse_region_def, time_scale
from schedport.study.selection import (  # noqa: F401  (re-exported: the sweep's public API)
    QUICK, SUMMARY_COUNTERS, Selection, load_corpus, metric_columns, select, write_demo_corpus,
)
from schedport.study.store import open_store
from schedport.study.tasks import code_fingerprint, measure_capacity, run_chunk  # noqa: F401
from schedport.workload.corpus import Window

FLUSH_SECONDS = 5.0
FLUSH_CELLS = 1000
DEFAULT_CORPUS = Path("corpus")
DEFAULT_OUT = Path("results")


class SweepInterrupted(SchedportError):
    """The sweep was stopped by Ctrl-C / SIGTERM after keeping every finished cell."""

    exit_code = 130


@dataclass
class SweepResult:
    """What a sweep did: cell counts, timings and where the results are."""

    out: Path
    cells_total: int
    cells_skipped: int
    cells_run: int
    wall_s: float
    sim_s: float
    capacity_s: float
    capacities_measured: int
    workers: int
    executor: str
    status: str
    moved_aside: Path | None = None
    timings: dict = field(default_factory=dict)
    sim_by_scheduler: dict = field(default_factory=dict)
    #: One line when a --workers the user gave was capped (`cap_workers`), else None.
    workers_note: str | None = None


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count where unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cap_workers(asked: int, n_cells: int, *, given: bool = True, local_cores: bool = True) -> tuple[int, str | None]:
    """(workers, note): `asked` capped at the `n_cells` cells to run and, when `local_cores` (a
    process pool, or a Ray instance started here), at this machine's cores. More workers than
    cells only start idle processes, and more than cores only share them: ``--workers 100000``
    would start for minutes before the first cell. `note` says so in one line when the user
    gave the number (`given`) and it was capped."""
    if n_cells < 1:
        return asked, None      # nothing to run: no worker starts
    limits = [(n_cells, f"the {n_cells} cell{'s' * (n_cells != 1)} to run")]
    if local_cores:
        cores = usable_cores()
        limits.append((cores, f"this machine's {cores} core{'s' * (cores != 1)}"))
    n, why = min(limits, key=lambda x: x[0])
    if asked <= n:
        return asked, None
    return n, (f"--workers {asked}: using {n}, the most that can work at once ({why})" if given else None)


class _StopOnSignal:
    """Turn SIGTERM into KeyboardInterrupt while the sweep runs, so both stop it cleanly."""

    def __enter__(self):
        self.old = None
        if threading.current_thread() is threading.main_thread():
            def handler(signum, frame):
                raise KeyboardInterrupt
            self.old = signal.signal(signal.SIGTERM, handler)
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
        return False


def _engine_config(engine):
    return engine if isinstance(engine, EngineConfig) else load_engine_config(engine)


def run_sweep(corpus_dir: str | os.PathLike[str], out: str | os.PathLike[str], *,
              schedulers: str | list[str] | None = None, sources: str | list[str] | None = None,
              regions: str | None = None, windows: int | None = None, seeds: int = 1, quick: bool = False,
              engine=None, executor: str = "local", workers: int | None = None,
              ray_address: str | None = None, keep_requests: bool = False, force: bool = False,
              progress: bool = True, console=None, flush_cells: int = FLUSH_CELLS,
              flush_seconds: float = FLUSH_SECONDS, progress_seconds: float = PROGRESS_SECONDS,
              region_def: str | None = None) -> SweepResult:
    """Run (or resume) the sweep of the selected cells into the results store at `out`.

    `engine` is an `EngineConfig`, a TOML path or None (defaults). Finished cells already
    in the store are skipped; the rest run on the chosen executor and are flushed to the
    store in atomic batches (every `flush_cells` cells or `flush_seconds` seconds).
    Raises `SweepInterrupted` (exit code 130) after a clean stop on Ctrl-C / SIGTERM, and
    `SchedportError` for any bad input, foreign or mismatched store. With the local
    executor and more than one worker, a script calling this must guard its entry point
    with ``if __name__ == "__main__":`` (worker processes re-import the main module).
    Returns a `SweepResult`; the method is in the module docstring.
    """
    t_start = time.perf_counter()
    out = Path(out)
    cfg = _engine_config(engine)
    given_workers = workers is not None
    workers = int(workers) if workers is not None else usable_cores()
    if workers < 1:
        raise SchedportError(f"--workers must be at least 1, got {workers}")
    if executor not in EXECUTORS:
        raise SchedportError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    corpus = load_corpus(corpus_dir)
    sel = select(corpus, schedulers=schedulers, sources=sources, regions=regions, windows=windows,
                 seeds=seeds, quick=quick)
    # every [scheduler.*] table against the policies it names, before any worker starts
    check_scheduler_tables(cfg, [from_source(src) for src in sel.policies.values()])
    store, moved = open_store(out, corpus_sha256=corpus.corpus_sha256, engine_config=cfg.to_dict(),
                              engine_hash=cfg.config_hash(), metric_columns=metric_columns(cfg),
                              corpus_dir=os.path.abspath(corpus_dir), force=force)
    try:   # a user scheduler's cells are never mixed across versions of its file
        store.adopt_policies(sel.policies)
    except BaseException:
        store.close()
        raise
    sw = _Sweep(corpus, corpus_dir, sel, cfg, store, workers, flush_cells, flush_seconds, keep_requests)
    rdef = parse_region_def(region_def, list(cfg.slo_profiles))
    sw.region_def, sw.cap_hash = rdef.spec, rdef.cache_hash(sw.chash)
    res = SweepResult(out=out, cells_total=sel.n_cells, cells_skipped=0, cells_run=0, wall_s=0.0, sim_s=0.0,
                      capacity_s=0.0, capacities_measured=0, workers=workers, executor=executor,
                      status="failed", moved_aside=moved, timings=sw.timings, sim_by_scheduler=sw.by_sched)
    interrupted = False
    try:
        sw.plan()
        res.cells_skipped = sw.skipped
        sw.workers, res.workers_note = cap_workers(workers, sel.n_cells - sw.skipped, given=given_workers,
                                                   local_cores=executor == "local" or ray_address is None)
        workers = res.workers = sw.workers
        store.begin_run({"selectors": sw.selectors(quick), "executor": executor, "workers": workers,
                         "cells_planned": sel.n_cells, "cells_skipped": sw.skipped})
        if sw.todo:
            sw.load_traces(t_start)
            sw.ex = make_executor(executor, workers, ray_address)
            sw.timings["executor_start_s"] = time.perf_counter() - t_start - sw.timings["load_s"]
            with _StopOnSignal(), progress_display(progress, console, progress_seconds) as bar:
                sw.measure_capacities(out / "capacity.json", bar)
                sw.check_scales()
                sw.run_cells(bar)
            sw.ex.shutdown()
            sw.ex = None
        res.status = "finished"
    except KeyboardInterrupt:
        res.status = "interrupted"
        interrupted = True
    finally:
        if sw.ex is not None:
            sw.ex.shutdown(cancel=True)
        res.wall_s = time.perf_counter() - t_start
        res.cells_run, res.sim_s = sw.cells_run, sw.sim_s
        res.capacity_s, res.capacities_measured = sw.cap_s, sw.n_measured
        try:
            store.flush()  # every finished cell is kept, whatever stopped the sweep
            if store.manifest.get("runs") and store.manifest["runs"][-1]["status"] == "running":
                store.end_run(res.status, cells_run=res.cells_run, wall_s=round(res.wall_s, 3),
                              sim_s=round(res.sim_s, 3))
        finally:
            store.close()
    if interrupted:
        raise SweepInterrupted(f"interrupted: kept {len(store.done)} finished cells in {out}; "
                               f"rerun the same command to resume")
    return res


class _Sweep:
    """The state of one `run_sweep` invocation between planning and the last flush."""

    def __init__(self, corpus, corpus_dir, sel: Selection, cfg, store, workers: int, flush_cells: int,
                 flush_seconds: float, keep_requests: bool):
        self.corpus, self.corpus_dir, self.sel, self.cfg, self.store = corpus, corpus_dir, sel, cfg, store
        self.workers, self.flush_cells, self.flush_seconds = workers, flush_cells, flush_seconds
        self.keep_requests = keep_requests
        self.chash = cfg.config_hash()
        self.region_def, self.cap_hash = "sustainable", self.chash + "|sustainable"  # set by run_sweep
        self.ex = None
        self.todo: dict[tuple[str, str], list[tuple[str, float, int]]] = {}
        self.skipped = 0
        self.need: list[Window] = []
        self.traces: dict = {}
        self.caps: dict[str, float] = {}
        self.cells_run = 0
        self.sim_s = self.cap_s = 0.0
        self.n_measured = 0
        self.timings: dict[str, float] = {}
        self.by_sched: dict[str, float] = {}

    def plan(self) -> None:
        """Split the selection into finished cells (skipped) and chunks still to run."""
        before = {parse_region_def((r.get("selectors") or {}).get("region_def", LEGACY_DRAIN)).spec
                  for r in self.store.manifest.get("runs", [])} if self.store.done else set()
        if before - {self.region_def}:
            raise SchedportError(f"{self.store.root}: its regions were run with --region-def "
                                 f"{', '.join(sorted(before))}, this run asks {self.region_def}; use another --out")
        for region, rho in self.sel.regions.items():
            old = self.store.region_rho.get(region)
            if old is not None and old != rho:
                raise SchedportError(f"{self.store.root}: region {region!r} was run at rho={old}, this run asks "
                                     f"rho={rho}; give the custom region another name or use a new --out")
        for key in self.sel.cells():
            if key in self.store.done:
                self.skipped += 1
                continue
            _, wid, region, sched, seed = key
            self.todo.setdefault((wid, sched), []).append((region, self.sel.regions[region], seed))
        wanted = {wid for wid, _ in self.todo}
        self.need = [w for w in self.sel.windows if w.window_id in wanted]

    def selectors(self, quick: bool) -> dict:
        """The selection as recorded in the manifest."""
        sel = self.sel
        return {"schedulers": list(sel.schedulers), "sources": list(dict.fromkeys(w.source for w in sel.windows)),
                "windows": [w.window_id for w in sel.windows], "regions": sel.regions, "seeds": list(sel.seeds),
                "quick": quick, "keep_requests": self.keep_requests, "region_def": self.region_def}

    def load_traces(self, t_start: float) -> None:
        """Load every window still needed, checking its content hash and that it can be scaled."""
        for w in self.need:
            t = self.corpus.trace(w.window_id)
            if t.content_sha256() != w.sha256:
                raise SchedportError(f"{self.corpus_dir}: window {w.window_id} does not match its manifest "
                                     f"sha256 (run `schedport corpus verify`)")
            offered_rate(t)  # a window that cannot be brought to a region fails here, before any work
            self.traces[w.window_id] = t
        self.timings["load_s"] = time.perf_counter() - t_start

    def measure_capacities(self, cache_path: Path, bar) -> None:
        """Capacity of every needed window: from the cache, else measured in parallel and cached."""
        ex = self.ex
        self.refs = {wid: ex.put(t) for wid, t in self.traces.items()}
        self.cfg_ref = ex.put(self.cfg)
        cache = capacity_cache(cache_path)
        missing = []
        for w in self.need:
            c = cache.get(w.sha256, self.cap_hash)
            if c is None:
                missing.append(w)
            else:
                self.caps[w.window_id] = c
        if not missing:
            return
        t0 = last_save = time.perf_counter()
        task = bar.add_task("capacities", total=len(missing))
        handles = {ex.submit(measure_capacity, self.refs[w.window_id], self.cfg_ref, self.region_def): w
                   for w in missing}
        try:
            for h, res in ex.as_completed(list(handles), tick=1.0):
                if h is None:
                    continue
                w = handles[h]
                cap, dt = res
                self.caps[w.window_id] = cap
                self.cap_s += dt
                self.n_measured += 1
                cache.put(w.sha256, self.cap_hash, cap)
                bar.advance(task)
                if time.perf_counter() - last_save >= self.flush_seconds:
                    with writing(cache_path):
                        cache.save()
                    last_save = time.perf_counter()
        finally:
            with writing(cache_path):
                cache.save()
        self.timings["capacity_wall_s"] = time.perf_counter() - t0

    def check_scales(self) -> None:
        """Refuse, before any cell runs, a region whose time scale no window can be simulated
        at (not finite, arrivals beyond the clock's resolution: `api.check_clock`) or measured
        at (a metrics horizon no request can complete in: `api.check_metrics_horizon`)."""
        lat = make_latency_model(self.cfg)
        for w in self.need:
            trace, cap = self.traces[w.window_id], self.caps[w.window_id]
            regions = {r: rho for cells in (self.todo.get((w.window_id, s), ()) for s in self.sel.schedulers)
                       for r, rho, _ in cells}
            for region, rho in regions.items():
                where = f"window {w.window_id}, region {region} (rho {rho!r})"
                scale = check_time_scale(time_scale(trace, cap, rho), f"{where}: the time scale")
                scaled = rescale(trace, scale)
                check_clock(scaled, trace, f"({where}, time scale {scale:.4g})")
                check_metrics_horizon(scaled, self.cfg, lat.alone_time(trace.input_tokens, trace.output_tokens),
                                      f" in region {region} (rho {rho!r}); give a lower rho")

    def run_cells(self, bar) -> None:
        """Run every remaining chunk, flushing finished cells to the store in batches."""
        ex, store = self.ex, self.store
        t0 = time.perf_counter()
        task = bar.add_task("runs", total=sum(len(c) for c in self.todo.values()))
        handles = {}
        for w in self.need:  # window-major: corpus order, then scheduler order
            for s in self.sel.schedulers:
                cells = self.todo.get((w.window_id, s))
                if cells:
                    h = ex.submit(run_chunk, self.refs[w.window_id], self.cfg_ref, self.sel.policies.get(s, s),
                                  (w.source, w.window_id, w.sha256, self.caps[w.window_id]), cells,
                                  self.keep_requests)
                    handles[h] = s
        allowed = set(metric_columns(self.cfg)) | {"source", "window_id", "region", "scheduler", "seed", "rho",
                                                   "time_scale", "capacity_rps", "window_sha256"}
        last_flush = last_event = time.monotonic()
        outstanding = len(handles)
        idle = 0.0  # worker-seconds without a task (the tail): a diagnostic for the benchmark
        for h, res in ex.as_completed(list(handles), tick=1.0):
            if h is None:
                bar.refresh()  # a plain-line display reports even while no chunk finishes
            now = time.monotonic()
            if outstanding < self.workers:
                idle += (self.workers - outstanding) * (now - last_event)
            last_event = now
            if h is not None:
                outstanding -= 1
                rows, reqs, dt = res
                extra = set(rows[0]) - allowed
                if extra:
                    raise RuntimeError(f"schedport bug: the run summary has keys the store does not declare: "
                                       f"{sorted(extra)}")
                store.add(rows, reqs)
                self.sim_s += dt
                self.by_sched[handles[h]] = self.by_sched.get(handles[h], 0.0) + dt
                self.cells_run += len(rows)
                bar.advance(task, len(rows))
            if store.pending and (store.pending >= self.flush_cells
                                  or time.monotonic() - last_flush >= self.flush_seconds):
                store.flush()
                last_flush = time.monotonic()
        store.flush()
        self.timings.update(runs_wall_s=time.perf_counter() - t0, idle_worker_s=idle, tasks=len(handles))
