"""The frozen corpus: windows cut from public traces by a spec, with a manifest of hashes.

A corpus directory holds ``windows/<window_id>.parquet`` (canonical traces, written by
`schedport.workload.trace.save_trace`) and ``manifest.json``: per window its source, selection,
seed, origin file and sha256, statistics, drops and the sha256 of its canonical content;
for the whole corpus ``corpus_sha256`` (over the sorted ``(window_id, sha256)`` pairs and
the spec as built) and ``manifest_sha256`` (a seal over every other manifest field, so a
hand edit anywhere is caught). ``build.json`` beside them records when and where it was
built (kept out of the manifest so two builds are byte-identical).

The corpus is defined by a spec (TOML; the study's is packaged as
``schedport/workload/data/corpus-spec.toml``, documented in docs/corpus.md): sources, each with an
adapter (`schedport.workload.sources` formats, plus ``burstgpt-modeled``), files relative to the data
directory, a window rule and count, and seeds. The packaged
``schedport/workload/data/corpus-expected.json`` holds the window hashes of the study as frozen, so a
build on another machine says whether its data reproduced the same windows.

Window rules (``windows = {rule = ..., ...}``):

- ``tile``: ``count`` equal, contiguous windows from the file's first request to 1 ms after
  its last (no gap, no overlap; every request in exactly one window). The study's Azure
  hours use it: they span 3,502 s and 3,436 s, so 20 windows are ~3 minutes each.
- ``contiguous``: ``count`` windows of ``duration_s`` from ``start_s`` (default 0), one
  every ``step_s`` (default ``duration_s``); time is the file's own clock.
- ``stratified``: ``count`` windows spread over ``days`` (an integer, or ``"auto"`` = the
  whole days the file spans) and the time of day. Window k starts on day
  ``floor((k + 0.5) * days / count)`` at hour ``3 * ((3k) mod 8) + (k div 8) mod 3``: the
  eight 3-hour blocks of the day are visited in the order 0, 3, 6, 1, 4, 7, 2, 5 (every
  block once per 8 windows, consecutive windows 9 h apart) and the hour inside the block
  rotates each round, so 40 windows cover every hour of the day and every block five times.
  The window is then the first ``rows`` requests from that start (tabular files and
  ``burstgpt-modeled``) or the 600 s ServeGen slot starting there (``servegen``).
- ``explicit``: ``starts_s = [...]`` with ``duration_s`` or ``rows`` (or ServeGen slots).

ServeGen slots take ``target_requests`` (scale every active client's rate by one factor so
the slot's expected request count is the target: factor = target / (sum of the active
clients' rates x slot length), clients without length data left out) or a fixed
``rate_scale``; each slot is generated with seed ``derive_seed(seed, slot)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import sys
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import typer

from schedport.__about__ import __version__
from schedport.errors import ConfigError, DataError, SchedportError
from schedport.common.guard import WHAT, claim_dir, dir_kind
from schedport.common.outputs import cause, parse_out_path, process_alive

MANIFEST_SCHEMA = 1
SPEC_SCHEMA = 1
MANIFEST_KIND = "schedport-corpus"
EXPECTED_KIND = "schedport-corpus-expected"
DEFAULT_OUT = Path("corpus")
MODELED_ADAPTER = "burstgpt-modeled"
TABULAR = ("azure", "burstgpt", "jsonl", "canonical")
ADAPTERS = (*TABULAR, "servegen", MODELED_ADAPTER)
RULES = ("contiguous", "tile", "stratified", "explicit")
STRATA = 8  # 3-hour blocks of the day
STRATUM_STEP = 3  # visit order 0, 3, 6, 1, 4, 7, 2, 5 (3 is coprime with 8)
DAY_S = 86400
SERVEGEN_SLOT_S = 600
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_SOURCE_KEYS = {"name", "adapter", "cite", "files", "files_any", "options", "seed", "windows",
                "parts", "fallback"}
_PART_KEYS = {"label", "files", "files_any", "options", "seed", "windows"}
_SPEC_KEYS = {"schema", "name", "description", "extends", "sources"}
_DEFAULT_REGIONS = {"light": 0.3, "moderate": 0.6, "high": 0.8, "near-saturation": 0.95,
                    "overload": 1.2, "severe": 1.6}
_STAT_KEYS = ("n_requests", "duration_s", "input_mean", "input_p50", "input_p99", "output_mean",
              "output_p50", "output_p99", "mean_rate_rps", "index_of_dispersion", "span_s",
              "n_clients")


# =========================================================================== the corpus


@dataclass(frozen=True)
class Window:
    """One window of a corpus: its id, source, content sha256, parquet path and manifest entry."""

    window_id: str
    source: str
    sha256: str
    path: Path
    meta: dict = field(default_factory=dict, compare=False, repr=False)


class Corpus:
    """A built corpus directory: the manifest, its windows in manifest order, and their traces.

    `reproduction` is set by `build_corpus` (the comparison with the shipped expected
    hashes); it is None for a corpus opened with `load_corpus`.
    """

    def __init__(self, root: Path, manifest: dict, windows: list[Window]):
        self.root = root
        self.manifest = manifest
        self.windows = windows
        self.corpus_sha256: str = manifest["corpus_sha256"]
        self.reproduction: dict | None = None
        self._by_id = {w.window_id: w for w in windows}

    def __repr__(self) -> str:
        return f"Corpus({str(self.root)!r}, {len(self.windows)} windows, {self.corpus_sha256[:12]})"

    @property
    def sources(self) -> list[str]:
        """Source names in manifest order."""
        return list(dict.fromkeys(w.source for w in self.windows))

    def window(self, window_id: str) -> Window:
        """The window with this id (a one-line `ConfigError` if there is none)."""
        try:
            return self._by_id[window_id]
        except KeyError:
            raise ConfigError(f"{self.root}: no window {window_id!r} in this corpus") from None

    def trace(self, window_id: str):
        """The canonical `Trace` of a window, read from its parquet file (named by the window id)."""
        from schedport.workload.trace import load_trace

        return load_trace(self.window(window_id).path)

    def select(self, sources: list[str] | str | None = None,
               n_per_source: int | None = None) -> list[Window]:
        """The first `n_per_source` windows (all if None) of each of `sources` (all if None).

        Windows keep manifest order. Unknown source names are a one-line `ConfigError`.
        """
        if isinstance(sources, str):
            sources = [s.strip() for s in sources.split(",") if s.strip()]
        known = self.sources
        if sources is not None:
            bad = [s for s in sources if s not in known]
            if bad:
                raise ConfigError(f"unknown source(s) {', '.join(bad)} in {self.root} "
                                  f"(known: {', '.join(known)})")
        if n_per_source is not None and n_per_source < 1:
            raise ConfigError(f"n_per_source must be at least 1, got {n_per_source}")
        want = set(known if sources is None else sources)
        taken: dict[str, int] = {}
        out = []
        for w in self.windows:
            if w.source not in want:
                continue
            if n_per_source is not None and taken.get(w.source, 0) >= n_per_source:
                continue
            taken[w.source] = taken.get(w.source, 0) + 1
            out.append(w)
        return out


def load_corpus(dir: str | os.PathLike[str] = DEFAULT_OUT) -> Corpus:
    """Open the corpus at `dir` (its manifest; window files are read on demand).

    A missing, unreadable or malformed manifest is a one-line `DataError` saying how to
    build one. Hashes are not checked here (that is `verify_corpus`), so opening is cheap.
    """
    root = Path(dir)
    mpath = root / "manifest.json"
    kind = dir_kind(root)
    if kind == "empty":
        hint = f"build it with `schedport corpus build --out {root}`"
    else:  # never advise a build that would be refused, or replace what is there
        hint = (f"it holds {WHAT.get(kind, 'other files')}; give a corpus directory, or build one in a new "
                f"directory with `schedport corpus build --out NEW_DIR`")
    if not mpath.is_file():
        raise DataError(f"{root}: not a corpus directory (no manifest.json); {hint}")
    try:
        man = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{mpath}: unreadable corpus manifest ({_one_line(e)}); {hint}") from None
    if not isinstance(man, dict) or man.get("schema") != MANIFEST_SCHEMA:
        raise DataError(f"{mpath}: not a schedport corpus manifest (schema {MANIFEST_SCHEMA}); {hint}")
    if not isinstance(man.get("corpus_sha256"), str) or not isinstance(man.get("windows"), list):
        raise DataError(f"{mpath}: corpus manifest lacks corpus_sha256 or its windows list; {hint}")
    windows: list[Window] = []
    seen: set[str] = set()
    for i, w in enumerate(man["windows"]):
        if not isinstance(w, dict) or not all(isinstance(w.get(k), str) and w.get(k)
                                              for k in ("window_id", "source", "sha256")):
            raise DataError(f"{mpath}: windows[{i}] needs string window_id, source and sha256")
        wid = w["window_id"]
        if wid in seen:
            raise DataError(f"{mpath}: window {wid!r} is listed twice")
        if "/" in wid or "\\" in wid or wid.startswith("."):
            raise DataError(f"{mpath}: windows[{i}]: {wid!r} is not a valid window id")
        seen.add(wid)
        windows.append(Window(wid, w["source"], w["sha256"], root / "windows" / f"{wid}.parquet",
                              w))
    if not windows:
        raise DataError(f"{mpath}: the corpus has no windows; {hint}")
    return Corpus(root, man, windows)


# =========================================================================== hashes & stats


def _canon(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def corpus_hash(pairs: list[tuple[str, str]], spec: dict) -> str:
    """The corpus identity: sha256 over the sorted (window_id, sha256) pairs, then the spec.

    Only window *content* hashes and the spec enter it (not file bytes, statistics or the
    code version), so the same windows built anywhere have the same corpus_sha256.
    """
    h = hashlib.sha256(b"schedport-corpus-v1\n")
    for wid, sha in sorted(pairs):
        h.update(f"{wid} {sha}\n".encode("utf-8"))
    h.update(b"spec ")
    h.update(_canon(spec))
    return h.hexdigest()


def manifest_seal(manifest: dict) -> str:
    """sha256 of the canonical JSON of the manifest without its ``manifest_sha256`` field."""
    return hashlib.sha256(_canon({k: v for k, v in manifest.items()
                                  if k != "manifest_sha256"})).hexdigest()


def derive_seed(base: int, *parts) -> int:
    """A 31-bit seed derived from a base seed and labels (stable across Python/NumPy versions)."""
    text = ":".join(str(p) for p in (base, *parts))
    return int.from_bytes(hashlib.sha256(f"schedport-corpus:{text}".encode()).digest()[:4],
                          "big") & 0x7FFFFFFF


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def window_stats(trace, duration_s: float) -> dict:
    """Per-window statistics stored in the manifest (and recomputed by `verify_corpus`).

    Lengths: mean, p50, p99 (numpy linear percentiles). Rate: requests / `duration_s`.
    Index of dispersion: variance / mean (population variance) of arrival counts in 1-s
    bins over [0, ceil(duration_s)); 1 for Poisson arrivals, far above for bursty ones.
    """
    inp = np.asarray(trace.input_tokens, dtype=np.float64)
    out = np.asarray(trace.output_tokens, dtype=np.float64)
    arr = np.asarray(trace.arrival_s, dtype=np.float64)
    n = len(arr)
    nb = max(1, int(math.ceil(duration_s)))
    bins = np.clip(np.floor(arr).astype(np.int64), 0, nb - 1)
    counts = np.bincount(bins, minlength=nb).astype(np.float64)
    mean_c = float(counts.mean())
    clients = 0 if trace.client_id is None else len({c for c in trace.client_id.tolist()
                                                     if c is not None})
    return {
        "n_requests": int(n),
        "duration_s": float(duration_s),
        "input_mean": float(inp.mean()),
        "input_p50": float(np.percentile(inp, 50)),
        "input_p99": float(np.percentile(inp, 99)),
        "output_mean": float(out.mean()),
        "output_p50": float(np.percentile(out, 50)),
        "output_p99": float(np.percentile(out, 99)),
        "mean_rate_rps": float(n / duration_s) if duration_s > 0 else None,
        "index_of_dispersion": float(counts.var() / mean_c) if mean_c > 0 else None,
        "span_s": float(trace.span_s),
        "n_clients": int(clients),
    }


# =========================================================================== the spec


def default_spec_path():
    """The packaged study spec (``schedport/workload/data/corpus-spec.toml``)."""
    return resources.files("schedport.workload") / "data" / "corpus-spec.toml"


def _expected_path():
    return resources.files("schedport.workload") / "data" / "corpus-expected.json"


@dataclass
class _Part:
    """One run of windows of a source: its files (as written and resolved), options and rule."""

    label: str | None
    files: list[str]
    paths: list[Path]
    options: dict
    windows: dict
    seed: int | None
    registered: bool = False  # every file is a registered public one (checked against its sha256)


@dataclass
class _Source:
    name: str
    adapter: str
    cite: str
    spec: dict  # normalised entry recorded in the manifest's spec
    parts: list[_Part]


def _read_toml(path, what: str) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what}: cannot read spec ({_one_line(e)})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what}: malformed TOML ({_one_line(e)})") from None


def load_spec(spec: str | os.PathLike[str] | None = None) -> tuple[dict, Path | None]:
    """Read a corpus spec (None: the packaged study) -> (raw dict with `extends` merged, its folder).

    ``extends = "default"`` (or a path to another spec, relative to this one) puts that
    spec's sources first, so a user adds a source to the study in a few lines. Structural
    errors are one-line `ConfigError`s naming the spec and key.
    """
    if spec is None:
        raw = _read_toml(default_spec_path(), "corpus-spec.toml (packaged)")
        return _check_spec(raw, "corpus-spec.toml (packaged)"), None
    p = Path(spec)
    if not p.is_file():
        raise ConfigError(f"{p}: spec file not found")
    raw = _check_spec(_read_toml(p, str(p)), str(p))
    ext = raw.pop("extends", None)
    if ext is not None:
        if not isinstance(ext, str) or not ext:
            raise ConfigError(f"{p}: extends must be \"default\" or a path to another spec")
        if ext == "default":
            base, _ = load_spec(None)
        else:
            q = Path(ext) if Path(ext).is_absolute() else p.parent / ext
            if q.resolve() == p.resolve():
                raise ConfigError(f"{p}: extends names the spec itself")
            base, _ = load_spec(q)
        raw["sources"] = list(base["sources"]) + list(raw.get("sources", []))
    if not raw.get("sources"):
        raise ConfigError(f"{p}: the spec defines no [[sources]]")
    return raw, p.parent


def _check_spec(raw: dict, where: str) -> dict:
    unknown = sorted(set(raw) - _SPEC_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} "
                          f"(allowed: {', '.join(sorted(_SPEC_KEYS))})")
    if raw.get("schema", SPEC_SCHEMA) != SPEC_SCHEMA:
        raise ConfigError(f"{where}: schema must be {SPEC_SCHEMA}, not {raw.get('schema')!r}")
    srcs = raw.get("sources", [])
    if not isinstance(srcs, list) or not all(isinstance(s, dict) for s in srcs):
        raise ConfigError(f"{where}: sources must be an array of tables ([[sources]])")
    if not srcs and "extends" not in raw:
        raise ConfigError(f"{where}: the spec defines no [[sources]]")
    for i, s in enumerate(srcs):
        s.setdefault("_where", f"{where}: sources[{i}]")
    return raw


def _int(v, what: str, lo: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ConfigError(f"{what} must be an integer >= {lo}, not {v!r}")
    return int(v)


def _num(v, what: str, positive: bool = True) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
            or (v <= 0 if positive else v < 0):
        raise ConfigError(f"{what} must be a number {'> 0' if positive else '>= 0'}, not {v!r}")
    return v


def _check_windows(w, adapter: str, where: str) -> dict:
    """Validate a `windows` table for `adapter`; returns it with the rule's defaults filled in."""
    if not isinstance(w, dict):
        raise ConfigError(f"{where}: windows must be a table, e.g. "
                          "{ rule = \"contiguous\", count = 20, duration_s = 180 }")
    w = dict(w)
    rule = w.get("rule")
    if rule not in RULES:
        raise ConfigError(f"{where}: windows.rule must be one of {', '.join(RULES)}, not {rule!r}")
    allowed = {"contiguous": {"rule", "count", "duration_s", "start_s", "step_s"},
               "tile": {"rule", "count"},
               "stratified": {"rule", "count", "days", "rows", "target_requests", "rate_scale"},
               "explicit": {"rule", "starts_s", "duration_s", "rows", "target_requests",
                            "rate_scale"}}[rule]
    unknown = sorted(set(w) - allowed)
    if unknown:
        raise ConfigError(f"{where}: windows: unknown key(s) {', '.join(unknown)} for rule "
                          f"{rule!r} (allowed: {', '.join(sorted(allowed - {'rule'}))})")
    if rule == "contiguous":
        if adapter not in TABULAR:
            raise ConfigError(f"{where}: rule 'contiguous' needs a tabular adapter "
                              f"({', '.join(TABULAR)}), not {adapter!r}")
        _int(w.get("count"), f"{where}: windows.count", 1)
        _num(w.get("duration_s"), f"{where}: windows.duration_s")
        w.setdefault("start_s", 0)
        _num(w["start_s"], f"{where}: windows.start_s", positive=False)
        w.setdefault("step_s", w["duration_s"])
        _num(w["step_s"], f"{where}: windows.step_s")
        return w
    if rule == "tile":
        if adapter not in TABULAR:
            raise ConfigError(f"{where}: rule 'tile' needs a tabular adapter "
                              f"({', '.join(TABULAR)}), not {adapter!r}")
        _int(w.get("count"), f"{where}: windows.count", 1)
        return w
    if rule == "stratified":
        _int(w.get("count"), f"{where}: windows.count", 1)
        days = w.get("days")
        if days == "auto":
            if adapter not in TABULAR:
                raise ConfigError(f"{where}: windows.days = \"auto\" needs a tabular adapter; "
                                  "give the number of days")
        else:
            _int(days, f"{where}: windows.days (or \"auto\")", 1)
    else:
        starts = w.get("starts_s")
        if not isinstance(starts, list) or not starts:
            raise ConfigError(f"{where}: windows.starts_s must be a non-empty list of seconds")
        for s in starts:
            _num(s, f"{where}: windows.starts_s entries", positive=False)
        if adapter == "servegen":
            for s in starts:
                if not isinstance(s, int) or s % SERVEGEN_SLOT_S:
                    raise ConfigError(f"{where}: windows.starts_s: servegen slots are integers, "
                                      f"multiples of {SERVEGEN_SLOT_S} s, not {s!r}")
    if adapter == "servegen":
        if "rows" in w or "duration_s" in w:
            raise ConfigError(f"{where}: servegen windows are 600 s slots; use target_requests "
                              "or rate_scale, not rows/duration_s")
        if ("target_requests" in w) == ("rate_scale" in w):
            raise ConfigError(f"{where}: servegen windows need exactly one of target_requests "
                              "or rate_scale")
        if "target_requests" in w:
            _int(w["target_requests"], f"{where}: windows.target_requests", 1)
        else:
            _num(w["rate_scale"], f"{where}: windows.rate_scale")
        return w
    if "target_requests" in w or "rate_scale" in w:
        raise ConfigError(f"{where}: target_requests/rate_scale apply to servegen only")
    if rule == "stratified" or adapter == MODELED_ADAPTER:
        if "duration_s" in w and adapter == MODELED_ADAPTER:
            raise ConfigError(f"{where}: {MODELED_ADAPTER} windows are given by rows")
        if rule == "stratified":
            _int(w.get("rows"), f"{where}: windows.rows", 1)
    if rule == "explicit":
        if ("rows" in w) == ("duration_s" in w):
            raise ConfigError(f"{where}: explicit windows need exactly one of rows or duration_s")
        if "rows" in w:
            _int(w["rows"], f"{where}: windows.rows", 1)
        else:
            _num(w["duration_s"], f"{where}: windows.duration_s")
    return w


