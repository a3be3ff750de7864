"""A built corpus as it is stored: ``manifest.json`` and ``windows/<window_id>.parquet``.

`load_corpus` opens a corpus directory into a `Corpus` (its `Window`s in manifest order, their
traces read on demand). The hashes that make a corpus checkable are defined here: `corpus_hash`
(the corpus identity, over the sorted (window_id, content sha256) pairs and the spec),
`manifest_seal` (over every other manifest field, so a hand edit anywhere is caught) and
`file_sha256`; `window_stats` are the per-window statistics the manifest records. The
directory's format is described in `schedport.workload.corpus`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from schedport.common.guard import WHAT, dir_kind
from schedport.errors import ConfigError, DataError
from schedport.workload.trace import load_trace

MANIFEST_SCHEMA = 1
SPEC_SCHEMA = 1
MANIFEST_KIND = "schedport-corpus"
EXPECTED_KIND = "schedport-corpus-expected"
DEFAULT_OUT = Path("corpus")
MODELED_ADAPTER = "burstgpt-modeled"
#: The built-in sources, by their reserved names, each with the adapter it is built with. A
#: source's name is its identity: the analysis cites and compares these sources by exact name,
#: so a spec may give one of these names only to that public source (`corpus_spec`).
BUILTIN_SOURCES = {"azure": "azure", "bailian": "servegen", "burstgpt": "burstgpt",
                   MODELED_ADAPTER: MODELED_ADAPTER}
#: The statistics of a window that `verify_corpus` recomputes and compares with the manifest.
STAT_KEYS = ("n_requests", "duration_s", "input_mean", "input_p50", "input_p99", "output_mean",
              "output_p50", "output_p99", "mean_rate_rps", "index_of_dispersion", "span_s",
              "n_clients")


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


def canonical_json(obj) -> bytes:
    """The canonical JSON bytes of `obj` (sorted keys, no spaces, no NaN) that every corpus hash
    is taken over, so equal content hashes the same on every machine."""
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
    h.update(canonical_json(spec))
    return h.hexdigest()


def manifest_seal(manifest: dict) -> str:
    """sha256 of the canonical JSON of the manifest without its ``manifest_sha256`` field."""
    return hashlib.sha256(canonical_json({k: v for k, v in manifest.items()
                                  if k != "manifest_sha256"})).hexdigest()


def derive_seed(base: int, *parts) -> int:
    """A 31-bit seed derived from a base seed and labels (stable across Python/NumPy versions)."""
    text = ":".join(str(p) for p in (base, *parts))
    return int.from_bytes(hashlib.sha256(f"schedport-corpus:{text}".encode()).digest()[:4],
                          "big") & 0x7FFFFFFF


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def window_stats(trace, duration_s: float, warmup_s: float = 0.0) -> dict:
    """Per-window statistics stored in the manifest (and recomputed by `verify_corpus`).

    Lengths: mean, p50, p99 (numpy linear percentiles). Rate: requests / `duration_s`.
    Index of dispersion: variance / mean (population variance) of arrival counts in 1-s
    bins over [0, ceil(duration_s)); 1 for Poisson arrivals, far above for bursty ones.
    Every statistic is of the measured requests: a window with a warm-up (its manifest's
    ``warmup_s``, the span the warm-up covers before the window's start) counts its arrivals
    from the window's start, as without it.
    """
    trace = trace.measured()
    inp = np.asarray(trace.input_tokens, dtype=np.float64)
    out = np.asarray(trace.output_tokens, dtype=np.float64)
    arr = np.asarray(trace.arrival_s, dtype=np.float64) - warmup_s
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


def builtin_source(name: str) -> str | None:
    """The built-in source a source name denotes, by exact name (``azure``, ``bailian``,
    ``burstgpt``, ``burstgpt-modeled``), else None: ``my-burstgpt`` is a user's source, never
    the BurstGPT trace. A modeled variant (a name starting with ``burstgpt-modeled``, which a spec
    gives only to the modeled adapter) is the modeled source."""
    if name in BUILTIN_SOURCES:
        return name
    return MODELED_ADAPTER if name.startswith(MODELED_ADAPTER) else None


def find_builtin(sources, *keys: str) -> str | None:
    """The first of `sources` that is one of the built-in sources `keys` (exact identity)."""
    return next((s for s in sources if builtin_source(s) in keys), None)


def source_label(adapter: str) -> str:
    """What a source's windows are: a modeled source says so in these words everywhere."""
    if adapter == MODELED_ADAPTER:
        from schedport.workload.sources.burstgpt_model import LABEL

        return LABEL
    if adapter == "servegen":
        return "generated from a ServeGen client pool (published per-client fits)"
    return "cut from a trace file"

def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
