"""The runner of `schedport explain`: one results store, its corpus and engine, and a cache of variant runs.

`Explainer` opens a store, resolves the reversal to explain, builds its variants
(`schedport.analysis.explain.variants`), runs A and B on them and attributes the gap
(`schedport.analysis.explain.effects`). The window resamples are the analysis's: drawn from the
same seeded generator in the same order as `compute_portability`, so the original conditions'
resamples are the analysis's.

Runs go through the sweep's executors (`schedport.study.sweep.make_executor`: a local process pool or
Ray) with the sweep's own tasks (`measure_capacity`, `run_chunk`). Every finished run is one JSON
file under ``CACHE/cells/`` named by the sha256 of (variant content, scheduler, rho, seed, engine
hash, code fingerprint), written atomically, so a rerun (or another reversal over the same
windows) skips it; variant windows are kept as Parquet under ``CACHE/variants/`` with their recipe.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from schedport.errors import SchedportError
from schedport.common.atomic import atomic_write_text
from schedport.engine.core.config import engine_config_from_dict
from schedport.engine.capacity import LEGACY_DRAIN, THROUGHPUT_KINDS, parse_region_def
from schedport.study.regions import capacity_cache
from schedport.study.sweep import code_fingerprint, make_executor, measure_capacity, progress_display, run_chunk
from schedport.workload.corpus import load_corpus
from schedport.workload.trace import Trace, load_trace, save_trace
from schedport.analysis.directions import metric_direction, metric_is_bounded
from schedport.analysis.explain.effects import (attribute, finite_or_none, median_effects, paired_effects,
                                                percentile_interval, verdict)
from schedport.analysis.explain.reversals import ranked_reversals, read_portability
from schedport.analysis.explain.variants import CLIENT_AWARE, FEATURES, Variant, build_variant, variant_name
from schedport.analysis.store_loading import load_store, window_key
from schedport.engine.policies.plugins import PolicySource

__all__ = ["DEFAULT_BOOT", "Explainer"]

#: Window resamples of the intervals (the analysis's default).
DEFAULT_BOOT = 1000


def _cell_key(content_sha: str, scheduler: str, rho: float, seed: int, anchor_hash: str, code: str) -> str:
    """The cache name of one run: `anchor_hash` is the engine hash under the region definition
    (`RegionDefinition.cache_hash`), since one rho is another time scale under another one."""
    text = json.dumps([content_sha, scheduler, repr(float(rho)), int(seed), anchor_hash, code])
    return hashlib.sha256(text.encode()).hexdigest()


def _cell_checksum(cell: dict) -> str:
    """The sha256 sealing one cached run: its identity (variant, scheduler, rho, seed, engine) and
    every number of its summary, so an edited or damaged cell is recomputed, never believed."""
    body = {k: cell.get(k) for k in ("content_sha256", "scheduler", "rho", "seed", "engine_hash", "summary")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=True, separators=(",", ":")).encode()).hexdigest()


def _read_cell(path: Path, sha: str, sched: str, rho: float, seed: int, engine_hash: str) -> dict | None:
    """The summary of a cached cell that is exactly the run asked for and passes its checksum;
    None for anything else (missing, unreadable, edited, another run's)."""
    try:
        cell = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(cell, dict) and isinstance(cell.get("summary"), dict)
            and cell.get("sha256") == _cell_checksum(cell)):
        return None
    if (cell.get("content_sha256"), cell.get("scheduler"), cell.get("rho"), cell.get("seed"),
            cell.get("engine_hash")) != (sha, sched, float(rho), int(seed), engine_hash):
        return None
    return cell["summary"]


def _write_json_atomic(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, allow_nan=True), durable=False)


def _burst_sha(trace: Trace) -> str:
    """sha256 of the trace as its capacity sees it (every request at time 0): capacity is a
    function of exactly this (`api.capacity`), so variants that only move arrivals share it."""
    return Trace(np.zeros(len(trace)), trace.input_tokens, trace.output_tokens, trace.client_id,
                 trace.name).content_sha256()