def _str_list(v, what: str) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise ConfigError(f"{what} must be a non-empty list of file names")
    return list(v)


def _normalise_source(src: dict, where: str) -> dict:
    """Check one [[sources]] table's keys and types; returns it with parts made explicit."""
    unknown = sorted(set(src) - _SOURCE_KEYS - {"_where"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} "
                          f"(allowed: {', '.join(sorted(_SOURCE_KEYS))})")
    name = src.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(f"{where}: name must be lower-case letters, digits, '.', '_' or '-' "
                          f"(it prefixes window ids), not {name!r}")
    where = f"{where} ({name})"
    adapter = src.get("adapter")
    if adapter not in ADAPTERS:
        raise ConfigError(f"{where}: adapter must be one of {', '.join(ADAPTERS)}, not {adapter!r}")
    if adapter == "burstgpt" and name == MODELED_ADAPTER:
        raise ConfigError(f"{where}: the name {MODELED_ADAPTER!r} is reserved for the modeled source")
    if adapter == MODELED_ADAPTER and not name.startswith(MODELED_ADAPTER):
        raise ConfigError(f"{where}: a {MODELED_ADAPTER} source must be named "
                          f"'{MODELED_ADAPTER}...' so it is never taken for the real trace")
    for k in ("options",):
        if k in src and not isinstance(src[k], dict):
            raise ConfigError(f"{where}: {k} must be a table")
    if "seed" in src:
        _int(src["seed"], f"{where}: seed")
    if "cite" in src and not isinstance(src["cite"], str):
        raise ConfigError(f"{where}: cite must be a string")
    parts = src.get("parts")
    if parts is None:
        parts = [{k: src[k] for k in ("files", "files_any", "windows") if k in src}]
        parts[0]["label"] = None
    else:
        if not isinstance(parts, list) or not parts or not all(isinstance(p, dict) for p in parts):
            raise ConfigError(f"{where}: parts must be an array of tables ([[sources.parts]])")
        if any(k in src for k in ("files", "files_any", "windows")):
            raise ConfigError(f"{where}: give files/windows either on the source or on each "
                              "part, not both")
    out_parts = []
    labels = set()
    for j, part in enumerate(parts):
        pw = f"{where}: parts[{j}]" if src.get("parts") is not None else where
        unknown = sorted(set(part) - _PART_KEYS)
        if unknown:
            raise ConfigError(f"{pw}: unknown key(s) {', '.join(unknown)} "
                              f"(allowed: {', '.join(sorted(_PART_KEYS))})")
        label = part.get("label")
        if src.get("parts") is not None:
            if not isinstance(label, str) or not _NAME_RE.match(label) or label in labels:
                raise ConfigError(f"{pw}: each part needs a distinct label (lower-case, as in "
                                  f"window ids), not {label!r}")
            labels.add(label)
        if adapter == MODELED_ADAPTER:
            if "files" in part or "files_any" in part:
                raise ConfigError(f"{pw}: {MODELED_ADAPTER} reads no files")
        elif ("files" in part) == ("files_any" in part):
            raise ConfigError(f"{pw}: give exactly one of files or files_any")
        files = part.get("files", part.get("files_any"))
        if files is not None:
            files = _str_list(files, f"{pw}: files")
        opts = part.get("options", {})
        if not isinstance(opts, dict):
            raise ConfigError(f"{pw}: options must be a table")
        if "seed" in part:
            _int(part["seed"], f"{pw}: seed")
        if "windows" not in part:
            raise ConfigError(f"{pw}: windows is missing (e.g. windows = {{ rule = \"contiguous\", "
                              "count = 20, duration_s = 180 }})")
        entry = {"label": label,
                 "files_any" if "files_any" in part else "files": files,
                 "options": {**src.get("options", {}), **opts},
                 "windows": _check_windows(part["windows"], adapter, pw)}
        if files is None:
            entry.pop("files", None)
        seed = part.get("seed", src.get("seed"))
        if adapter in ("servegen", MODELED_ADAPTER) and seed is None:
            raise ConfigError(f"{pw}: a generated source needs a seed")
        entry["seed"] = seed
        out_parts.append(entry)
    norm = {"name": name, "adapter": adapter, "cite": src.get("cite", ""), "parts": out_parts}
    if "fallback" in src:
        fb = src["fallback"]
        if not isinstance(fb, dict):
            raise ConfigError(f"{where}: fallback must be a table")
        if not any("files_any" in p for p in out_parts):
            raise ConfigError(f"{where}: a fallback needs files_any (it is used when none is present)")
        norm["fallback"] = _normalise_source(fb, f"{where}: fallback")
    return norm


