"""The sweep: schedulers x windows x regions x seeds, resumable, on a process pool or Ray.

`run_sweep` is the engine of ``schedport run``:

1. Read the corpus (``DIR/manifest.json`` + ``DIR/windows/*.parquet``) and select the
   cells: ``schedulers x windows x regions x seeds`` (``--windows N`` keeps the first N
   windows of each source, in manifest order; ``--seeds N`` runs seeds 0..N-1).
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

Executors: ``local`` is a `ProcessPoolExecutor` over ``--workers`` processes (default: all
cores; one worker runs in-process); ``ray`` submits the same chunks as Ray tasks to an
existing cluster (``--ray-address``) or to a local instance with ``--workers`` CPUs. Each
window's trace goes to the Ray object store once, so cluster nodes need no shared file
system -- only the same schedport version installed (checked at start).

``--quick`` selects `QUICK`: 5 schedulers (vllm-fcfs, sarathi, sjf, vtc, slo-admission:
cheap to simulate, and batching, ordering, fairness and admission all represented), the
first 4 windows of each source (enough for the analysis's per-window statistics), 3
regions (moderate, near-saturation, overload: below, at and past the knee), 1 seed --
180 runs on the 3-source corpus: on a busy 2-core machine (load average 8) 17 s of sweep and
about 15 s of analysis and start-up, plus 37 s for the corpus build on a fresh clone. Explicit
selectors override it.

Ctrl-C (or SIGTERM) stops cleanly: running tasks are cancelled, every finished cell is
flushed, the manifest says "interrupted", and the command exits 130; rerunning resumes.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import signal
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import typer

from schedport.workload.corpus import Window
from schedport.errors import SchedportError
from schedport.common.outputs import output_dir, parse_out_path, process_alive, writing

FLUSH_SECONDS = 5.0
FLUSH_CELLS = 1000
DEFAULT_CORPUS = Path("corpus")
DEFAULT_OUT = Path("results")
#: Extra counters `schedport.engine.runner.simulate` adds to every summary (after the SLO metrics).
SUMMARY_COUNTERS = ("recomputed_tokens", "swapped_bytes", "load_scale", "predictor_tau",
                    "host_swap_full_events", "stall_recomputes")
#: The ``--quick`` subset (documented in the module docstring and the CLI help).
QUICK = {"schedulers": ("vllm-fcfs", "sarathi", "sjf", "vtc", "slo-admission"), "windows": 4,
         "regions": ("moderate", "near-saturation", "overload")}
EXECUTORS = ("local", "ray")


class SweepInterrupted(SchedportError):
    """The sweep was stopped by Ctrl-C / SIGTERM after keeping every finished cell."""

    exit_code = 130


# ============================================================================ corpus access


def load_corpus(root: str | os.PathLike[str]):
    """The corpus at `root` (`schedport.workload.corpus.load_corpus`; a one-line error if there is none)."""
    from schedport.workload.corpus import load_corpus as _load

    return _load(root)


def write_demo_corpus(out: str | os.PathLike[str], *, sources: tuple[str, ...] = ("demo-a", "demo-b"),
                      windows_per_source: int = 2, requests_per_window: int = 60, seed: int = 0) -> Path:
    """Write a small synthetic corpus (same layout and manifest as the real one) to `out`.

    Windows are consecutive slices of `schedport.workload.examples.make_example_trace` (one
    generated trace per source, seeded by `seed` + source index), re-based to start at 0.
    For tests, the sweep benchmark and first contact without the public data; its sources
    are synthetic and named as such, never mistaken for real traces.
    """
    import hashlib

    import numpy as np

    from schedport.workload.examples import make_example_trace
    from schedport.study.regions import atomic_write_bytes
    from schedport.workload.trace import Trace, save_trace

    out = Path(out)
    (out / "windows").mkdir(parents=True, exist_ok=True)
    entries = []
    n = requests_per_window
    for si, src in enumerate(sources):
        full = make_example_trace(n * windows_per_source, seed + si)
        for k in range(windows_per_source):
            part = full[k * n:(k + 1) * n]
            arr = np.round(part.arrival_s - part.arrival_s[0], 6)
            wid = f"{src}-{k:02d}"
            t = Trace.from_arrays(arr, part.input_tokens, part.output_tokens, part.client_id, name=wid)
            save_trace(t, out / "windows" / f"{wid}.parquet")
            entries.append({"window_id": wid, "source": src, "n_requests": len(t),
                            "duration_s": float(t.span_s), "sha256": t.content_sha256()})
    digest = hashlib.sha256("".join(e["window_id"] + ":" + e["sha256"] + "\n" for e in entries).encode())
    manifest = {"schema": 1, "corpus_sha256": digest.hexdigest(), "code_version": "demo", "windows": entries}
    atomic_write_bytes(out / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    return out


# ============================================================================ selection


@dataclass(frozen=True)
class Selection:
    """What to run: scheduler names, windows (in corpus order), regions {name: rho}, seeds."""

    schedulers: tuple[str, ...]
    windows: tuple[Window, ...]
    regions: dict[str, float]
    seeds: tuple[int, ...]

    @property
    def n_cells(self) -> int:
        """Number of cells (runs) in the selection."""
        return len(self.schedulers) * len(self.windows) * len(self.regions) * len(self.seeds)

    def cells(self):
        """Every cell key (source, window_id, region, scheduler, seed), window-major."""
        for w in self.windows:
            for s in self.schedulers:
                for r in self.regions:
                    for seed in self.seeds:
                        yield (w.source, w.window_id, r, s, seed)


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    return items or None


def select(corpus, *, schedulers: str | list[str] | None = None, sources: str | list[str] | None = None,
           regions: str | None = None, windows: int | None = None, seeds: int = 1,
           quick: bool = False) -> Selection:
    """Resolve command-line selectors against the corpus and the scheduler registry.

    Names are validated (unknown scheduler, source or region -> one-line error listing the
    known ones). `quick` fills in `QUICK` for every selector not given explicitly.
    """
    from schedport.study.regions import REGIONS, parse_regions
    from schedport.engine.schedulers import REGISTRY, get_policy

    for opt, val in (("--schedulers", schedulers), ("--sources", sources), ("--regions", regions)):
        if isinstance(val, str) and _split(val) is None:
            raise SchedportError(f"{opt}: no name given ({val!r}); leave the option out to select all")
    sch = _split(schedulers) if isinstance(schedulers, str) or schedulers is None else list(schedulers)
    src = _split(sources) if isinstance(sources, str) or sources is None else list(sources)
    if quick:
        sch = sch or list(QUICK["schedulers"])
        windows = windows if windows is not None else QUICK["windows"]
        if regions is None:
            regions = ",".join(QUICK["regions"])
    sch = sch or list(REGISTRY)
    for s in sch:
        get_policy(s)
    if len(set(sch)) != len(sch):
        raise SchedportError("--schedulers: a scheduler is named twice")
    reg = parse_regions(regions) if regions is not None else dict(REGIONS)
    if windows is not None and windows < 1:
        raise SchedportError(f"--windows must be at least 1, got {windows}")
    if seeds < 1:
        raise SchedportError(f"--seeds must be at least 1, got {seeds}")
    known = list(dict.fromkeys(w.source for w in corpus.windows))
    if src:
        for s in src:
            if s not in known:
                raise SchedportError(f"--sources: unknown source {s!r} in this corpus (known: {', '.join(known)})")
    chosen: list[Window] = []
    per_source: dict[str, int] = {}
    for w in corpus.windows:
        if src and w.source not in src:
            continue
        if windows is not None and per_source.get(w.source, 0) >= windows:
            continue
        per_source[w.source] = per_source.get(w.source, 0) + 1
        chosen.append(w)
    return Selection(tuple(sch), tuple(chosen), reg, tuple(range(seeds)))


def metric_columns(cfg) -> list[str]:
    """The metric columns of every stored row for engine config `cfg` (summary key order)."""
    from schedport.engine.metrics import summary_keys

    return summary_keys(list(cfg.slo_profiles), SUMMARY_COUNTERS)


# ============================================================================ the work (in workers)


def measure_capacity(trace, cfg, region_def: str = "sustainable") -> tuple[float, float]:
    """Worker task: (anchor in req/s, seconds spent) of one window on engine `cfg`: its capacity
    under `region_def` (sustainable or drain), or under a latency-anchored one the rate meeting
    its SLO target."""
    from schedport.study.regions import parse_region_def

    t0 = time.perf_counter()
    cap = parse_region_def(region_def).anchor(trace, cfg)
    return cap, time.perf_counter() - t0


def run_chunk(trace, cfg, scheduler: str, window: tuple[str, str, str, float], cells: list[tuple[str, float, int]],
              keep_requests: bool = False) -> tuple[list[dict], list | None, float]:
    """Worker task: simulate one window under one scheduler at several (region, rho, seed).

    `window` is (source, window_id, sha256, capacity_rps). Returns the stored rows, the
    per-request tables when `keep_requests` (else None), and the seconds spent inside
    `api.simulate` (to measure the sweep machinery's overhead).
    """
    from schedport.engine.runner import simulate
    from schedport.study.regions import time_scale

    source, window_id, sha, cap = window
    rows: list[dict] = []
    reqs: list | None = [] if keep_requests else None
    sim_s = 0.0
    for region, rho, seed in cells:
        scale = time_scale(trace, cap, rho)
        t0 = time.perf_counter()
        res = simulate(trace, scheduler, engine=cfg, seed=seed, time_scale=scale)
        sim_s += time.perf_counter() - t0
        row = {"source": source, "window_id": window_id, "region": region, "scheduler": scheduler,
               "seed": int(seed), "rho": float(rho), "time_scale": float(scale), "capacity_rps": float(cap),
               "window_sha256": sha}
        row.update(res.summary)
        rows.append(row)
        if reqs is not None:
            reqs.append(res.requests)
    return rows, reqs, sim_s


def _worker_init(driver_pid: int) -> None:
    """Pool worker set-up: ignore Ctrl-C, die with the driver, pay the imports up front."""
    # Ctrl-C reaches the whole process group; only the driver handles it (flush, mark, exit).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_driver, args=(driver_pid,), daemon=True, name="driver-watch").start()
    import schedport.engine.runner  # noqa: F401


def _watch_driver(pid: int, period: float = 1.0) -> None:
    # A SIGKILLed driver cannot stop its workers (forkserver children are not its own), and
    # they would otherwise wait for work forever: exit within a second of its death.
    while True:
        time.sleep(period)
        if not process_alive(pid):
            os._exit(1)


def _warmup() -> int:
    """Worker task used to start every pool process before the sweep's clock starts."""
    time.sleep(0.05)  # long enough that each warm-up task lands on its own new process
    return os.getpid()


def code_fingerprint() -> str:
    """sha256 over the source of the modules a simulation's result depends on.

    The whole engine package (config, latency model, simulator, policies, metrics, runner),
    the trace format and the region definitions: any edit there can change a run's numbers, so
    caches keyed on this fingerprint (explain's runs, a Ray cluster's code check) are refreshed.
    """
    import hashlib

    import schedport

    h = hashlib.sha256(schedport.__version__.encode())
    pkg = Path(schedport.__file__).parent
    files = sorted((pkg / "engine").glob("*.py")) + [pkg / "workload" / "trace.py", pkg / "study" / "regions.py"]
    for p in files:
        h.update(p.relative_to(pkg).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


# ============================================================================ executors


class _Task:
    """A deferred call (the serial executor's task handle; hashable by identity)."""

    __slots__ = ("fn", "args")

    def __init__(self, fn, args):
        self.fn = fn
        self.args = args


class _Serial:
    """Runs tasks in the driver process, one at a time (``--workers 1``)."""

    name = "local"

    def put(self, obj):
        return obj

    def submit(self, fn, *args):
        return _Task(fn, args)

    def as_completed(self, handles, tick: float):
        """Run each task now, in submission order, yielding (handle, result)."""
        for h in list(handles):
            yield h, h.fn(*h.args)

    def shutdown(self, cancel: bool = False) -> None:
        pass


class _Pool:
    """A process pool over `workers` processes (forkserver start: safe with the driver's threads)."""

    name = "local"

    def __init__(self, workers: int):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init,
                                        initargs=(os.getpid(),))
        from concurrent.futures.process import BrokenProcessPool

        try:
            for f in [self.pool.submit(_warmup) for _ in range(workers)]:
                f.result()
        except BrokenProcessPool:
            self.pool.shutdown(wait=False, cancel_futures=True)
            raise SchedportError("the worker processes failed to start (a script calling run_sweep must "
                                 "guard its entry point with `if __name__ == \"__main__\":`)") from None

    def put(self, obj):
        return obj

    def submit(self, fn, *args):
        return self.pool.submit(fn, *args)

    def as_completed(self, handles, tick: float):
        """Yield (handle, result) as tasks finish, and (None, None) every `tick` seconds idle."""
        from concurrent.futures import FIRST_COMPLETED, wait

        pending = set(handles)
        while pending:
            done, pending = wait(pending, timeout=tick, return_when=FIRST_COMPLETED)
            if not done:
                yield None, None
            for f in done:
                yield f, f.result()

    def shutdown(self, cancel: bool = False) -> None:
        if cancel:
            procs = list((getattr(self.pool, "_processes", None) or {}).values())
            self.pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:  # our own worker processes: stop their in-flight chunk now
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=5)
        else:
            self.pool.shutdown(wait=True)


