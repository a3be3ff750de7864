"""The analysis's inputs: the results store (verified, reshaped per source) and the corpus's
per-window statistics.

`load_store` reads and refuses a store the way `schedport run` verifies it; `Study` reshapes its
runs table into per-source arrays (regions x metrics x windows x schedulers) on the complete
blocks of windows, collecting a note for everything it leaves out; `load_workload` reads the
corpus manifest's per-window statistics for the report's workload figure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from schedport.analysis.defaults import MIN_WINDOWS
from schedport.analysis.directions import SURVIVOR_ONLY, metric_direction
from schedport.common.values import json_safe
from schedport.errors import SchedportError, read_json

#: The columns that identify a run; a store holds one row per combination.
ID_COLUMNS = ("source", "window_id", "region", "scheduler", "seed")
#: Store columns that describe a run but are not scored.
BOOKKEEPING = frozenset({
    "rho", "time_scale", "n_requests", "n_completed", "n_unfinished", "makespan_s",
    "horizon_s", "iterations", "corpus_sha256", "engine_hash", "wall_s", "status", "capacity_rps",
    "window_sha256", "load_scale", "predictor_tau", "backlog_at_last_arrival",
    "host_swap_full_events", "stall_recomputes",
})


def window_key(v: Any):
    """Sort key for window ids: numeric ids in numeric order, then the others as text."""
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def load_store(results_dir, *, expect_corpus: Optional[str] = None,
               expect_engine: Optional[str] = None) -> tuple[pd.DataFrame, dict]:
    """Read a results store: (runs table, manifest dict), refusing unusable or mixed stores.

    Every part is verified as `schedport run` verifies it (`schedport.study.store.verified_runs`:
    page checksums, the manifest's schema, and its engine hash recomputed from the stored
    engine config). A missing directory, missing/invalid ``manifest.json``, absent or empty ``runs/``, missing
    id columns, duplicated run rows, or more than one corpus hash (in the manifest or in a
    ``corpus_sha256`` column) raise a one-line `SchedportError`, as do a corpus or engine
    hash that differs from the expected one given. The analysis only ever reads this.
    """
    d = Path(results_dir)
    if not d.is_dir():
        raise SchedportError(f"{d}: results directory not found")
    mpath = d / "manifest.json"
    if not mpath.is_file():
        raise SchedportError(f"{mpath}: missing; not a schedport results store (run `schedport run` first)")
    manifest = read_json(mpath)
    if not isinstance(manifest, dict):
        raise SchedportError(f"{mpath}: expected a JSON object")
    rpath = d / "runs"
    if not rpath.exists():
        raise SchedportError(f"{rpath}: missing; the results store has no runs")
    from schedport.study.store import verified_runs   # pyarrow (+0.19 s): loaded when a store is read

    df = verified_runs(d, manifest)  # every part as `run` verifies it: page checksums, schema, hashes
    if len(df) == 0:
        raise SchedportError(f"{rpath}: the results store holds no runs")
    missing = [c for c in ID_COLUMNS if c not in df.columns]
    if missing:
        raise SchedportError(f"{rpath}: missing column(s) {', '.join(missing)}")
    for c in ID_COLUMNS:
        if df[c].isna().any():
            i = int(np.flatnonzero(df[c].isna().to_numpy())[0])
            raise SchedportError(f"{rpath}: row {i} has no {c}")
    dup = df.duplicated(list(ID_COLUMNS))
    if dup.any():
        r = df[dup].iloc[0]
        raise SchedportError(
            f"{rpath}: duplicated run ({', '.join(f'{c}={r[c]}' for c in ID_COLUMNS)}); "
            "a store must hold one row per (source, window_id, region, scheduler, seed)")
    hashes = manifest.get("corpus_sha256")
    hset = set(hashes) if isinstance(hashes, list) else ({hashes} if hashes else set())
    if "corpus_sha256" in df.columns:
        hset |= {h for h in df["corpus_sha256"].dropna().unique()}
    if len(hset) > 1:
        raise SchedportError(f"{d}: mixes results from {len(hset)} corpora ({', '.join(sorted(map(str, hset)))}); "
                             "analyse one corpus per store")
    if expect_corpus and hset and expect_corpus not in hset:
        raise SchedportError(f"{d}: corpus {next(iter(hset))} differs from the expected {expect_corpus}")
    if expect_corpus and not hset:
        raise SchedportError(f"{mpath}: names no corpus_sha256, cannot check it is {expect_corpus}")
    if expect_engine:
        eh = manifest.get("engine_hash")
        if eh != expect_engine:
            raise SchedportError(f"{d}: engine {eh} differs from the expected {expect_engine}")
    if "engine_hash" in df.columns and df["engine_hash"].dropna().nunique() > 1:
        raise SchedportError(f"{d}: mixes results from {df['engine_hash'].nunique()} engine configs")
    return df, manifest


class Study:
    """The store reshaped into per-source arrays (regions x metrics x windows x schedulers).

    Built from a runs table (`load_store`): ``metrics`` (analysed, in column order) and their
    ``direction`` (+1 higher is better), ``regions`` (by rho) with their ``rho``, ``sources``,
    ``schedulers``, and per source its ``windows``, its ``values`` (R, M, W, K; seeds averaged,
    NaN outside the complete block) and its complete ``block`` (R, W). Cells missing from the
    full grid are listed in ``missing_cells``, block sizes in ``complete_blocks``; whatever is
    left out is said in `notes`, which the constructor appends to.
    """

    def __init__(self, df: pd.DataFrame, metrics: Optional[Sequence[str]], notes: list[str]):
        df = df.copy()
        for c in ("source", "region", "scheduler"):
            df[c] = df[c].astype(str)
        self.metrics = self._choose_metrics(df, metrics, notes)
        self.direction = np.array([metric_direction(m) for m in self.metrics], dtype=np.float64)
        self._order_regions(df, notes)
        self.sources = sorted(df["source"].unique())
        self.schedulers = sorted(df["scheduler"].unique())
        if len(self.schedulers) < 2:
            raise SchedportError(f"the results store holds one scheduler ({self.schedulers[0]}); nothing to rank")
        keys = ["source", "window_id", "region", "scheduler"]
        g = df.groupby(keys, sort=False)
        avg = g[self.metrics].mean()
        nseeds = g.size()
        if nseeds.nunique() > 1:
            notes.append(f"Seeds per cell vary ({nseeds.min()}-{nseeds.max()}); each cell is the mean of its seeds.")
        self.n_seeds = (int(nseeds.min()), int(nseeds.max()))
        self.windows: dict[str, list] = {}
        self.values: dict[str, np.ndarray] = {}
        self.block: dict[str, np.ndarray] = {}
        self.missing_cells: list[dict] = []
        self.complete_blocks: list[dict] = []
        avg = avg.reset_index()
        for s in self.sources:
            self._add_source(s, avg[avg["source"] == s], notes)
        if not any(b["analysed"] for b in self.complete_blocks):
            raise SchedportError(f"no (source, region) condition has {MIN_WINDOWS} or more windows in which every "
                                 "scheduler has a result; nothing to analyse")
        if self.missing_cells:
            notes.append(f"{len(self.missing_cells)} cell(s) (source, window, region, scheduler) are missing "
                         "from the store; every condition is analysed on its complete block of windows.")

    @staticmethod
    def _choose_metrics(df: pd.DataFrame, metrics: Optional[Sequence[str]], notes: list[str]) -> list[str]:
        """The metrics to analyse: those asked for (checked), else every directed column but the
        survivor-only variants; metrics NaN in every run are dropped with a note."""
        numeric = [c for c in df.columns if c not in ID_COLUMNS and pd.api.types.is_numeric_dtype(df[c])]
        known = [c for c in numeric if metric_direction(c) is not None]
        other = [c for c in df.columns if c not in ID_COLUMNS and c not in BOOKKEEPING and c not in known]
        if metrics is not None:
            bad = [m for m in metrics if m not in df.columns]
            if bad:
                raise SchedportError(f"metric(s) not in the results store: {', '.join(bad)}")
            undirected = [m for m in metrics if metric_direction(m) is None]
            if undirected:
                raise SchedportError(f"metric(s) with no known direction (better = higher or lower?): "
                                     f"{', '.join(undirected)}")
            chosen = list(dict.fromkeys(metrics))
        else:
            # the survivor-only variants repeat their every-request counterparts wherever nothing
            # is refused: analysed only when asked for, so the pooled counts do not count both
            chosen = [c for c in known if not SURVIVOR_ONLY.fullmatch(c)]
            if len(chosen) < len(known):
                notes.append(f"Survivor-only metrics (*_completed, over completed requests alone) are stored "
                             f"but analysed only when named with --metrics: {len(known) - len(chosen)} column(s).")
            if other:
                notes.append(f"Ignored column(s) with no known metric direction: {', '.join(other)}.")
        empty = [m for m in chosen if df[m].isna().all()]
        if empty:
            notes.append(f"Dropped metric(s) undefined (NaN) in every run: {', '.join(empty)}.")
        chosen = [m for m in chosen if m not in empty]
        if not chosen:
            raise SchedportError("the results store has no metric column to analyse")
        return chosen

    def _order_regions(self, df: pd.DataFrame, notes: list[str]) -> None:
        """``regions`` ordered by their (median) rho, and ``rho`` per region; by name without rho."""
        if "rho" in df.columns and df["rho"].notna().any():
            rho = df.groupby("region")["rho"].median()
            spread = df.groupby("region")["rho"].agg(lambda s: s.max() - s.min())
            if (spread > 1e-9).any():
                notes.append("Some regions hold runs at several rho values: "
                             + ", ".join(sorted(spread[spread > 1e-9].index)) + " (ordered by the median).")
            self.regions = sorted(rho.index, key=lambda r: (rho[r] if pd.notna(rho[r]) else math.inf, r))
            self.rho = {r: (float(rho[r]) if pd.notna(rho[r]) else None) for r in self.regions}
        else:
            self.regions = sorted(df["region"].unique())
            self.rho = {r: None for r in self.regions}
            notes.append("No rho column: regions are ordered by name.")

    def _add_source(self, s: str, sub: pd.DataFrame, notes: list[str]) -> None:
        """One source's seed-averaged rows `sub` as its (R, M, W, K) array on complete blocks."""
        R, M, K = len(self.regions), len(self.metrics), len(self.schedulers)
        wins = sorted(pd.unique(sub["window_id"]), key=window_key)
        self.windows[s] = wins
        W = len(wins)
        ri = pd.Index(self.regions).get_indexer(sub["region"])
        wi = pd.Index(wins).get_indexer(sub["window_id"])
        ki = pd.Index(self.schedulers).get_indexer(sub["scheduler"])
        vals = np.full((R, M, W, K), np.nan)
        vals[ri, :, wi, ki] = sub[self.metrics].to_numpy(dtype=np.float64)
        present = np.zeros((R, W, K), dtype=bool)
        present[ri, wi, ki] = True
        absent = [self.schedulers[k] for k in np.flatnonzero(~present.any(axis=(0, 1)))]
        if absent:
            notes.append(f"Scheduler(s) {', '.join(absent)} have no result for source {s}: none of its "
                         "windows is complete, so the source is left out.")
        block = present.all(axis=-1)
        for r, w, k in zip(*np.nonzero(~present)):
            self.missing_cells.append({"source": s, "window_id": json_safe(wins[w]), "region": self.regions[r],
                                       "scheduler": self.schedulers[k]})
        for r, reg in enumerate(self.regions):
            nb = int(block[r].sum())
            nw = int(present[r].any(axis=-1).sum())
            analysed = nb >= MIN_WINDOWS
            self.complete_blocks.append({"source": s, "region": reg, "n_windows": nw,
                                         "n_complete": nb, "analysed": analysed})
            if not analysed:
                block[r] = False
                notes.append(f"{s} @ {reg}: {nb} complete window(s) (< {MIN_WINDOWS}); condition skipped.")
            elif nb < nw:
                notes.append(f"{s} @ {reg}: analysed on the complete block of {nb} of {nw} windows.")
        vals[np.broadcast_to(~block[:, None, :, None], vals.shape)] = np.nan
        self.values[s] = vals
        self.block[s] = block

    def drop_metrics(self, drop: Sequence[str]) -> None:
        """Remove metrics from the study (values, directions, metric list): a family's repeats."""
        keep = [i for i, m in enumerate(self.metrics) if m not in set(drop)]
        self.metrics = [self.metrics[i] for i in keep]
        self.direction = self.direction[keep]
        for s in self.sources:
            self.values[s] = self.values[s][:, keep]