def _resolve_file(name: str, data_dir: Path, spec_dir: Path | None, download: bool,
                  where: str) -> Path:
    """A spec file name -> a local path: registered public file (located/downloaded), or a user file."""
    from schedport.workload import datadir

    try:
        datadir.lookup(name)
        registered = True
    except ConfigError:
        registered = False
    if registered:
        return datadir.locate(name, data_dir, download=download)
    p = Path(name).expanduser()
    cands = [p] if p.is_absolute() else (
        ([spec_dir / p] if spec_dir is not None else []) + [data_dir / p, Path.cwd() / p])
    for c in cands:
        if c.exists():
            return c
    tried = ", ".join(str(c) for c in cands)
    raise DataError(f"{where}: file {name!r} not found (looked in {tried})")


def _is_registered(name: str) -> bool:
    """Whether a spec file name denotes a registered public file or folder (not a user's own)."""
    from schedport.workload import datadir

    try:
        datadir.lookup(name)
        return True
    except ConfigError:
        pass
    prefix = name.rstrip("/") + "/"
    return name.endswith("/") and any(f.relpath.startswith(prefix) for f in datadir.DATA_FILES.values())


def _present(name: str, data_dir: Path, spec_dir: Path | None) -> Path | None:
    try:
        return _resolve_file(name, data_dir, spec_dir, False, "")
    except SchedportError:
        return None