class _Ray:
    """The same tasks as Ray remote tasks, on an existing cluster or a local instance."""

    name = "ray"

    def __init__(self, workers: int, address: str | None):
        try:
            import ray
        except ImportError:
            raise SchedportError("--executor ray needs Ray: pip install 'schedport[ray]'") from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            kw: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False}
            if address:
                _check_reachable(address)
            try:
                if address:
                    ray.init(address=address, **kw)
                else:
                    ray.init(num_cpus=workers, include_dashboard=False, **kw)
            except Exception as e:  # connection refused, bad address, ...
                where = f"the Ray cluster at {address}" if address else "a local Ray instance"
                raise SchedportError(f"cannot start or reach {where}: {' '.join(str(e).split())[:300]}") from None
            self.started = True
        self._remote: dict = {}
        self._pending: set = set()
        mine = code_fingerprint()
        theirs = ray.get(self._fn(code_fingerprint).remote())
        if theirs != mine:
            self.shutdown()
            raise SchedportError("the Ray workers run another schedport version/code than this driver "
                                 "(results would not be comparable); install the same schedport there")

    def _fn(self, fn):
        if fn not in self._remote:
            self._remote[fn] = self.ray.remote(fn)
        return self._remote[fn]

    def put(self, obj):
        return self.ray.put(obj)

    def submit(self, fn, *args):
        ref = self._fn(fn).remote(*args)
        self._pending.add(ref)
        return ref

    def as_completed(self, handles, tick: float):
        """Yield (ref, result) as tasks finish, and (None, None) every `tick` seconds idle."""
        pending = list(handles)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1, timeout=tick)
            if not done:
                yield None, None
            for ref in done:
                self._pending.discard(ref)
                try:
                    res = self.ray.get(ref)
                except self.ray.exceptions.RayTaskError as e:
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, SchedportError):
                        raise cause from None
                    raise
                yield ref, res

    def shutdown(self, cancel: bool = False) -> None:
        if cancel:  # on a shared cluster, do not leave our queued tasks behind
            for ref in self._pending:
                try:
                    self.ray.cancel(ref, force=True)
                except Exception:  # already finished or gone: nothing to cancel
                    pass
            self._pending.clear()
        if self.started:
            self.ray.shutdown()
            self.started = False


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast (one line) when a ``host:port`` Ray address refuses connections.

    `ray.init` would otherwise retry for minutes. Addresses without an explicit port
    ("auto", "local") are left to Ray.
    """
    import socket

    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise SchedportError(f"cannot start or reach the Ray cluster at {address}: "
                             f"{e.strerror or e}") from None


def make_executor(kind: str, workers: int, ray_address: str | None = None):
    """The executor named `kind` ("local" or "ray") with `workers` processes / local CPUs."""
    if kind == "local":
        if ray_address:
            raise SchedportError("--ray-address only applies to --executor ray")
        return _Serial() if workers == 1 else _Pool(workers)
    if kind == "ray":
        return _Ray(workers, ray_address)
    raise SchedportError(f"--executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")


# ============================================================================ the sweep


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


#: Seconds between two progress lines when the output is not a terminal (a log, a pipe).
PROGRESS_SECONDS = 5.0


class PlainProgress:
    """Progress as plain lines for a log or a pipe: ``runs: 1200/9360 (12.8%), 17.3 runs/s,
    elapsed 1 min 09 s, ETA 7 min 52 s`` at most every `every` seconds while a task advances,
    and once when it completes. Same calls as the rich display (`add_task`, `advance`,
    `refresh`), so the sweep drives either."""

    def __init__(self, console, every: float = PROGRESS_SECONDS, clock=time.monotonic):
        self.console, self.every, self.clock = console, every, clock
        self.tasks: list[dict] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, description: str, total: int) -> int:
        """Start counting a task of `total` units; returns its id."""
        now = self.clock()
        self.tasks.append({"desc": description, "total": int(total), "done": 0, "t0": now, "last": now})
        return len(self.tasks) - 1

    def advance(self, task: int, n: int = 1) -> None:
        """Count `n` more units done; print a line if one is due."""
        t = self.tasks[task]
        t["done"] += n
        if t["done"] >= t["total"] or self.clock() - t["last"] >= self.every:
            self._line(t)

    def refresh(self) -> None:
        """Print a line for each unfinished task whose interval has passed (called while idle)."""
        for t in self.tasks:
            if t["done"] < t["total"] and self.clock() - t["last"] >= self.every:
                self._line(t)

    def _line(self, t: dict) -> None:
        now = self.clock()
        t["last"] = now
        el = now - t["t0"]
        rate = t["done"] / el if el > 0 else math.nan
        left = t["total"] - t["done"]
        pct = 100.0 * t["done"] / t["total"] if t["total"] else 100.0
        eta = "done" if left <= 0 else (f"ETA {_fmt_wall(left / rate)}" if rate > 0 else "ETA unknown")
        rate_s = f"{rate:.1f} {t['desc']}/s" if math.isfinite(rate) else f"-- {t['desc']}/s"
        self.console.print(f"{t['desc']}: {t['done']}/{t['total']} ({pct:.1f}%), {rate_s}, "
                           f"elapsed {_fmt_wall(el)}, {eta}", markup=False, highlight=False, soft_wrap=True)


def progress_display(enabled: bool, console=None, every: float = PROGRESS_SECONDS):
    """A rich progress display (description, bar, done/total, runs/s, elapsed and ETA) on a
    terminal; `PlainProgress` lines every `every` seconds when the output is not a terminal."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task):
            speed = task.finished_speed or task.speed
            return Text("-- runs/s" if not speed else f"{speed:.1f} runs/s", style="progress.data.speed")

    console = console or Console(stderr=True)
    if enabled and not console.is_terminal:
        return PlainProgress(console, every)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=console, disable=not enabled)


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
    from schedport.engine.config import EngineConfig, load_engine_config

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
    from schedport.study.store import open_store

    t_start = time.perf_counter()
    out = Path(out)
    cfg = _engine_config(engine)
    from schedport.engine.schedulers import validate_scheduler_params
    validate_scheduler_params(cfg)      # every [scheduler.*] table, before any worker starts
    workers = int(workers) if workers is not None else (os.cpu_count() or 1)
    if workers < 1:
        raise SchedportError(f"--workers must be at least 1, got {workers}")
    if executor not in EXECUTORS:
        raise SchedportError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    corpus = load_corpus(corpus_dir)
    sel = select(corpus, schedulers=schedulers, sources=sources, regions=regions, windows=windows,
                 seeds=seeds, quick=quick)
    store, moved = open_store(out, corpus_sha256=corpus.corpus_sha256, engine_config=cfg.to_dict(),
                              engine_hash=cfg.config_hash(), metric_columns=metric_columns(cfg),
                              corpus_dir=os.path.abspath(corpus_dir), force=force)
    sw = _Sweep(corpus, corpus_dir, sel, cfg, store, workers, flush_cells, flush_seconds, keep_requests)
    from schedport.study.regions import parse_region_def
    rdef = parse_region_def(region_def, list(cfg.slo_profiles))
    sw.region_def, sw.cap_hash = rdef.spec, rdef.cache_hash(sw.chash)
    res = SweepResult(out=out, cells_total=sel.n_cells, cells_skipped=0, cells_run=0, wall_s=0.0, sim_s=0.0,
                      capacity_s=0.0, capacities_measured=0, workers=workers, executor=executor,
                      status="failed", moved_aside=moved, timings=sw.timings, sim_by_scheduler=sw.by_sched)
    interrupted = False
    try:
        sw.plan()
        res.cells_skipped = sw.skipped
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
        from schedport.study.regions import LEGACY_DRAIN, parse_region_def

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
        from schedport.study.regions import offered_rate

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
        from schedport.study.regions import capacity_cache

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
        from schedport.engine.runner import check_clock, check_metrics_horizon, check_time_scale, rescale
        from schedport.engine.latency import make_latency_model
        from schedport.study.regions import time_scale

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
                    h = ex.submit(run_chunk, self.refs[w.window_id], self.cfg_ref, s,
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


# ============================================================================ the CLI command


def run_command(
    schedulers: Optional[str] = typer.Option(
        None, "--schedulers", help="Comma-separated scheduler names (default: all 13; see `schedport schedulers`)."),
    sources: Optional[str] = typer.Option(
        None, "--sources", help="Comma-separated corpus sources (default: all, e.g. azure,bailian,burstgpt-modeled)."),
    regions: Optional[str] = typer.Option(
        None, "--regions", help="Comma-separated regions: light,moderate,high,near-saturation,overload,severe "
                                "(rho 0.3..1.6), or custom name=rho. Default: all six."),
    windows: Optional[int] = typer.Option(
        None, "--windows", help="Run only the first N windows of each source (default: all)."),
    seeds: int = typer.Option(1, "--seeds", help="Run seeds 0..N-1 of every cell."),
    corpus: Path = typer.Option(
        DEFAULT_CORPUS, "--corpus", parser=parse_out_path,
        help="Corpus directory (built from the public data if missing)."),
    engine: Optional[Path] = typer.Option(None, "--engine", help="Engine config TOML (defaults: docs/engine.md)."),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="Public data directory, used only to build a missing corpus."),
    quick: bool = typer.Option(
        False, "--quick", help="Small first-contact subset (180 runs, about half a minute on 2 cores plus a first "
                               "corpus build): schedulers "
                               "vllm-fcfs,sarathi,sjf,vtc,slo-admission; 4 windows per source; regions "
                               "moderate,near-saturation,overload. Explicit selectors override it."),
    out: Path = typer.Option(
        DEFAULT_OUT, "--out", parser=parse_out_path, help="Results directory: Parquet dataset OUT/runs/ + OUT/manifest.json. "
                                   "Rerunning resumes, skipping finished cells."),
    force: bool = typer.Option(
        False, "--force", help="If OUT holds results of another corpus/engine config, or is corrupt or foreign, "
                               "move it aside to OUT.old-<timestamp> and start afresh (nothing is deleted)."),
    workers: Optional[int] = typer.Option(
        None, "--workers", help="Worker processes (local) or CPUs of a local Ray instance (default: all cores)."),
    executor: str = typer.Option("local", "--executor", help="local (process pool) or ray."),
    ray_address: Optional[str] = typer.Option(
        None, "--ray-address", help="Existing Ray cluster (e.g. ray://host:10001 or auto); default: start a "
                                    "local instance."),
    keep_requests: bool = typer.Option(
        False, "--keep-requests", help="Also keep every run's per-request table in OUT/requests/ (large)."),
    region_def: str = typer.Option(
        "sustainable", "--region-def", help="How rho is anchored: 'sustainable' (offered / the rate the engine "
        "sustains with a queue, the default), 'drain' (offered / requests per makespan of an all-at-once replay, "
        "the earlier definition) or 'slo[:PROFILE[:TARGET]]' (offered / the rate at which vllm-fcfs meets TARGET "
        "of PROFILE's SLO; default slo:standard:0.9)."),
    do_analyze: bool = typer.Option(
        True, "--analyze/--no-analyze", help="After the sweep, analyse the store and write the report (default); "
                                             "--no-analyze runs any selection (one window or scheduler too) and "
                                             "leaves `schedport analyze` for later."),
) -> None:
    """Run the experiment matrix (schedulers x windows x regions x seeds), resumable, then the analysis."""
    try:
        _run_command(schedulers, sources, regions, windows, seeds, corpus, engine, data_dir, quick, out, force,
                     workers, executor, ray_address, keep_requests, region_def, do_analyze)
    except (KeyboardInterrupt, SweepInterrupted) as e:
        from rich.console import Console

        msg = str(e) if isinstance(e, SweepInterrupted) else "interrupted"
        Console(stderr=True).print(msg, markup=False)
        raise typer.Exit(130) from None