class Explainer:
    """One results store, its corpus and engine, and a cache of variant runs, ready to explain reversals.

    Opening it reads the store (`analysis.load_store`), the engine config recorded in its manifest,
    the corpus it was run on (``corpus_dir`` or the manifest's), and draws the analysis's window
    resamples. `explain_reversal` then builds, runs and attributes one reversal; `close` shuts
    the executor down.
    """

    def __init__(self, results_dir, *, corpus_dir=None, cache_dir=None, executor: str = "local",
                 workers: Optional[int] = None, ray_address: Optional[str] = None, n_boot: int = DEFAULT_BOOT,
                 seed: int = 0, progress: bool = True, console=None):
        if n_boot < 1:
            raise SchedportError(f"--boot must be at least 1, got {n_boot}")
        self.results = Path(results_dir)
        df, manifest = load_store(self.results)
        self.df, self.manifest = df, manifest
        ec = manifest.get("engine_config")
        if not isinstance(ec, dict):
            raise SchedportError(f"{self.results / 'manifest.json'}: records no engine_config")
        self.cfg = engine_config_from_dict(ec, source=str(self.results / "manifest.json"))
        self.engine_hash = self.cfg.config_hash()
        cdir = corpus_dir if corpus_dir is not None else manifest.get("corpus_dir")
        if cdir is None:
            raise SchedportError(f"{self.results}: the store names no corpus; give --corpus DIR")
        cdir = Path(cdir)
        if not (cdir / "manifest.json").is_file() and not cdir.is_absolute():
            cdir = self.results / cdir
        self.corpus = load_corpus(cdir)
        if manifest.get("corpus_sha256") and self.corpus.corpus_sha256 != manifest["corpus_sha256"]:
            raise SchedportError(f"{cdir}: corpus {self.corpus.corpus_sha256[:12]} is not the store's "
                                 f"({str(manifest['corpus_sha256'])[:12]}); give the corpus it was run on")
        sel = manifest.get("selectors") if isinstance(manifest.get("selectors"), dict) else {}
        self.region_def = parse_region_def(sel.get("region_def", LEGACY_DRAIN), list(self.cfg.slo_profiles))
        self.cap_hash = self.region_def.cache_hash(self.engine_hash)
        self.code = code_fingerprint()
        # user schedulers rerun from the source text the store recorded: the code that made its cells
        self.policies = {name: PolicySource.from_record(name, rec)
                         for name, rec in (manifest.get("policies") or {}).items()}
        self.seeds = sorted(int(s) for s in df["seed"].unique())
        rho = df.groupby("region")["rho"].median() if "rho" in df.columns else {}
        self.rho = {str(k): float(v) for k, v in dict(rho).items()}
        self.schedulers = sorted(df["scheduler"].astype(str).unique())
        self.sources = sorted(df["source"].astype(str).unique())
        self.windows = {s: sorted(df.loc[df["source"] == s, "window_id"].unique(), key=window_key)
                        for s in self.sources}
        # the analysis's window resamples: one generator, sources in sorted order
        rng = np.random.default_rng(seed)
        self.counts = {s: rng.multinomial(len(self.windows[s]), np.full(len(self.windows[s]),
                                                                      1.0 / len(self.windows[s])),
                                          size=int(n_boot)).astype(np.float64) for s in self.sources}
        self.n_boot, self.seed = int(n_boot), int(seed)
        self.cache = Path(cache_dir) if cache_dir is not None else self.results / "explain"
        self.executor, self.workers, self.ray_address = executor, workers, ray_address
        self.progress, self.console = progress, console
        self._ex = None
        self._traces: dict[str, Trace] = {}
        self._store_caps = self._read_store_capacities()
        self.timings = {"runs": 0, "capacities": 0, "cached_cells": 0, "refused_cells": 0}

    # ---------------------------------------------------------------- inputs

    def _read_store_capacities(self) -> dict:
        p = self.results / "capacity.json"
        if not p.is_file():
            return {}
        return dict(capacity_cache(p).entries)

    def trace(self, window_id: str) -> Trace:
        """A corpus window's trace (read once)."""
        if window_id not in self._traces:
            w = self.corpus.window(window_id)
            t = self.corpus.trace(window_id)
            if t.content_sha256() != w.sha256:
                raise SchedportError(f"{self.corpus.root}: window {window_id} does not match its manifest sha256 "
                                     "(run `schedport corpus verify`)")
            self._traces[window_id] = t
        return self._traces[window_id]

    def block(self, source: str, region: str) -> list[str]:
        """The windows of `source` in which every scheduler has a result at `region` (the analysis's block)."""
        sub = self.df[(self.df["source"] == source) & (self.df["region"] == region)]
        per = sub.groupby("window_id")["scheduler"].nunique()
        return [w for w in self.windows[source] if per.get(w, 0) == len(self.schedulers)]

    def resolve(self, *, reversal: Optional[int] = None, pair: Optional[str] = None, metric: Optional[str] = None,
                region: Optional[str] = None, sources: Optional[str] = None,
                portability: Optional[dict] = None) -> dict:
        """The reversal to explain: by its number in `ranked_reversals` or by pair, metric, region and sources."""
        if reversal is not None:
            if any(v is not None for v in (pair, metric, region, sources)):
                raise SchedportError("give either --reversal or --pair/--metric/--region/--sources, not both")
            res = portability if portability is not None else self._portability()
            items = ranked_reversals(res)
            if not items:
                raise SchedportError(f"{self.results}: the study form has no reversal to explain")
            if not (1 <= int(reversal) <= len(items)):
                raise SchedportError(f"--reversal: {reversal} is not between 1 and {len(items)} (the study form's "
                                     "reversals; `schedport explain --list` shows them)")
            it = items[int(reversal) - 1]
            out = self._reversal(it["scheduler_a"], it["scheduler_b"], it["metric"], it["region"], it["source_a"],
                                 it["source_b"])
            out.update(id=it["id"], pair_label=it["pair"])
            out["condition_a"]["store_effect"] = it["effect_a"]
            out["condition_b"]["store_effect"] = it["effect_b"]
            return out
        missing = [n for n, v in (("--pair", pair), ("--metric", metric), ("--region", region),
                                  ("--sources", sources)) if not v]
        if missing:
            raise SchedportError(f"give --reversal ID, or all of --pair A,B --metric M --region R --sources X,Y "
                                 f"(missing {', '.join(missing)})")
        ab = [s.strip() for s in pair.split(",") if s.strip()]
        xy = [s.strip() for s in sources.split(",") if s.strip()]
        if len(ab) != 2 or ab[0] == ab[1]:
            raise SchedportError(f"--pair: expected two different schedulers A,B, got {pair!r}")
        if len(xy) != 2 or xy[0] == xy[1]:
            raise SchedportError(f"--sources: expected two different sources X,Y, got {sources!r} (explain compares "
                                 "two sources at one region, as the study form's reversals do)")
        return self._reversal(ab[0], ab[1], metric.strip(), region.strip(), xy[0], xy[1])

    def _portability(self) -> dict:
        return read_portability(self.results, hint=" first, or give --pair/--metric/--region/--sources",
                                store=self.results)

    def _reversal(self, a: str, b: str, metric: str, region: str, x: str, y: str) -> dict:
        for s in (a, b):
            if s not in self.schedulers:
                raise SchedportError(f"--pair: scheduler {s!r} is not in the store (has: {', '.join(self.schedulers)})")
        for s in (x, y):
            if s not in self.sources:
                raise SchedportError(f"--sources: source {s!r} is not in the store (has: {', '.join(self.sources)})")
        if region not in self.rho:
            raise SchedportError(f"--region: {region!r} is not in the store (has: {', '.join(self.rho)})")
        if metric not in self.df.columns or metric_direction(metric) is None:
            raise SchedportError(f"--metric: {metric!r} is not a ranked metric of the store")
        return {"scheduler_a": a, "scheduler_b": b, "metric": metric, "region": region, "rho": self.rho[region],
                "effect_scale": "absolute" if metric_is_bounded(metric) else "relative",
                "condition_a": {"source": x, "region": region}, "condition_b": {"source": y, "region": region}}

    # ---------------------------------------------------------------- variants

    def features_for(self, rev: dict, features: Optional[Sequence[str]] = None) -> list[str]:
        """The features explained for a reversal: all but the client variants, which need a client-aware pair."""
        if features is not None:
            bad = [f for f in features if f not in FEATURES]
            if bad:
                raise SchedportError(f"--features: unknown {', '.join(bad)} (known: {', '.join(FEATURES)})")
            return list(features)
        aware = bool({rev["scheduler_a"], rev["scheduler_b"]} & CLIENT_AWARE)
        return [f for f in FEATURES if aware or not f.startswith("clients")]

    def variants(self, side_windows: list[str], donor_windows: list[str], feature: str) -> list[Variant]:
        """One variant per base window: window i takes its donor feature from donor window i mod n."""
        out = []
        for i, w in enumerate(side_windows):
            bw = self.corpus.window(w)
            if feature == "original":
                out.append(Variant("original", w, bw.sha256, seed=self.seed))
            elif FEATURES[feature][0] == "transplant":
                d = donor_windows[i % len(donor_windows)]
                out.append(Variant(feature, w, bw.sha256, d, self.corpus.window(d).sha256, self.seed))
            else:
                out.append(Variant(feature, w, bw.sha256, seed=self.seed))
        return out

    def variant_trace(self, v: Variant) -> tuple[Trace, dict]:
        """The variant's window (cached as Parquet under CACHE/variants/) and its record."""
        base = self.trace(v.base)
        if v.feature == "original":
            return base, {"recipe_sha256": v.recipe_sha256(), "content_sha256": base.content_sha256()}
        rsha = v.recipe_sha256()
        path = self.cache / "variants" / f"{rsha[:24]}.parquet"
        meta = path.with_suffix(".json")
        t = None
        if path.is_file() and meta.is_file():
            try:
                rec = json.loads(meta.read_text())
                t = load_trace(path)
                if t.content_sha256() != rec.get("content_sha256") or rec.get("recipe") != v.recipe():
                    t = None
            except (OSError, ValueError, SchedportError):
                t = None
        if t is None:
            donor = self.trace(v.donor) if v.donor else None
            t = build_variant(v, base, donor)
            path.parent.mkdir(parents=True, exist_ok=True)
            save_trace(t, path)
            _write_json_atomic(meta, {"recipe": v.recipe(), "recipe_sha256": rsha,
                                      "content_sha256": t.content_sha256()})
        return t, {"recipe_sha256": rsha, "content_sha256": t.content_sha256()}

    # ---------------------------------------------------------------- running

    def _executor(self):
        if self._ex is None:
            w = int(self.workers) if self.workers is not None else (os.cpu_count() or 1)
            if w < 1:
                raise SchedportError(f"--workers must be at least 1, got {w}")
            self._ex = make_executor(self.executor, w, self.ray_address)
        return self._ex

    def close(self, cancel: bool = False) -> None:
        """Shut the executor down (worker processes or the local Ray instance); `cancel` stops
        running and queued runs at once (after an error or Ctrl-C: finished runs are already cached)."""
        if self._ex is not None:
            self._ex.shutdown(cancel=cancel)
            self._ex = None

    def _version(self, sched: str) -> str:
        """A scheduler's identity in the cache: its name, and for a user policy its source's hash."""
        src = self.policies.get(sched)
        return sched if src is None else f"{sched}@{src.sha256}"

    def run_cells(self, jobs: list[tuple[Trace, str, str]], rho: float, label: str = "runs") -> dict:
        """Summaries of every (trace, content sha, scheduler) at `rho` and every store seed: cached, or run.

        Capacities are taken from the store's capacity.json for corpus windows, shared by variants
        whose requests are the same (only arrivals moved), else measured (`sweep.measure_capacity`);
        runs go to `sweep.run_chunk`, one task per (window, scheduler). Each finished run is written
        at once to its own cell file. Returns {(content sha, scheduler, seed): summary}.
        """
        out: dict = {}
        todo: dict = {}
        for trace, sha, sched in jobs:
            for seed in self.seeds:
                key = _cell_key(sha, self._version(sched), rho, seed, self.cap_hash, self.code)
                p = self.cache / "cells" / key[:2] / f"{key}.json"
                if (sha, sched, seed) in out or seed in todo.get((sha, sched), (None, ()))[1]:
                    continue
                if p.is_file():
                    summary = _read_cell(p, sha, sched, rho, seed, self.engine_hash)
                    if summary is not None:
                        out[(sha, sched, seed)] = summary
                        self.timings["cached_cells"] += 1
                        continue
                    self.timings["refused_cells"] += 1
                todo.setdefault((sha, sched), (trace, []))[1].append(seed)
        if not todo:
            return out
        cache = capacity_cache(self.cache / "capacity.json")
        throughput = self.region_def.kind in THROUGHPUT_KINDS   # depends on the mix alone
        caps: dict = {}
        need_cap: dict = {}
        for (sha, _), (trace, _) in todo.items():
            if sha in caps or sha in need_cap:
                continue
            ck = _burst_sha(trace) if throughput else sha
            c = cache.get(ck, self.cap_hash)
            if c is None:
                c = self._store_caps.get(f"{sha}:{self.cap_hash}")
                if c is not None and throughput:
                    cache.put(ck, self.cap_hash, c)
            if c is None:
                need_cap[sha] = (trace, ck)
            else:
                caps[sha] = c
        ex = self._executor()
        cfg_ref = ex.put(self.cfg)
        with progress_display(self.progress, self.console) as bar:
            if need_cap:
                by_key: dict = {}
                for sha, (trace, ck) in need_cap.items():
                    by_key.setdefault(ck, []).append((sha, trace))
                task = bar.add_task("capacities", total=len(by_key))
                handles = {ex.submit(measure_capacity, ex.put(v[0][1]), cfg_ref, self.region_def.spec): ck
                           for ck, v in by_key.items()}
                for h, res in ex.as_completed(list(handles), tick=1.0):
                    if h is None:
                        bar.refresh()
                        continue
                    ck = handles[h]
                    cache.put(ck, self.cap_hash, res[0])
                    for sha, _ in by_key[ck]:
                        caps[sha] = res[0]
                    self.timings["capacities"] += 1
                    bar.advance(task)
                cache.save()
            task = bar.add_task(label, total=sum(len(s) for _, s in todo.values()))
            handles = {}
            for (sha, sched), (trace, seeds) in todo.items():
                cells = [("explain", float(rho), s) for s in seeds]
                h = ex.submit(run_chunk, ex.put(trace), cfg_ref, self.policies.get(sched, sched),
                              ("variant", trace.name, sha, caps[sha]), cells, False)
                handles[h] = (sha, sched)
            for h, res in ex.as_completed(list(handles), tick=1.0):
                if h is None:
                    bar.refresh()
                    continue
                sha, sched = handles[h]
                rows = res[0]
                for row in rows:
                    seed = int(row["seed"])
                    summary = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                    key = _cell_key(sha, self._version(sched), rho, seed, self.cap_hash, self.code)
                    cell = {"content_sha256": sha, "scheduler": sched, "rho": float(rho), "seed": seed,
                            "engine_hash": self.engine_hash, "summary": summary}
                    cell["sha256"] = _cell_checksum(cell)
                    _write_json_atomic(self.cache / "cells" / key[:2] / f"{key}.json", cell)
                    out[(sha, sched, seed)] = summary
                    self.timings["runs"] += 1
                bar.advance(task, len(rows))
        return out

    # ---------------------------------------------------------------- one reversal

    def explain_reversal(self, rev: dict, features: Optional[Sequence[str]] = None) -> dict:
        """Build the variants of one reversal, run A and B on them, and attribute the gap (the JSON contract)."""
        t0 = time.perf_counter()
        runs0, caps0, cached0, refused0 = (self.timings[k] for k in ("runs", "capacities", "cached_cells",
                                                                     "refused_cells"))
        feats = self.features_for(rev, features)
        A, B, metric, region = rev["scheduler_a"], rev["scheduler_b"], rev["metric"], rev["region"]
        x, y = rev["condition_a"]["source"], rev["condition_b"]["source"]
        full = {s: self.windows[s] for s in (x, y)}
        block = {s: self.block(s, region) for s in (x, y)}
        for s in (x, y):
            if len(block[s]) < 2:
                raise SchedportError(f"{s} @ {region}: {len(block[s])} window(s) with every scheduler's result; "
                                     "explain needs at least 2")
        other = {x: y, y: x}
        plan = []  # (side, feature, [(window position, Variant)])
        for side, s in (("x", x), ("y", y)):
            for f in ["original"] + feats:
                vs = self.variants(block[s], block[other[s]], f)
                plan.append((side, s, f, vs))
        jobs, records = [], []
        built = {}
        for side, s, f, vs in plan:
            for v in vs:
                t, rec = self.variant_trace(v)
                built[(side, f, v.base)] = rec["content_sha256"]
                for sched in (A, B):
                    jobs.append((t, rec["content_sha256"], sched))
                if f != "original":
                    records.append({"variant": variant_name(s, f, other[s]), "window_id": v.base,
                                    "donor_window": v.donor, **rec})
        summaries = self.run_cells(jobs, rev["rho"])

        effects_out, eff = [], {}
        for side, s, f, vs in plan:
            W = len(full[s])
            pos = {w: i for i, w in enumerate(full[s])}
            a_vals, b_vals = np.full(W, np.nan), np.full(W, np.nan)
            for v in vs:
                sha = built[(side, f, v.base)]
                a_vals[pos[v.base]] = np.mean([_num(summaries[(sha, A, sd)].get(metric)) for sd in self.seeds])
                b_vals[pos[v.base]] = np.mean([_num(summaries[(sha, B, sd)].get(metric)) for sd in self.seeds])
            rows = paired_effects(a_vals, b_vals, metric)
            point, med_b = median_effects(rows[None, :], self.counts[s])
            eff[(side, f)] = (float(point[0]), med_b[:, 0])
            lo, hi = percentile_interval(med_b[:, 0])
            donor = other[s] if f != "original" and FEATURES[f][0] == "transplant" else None
            effects_out.append({"variant": variant_name(s, f, other[s]), "base": s,
                                "feature": None if f == "original" else f, "donor": donor,
                                "median_effect": finite_or_none(point[0]), "ci_low": lo, "ci_high": hi,
                                "n_windows": int(np.isfinite(rows).sum())})
        rev = dict(rev)
        rev["condition_a"] = {**rev["condition_a"], "median_effect": finite_or_none(eff[("x", "original")][0])}
        rev["condition_b"] = {**rev["condition_b"], "median_effect": finite_or_none(eff[("y", "original")][0])}
        att = attribute(eff, feats)
        gap = eff[("y", "original")][0] - eff[("x", "original")][0]
        gap_ci = percentile_interval(eff[("y", "original")][1] - eff[("x", "original")][1])
        ver = verdict(att, rev, gap_ci)
        wall = time.perf_counter() - t0
        # the schema names the file format, fixed since 0.1.0; it is not the module path
        return {"schema": "schedport.explain/1", "reversal": rev, "effects": effects_out, "attribution": att,
                "verdict": ver, "gap": finite_or_none(gap), "gap_ci_low": gap_ci[0], "gap_ci_high": gap_ci[1],
                "method": {"effect": "median over windows of the analysis's per-window effect "
                                     f"({rev['effect_scale']}); interval: 2.5-97.5 percentile over {self.n_boot} "
                                     "window resamples (the analysis's, seed "
                                     f"{self.seed})",
                           "share_transplant": "((E_X<-f - E_X) + (E_Y - E_Y<-f)) / (2 (E_Y - E_X))",
                           "share_control": "1 - (E_Y,c - E_X,c) / (E_Y - E_X)",
                           "pairing": "base window i takes its donor feature from donor window i mod n (store order)",
                           "features": {f: FEATURES[f][1] for f in feats}},
                "variants": records,
                "run_info": {"runs": self.timings["runs"] - runs0, "capacities": self.timings["capacities"] - caps0,
                             "cached_runs": self.timings["cached_cells"] - cached0,
                             "refused_cached_runs": self.timings["refused_cells"] - refused0, "wall_s": round(wall, 2),
                             "engine_hash": self.engine_hash, "seeds": self.seeds,
                             "note": "wall time and run counts depend on what the cache already held"}}


def _num(v) -> float:
    try:
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan

