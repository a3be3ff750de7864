"""The corpus spec: which sources, which files, which windows (TOML; docs/corpus.md).

`load_spec` reads and checks a spec (the packaged study's by default, `default_spec_path`),
every source normalised so the manifest records exactly what was built; `resolve_sources` finds
each source's files (through `schedport.workload.datadir`, downloading a missing registered file
when allowed) and returns the sources to cut windows from (`SourceSpec`, `SourcePart`). The window
rules are described in `schedport.workload.corpus`.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

from schedport.errors import ConfigError, DataError, SchedportError
from schedport.workload.corpus_manifest import (BUILTIN_SOURCES, MODELED_ADAPTER, SPEC_SCHEMA, builtin_source,
                                                source_label)

TABULAR = ("azure", "burstgpt", "jsonl", "mooncake", "canonical")
ADAPTERS = (*TABULAR, "servegen", MODELED_ADAPTER)
RULES = ("contiguous", "tile", "stratified", "explicit")
#: Adapters whose traces may carry prefix identity (hash_ids): the only ones a warm-up applies to.
PREFIX_ADAPTERS = ("mooncake", "canonical")
#: The warm-up of a window whose trace carries hash_ids when its spec gives no ``warmup_s``: the
#: requests of the 600 s before the window (docs/corpus.md, "Warm caches").
DEFAULT_WARMUP_S = 600.0
SERVEGEN_SLOT_S = 600
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_SOURCE_KEYS = {"name", "adapter", "cite", "files", "files_any", "options", "seed", "windows",
                "parts", "fallback"}
_PART_KEYS = {"label", "files", "files_any", "options", "seed", "windows"}
_SPEC_KEYS = {"schema", "name", "description", "extends", "sources", "variants"}


def default_spec_path():
    """The packaged study spec (``schedport/workload/data/corpus-spec.toml``)."""
    return resources.files("schedport.workload") / "data" / "corpus-spec.toml"


@dataclass
class SourcePart:
    """One run of windows of a source: its files (as written and resolved), options and rule."""

    label: str | None
    files: list[str]
    paths: list[Path]
    options: dict
    windows: dict
    seed: int | None
    registered: bool = False  # every file is a registered public one (checked against its sha256)


@dataclass
class SourceSpec:
    """One source of the spec, resolved: its name, adapter, citation, normalised spec entry and parts."""

    name: str
    adapter: str
    cite: str
    spec: dict  # normalised entry recorded in the manifest's spec
    parts: list[SourcePart]


def _read_toml(path, what: str) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what}: cannot read spec ({_one_line(e)})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what}: malformed TOML ({_one_line(e)})") from None


def load_spec(spec: str | os.PathLike[str] | None = None,
              _chain: tuple[Path, ...] = ()) -> tuple[dict, Path | None]:
    """Read a corpus spec (None: the packaged study) -> (raw dict with `extends` merged, its folder).

    ``extends = "default"`` (or a path to another spec, relative to this one) puts that
    spec's sources first, so a user adds a source to the study in a few lines. Structural
    errors are one-line `ConfigError`s naming the spec and key, and so is a chain of
    ``extends`` that comes back to a spec already in it (`_chain`, the specs extending this one).
    """
    if spec is None:
        raw = _read_toml(default_spec_path(), "corpus-spec.toml (packaged)")
        return _check_spec(raw, "corpus-spec.toml (packaged)"), None
    p = Path(spec)
    if not p.is_file():
        raise ConfigError(f"{p}: spec file not found")
    raw = _check_spec(_read_toml(p, str(p)), str(p))
    if "variants" in raw:
        raw["variants"] = _variants_key(raw["variants"], p)
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
            chain = (*_chain, p.resolve())
            if q.resolve() in chain:
                loop = " -> ".join(str(c) for c in (*chain[chain.index(q.resolve()):], q.resolve()))
                raise ConfigError(f"{p}: extends {ext!r} comes back to a spec that extends it ({loop})")
            base, _ = load_spec(q, chain)
        raw["sources"] = list(base["sources"]) + list(raw.get("sources", []))
    if not raw.get("sources"):
        raise ConfigError(f"{p}: the spec defines no [[sources]]")
    return raw, p.parent


def _variants_key(v, spec: Path) -> str:
    """The spec's ``variants`` key (the engine variants `schedport run` runs this study under, docs/
    engine.md §3.6): a shipped set's name as written, a TOML file resolved against the spec's folder.
    The set itself is read and checked by `run`, which owns the engine."""
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"{spec}: variants must be a variant set's name (e.g. \"uncertainty\") or a TOML file")
    if not v.endswith(".toml"):
        return v
    f = Path(v) if Path(v).is_absolute() else spec.parent / v
    if not f.is_file():
        raise ConfigError(f"{spec}: variants: file {v!r} not found beside the spec")
    return str(f.resolve())


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
                            "rate_scale"}}[rule] | {"warmup_s"}
    if "warmup_s" in w:
        _check_warmup(w["warmup_s"], adapter, where)
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


def _check_warmup(v, adapter: str, where: str) -> None:
    """A ``windows.warmup_s``: seconds >= 0, for an adapter whose traces may carry hash_ids (the
    warm-up fills the prefix cache; a source without prefix identity has nothing to warm)."""
    if adapter not in PREFIX_ADAPTERS:
        raise ConfigError(f"{where}: windows.warmup_s: a warm-up fills the prefix cache, so it applies to a "
                          f"source whose trace carries hash_ids (adapter {' or '.join(PREFIX_ADAPTERS)}), "
                          f"not {adapter!r}")
    _num(v, f"{where}: windows.warmup_s (seconds of requests replayed before each window)", positive=False)


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
    _check_reserved_name(name, adapter, out_parts, where)
    norm = {"name": name, "adapter": adapter, "cite": src.get("cite", ""), "parts": out_parts}
    if "fallback" in src:
        fb = src["fallback"]
        if not isinstance(fb, dict):
            raise ConfigError(f"{where}: fallback must be a table")
        if not any("files_any" in p for p in out_parts):
            raise ConfigError(f"{where}: a fallback needs files_any (it is used when none is present)")
        norm["fallback"] = _normalise_source(fb, f"{where}: fallback")
    return norm


def _check_reserved_name(name: str, adapter: str, parts: list[dict], where: str) -> None:
    """A built-in source's name (`BUILTIN_SOURCES`) only for that source: its adapter and its
    registered public files. The analysis cites and compares sources by name, so a user's data
    under such a name would be cited and analysed as the public trace."""
    key = builtin_source(name)
    if key is None:
        return
    own = [f for p in parts for f in p.get("files", p.get("files_any", [])) if not _is_registered(f)]
    if adapter != BUILTIN_SOURCES[key] or own:
        why = (f"adapter {adapter!r}" if adapter != BUILTIN_SOURCES[key]
               else f"file {own[0]!r} is not one of its registered public files")
        raise ConfigError(f"{where}: the name {name!r} is reserved for the built-in {key} source "
                          f"(adapter {BUILTIN_SOURCES[key]!r}, its public files), not a source with {why}; "
                          f"give your source a name of its own")


def _resolve_file(name: str, data_dir: Path, spec_dir: Path | None, download: bool,
                  where: str, folder: bool = False) -> Path:
    """A spec file name -> a local path: registered public file (located/downloaded), or a user file.

    A user's relative name is looked up beside the spec, then in the data directory, and must
    stay inside that folder once resolved: ``../../etc/passwd``, or a link to a file elsewhere,
    is refused (an absolute name reads a file anywhere, on purpose). A folder is refused where
    a file is read (`folder`: a ServeGen pool folder is wanted). Errors name the path, never
    what the file holds.
    """
    from schedport.workload import datadir

    try:
        datadir.lookup(name)
        registered = True
    except ConfigError:
        registered = False
    if registered:
        return datadir.locate(name, data_dir, download=download)
    p = Path(name).expanduser()
    bases = [None] if p.is_absolute() else [b for b in (spec_dir, data_dir) if b is not None]
    cands = [p if b is None else b / p for b in bases]
    for base, c in zip(bases, cands):
        if not c.exists():
            continue
        if base is not None and not _inside(c, base):
            raise DataError(f"{where}: file {name!r} leads outside {base.resolve()} (to {c.resolve()}); a spec's "
                            "files stay beside it or in the data directory, give an absolute path "
                            "to read a file elsewhere")
        if c.is_dir() and not folder:
            raise DataError(f"{where}: file {name!r} is a directory ({c.resolve()}), expected a file")
        return c
    tried = ", ".join(str(c) for c in cands)
    raise DataError(f"{where}: file {name!r} not found (looked in {tried})")


def _inside(path: Path, base: Path) -> bool:
    """Whether `path`, links followed, lies in the folder `base` (links followed too)."""
    try:
        path.resolve().relative_to(base.resolve())
        return True
    except (ValueError, OSError):
        return False


def _is_registered(name: str) -> bool:
    """Whether a spec file name denotes a registered public file or folder (not a user's own)."""
    from schedport.workload import datadir

    try:
        datadir.lookup(name)
        return True
    except ConfigError:
        pass
    prefix = name.rstrip("/") + "/"
    return name.endswith("/") and any(f.relpath.startswith(prefix) for f in datadir.data_files().values())


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
    reg = sorted((f for f in datadir.data_files().values() if f.relpath.startswith(prefix)),
                 key=lambda f: f.relpath)
    if not reg:
        p = _resolve_file(name.rstrip("/"), data_dir, spec_dir, download, where, folder=True)
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


def resolve_sources(raw: dict, data_dir: Path, spec_dir: Path | None, download: bool,
                     log: Callable[[str], None]) -> tuple[list[SourceSpec], dict]:
    """Validate every source, choose real-or-fallback, locate files -> sources + the spec as built."""
    srcs: list[SourceSpec] = []
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
                    f"{chosen['name']} ({source_label(chosen['adapter'])})")
        chosen = {k: v for k, v in chosen.items() if k != "fallback"}
        if chosen["name"] in names:
            raise ConfigError(f"{where}: source name {chosen['name']!r} is used twice")
        names.add(chosen["name"])
        parts: list[SourcePart] = []
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
            parts.append(SourcePart(pdict["label"], files, paths, pdict["options"], pdict["windows"],
                               pdict["seed"], registered=bool(files) and all(map(_is_registered, files))))
        chosen["parts"] = [{**({"label": p.label} if p.label else {}),
                            **({"files": p.files} if p.files else {}),
                            "options": p.options, "seed": p.seed, "windows": p.windows}
                           for p in parts]
        srcs.append(SourceSpec(chosen["name"], chosen["adapter"], chosen.get("cite", ""), chosen, parts))
    spec = {"schema": SPEC_SCHEMA, "name": raw.get("name", "unnamed"),
            "description": raw.get("description", ""), "sources": [s.spec for s in srcs]}
    return srcs, spec

def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