def _servegen_folder(name: str, data_dir: Path, spec_dir: Path | None, download: bool,
                     where: str) -> list[Path]:
    """A ServeGen pool folder: its registered files (located one by one) or a user folder."""
    from schedport.workload import datadir

    prefix = name.rstrip("/") + "/"
    reg = sorted((f for f in datadir.DATA_FILES.values() if f.relpath.startswith(prefix)),
                 key=lambda f: f.relpath)
    if not reg:
        p = _resolve_file(name.rstrip("/"), data_dir, spec_dir, download, where)
        return [p]
    located = {f.relpath: datadir.locate(f.relpath, data_dir, download=download) for f in reg}
    traces = [p for rel, p in located.items() if rel.endswith(("-trace.csv.gz", "-trace.csv"))]
    for rel, p in located.items():
        m = re.search(r"chunk-(\d+)-dataset", rel)
        if m:
            twin = [t for t in traces if re.match(rf"chunk-{m.group(1)}-trace\.csv", t.name)]
            if twin and twin[0].parent != p.parent:
                raise DataError(f"{where}: {p.name} is in {p.parent} but its trace file is in "
                                f"{twin[0].parent}; put the ServeGen files in one folder "
                                f"({Path(data_dir) / name.rstrip('/')})")
    return traces


def _resolve_sources(raw: dict, data_dir: Path, spec_dir: Path | None, download: bool,
                     log: Callable[[str], None]) -> tuple[list[_Source], dict]:
    """Validate every source, choose real-or-fallback, locate files -> sources + the spec as built."""
    srcs: list[_Source] = []
    names: set[str] = set()
    for src in raw["sources"]:
        where = src.get("_where", "spec")
        norm = _normalise_source(src, where)
        chosen = norm
        if "fallback" in norm:
            any_files = [f for p in norm["parts"] for f in p.get("files_any", [])]
            if not any(_present(f, data_dir, spec_dir) for f in any_files):
                chosen = dict(norm["fallback"])
                chosen["fallback_for"] = norm["name"]
                chosen["fallback_reason"] = (f"none of {', '.join(any_files)} was found in the "
                                             "data directory")
                log(f"{norm['name']}: none of {', '.join(any_files)} in {data_dir}; using "
                    f"{chosen['name']} ({_label_of(chosen['adapter'])})")
        chosen = {k: v for k, v in chosen.items() if k != "fallback"}
        if chosen["name"] in names:
            raise ConfigError(f"{where}: source name {chosen['name']!r} is used twice")
        names.add(chosen["name"])
        parts: list[_Part] = []
        for pdict in chosen["parts"]:
            pw = f"source {chosen['name']}" + (f" part {pdict['label']}" if pdict["label"] else "")
            paths: list[Path] = []
            files: list[str] = []
            if "files_any" in pdict:
                hit = next(((f, p) for f in pdict["files_any"]
                            if (p := _present(f, data_dir, spec_dir)) is not None), None)
                if hit is None:  # no fallback: fetch the first one, or fail as locate does
                    first = pdict["files_any"][0]
                    hit = (first, _resolve_file(first, data_dir, spec_dir, download, pw))
                files, paths = [hit[0]], [hit[1]]
                pdict = {**{k: v for k, v in pdict.items() if k != "files_any"}, "files": files}
            elif "files" in pdict:
                files = pdict["files"]
                for f in files:
                    if chosen["adapter"] == "servegen" and f.endswith("/"):
                        paths.extend(_servegen_folder(f, data_dir, spec_dir, download, pw))
                    else:
                        paths.append(_resolve_file(f, data_dir, spec_dir, download, pw))
            parts.append(_Part(pdict["label"], files, paths, pdict["options"], pdict["windows"],
                               pdict["seed"], registered=bool(files) and all(map(_is_registered, files))))
        chosen["parts"] = [{**({"label": p.label} if p.label else {}),
                            **({"files": p.files} if p.files else {}),
                            "options": p.options, "seed": p.seed, "windows": p.windows}
                           for p in parts]
        srcs.append(_Source(chosen["name"], chosen["adapter"], chosen.get("cite", ""), chosen, parts))
    spec = {"schema": SPEC_SCHEMA, "name": raw.get("name", "unnamed"),
            "description": raw.get("description", ""), "sources": [s.spec for s in srcs]}
    return srcs, spec


