"""Cutting windows: the plans a source's window rule makes (`window_plans`), cutting one window
from the source files (`cut_window`) and its manifest entry (`manifest_entry`).

The rules (``tile``, ``contiguous``, ``stratified``, ``explicit``) are described in
`schedport.workload.corpus`; `stratified_start` and `tile_windows` are their arithmetic.
A window whose trace carries prefix identity (hash_ids) is preceded by its warm-up
(`with_warmup`; docs/corpus.md, "Warm caches").
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from schedport.errors import DataError
from schedport.workload.corpus_manifest import MODELED_ADAPTER, derive_seed, window_stats
from schedport.workload.corpus_spec import DEFAULT_WARMUP_S, SERVEGEN_SLOT_S, SourcePart, SourceSpec

STRATA = 8  # 3-hour blocks of the day
STRATUM_STEP = 3  # visit order 0, 3, 6, 1, 4, 7, 2, 5 (3 is coprime with 8)
DAY_S = 86400


def stratified_start(k: int, count: int, days: int) -> tuple[int, int]:
    """(day, hour) of window k of `count` stratified over `days` days and the time of day.

    day = floor((k + 0.5) * days / count); hour = 3 * ((3k) mod 8) + (k div 8) mod 3: the
    eight 3-hour blocks in the order 0, 3, 6, 1, 4, 7, 2, 5, the hour inside a block
    rotating each round of eight (see the module docstring).
    """
    day = int(math.floor((k + 0.5) * days / count))
    block = (STRATUM_STEP * k) % STRATA
    hour = (24 // STRATA) * block + (k // STRATA) % (24 // STRATA)
    return day, hour


@dataclass
class WindowPlan:
    """One window to cut: its id, the selection in the source's files, its duration (None: up to
    the last arrival, for row windows), its stratum, seed and ServeGen request target."""

    window_id: str
    selection: dict
    duration_s: float | None  # None: up to the last arrival (row windows)
    stratum: dict | None
    seed: int | None
    target_requests: int | None = None


def _window_ids(name: str, label: str | None, count: int) -> list[str]:
    width = max(2, len(str(count - 1)))
    base = f"{name}-{label}" if label else name
    return [f"{base}-{k:0{width}d}" for k in range(count)]


def _file_clock(adapter: str, paths: list[Path], options: dict,
                every_row: bool = False) -> tuple[float, float]:
    """(first, last) arrival of a tabular file's usable rows on the file's own clock; with
    `every_row`, of every row with a time, a dropped one too (zero tokens, too long), so the
    windows that tile a file hold each of its rows and count the dropped ones."""
    res = _adapter_read(adapter, paths, {"start_s": 0}, options)
    if not len(res.trace):
        raise DataError(f"{paths[0].name}: no usable request in the file")
    if every_row and res.clock is not None:
        return res.clock
    return float(res.trace.arrival_s[0]), float(res.trace.arrival_s[-1])


def _file_days(adapter: str, paths: list[Path], options: dict) -> int:
    """Whole days covered by a tabular file on its own clock (for days = "auto").

    A last, partial day is left out so that no stratified start falls after the data end.
    """
    last = _file_clock(adapter, paths, options)[1]
    return max(1, int(math.floor(last / DAY_S)))


TILE_EPS_S = 1e-3


def tile_windows(first: float, last: float, count: int) -> tuple[list[float], float]:
    """(starts, length) of `count` equal windows tiling [first, last + 1 ms) with no gap or overlap.

    The length is rounded up to a microsecond and the starts to microseconds, so the
    boundaries are exact decimals in the manifest.
    """
    length = math.ceil((last + TILE_EPS_S - first) / count * 1e6) / 1e6
    return [round(first + k * length, 6) for k in range(count)], length


def window_plans(src: SourceSpec, part: SourcePart) -> list[WindowPlan]:
    """The windows `part`'s rule asks for, in order (ids, selections, seeds)."""
    w = part.windows
    rule = w["rule"]
    if rule == "contiguous":
        count = w["count"]
        ids = _window_ids(src.name, part.label, count)
        return [WindowPlan(ids[k], {"start_s": w["start_s"] + k * w["step_s"],
                               "duration_s": w["duration_s"]}, float(w["duration_s"]), None, None)
                for k in range(count)]
    if rule == "tile":
        count = w["count"]
        ids = _window_ids(src.name, part.label, count)
        first, last = _file_clock(src.adapter, part.paths, part.options, every_row=True)
        starts, length = tile_windows(first, last, count)
        return [WindowPlan(ids[k], {"start_s": starts[k], "duration_s": length}, length, None, None)
                for k in range(count)]
    if rule == "stratified":
        count = w["count"]
        days = w["days"]
        if days == "auto":
            days = _file_days(src.adapter, part.paths, part.options)
        starts = []
        for k in range(count):
            day, hour = stratified_start(k, count, days)
            starts.append((day * DAY_S + hour * 3600, {"day": day, "hour": hour, "days": days}))
    else:
        starts = [(s, None) for s in w["starts_s"]]
    ids = _window_ids(src.name, part.label, len(starts))
    plans = []
    for k, (start, stratum) in enumerate(starts):
        if src.adapter == "servegen":
            seed = derive_seed(part.seed, start)
            sel = {"slot_start_s": int(start), "seed": seed}
            if "rate_scale" in w:
                sel["rate_scale"] = float(w["rate_scale"])
            plans.append(WindowPlan(ids[k], sel, None, stratum, seed, w.get("target_requests")))
        elif src.adapter == MODELED_ADAPTER:
            sel = {"start_s": start, "rows": w["rows"], "seed": part.seed}
            plans.append(WindowPlan(ids[k], sel, None, stratum, part.seed))
        elif "rows" in w:
            plans.append(WindowPlan(ids[k], {"start_s": start, "rows": w["rows"]}, None, stratum, None))
        else:
            plans.append(WindowPlan(ids[k], {"start_s": start, "duration_s": w["duration_s"]},
                               float(w["duration_s"]), stratum, None))
    return plans