def _run_command(schedulers, sources, regions, windows, seeds, corpus, engine, data_dir, quick, out, force,
                 workers, executor, ray_address, keep_requests, region_def="sustainable", do_analyze=True) -> None:
    from rich.console import Console

    con = Console()
    from schedport.common.guard import claim_dir

    # a store (resumed) or a new folder; never a corpus, an analysis, a cache or a run output
    claim_dir(out, {"results"}, inputs=[corpus, engine, data_dir])
    output_dir(out, create=False)  # before a corpus build or any simulation
    from schedport.engine.schedulers import validate_scheduler_params
    validate_scheduler_params(_engine_config(engine))     # before a corpus build or any worker
    if not corpus.exists():
        from schedport.workload.corpus import build_corpus

        output_dir(corpus, "--corpus", create=False)
        con.print(f"no corpus at {corpus}/: building it from the public data first", markup=False,
                  soft_wrap=True)
        kw = {}
        if "progress" in inspect.signature(build_corpus).parameters:
            kw["progress"] = lambda msg: con.print(str(msg), markup=False, soft_wrap=True)
        build_corpus(spec=None, data_dir=data_dir, out=corpus, **kw)
    if do_analyze:
        check_analysable(select(load_corpus(corpus), schedulers=schedulers, sources=sources, regions=regions,
                                windows=windows, seeds=seeds, quick=quick))
    res = run_sweep(corpus, out, schedulers=schedulers, sources=sources, regions=regions, windows=windows,
                    seeds=seeds, quick=quick, engine=engine, executor=executor, workers=workers,
                    ray_address=ray_address, keep_requests=keep_requests, force=force, region_def=region_def)
    if res.moved_aside is not None:
        con.print(f"moved the previous contents of {out} aside to {res.moved_aside}", markup=False,
                  soft_wrap=True)
    if res.cells_run == 0:
        con.print(f"nothing to run: all {res.cells_total} cells are already in {out / 'runs'} "
                  f"(0 simulations, {res.wall_s:.1f} s)", markup=False,
                  soft_wrap=True)
    else:
        rate = res.cells_run / res.wall_s if res.wall_s > 0 else math.nan
        con.print(f"{res.cells_run} runs ({res.cells_skipped} already done, {res.cells_total} in the selection) "
                  f"in {_fmt_wall(res.wall_s)} wall ({rate:.1f} runs/s, {res.workers} {res.executor} workers); "
                  f"results in {out / 'runs'}", markup=False, soft_wrap=True)
    if not do_analyze:
        con.print(f"analysis skipped (--no-analyze); run `schedport analyze --results {out}` when ready",
                  markup=False, soft_wrap=True)
        return
    try:
        from schedport.analysis.portability import analyze
    except ImportError:
        return
    kw = {"corpus_dir": corpus} if "corpus_dir" in inspect.signature(analyze).parameters else {}
    from schedport.api import analysis_outputs_cleaned

    with analysis_outputs_cleaned(out):
        ares = analyze(out, out, **kw)
    sel = (ares or {}).get("selection") or {}
    if sel:
        con.print(f"analysis over {len(sel['schedulers'])} schedulers x {sum(sel['windows_per_source'].values())} "
                  f"windows x {len(sel['regions'])} regions of the store (sources: {', '.join(sel['sources'])})",
                  markup=False, soft_wrap=True)
    missing = (ares or {}).get("missing_cells") or []
    if missing:
        con.print(f"analysis: {len(missing)} cell(s) of incomplete blocks (a scheduler, window or region run for "
                  f"only part of the selection) were left out; the report's notes list them, and a rerun of the "
                  f"whole selection fills them in", markup=False, soft_wrap=True)
    for name in ("portability.json", "report.html"):
        if (out / name).exists():
            con.print(f"{'analysis' if name.endswith('json') else 'report'}: {out / name}", markup=False,
                      soft_wrap=True)


def check_analysable(sel: Selection) -> None:
    """Refuse up front a selection the analysis that ends `schedport run` cannot use, instead of
    running every cell first: it ranks at least two schedulers, and its statistics are over
    windows, so some source needs `analysis.MIN_WINDOWS` windows."""
    try:
        from schedport.analysis.portability import MIN_WINDOWS
    except ImportError:  # no analysis installed: nothing follows the sweep
        return
    if len(sel.schedulers) < 2:
        raise SchedportError(f"--schedulers: the analysis that ends `run` ranks schedulers, so it needs at "
                             f"least 2 (got {', '.join(sel.schedulers)})")
    per_source: dict[str, int] = {}
    for w in sel.windows:
        per_source[w.source] = per_source.get(w.source, 0) + 1
    if not per_source or max(per_source.values()) < MIN_WINDOWS:
        raise SchedportError(f"--windows: the analysis that ends `run` needs at least {MIN_WINDOWS} windows of one "
                             f"source (its statistics are over windows); this selection has "
                             f"{max(per_source.values(), default=0)} per source")


def _fmt_wall(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec:02d} s"