def _label_of(adapter: str) -> str:
    """What a source's windows are: a modeled source says so in these words everywhere."""
    if adapter == MODELED_ADAPTER:
        from schedport.workload.sources.burstgpt_model import LABEL

        return LABEL
    if adapter == "servegen":
        return "generated from a ServeGen client pool (published per-client fits)"
    return "cut from a trace file"


# =========================================================================== window plans


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
class _Plan:
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


def _file_clock(adapter: str, paths: list[Path], options: dict) -> tuple[float, float]:
    """(first, last) arrival of a tabular file's usable rows on the file's own clock."""
    res = _adapter_read(adapter, paths, {"start_s": 0}, options)
    if not len(res.trace):
        raise DataError(f"{paths[0].name}: no usable request in the file")
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


def _plans(src: _Source, part: _Part) -> list[_Plan]:
    w = part.windows
    rule = w["rule"]
    if rule == "contiguous":
        count = w["count"]
        ids = _window_ids(src.name, part.label, count)
        return [_Plan(ids[k], {"start_s": w["start_s"] + k * w["step_s"],
                               "duration_s": w["duration_s"]}, float(w["duration_s"]), None, None)
                for k in range(count)]
    if rule == "tile":
        count = w["count"]
        ids = _window_ids(src.name, part.label, count)
        first, last = _file_clock(src.adapter, part.paths, part.options)
        starts, length = tile_windows(first, last, count)
        return [_Plan(ids[k], {"start_s": starts[k], "duration_s": length}, length, None, None)
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
            plans.append(_Plan(ids[k], sel, None, stratum, seed, w.get("target_requests")))
        elif src.adapter == MODELED_ADAPTER:
            sel = {"start_s": start, "rows": w["rows"], "seed": part.seed}
            plans.append(_Plan(ids[k], sel, None, stratum, part.seed))
        elif "rows" in w:
            plans.append(_Plan(ids[k], {"start_s": start, "rows": w["rows"]}, None, stratum, None))
        else:
            plans.append(_Plan(ids[k], {"start_s": start, "duration_s": w["duration_s"]},
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


def _run_plan(src: _Source, part: _Part, plan: _Plan):
    """Produce one window -> (AdapterResult, selection actually used, extra manifest fields)."""
    extra: dict = {}
    sel = dict(plan.selection)
    if src.adapter != "servegen":
        return _adapter_read(src.adapter, part.paths, sel, part.options), sel, extra
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


# =========================================================================== build


_REGISTRY_BY_NAME: dict | None = None


def _registered_sums(name: str) -> tuple[set[str], str] | None:
    """Known sha256s (mirror and published form) and URL of a registered file, by base name."""
    global _REGISTRY_BY_NAME
    if _REGISTRY_BY_NAME is None:
        from schedport.workload import datadir

        table = {}
        for f in datadir.DATA_FILES.values():
            sums = {s for s in (f.sha256, f.original_sha256) if s}
            for rel in (f.relpath, f.original_relpath):
                if rel:
                    table[rel.rsplit("/", 1)[-1]] = (sums, f.url)
        _REGISTRY_BY_NAME = table
    return _REGISTRY_BY_NAME.get(name)


def _origin(res, part: _Part, src: _Source) -> tuple[str, str, int]:
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


def _entry(src: _Source, part: _Part, plan: _Plan, res, sel: dict, extra: dict, trace,
           file_sha: str) -> dict:
    if plan.duration_s is not None:
        duration = plan.duration_s
    elif src.adapter == "servegen":
        duration = float(extra["slot_s"])
    else:
        duration = float(trace.arrival_s[-1])
    stats = window_stats(trace, duration)
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
    return e


def build_corpus(spec: str | os.PathLike[str] | None = None,
                 data_dir: str | os.PathLike[str] | None = None,
                 out: str | os.PathLike[str] = DEFAULT_OUT, *, download: bool = True,
                 progress: Callable[[str], None] | None = None) -> Corpus:
    """Build the corpus of `spec` (None: the packaged study) from the public data into `out`.

    Files are found via `schedport.workload.datadir` (``data_dir``, $SCHEDPORT_DATA, the shared
    mirror, the user cache; a missing registered file is downloaded when `download` and the
    machine is online, else a one-line `DataError` says what to get and where to put it).
    The build is atomic: windows and manifest are written to a temporary directory beside
    `out` and renamed into place, replacing an earlier corpus there; a failure leaves `out`
    as it was. An existing `out` that is not a corpus (no manifest.json) and not empty is
    refused. The returned `Corpus` carries `reproduction`: the comparison with the shipped
    expected hashes (also written to ``build.json``). `progress` receives one-line messages.
    """
    from schedport.workload.datadir import resolve_data_dir
    from schedport.workload.trace import Trace, save_trace

    log = progress or (lambda msg: None)
    t0 = time.perf_counter()
    root = resolve_data_dir(None if data_dir is None else str(data_dir))
    raw, spec_dir = load_spec(spec)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory")
    # only an earlier corpus is ever replaced: a results store, a folder with a manifest of
    # another kind, or any other non-empty folder is refused (guard.claim_dir)
    try:
        claim_dir(out, {"corpus"}, allow_other=False, inputs=[root, spec])
    except SchedportError as e:
        raise ConfigError(str(e)) from None
    _remove_stale_builds(out)
    srcs, built_spec = _resolve_sources(raw, root, spec_dir, download, log)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{out}: cannot create its directory {out.parent} ({cause(e)})") from None
    tmp = out.parent / f".{out.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        (tmp / "windows").mkdir(parents=True)
        entries: list[dict] = []
        for src in srcs:
            ts = time.perf_counter()
            n0 = len(entries)
            for part in src.parts:
                for plan in _plans(src, part):
                    try:
                        res, sel, extra = _run_plan(src, part, plan)
                    except SchedportError as e:
                        raise type(e)(f"window {plan.window_id}: {e}") from None
                    tr = res.trace
                    if len(tr) == 0:
                        raise DataError(f"window {plan.window_id}: no requests in this window "
                                        f"({_sel_text(sel)}); choose other windows in the spec")
                    if "rows" in sel and len(tr) < sel["rows"]:
                        raise DataError(f"window {plan.window_id}: only {len(tr)} requests after "
                                        f"start_s={sel['start_s']:g} ({sel['rows']} asked); the "
                                        "file ends first")
                    # the checks `load_trace` applies when `run` reads the window back (token
                    # counts <= 2^31 - 1, arrivals in range): refused now, not after the build
                    tr = Trace.from_arrays(tr.arrival_s, tr.input_tokens, tr.output_tokens, tr.client_id,
                                           name=plan.window_id, source=f"window {plan.window_id}")
                    path = tmp / "windows" / f"{plan.window_id}.parquet"
                    try:
                        save_trace(tr, path)
                    except SchedportError as e:
                        if isinstance(e.__cause__, OSError):  # the disk, not the data: name the output
                            raise DataError(f"{out}: cannot write the corpus ({cause(e.__cause__)}); "
                                            f"nothing was changed there") from None
                        raise
                    entries.append(_entry(src, part, plan, res, sel, extra, tr,
                                          _file_sha256(path)))
            label = "" if src.adapter != MODELED_ADAPTER else f" [{_label_of(src.adapter)}]"
            log(f"{src.name}{label}: {len(entries) - n0} windows "
                f"({time.perf_counter() - ts:.1f} s)")
        ids = [e["window_id"] for e in entries]
        dup = next((i for i in ids if ids.count(i) > 1), None)
        if dup:
            raise ConfigError(f"window id {dup!r} produced twice; give the sources distinct names")
        manifest = _manifest(built_spec, entries, srcs)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, allow_nan=False) + "\n",
                                           encoding="utf-8")
        repro = compare_expected(manifest)
        build = {"built_unix_s": round(time.time(), 3), "build_seconds": round(time.perf_counter() - t0, 3),
                 "data_dir": str(root), "spec": str(spec) if spec is not None else "(packaged default)",
                 "code_version": __version__, "python": sys.version.split()[0],
                 "numpy": np.__version__, "reproduction": repro}
        (tmp / "build.json").write_text(json.dumps(build, indent=1) + "\n", encoding="utf-8")
        _swap_in(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise DataError(f"{out}: cannot write the corpus ({cause(e)}); nothing was changed there") from None
        raise
    corpus = load_corpus(out)
    corpus.reproduction = repro
    return corpus


def _remove_stale_builds(out: Path) -> None:
    """Remove the temporary folders of builds of `out` whose process is gone (a build killed
    with -9 cannot clean up after itself); a live build's folder is left alone."""
    parent = out.parent
    if not parent.is_dir():
        return
    pat = re.compile(rf"\.{re.escape(out.name)}\.(building|old)-(\d+)-[0-9a-f]{{8}}")
    for p in parent.iterdir():
        m = pat.fullmatch(p.name)
        if m and p.is_dir() and int(m.group(2)) != os.getpid() and not process_alive(int(m.group(2))):
            shutil.rmtree(p, ignore_errors=True)


def _sel_text(sel: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sel.items())


def _manifest(spec: dict, entries: list[dict], srcs: list[_Source]) -> dict:
    sources = {}
    for s in srcs:
        n = sum(1 for e in entries if e["source"] == s.name)
        sources[s.name] = {"adapter": s.adapter, "n_windows": n, "cite": s.cite,
                           "modeled": s.adapter == MODELED_ADAPTER,
                           "label": _label_of(s.adapter),
                           **({"fallback_for": s.spec["fallback_for"]} if "fallback_for" in s.spec else {})}
        if s.adapter == MODELED_ADAPTER:
            from schedport.workload.sources.burstgpt_model import DEFAULT_PARAMS, params_sha256

            sources[s.name]["model_params"] = DEFAULT_PARAMS
            sources[s.name]["model_params_sha256"] = params_sha256()
    man = {"schema": MANIFEST_SCHEMA, "kind": MANIFEST_KIND, "name": spec["name"],
           "corpus_sha256": corpus_hash([(e["window_id"], e["sha256"]) for e in entries], spec),
           "code_version": __version__, "n_windows": len(entries), "sources": sources,
           "spec": spec, "windows": entries}
    man["manifest_sha256"] = manifest_seal(man)
    return man


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename the freshly built `tmp` to `out`, moving an earlier corpus aside first."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# =========================================================================== expected hashes


def _definition_sha(source_spec: dict) -> str:
    return hashlib.sha256(_canon({k: v for k, v in source_spec.items() if k != "cite"})).hexdigest()


def load_expected() -> dict:
    """The shipped expected hashes (``schedport/workload/data/corpus-expected.json``); {} if absent."""
    try:
        return json.loads(_expected_path().read_text(encoding="utf-8"))
    except (OSError, FileNotFoundError, json.JSONDecodeError):
        return {}


def compare_expected(manifest: dict, expected: dict | None = None) -> dict:
    """Compare a built manifest with the frozen corpus's expected hashes, source by source.

    A source is compared when the expected file has a source of the same name and the same
    definition (its spec entry, citation aside); otherwise it is reported as custom or, for
    the real BurstGPT, as having no expected hashes (they could not be computed where the
    corpus was frozen). Returns ``{"status", "message", "sources": {...}}`` with status
    ``exact`` (every window and the corpus hash match), ``differs``, ``partial`` (what
    could be compared matched, something could not be) or ``none`` (nothing comparable).
    """
    exp = load_expected() if expected is None else expected
    exp_src = exp.get("sources", {}) if isinstance(exp, dict) else {}
    by_source: dict[str, list[dict]] = {}
    for e in manifest["windows"]:
        by_source.setdefault(e["source"], []).append(e)
    spec_by_name = {s["name"]: s for s in manifest["spec"]["sources"]}
    report: dict = {}
    differ_all: list[str] = []
    compared = uncomparable = 0
    for name, ents in by_source.items():
        x = exp_src.get(name)
        if x is None:
            report[name] = {"status": "custom", "message": f"{name}: not part of the frozen "
                            "corpus (a custom source); no expected hashes to compare"}
            uncomparable += 1
            continue
        if x.get("windows") is None:
            report[name] = {"status": "absent", "message": f"{name}: no expected hashes shipped "
                            f"({x.get('absent_reason', 'not computed')}); these "
                            f"{len(ents)} windows cannot be confirmed"}
            uncomparable += 1
            continue
        if x.get("definition_sha256") != _definition_sha(spec_by_name[name]):
            report[name] = {"status": "custom", "message": f"{name}: defined differently from the "
                            "frozen corpus's source of that name; not compared"}
            uncomparable += 1
            continue
        differ = [e["window_id"] for e in ents if x["windows"].get(e["window_id"]) != e["sha256"]]
        missing = [w for w in x["windows"] if w not in {e["window_id"] for e in ents}]
        compared += 1
        differ_all += differ
        ok = len(ents) - len(differ)
        st = "exact" if not differ and not missing else "differs"
        msg = f"{name}: {ok}/{len(x['windows'])} windows match the frozen corpus"
        if differ:
            msg += f"; differ: {_short_list(differ)}"
        if missing:
            msg += f"; not built: {_short_list(missing)}"
        report[name] = {"status": st, "message": msg, "differ": differ, "missing": missing}
    corp = exp.get("corpora", {}) if isinstance(exp, dict) else {}
    variant = next((v for v, c in corp.items() if c.get("corpus_sha256") == manifest["corpus_sha256"]),
                   None)
    if variant is not None:
        status = "exact"
        message = (f"reproduced the frozen corpus exactly (variant {variant}, corpus_sha256 "
                   f"{manifest['corpus_sha256'][:16]}...)")
    elif differ_all or any(r["status"] == "differs" for r in report.values()):
        status = "differs"
        message = (f"this machine's data did NOT reproduce the frozen corpus: "
                   f"{len(differ_all)} window(s) differ ({_short_list(differ_all)})")
    elif compared and uncomparable:
        status = "partial"
        message = (f"{compared} source(s) reproduced the frozen windows exactly; "
                   f"{uncomparable} source(s) have no expected hashes to compare")
    elif compared:
        status = "exact"
        message = "every window matches the frozen corpus"
    else:
        status = "none"
        message = "no expected hashes apply to this corpus (custom spec)"
    return {"status": status, "message": message, "sources": report}


def _short_list(items: list[str], n: int = 6) -> str:
    return ", ".join(items[:n]) + (f", ... ({len(items)} in all)" if len(items) > n else "")


def expected_from_manifest(manifest: dict, absent: dict | None = None) -> dict:
    """The expected-hashes document for a built manifest (to freeze a corpus definition).

    `absent` maps source names whose hashes cannot be computed here to the reason (the
    real BurstGPT); they are recorded with ``windows: null``.
    """
    import platform

    srcs = {}
    spec_by_name = {s["name"]: s for s in manifest["spec"]["sources"]}
    for e in manifest["windows"]:
        s = srcs.setdefault(e["source"], {"definition_sha256": _definition_sha(spec_by_name[e["source"]]),
                                          "windows": {}})
        s["windows"][e["window_id"]] = e["sha256"]
    variant = next((n for n in srcs if n.startswith(MODELED_ADAPTER)),
                   "burstgpt" if "burstgpt" in srcs else "custom")
    corpora = {variant: {"corpus_sha256": manifest["corpus_sha256"]}}
    for name, reason in (absent or {}).items():
        srcs[name] = {"definition_sha256": None, "windows": None, "absent_reason": reason}
        corpora[name] = {"corpus_sha256": None, "absent_reason": reason}
    return {"schema": 1, "kind": EXPECTED_KIND, "spec_name": manifest["spec"]["name"],
            "code_version": manifest["code_version"],
            "frozen_with": {"python": platform.python_version(), "numpy": np.__version__},
            "sources": srcs, "corpora": corpora}


# =========================================================================== verify


def verify_corpus(dir: str | os.PathLike[str] = DEFAULT_OUT) -> list[str]:
    """Recompute every hash of the corpus at `dir`; return the problems found (empty = intact).

    Checks: the manifest's seal (any edit), its corpus_sha256 (recomputed from the window
    list and spec), and per window that its file exists, has the recorded file sha256,
    loads as a canonical trace whose content sha256 and statistics match the manifest; files
    in ``windows/`` the manifest does not list are problems too.
    """
    from schedport.workload.trace import load_trace

    root = Path(dir)
    try:
        corpus = load_corpus(root)
    except SchedportError as e:
        return [str(e)]
    man = corpus.manifest
    problems: list[str] = []
    seal = man.get("manifest_sha256")
    if not isinstance(seal, str):
        problems.append("manifest.json: no manifest_sha256 seal")
    elif seal != manifest_seal(man):
        problems.append("manifest.json: manifest_sha256 does not match its content (the manifest "
                        "was edited after the build)")
    spec = man.get("spec")
    if not isinstance(spec, dict):
        problems.append("manifest.json: no spec")
    else:
        again = corpus_hash([(w.window_id, w.sha256) for w in corpus.windows], spec)
        if again != corpus.corpus_sha256:
            problems.append(f"manifest.json: corpus_sha256 {corpus.corpus_sha256[:16]}... does not "
                            f"match the windows and spec it lists (recomputed {again[:16]}...)")
    for w in corpus.windows:
        rel = f"windows/{w.window_id}.parquet"
        if not w.path.is_file():
            problems.append(f"{rel}: missing (window {w.window_id} of {w.source})")
            continue
        fsha = _file_sha256(w.path)
        if w.meta.get("file_sha256") != fsha:
            problems.append(f"{rel}: file sha256 {fsha[:16]}... differs from the manifest's "
                            f"{str(w.meta.get('file_sha256'))[:16]}... (the file changed)")
        try:
            tr = load_trace(w.path)
        except SchedportError as e:
            problems.append(f"{rel}: unreadable ({e})")
            continue
        csha = tr.content_sha256()
        if csha != w.sha256:
            problems.append(f"{rel}: content sha256 {csha[:16]}... differs from the manifest's "
                            f"{w.sha256[:16]}...")
            continue
        dur = w.meta.get("duration_s")
        if isinstance(dur, (int, float)) and not isinstance(dur, bool):
            st = window_stats(tr, float(dur))
            bad = [k for k in _STAT_KEYS if w.meta.get(k) != st[k]]
            if bad:
                problems.append(f"manifest.json: window {w.window_id}: recorded {', '.join(bad)} "
                                "do not match its trace")
        else:
            problems.append(f"manifest.json: window {w.window_id}: no duration_s")
    listed = {f"{w.window_id}.parquet" for w in corpus.windows}
    wdir = root / "windows"
    if wdir.is_dir():
        for p in sorted(wdir.iterdir()):
            if p.name not in listed and not p.name.startswith("."):
                problems.append(f"windows/{p.name}: not listed in the manifest")
    return problems


def write_expected(corpus_dir: str | os.PathLike[str], dest: str | os.PathLike[str],
                   merge: bool = True) -> Path:
    """Freeze a built study corpus: write its expected-hashes document to `dest`.

    Used when the corpus definition changes (see docs/corpus.md). The real BurstGPT is
    recorded as absent unless the corpus was built from it; with `merge`, sources and
    corpus variants already in `dest` that this corpus does not have are kept (so a machine
    with BurstGPT_1.csv can add the real variant's hashes to the modeled ones).
    """
    corpus = load_corpus(corpus_dir)
    problems = verify_corpus(corpus_dir)
    if problems:
        raise DataError(f"{corpus_dir}: does not verify ({problems[0]}); rebuild before freezing")
    absent = {}
    if "burstgpt" not in corpus.sources:
        absent["burstgpt"] = ("the real BurstGPT_1.csv could not be obtained where this corpus "
                              "was frozen (Git LFS / release asset), so its window hashes are "
                              "unknown")
    dest = Path(dest)
    doc = expected_from_manifest(corpus.manifest, absent)
    if merge and dest.is_file():
        try:
            old = json.loads(dest.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            old = {}
        for key in ("sources", "corpora"):
            merged = dict(old.get(key, {})) if isinstance(old, dict) else {}
            for k, v in doc[key].items():
                if v.get("absent_reason") and merged.get(k, {}).get("absent_reason") is None \
                        and k in merged:
                    continue  # keep hashes frozen on a machine that had the file
                merged[k] = v
            doc[key] = merged
    dest.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return dest


# =========================================================================== CLI

corpus_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                         help="Build, verify and list the frozen corpus of workload windows.")


@corpus_app.command("build")
def build_cmd(
    spec: Optional[Path] = typer.Option(None, "--spec", help="Corpus spec TOML (default: the packaged 120-window study)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Where the public files are (default: $SCHEDPORT_DATA, ../shared/datasets, the user cache)."),
    out: Path = typer.Option(DEFAULT_OUT, "--out", parser=parse_out_path,
                             help="Corpus directory to write (replaced atomically)."),
) -> None:
    """Build the corpus: cut every window, write windows/*.parquet and manifest.json, compare with the frozen hashes."""
    from schedport.common.outputs import output_dir

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
            typer.echo(f"note: {s} is {_label_of(MODELED_ADAPTER)}, not the real BurstGPT trace")


@corpus_app.command("verify")
def verify_cmd(
    corpus_dir: Path = typer.Option(DEFAULT_OUT, "--corpus", help="Corpus directory."),
) -> None:
    """Recompute every hash; exit 2 with one line per problem if anything changed or is missing."""
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


def _regions() -> dict[str, float]:
    try:
        from schedport.study.regions import REGIONS
    except ImportError:
        return dict(_DEFAULT_REGIONS)
    return dict(REGIONS)


def _fmt(v, nd: int = 1) -> str:
    if v is None:
        return "n/a"
    return f"{v:.{nd}f}"


@corpus_app.command("list")
def list_cmd(
    corpus_dir: Path = typer.Option(DEFAULT_OUT, "--corpus", help="Corpus directory."),
    regions: bool = typer.Option(False, "--regions", help="Also show each window's capacity and time-scale factor per region."),
    engine: Optional[Path] = typer.Option(None, "--engine", help="Engine config TOML for --regions (default engine otherwise)."),
) -> None:
    """One line per window with its statistics (and, with --regions, capacity and scale factors)."""
    corpus = load_corpus(corpus_dir)
    width = max(len(w.window_id) for w in corpus.windows)
    swidth = max(len(w.source) for w in corpus.windows)
    head = (f"{'window':<{width}}  {'source':<{swidth}}  {'n':>5}  {'dur_s':>7}  {'rate':>7}  "
            f"{'IoD':>6}  {'in_mean':>7} {'in_p50':>6} {'in_p99':>7}  {'out_mean':>8} "
            f"{'out_p50':>7} {'out_p99':>7}  {'dropped':>7}")
    regs: dict[str, float] = {}
    cache = cfg = None
    if regions:
        from schedport.engine.config import load_engine_config

        regs = _regions()
        cfg = load_engine_config(engine)
        try:
            from schedport.study.regions import capacity_cache

            cache = capacity_cache(Path(corpus_dir) / "capacity-cache.json")
        except ImportError:
            cache = None
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
            typer.echo(f"note: {s} is {_label_of(MODELED_ADAPTER)}, not the real BurstGPT trace")
    if regions:
        typer.echo("region columns: time-scale factor bringing the window to that offered load rho "
                   f"({', '.join(f'{n} {r:g}' for n, r in regs.items())}); >1 stretches time (lighter)")


def _region_cells(corpus: Corpus, w: Window, cfg, cache, regs: dict[str, float]) -> str:
    """Capacity and per-region time-scale cells of one window ("n/a" where undefined)."""
    tr = corpus.trace(w.window_id)
    try:
        if cache is not None:
            cap = cache.capacity(tr, cfg, w.sha256)
        else:
            from schedport.engine.runner import capacity

            cap = capacity(tr, cfg)
        factors = [_time_scale(tr, cap, rho) for rho in regs.values()]
    except SchedportError:
        return f"  {'n/a':>8}" + "".join(f"  {'n/a':>10}" for _ in regs)
    return f"  {cap:>8.3f}" + "".join(f"  {f:>10.4g}" for f in factors)


def _time_scale(trace, cap: float, rho: float) -> float:
    try:
        from schedport.study.regions import time_scale
    except ImportError:
        if len(trace) < 2 or trace.span_s <= 0:
            raise SchedportError(f"{trace.name}: needs two requests with distinct arrival times") from None
        return (len(trace) - 1) / trace.span_s / (cap * rho)
    return time_scale(trace, cap, rho)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