def _adapter_read(adapter: str, paths: list[Path], selection: dict, options: dict):
    from schedport.workload import sources

    opts = dict(options)
    if adapter == MODELED_ADAPTER:
        from schedport.workload.sources import burstgpt_model

        return burstgpt_model.generate(**{**opts, **selection})
    return sources.read(adapter, paths, **opts, **selection)


def _servegen_slot(paths: list[Path], slot: int, exclude: set[int],
                   duration: float | None) -> tuple[float, float]:
    """(summed rate of the slot's active clients with length data, slot length in s).

    Clients in `exclude` (found by the adapter to have no usable dataset entry) are left
    out, as are clients without a dataset file beside their trace file.
    """
    from schedport.workload.sources import servegen

    pat = re.compile(r"^chunk-(\d+)-trace\.csv(\.gz)?$")
    traces = [p for p in paths if pat.match(p.name)]
    if not traces and paths and paths[0].is_dir():  # a user's pool folder
        traces = sorted(p for p in paths[0].iterdir() if pat.match(p.name))
    total = 0.0
    length = None
    for p, ct in zip(traces, servegen.load_client_traces(traces)):
        cid = int(pat.match(p.name).group(1))
        k = int(np.searchsorted(ct.start, slot))
        if k >= len(ct.start) or ct.start[k] != slot:
            continue  # the adapter reports a missing slot
        if k + 1 < len(ct.start):
            step = float(ct.start[k + 1] - slot)
            length = step if length is None else min(length, step)
        if ct.pattern[k] <= 0 or cid in exclude:
            continue
        if not any((p.parent / f"chunk-{cid}-dataset.json{gz}").exists() for gz in ("", ".gz")):
            continue
        total += float(ct.rate[k])
    length = float(duration if duration is not None else (length or SERVEGEN_SLOT_S))
    return total, length