# stat name -> (exact key in schedport.workload.corpus manifests, fallbacks: substrings that must all be in the key)
_WORKLOAD_STATS = (
    ("n_requests", "n_requests", (("num_requests",),)),
    ("duration_s", "duration_s", (("duration",),)),
    ("rate_mean_rps", "mean_rate_rps", (("mean", "rate"), ("rate",))),
    ("dispersion", "index_of_dispersion", (("dispersion",), ("idc",))),
    ("input_mean", "input_mean", (("input", "mean"),)),
    ("input_p50", "input_p50", (("input", "p50"), ("input", "median"))),
    ("input_p99", "input_p99", (("input", "p99"),)),
    ("output_mean", "output_mean", (("output", "mean"),)),
    ("output_p50", "output_p50", (("output", "p50"), ("output", "median"))),
    ("output_p99", "output_p99", (("output", "p99"),)),
)


def _match_stat(flat: dict, exact: str, alternatives) -> Optional[float]:
    v = flat.get(exact)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    for must in alternatives:
        for k, v in flat.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if all(t in k.lower() for t in must):
                return float(v)
    return None


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "_"))
        else:
            out[key] = v
    return out


def load_workload(corpus_dir, expect_corpus: Optional[str] = None) -> dict:
    """Per-window workload statistics from a corpus manifest, for the characterization figure.

    Reads ``corpus_dir/manifest.json``; its ``windows`` entries (a list, or a dict keyed by window
    id) carry a ``source`` and per-window statistics, matched by name (e.g. ``mean_input_tokens``,
    ``input_p99``, ``mean_rate_rps``, ``index_of_dispersion``). A corpus whose hash differs from
    the results store's is refused: the figure would describe other windows.
    """
    d = Path(corpus_dir)
    mpath = d / "manifest.json" if d.is_dir() else d
    if not mpath.is_file():
        raise SchedportError(f"{mpath}: corpus manifest not found")
    man = read_json(mpath)
    if not isinstance(man, dict):
        raise SchedportError(f"{mpath}: expected a JSON object (a corpus manifest)")
    h = man.get("corpus_sha256") or man.get("sha256")
    if expect_corpus and h and h != expect_corpus:
        raise SchedportError(f"{mpath}: corpus {h} is not the one the results were run on ({expect_corpus})")
    wins = man.get("windows")
    if isinstance(wins, dict):
        wins = [{"window_id": k, **v} for k, v in wins.items() if isinstance(v, dict)]
    if not isinstance(wins, list) or not wins:
        raise SchedportError(f"{mpath}: no 'windows' entries")
    rows = []
    for w in wins:
        if not isinstance(w, dict):
            continue
        flat = _flatten(w)
        row = {"source": str(flat.get("source", "unknown")),
               "window_id": json_safe(flat.get("window_id", flat.get("id")))}
        for name, exact, alternatives in _WORKLOAD_STATS:
            v = _match_stat(flat, exact, alternatives)
            if v is not None:
                row[name] = v
        rows.append(row)
    found = [n for n, _, _ in _WORKLOAD_STATS if any(n in r for r in rows)]
    srcs = man.get("sources") if isinstance(man.get("sources"), dict) else {}
    corpus_sources = {str(k): {"cite": v.get("cite"), "modeled": v.get("modeled"), "adapter": v.get("adapter"),
                               **({"fidelity": v["fidelity"]} if isinstance(v.get("fidelity"), dict) else {}),
                               **({"prefix": v["prefix"]} if isinstance(v.get("prefix"), dict) else {})}
                      for k, v in srcs.items() if isinstance(v, dict)}
    return {"available": True, "corpus_dir": str(d), "corpus_sha256": h, "stats": found, "windows": rows,
            "corpus_sources": corpus_sources, "note": f"{len(rows)} windows from {mpath}"}