def cut_window(src: SourceSpec, part: SourcePart, plan: WindowPlan):
    """Produce one window -> (AdapterResult, selection actually used, extra manifest fields)."""
    extra: dict = {}
    sel = dict(plan.selection)
    if src.adapter != "servegen":
        res = _adapter_read(src.adapter, part.paths, sel, part.options)
        res, extra = with_warmup(src, part, sel, res)
        return res, sel, extra
    slot = sel["slot_start_s"]
    exclude: set[int] = set()
    for _ in range(3):
        total, length = _servegen_slot(part.paths, slot, exclude, part.options.get("duration_s"))
        if plan.target_requests is not None:
            if total <= 0:
                raise DataError(f"servegen: no active client with length data in slot {slot}")
            sel["rate_scale"] = plan.target_requests / (total * length)
        res = _adapter_read(src.adapter, part.paths, sel, part.options)
        nodata = {int(m.group(1)) for s in res.skipped
                  if (m := re.match(r"^servegen-(\d+): no dataset entry", s))}
        if plan.target_requests is None or nodata <= exclude:
            break
        exclude |= nodata  # recompute the factor without clients the adapter had to skip
    extra = {"slot_s": length, "target_requests": plan.target_requests,
             "active_rate_rps": total, "expected_requests": total * sel["rate_scale"] * length}
    return res, sel, extra


def with_warmup(src: SourceSpec, part: SourcePart, sel: dict, res):
    """The window `res` (cut with selection `sel` from a tabular source) preceded by its warm-up ->
    (result, manifest fields).

    A window whose trace carries hash_ids is preceded by the source's requests of the
    ``windows.warmup_s`` seconds (`DEFAULT_WARMUP_S` when the spec gives none) before its start
    on the file's own clock, cut with the part's options (the same drops), flagged as warm-up in
    the window's trace. Arrivals are then counted from the warm-up's start: the window's own
    shift by the warm-up's span (``warmup_s`` in the manifest: the span actually covered, less
    than asked near the file's start), so its requests keep their spacing exactly as without it.
    A window without hash_ids is returned as it is, with no manifest field (existing corpora
    are unchanged); a spec that asks such a window for a warm-up is a one-line `DataError`.
    """
    tr = res.trace
    asked = part.windows.get("warmup_s")
    if tr.hash_ids is None:
        if asked:
            raise DataError(f"source {src.name}: windows.warmup_s = {asked:g}: its trace carries no hash_ids, so "
                            "there is no prefix cache to warm; remove warmup_s or give the files hash_ids")
        return res, {}
    want = float(DEFAULT_WARMUP_S if asked is None else asked)
    start = float(sel["start_s"])
    lo = max(0.0, start - want)
    none = {"warmup_s": 0.0, "n_warmup": 0}
    if not len(tr) or not start > lo:   # an empty window is refused by the build, warm-up or not
        return res, none
    shift = start - lo
    pre = _adapter_read(src.adapter, part.paths, {"start_s": lo, "duration_s": shift}, part.options).trace
    keep = np.flatnonzero(pre.arrival_s < shift)   # a request at the window's start is the window's, never both
    if not len(keep):
        return res, none
    pre = pre.take(keep)
    clients = None
    if tr.client_id is not None or pre.client_id is not None:
        clients = np.concatenate([_clients(pre), _clients(tr)])
    from schedport.workload.trace import Trace

    both = Trace.from_arrays(
        np.concatenate([pre.arrival_s, tr.arrival_s + shift]), np.concatenate([pre.input_tokens, tr.input_tokens]),
        np.concatenate([pre.output_tokens, tr.output_tokens]), clients, name=tr.name,
        source=f"source {src.name}: the window from start_s={start:g} with its warm-up",
        hash_ids=pre.hash_id_lists() + tr.hash_id_lists(), hash_block_size=tr.hash_block_size, warmup=len(pre))
    return replace(res, trace=both), {"warmup_s": shift, "n_warmup": len(pre)}


def _clients(t) -> np.ndarray:
    """A trace's client ids as an object array (None for each request when it has no client column)."""
    return np.full(len(t), None, dtype=object) if t.client_id is None else np.asarray(t.client_id, dtype=object)


_REGISTRY_BY_NAME: dict | None = None


def _registered_sums(name: str) -> tuple[set[str], str] | None:
    """Known sha256s (mirror and published form) and URL of a registered file, by base name."""
    global _REGISTRY_BY_NAME
    if _REGISTRY_BY_NAME is None:
        from schedport.workload import datadir

        table = {}
        for f in datadir.data_files().values():
            sums = {s for s in (f.sha256, f.original_sha256) if s}
            for rel in (f.relpath, f.original_relpath):
                if rel:
                    table[rel.rsplit("/", 1)[-1]] = (sums, f.url)
        _REGISTRY_BY_NAME = table
    return _REGISTRY_BY_NAME.get(name)


def _origin(res, part: SourcePart, src: SourceSpec) -> tuple[str, str, int]:
    """(origin_file, origin_sha256, number of files) of a window; checks registered sums.

    Only files the spec names as registered public files are held to the public sha256s; a
    user's own files (a ServeGen-style pool of their own, say) may share the public names and
    are recorded by their own sha256 in the manifest instead.
    """
    org = res.origin
    for o in org if part.registered else ():
        hit = _registered_sums(o["name"])
        if hit and hit[0] and o["sha256"] not in hit[0]:
            raise DataError(f"{o['name']}: sha256 {o['sha256']} is not the registered one (a "
                            f"different or corrupted copy; remove it and fetch it again from "
                            f"{hit[1]})")
    if src.adapter == MODELED_ADAPTER:
        return org[0]["name"], org[0]["sha256"], 1
    name = part.files[0] if len(part.files) == 1 else ", ".join(part.files)
    if len(org) == 1:
        return name, org[0]["sha256"], 1
    listing = "".join(f"{o['sha256']}  {o['name']}\n" for o in sorted(org, key=lambda o: o["name"]))
    return name, hashlib.sha256(listing.encode("utf-8")).hexdigest(), len(org)


def manifest_entry(src: SourceSpec, part: SourcePart, plan: WindowPlan, res, sel: dict, extra: dict, trace,
                   file_sha: str) -> dict:
    """The manifest entry of a cut window: ids, hashes, statistics, selection, seed, origin and drops."""
    if plan.duration_s is not None:
        duration = plan.duration_s
    elif src.adapter == "servegen":
        duration = float(extra["slot_s"])
    else:
        duration = float(trace.arrival_s[-1]) - extra.get("warmup_s", 0.0)
    stats = window_stats(trace, duration, extra.get("warmup_s", 0.0))
    ofile, osha, nfiles = _origin(res, part, src)
    e = {"window_id": plan.window_id, "source": src.name, "label": part.label,
         "adapter": src.adapter, "modeled": src.adapter == MODELED_ADAPTER,
         "file": f"windows/{plan.window_id}.parquet",
         "sha256": trace.content_sha256(), "file_sha256": file_sha}
    e.update(stats)
    e.update({"selection": sel, "seed": plan.seed, "stratum": plan.stratum,
              "rule": part.windows["rule"], **extra,
              "origin_file": ofile, "origin_sha256": osha, "origin_files": nfiles,
              "dropped": dict(res.dropped), "n_dropped": int(sum(res.dropped.values())),
              "skipped": list(res.skipped), "notes": list(res.notes)})
    if getattr(res, "prefix", None) is not None:   # a derived prefix identity: the assumption, labelled
        e["prefix"] = dict(res.prefix)
    return e
