"""ServeGen client pool (Alibaba Bailian / Qwen) -> a generated canonical trace for one slot.

Data: ServeGen (github.com/alibaba/ServeGen, Apache-2.0), ``data/language/m-large/``, from
"ServeGen: Workload Characterization and Generation of Large Language Model Serving in
Production", arXiv 2505.09999, collected on Alibaba Cloud Model Studio (Bailian).

A client pool is a folder with, per client ``<id>``:

- ``chunk-<id>-trace.csv[.gz]``: no header, one row per 600 s window over 14 days,
  ``window_start_s,rate_rps,cv,pattern,param1,param2``; ``pattern`` is ``Gamma`` (shape,
  scale) or ``Weibull`` (shape c, scale), fitted to the client's inter-arrival times in that
  window; an empty pattern means the client sent nothing.
- ``chunk-<id>-dataset.json[.gz]``: ``{"<window_start_s>": {"input_tokens": "<pdf>",
  "output_tokens": "<pdf>"}}`` every 6 hours, each ``<pdf>`` a string holding a Python-literal
  dict ``{token_count: probability}``. Half of the entries in the public data are ``"{}"``
  (no data for that period).

What `read` generates for a slot, and the choices made (this is our own generator, written
from the data description, not ServeGen's code):

- Arrivals: for every client active in the slot, a *stationary* renewal process on
  [0, duration_s): inter-arrival times from the slot's fitted family with its fitted shape,
  the first arrival drawn from the forward-recurrence (equilibrium) distribution so the
  window does not start with an artificial arrival at 0. Gamma(k, θ) gaps; the equilibrium
  first arrival is U·Gamma(k+1, θ). Weibull(c, λ) gaps; the equilibrium first arrival is
  U·λ·G^(1/c) with G ~ Gamma(1 + 1/c).
- Mean versus rate: the fitted scale often does not give mean gap = 1/rate_rps. Over the
  m-large pool, Gamma windows (shape = 1/cv² exactly) have a fitted mean within 1% of
  1/rate in 66% of cases (5th percentile: 0.35x); Weibull windows in only 6% (median
  1.17x, 95th percentile 2.9x). The
  measured rate is what sets the load, so we keep the fitted *shape* (burstiness) and
  recompute the scale so the mean gap is exactly 1/(rate_rps·rate_scale). Each call's notes
  say how many clients this changed by more than 1%. (For Weibull the recorded ``cv`` then
  differs from the CV implied by c; we follow c, the fitted distribution.)
- ``rate_scale`` multiplies every client's rate (mean gap divided by it), keeping each
  client's shape, as ServeGen scales a pool to a target load.
- Lengths: input and output lengths are drawn *independently* from the client's input and
  output pdfs. ServeGen's own generator reuses one uniform draw per request for every field,
  which makes input and output comonotonic (the longest prompts always get the longest
  answers); the data give only the marginals, so we do not invent a coupling. The pdfs come
  from the dataset timestamp with data (both pdfs non-empty) nearest to the slot's midpoint
  (``length_match="nearest"``, the default), or from the latest one at or before the slot
  start (``length_match="preceding"``, ServeGen's convention).
- Clients active in the slot without length data (no dataset file, as for 15 clients of the
  mirror, or no non-empty entry) are skipped and listed in ``skipped``.
- A pdf is parsed with `ast.literal_eval` only (data is never evaluated as code) and must be a
  non-empty dict of integer token counts >= 0 to finite probabilities >= 0 summing to 1
  (±1e-6). A few public pdfs put mass on 0 tokens; such draws are dropped and counted as
  ``zero_input_tokens`` / ``zero_output_tokens``, never repaired.
- Random streams: each client gets its own generator seeded by (seed, slot_start_s, client
  id), so choosing a subset of clients does not change the others' requests.

Parsed files are cached within the process (keyed by path, size and mtime), so generating
many slots from one pool reads each file once. A client's pdfs are parsed (and so
validated) only when it draws at least one request in the slot. Cost: a cold slot of the
m-large pool takes about 0.9 s on a 2-core machine (half of it `ast.literal_eval` of ~1.5 MB
of pdf text); another slot in the same process about 0.1-0.5 s.
"""

from __future__ import annotations

import ast
import io
import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from schedport.errors import ConfigError
from schedport.workload.sources._common import (
    OVER_MAX, ZERO_IN, ZERO_OUT, AdapterResult, BadRows, decode_text, fail, parse_float_column,
    parse_int_column, read_bytes, read_csv_table, sha256_hex,
)
from schedport.workload.trace import Trace

SELECTION_KEYS = ("slot_start_s", "seed", "rate_scale", "duration_s", "clients",
                  "length_match", "max_len")
LENGTH_MATCH = ("nearest", "preceding")
PATTERNS = {"": 0, "Gamma": 1, "Weibull": 2}
FIELDS = ("input_tokens", "output_tokens")
PDF_SUM_TOL = 1e-6
MEAN_TOL = 0.01
_TRACE_RE = re.compile(r"^chunk-(\d+)-trace\.csv(\.gz)?$")


@dataclass(frozen=True)
class ClientTrace:
    """One client's parsed trace file: per-window rate and fitted arrival pattern."""

    start: np.ndarray  # int64 window start (s), strictly increasing
    rate: np.ndarray
    cv: np.ndarray
    pattern: np.ndarray  # 0 inactive, 1 Gamma, 2 Weibull
    p1: np.ndarray
    p2: np.ndarray
    sha256: str


@dataclass
class ClientDataset:
    """One client's dataset file: raw pdf strings per timestamp (parsed lazily, then cached)."""

    timestamps: np.ndarray  # int64, sorted
    raw: dict[int, dict[str, str]]
    has_data: np.ndarray  # bool per timestamp: both pdfs non-empty
    sha256: str
    parsed: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]


_TRACE_CACHE: dict[tuple, ClientTrace] = {}
_DATASET_CACHE: dict[tuple, ClientDataset] = {}


def clear_cache() -> None:
    """Forget every parsed ServeGen file (tests, or to free ~100 MB after a corpus build)."""
    _TRACE_CACHE.clear()
    _DATASET_CACHE.clear()


def _cache_key(path: Path) -> tuple:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise fail(path, None, f"file not found ({path})") from None
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


# --------------------------------------------------------------------------- trace files


_TRACE_NAMES = ["window_start_s", "rate_rps", "cv", "pattern", "param1", "param2"]
_TRACE_DTYPES = {"window_start_s": np.int64, "rate_rps": np.float64, "cv": np.float64,
                 "pattern": object, "param1": np.float64, "param2": np.float64}


def _parse_trace_fast(text: str) -> tuple[np.ndarray, ...] | None:
    """Vectorised parse of a well-formed trace file; None if anything looks off.

    pandas' C parser with fixed dtypes does the work; any parse problem, a wrong field
    count, an unknown pattern or a bad value sends the file to the checked parser, which
    names the first bad line and column.
    """
    try:
        df = pd.read_csv(io.StringIO(text), header=None, names=_TRACE_NAMES, dtype=_TRACE_DTYPES,
                         na_filter=False, skip_blank_lines=False, engine="c")
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return None
    if len(df) == 0 or text.count(",") != 5 * len(df) or not isinstance(df.index, pd.RangeIndex):
        return None
    pat = df["pattern"].to_numpy(dtype=object)
    code = np.full(len(pat), -1, dtype=np.int8)
    for name, c in PATTERNS.items():
        code[pat == name] = c
    nums = df[["rate_rps", "cv", "param1", "param2"]].to_numpy(dtype=np.float64)
    if (code < 0).any() or not np.isfinite(nums).all() or (nums < 0).any():
        return None
    start = df["window_start_s"].to_numpy(dtype=np.int64)
    if (start < 0).any():
        return None
    return start, nums[:, 0], nums[:, 1], code, nums[:, 2], nums[:, 3]


def _parse_trace_checked(path: Path, text: str) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Slow parse that names the first bad line and column."""
    table = read_csv_table(path, text, header=False, names=_TRACE_NAMES)
    bad = BadRows(path, table.lines, "error", initial=table.bad, initial_msg=table.bad_msg)
    if len(table.columns) != 6:
        raise fail(path, "line 1", f"expected 6 fields, found {len(table.columns)}")
    start = parse_int_column(table.columns["window_start_s"], "window_start_s", bad, most=2**53,
                             what="slot starts")
    rate = parse_float_column(table.columns["rate_rps"], "rate_rps", bad)
    cv = parse_float_column(table.columns["cv"], "cv", bad)
    p1 = parse_float_column(table.columns["param1"], "param1", bad)
    p2 = parse_float_column(table.columns["param2"], "param2", bad)
    for name, v in (("rate_rps", rate), ("cv", cv), ("param1", p1), ("param2", p2)):
        bad.add(np.nan_to_num(v) < 0, lambda i, name=name, v=v: f"column {name!r}: {v[i]} is negative")
    pat = np.array([str(x).strip() for x in table.columns["pattern"]], dtype=object)
    code = np.array([PATTERNS.get(p, -1) for p in pat], dtype=np.int8)
    bad.add(code < 0, lambda i: f"column 'pattern': {pat[i]!r} is not Gamma, Weibull or empty")
    bad.finish()
    return (start, rate, cv, code, p1, p2), table.lines


def _validate_trace(path: Path, sha: str, parsed: tuple[np.ndarray, ...],
                    lines: np.ndarray) -> ClientTrace:
    start, rate, cv, code, p1, p2 = parsed
    if len(start) == 0:
        raise fail(path, None, "no rows")
    back = np.flatnonzero(np.diff(start) <= 0)
    if len(back):
        raise fail(path, f"line {lines[back[0] + 1]}", f"column 'window_start_s': "
                   f"{start[back[0] + 1]} does not follow {start[back[0]]} (window starts must "
                   "increase)")
    active = code > 0
    broken = active & ~((rate > 0) & (p1 > 0) & (p2 > 0))
    if broken.any():
        i = int(np.flatnonzero(broken)[0])
        raise fail(path, f"line {lines[i]}", "an active window (Gamma/Weibull) needs rate_rps, "
                   "param1 and param2 > 0")
    tiny = (code == 2) & (p1 < 0.01)
    if tiny.any():
        i = int(np.flatnonzero(tiny)[0])
        raise fail(path, f"line {lines[i]}", f"column 'param1': Weibull shape {p1[i]} is below "
                   "0.01 (its mean is not representable)")
    return ClientTrace(start, rate, cv, code, p1, p2, sha)


def _read_text(path: Path) -> tuple[str, str]:
    data = read_bytes(path)
    return decode_text(path, data), sha256_hex(data)


def load_client_traces(paths: list[Path]) -> list[ClientTrace]:
    """Parse and validate ``chunk-<id>-trace.csv[.gz]`` files (cached per process).

    Every row needs six fields; window starts must be strictly increasing integers; rate,
    cv and parameters finite and >= 0; an active row (Gamma/Weibull) needs rate > 0 and
    both parameters > 0. Any violation is a one-line `DataError` naming file and line.
    Uncached files are read and gunzipped on two threads and, when all are well-formed,
    parsed in one vectorised pass (a client pool is ~160 small files).
    """
    paths = [Path(p) for p in paths]
    keys = [_cache_key(p) for p in paths]
    todo = [i for i, k in enumerate(keys) if k not in _TRACE_CACHE]
    if todo:
        with ThreadPoolExecutor(max_workers=2) as pool:
            loaded = list(pool.map(_read_text, [paths[i] for i in todo]))
        texts = [t.replace("\r\n", "\n") for t, _ in loaded]
        texts = [t if t.endswith("\n") else t + "\n" for t in texts]
        counts = [t.count("\n") for t in texts]
        batch = _parse_trace_fast("".join(texts)) if all(c > 0 for c in counts) else None
        if batch is not None and len(batch[0]) == sum(counts):
            edges = np.cumsum([0, *counts])
            per_file = [tuple(a[edges[j]:edges[j + 1]] for a in batch) for j in range(len(todo))]
            line_nos = [np.arange(1, c + 1) for c in counts]
        else:
            per_file, line_nos = [], []
            for j, i in enumerate(todo):
                parsed = _parse_trace_fast(texts[j])
                if parsed is not None and len(parsed[0]) == counts[j]:
                    per_file.append(parsed)
                    line_nos.append(np.arange(1, counts[j] + 1))
                else:
                    parsed, lines = _parse_trace_checked(paths[i], loaded[j][0])
                    per_file.append(parsed)
                    line_nos.append(lines)
        for j, i in enumerate(todo):
            _TRACE_CACHE[keys[i]] = _validate_trace(paths[i], loaded[j][1], per_file[j],
                                                    line_nos[j])
    return [_TRACE_CACHE[k] for k in keys]


def load_client_trace(path: Path) -> ClientTrace:
    """Parse and validate one ``chunk-<id>-trace.csv[.gz]`` (see `load_client_traces`)."""
    return load_client_traces([path])[0]


# --------------------------------------------------------------------------- dataset files


def _is_empty_pdf(s: str) -> bool:
    return len(s) <= 64 and "".join(s.split()) == "{}"


def load_client_dataset(path: Path) -> ClientDataset:
    """Parse the structure of one ``chunk-<id>-dataset.json[.gz]`` (cached per process).

    The JSON must be an object whose keys are integer window starts and whose values hold
    string ``input_tokens`` and ``output_tokens`` pdfs. The pdf strings themselves are
    parsed on first use (`pdf`), since one slot needs one timestamp per client.
    """
    path = Path(path)
    key = _cache_key(path)
    hit = _DATASET_CACHE.get(key)
    if hit is not None:
        return hit
    text, sha = _read_text(path)
    return _parse_dataset(path, key, text, sha)


class _DatasetLoader:
    """Loads dataset files in the background (read + gunzip on two threads, which release the
    GIL) while the caller parses pdfs of files already loaded; results go to the cache."""

    def __init__(self, paths: list[Path]):
        self._pool = ThreadPoolExecutor(max_workers=2)
        self._jobs = {}
        for p in paths:
            key = _cache_key(p)
            if key not in _DATASET_CACHE and key not in self._jobs:
                self._jobs[key] = (p, self._pool.submit(_read_text, p))

    def get(self, path: Path) -> ClientDataset:
        key = _cache_key(path)
        job = self._jobs.pop(key, None)
        if job is None:
            return load_client_dataset(path)
        text, sha = job[1].result()
        return _parse_dataset(job[0], key, text, sha)

    def close(self) -> None:
        for _, fut in self._jobs.values():
            fut.cancel()
        self._pool.shutdown(wait=True)


def prefetch_datasets(paths: list[Path]) -> None:
    """Load uncached dataset files (two reader threads) into the process cache."""
    loader = _DatasetLoader([Path(p) for p in paths])
    try:
        for p in paths:
            loader.get(Path(p))
    finally:
        loader.close()


def _parse_dataset(path: Path, key: tuple, text: str, sha: str) -> ClientDataset:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(path, f"line {exc.lineno}", f"bad JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise fail(path, None, "bad JSON (nested too deeply)") from None
    if not isinstance(obj, dict):
        raise fail(path, None, f"expected a JSON object of timestamps, found {type(obj).__name__}")
    raw: dict[int, dict[str, str]] = {}
    for k, v in obj.items():
        try:
            ts = int(k)
        except ValueError:
            raise fail(path, f"key {k!r}", "is not an integer window start") from None
        if ts < 0 or str(ts) != k.strip():
            raise fail(path, f"key {k!r}", "is not a non-negative integer window start")
        if not isinstance(v, dict):
            raise fail(path, f"key {k!r}", f"expected an object with {', '.join(FIELDS)}")
        for f in FIELDS:
            if f not in v:
                raise fail(path, f"key {k!r}", f"missing field {f!r}")
            if not isinstance(v[f], str):
                raise fail(path, f"key {k!r} field {f!r}",
                           f"expected a string holding a dict literal, found {type(v[f]).__name__}")
        raw[ts] = {f: v[f] for f in FIELDS}
    stamps = np.array(sorted(raw), dtype=np.int64)
    has = np.array([not any(_is_empty_pdf(raw[int(t)][f]) for f in FIELDS) for t in stamps],
                   dtype=bool)
    ds = ClientDataset(stamps, raw, has, sha, {})
    _DATASET_CACHE[key] = ds
    return ds


def parse_pdf(text: str, where: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A pdf literal ``"{tokens: prob, ...}"`` -> (sorted token counts, cumulative probabilities).

    Parsed with `ast.literal_eval` (never `eval`). Rejected with a one-line `DataError`
    naming file and key: anything but a non-empty dict, non-integer or negative token
    counts, non-numeric, negative or non-finite probabilities, or a sum not within 1e-6 of 1.
    """
    try:
        obj = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise fail(path, where, f"not a Python-literal dict ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise fail(path, where, f"expected a dict {{tokens: probability}}, found {type(obj).__name__}")
    if not obj:
        raise fail(path, where, "empty pdf")
    # Type checks at C speed (set of types); the per-item loop only runs to name a culprit.
    if not set(map(type, obj)) <= {int} or not set(map(type, obj.values())) <= {int, float}:
        _explain_bad_pdf(obj, where, path)
    if min(obj) < 0 or max(obj) >= 2**53:
        _explain_bad_pdf(obj, where, path)
    toks = np.fromiter(obj.keys(), dtype=np.int64, count=len(obj))
    probs = np.fromiter(obj.values(), dtype=np.float64, count=len(obj))
    if not (np.isfinite(probs).all() and (probs >= 0).all()):
        _explain_bad_pdf(obj, where, path)
    total = float(probs.sum())
    if not abs(total - 1.0) <= PDF_SUM_TOL:
        raise fail(path, where, f"probabilities sum to {total:.9g}, not 1")
    order = np.argsort(toks, kind="stable")
    toks, probs = toks[order], probs[order]
    cdf = np.cumsum(probs) / total
    cdf[-1] = 1.0
    return toks, cdf


def _explain_bad_pdf(obj: dict, where: str, path: Path) -> None:
    """Raise the one-line error for the first invalid entry of a pdf dict."""
    for tok, p in obj.items():
        if type(tok) is not int or tok < 0 or tok >= 2**53:
            raise fail(path, where, f"token count {tok!r} is not an integer >= 0")
        if type(p) not in (int, float) or not math.isfinite(p) or p < 0:
            raise fail(path, where, f"probability {p!r} for {tok} tokens is not a finite number >= 0")
    raise AssertionError("unreachable: pdf flagged invalid but no entry is")  # pragma: no cover


def _pdf(ds: ClientDataset, path: Path, ts: int, field: str) -> tuple[np.ndarray, np.ndarray]:
    hit = ds.parsed.get((ts, field))
    if hit is None:
        hit = parse_pdf(ds.raw[ts][field], f"key '{ts}' field {field!r}", path)
        ds.parsed[(ts, field)] = hit
    return hit


# --------------------------------------------------------------------------- generation


def _equilibrium_renewal(rng: np.random.Generator, kind: int, shape: float, mean_gap: float,
                         duration: float) -> np.ndarray:
    """Arrival times in [0, duration) of a stationary renewal process with the given gaps."""
    if kind == 1:  # Gamma(shape, scale)
        scale = mean_gap / shape
        first = rng.uniform() * rng.gamma(shape + 1.0, scale)

        def gaps(n):
            return rng.gamma(shape, scale, n)
    else:  # Weibull(c, lam)
        lam = mean_gap / float(math.gamma(1.0 + 1.0 / shape))
        first = rng.uniform() * lam * rng.gamma(1.0 + 1.0 / shape) ** (1.0 / shape)

        def gaps(n):
            return lam * rng.weibull(shape, n)
    if first >= duration:
        return np.empty(0)
    out = [np.array([first])]
    t = first
    expected = (duration - first) / mean_gap
    while True:
        n = int(expected * 1.25 + 4.0 * math.sqrt(expected) + 16)
        c = t + np.cumsum(gaps(n))
        out.append(c[c < duration])
        if c[-1] >= duration:
            break
        t = float(c[-1])
        expected = (duration - t) / mean_gap
    return np.concatenate(out)


def _sample(rng: np.random.Generator, toks: np.ndarray, cdf: np.ndarray, n: int) -> np.ndarray:
    idx = np.searchsorted(cdf, rng.random(n), side="right")
    return toks[np.minimum(idx, len(toks) - 1)]


def _fitted_mean(kind: int, p1: float, p2: float) -> float:
    if kind == 1:
        return p1 * p2
    return p2 * float(math.gamma(1.0 + 1.0 / p1))


def _find_trace_files(paths: list[Path]) -> dict[int, Path]:
    found: dict[int, Path] = {}

    def add(cid: int, p: Path) -> None:
        if cid in found and found[cid].parent != p.parent:
            raise ConfigError(f"servegen: client {cid} given twice ({found[cid]} and {p})")
        # Prefer the uncompressed original when both forms sit side by side.
        if cid not in found or not p.name.endswith(".gz"):
            found[cid] = p

    for p in map(Path, paths):
        if p.is_dir():
            for q in sorted(p.iterdir()):
                m = _TRACE_RE.match(q.name)
                if m:
                    add(int(m.group(1)), q)
        elif p.exists():
            m = _TRACE_RE.match(p.name)
            if not m:
                raise ConfigError(f"servegen: {p.name} is not a chunk-<id>-trace.csv[.gz] file "
                                  "or a client-pool folder")
            add(int(m.group(1)), p)
        else:
            raise fail(p, None, f"no such file or folder ({p})")
    if not found:
        raise fail(Path(paths[0]) if paths else Path("."), None,
                   "no chunk-<id>-trace.csv[.gz] files found (expected a ServeGen client-pool folder)")
    return dict(sorted(found.items()))


def _dataset_path(trace_path: Path, cid: int) -> Path | None:
    for name in (f"chunk-{cid}-dataset.json", f"chunk-{cid}-dataset.json.gz"):
        q = trace_path.parent / name
        if q.exists():
            return q
    return None


def _check(selection: dict) -> dict:
    unknown = sorted(set(selection) - set(SELECTION_KEYS))
    if unknown:
        raise ConfigError(f"servegen: unknown selection option(s) {', '.join(unknown)} "
                          f"(accepted: {', '.join(SELECTION_KEYS)})")
    s = dict(selection)
    if "slot_start_s" not in s or s["slot_start_s"] is None:
        raise ConfigError("servegen: slot_start_s is required (a 600 s window start, e.g. 36000)")
    for k, default in (("slot_start_s", None), ("seed", 0)):
        v = s.get(k, default)
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"servegen: {k} must be an integer >= 0, not {v!r}")
        s[k] = int(v)
    rs = s.get("rate_scale", 1.0)
    if not isinstance(rs, (int, float)) or isinstance(rs, bool) or not math.isfinite(rs) or rs <= 0:
        raise ConfigError(f"servegen: rate_scale must be a finite number > 0, not {rs!r}")
    s["rate_scale"] = float(rs)
    d = s.get("duration_s")
    if d is not None and (not isinstance(d, (int, float)) or isinstance(d, bool)
                          or not math.isfinite(d) or d <= 0):
        raise ConfigError(f"servegen: duration_s must be a number > 0, not {d!r}")
    lm = s.get("length_match", "nearest")
    if lm not in LENGTH_MATCH:
        raise ConfigError(f"servegen: length_match must be one of {', '.join(LENGTH_MATCH)}, not {lm!r}")
    s["length_match"] = lm
    ml = s.get("max_len")
    if ml is not None and (not isinstance(ml, (int, np.integer)) or isinstance(ml, bool) or ml < 1):
        raise ConfigError(f"servegen: max_len must be an integer >= 1, not {ml!r}")
    if s.get("clients") is not None:
        try:
            s["clients"] = {int(c) for c in s["clients"]}
        except (TypeError, ValueError):
            raise ConfigError(f"servegen: clients must be a list of client ids, not "
                              f"{s['clients']!r}") from None
    return s


def _choose_timestamp(ds: ClientDataset, slot: int, duration: float, how: str) -> int | None:
    stamps = ds.timestamps[ds.has_data]
    if len(stamps) == 0:
        return None
    if how == "preceding":
        k = int(np.searchsorted(stamps, slot, side="right")) - 1
        return int(stamps[k]) if k >= 0 else None
    mid = slot + duration / 2.0
    dist = np.abs(stamps - mid)
    return int(stamps[int(np.argmin(dist))])  # argmin takes the earlier one on a tie


def read(paths: list[Path], **selection) -> AdapterResult:
    """Generate one slot of requests from a ServeGen client pool (see the module docstring).

    Selection: ``slot_start_s`` (required; a window start of the trace files, multiples of
    600 s over 14 days), ``seed`` (default 0), ``rate_scale`` (default 1.0; multiplies every
    client's rate, keeping its shape), ``duration_s`` (default: the window length, at most
    that), ``clients`` (ids to use; default all), ``length_match`` ("nearest" | "preceding"),
    ``max_len`` (drop requests whose input + output exceeds it).
    ``paths``: client-pool folder(s) and/or individual ``chunk-<id>-trace.csv[.gz]`` files
    (each client's dataset file is looked up beside its trace file).
    arrival_s runs from the slot start; client ids are ``servegen-<id>``. Identical inputs
    and seed give identical output.
    """
    sel = _check(selection)
    slot, seed, rate_scale = sel["slot_start_s"], sel["seed"], sel["rate_scale"]
    files = _find_trace_files(list(paths))
    if sel.get("clients") is not None:
        missing = sorted(sel["clients"] - set(files))
        if missing:
            raise ConfigError(f"servegen: no trace file for client(s) {', '.join(map(str, missing))}")
        files = {c: p for c, p in files.items() if c in sel["clients"]}

    origin: list[dict] = []
    active: list[tuple[int, int, ClientTrace]] = []
    duration = None
    for (cid, tpath), ct in zip(files.items(), load_client_traces(list(files.values()))):
        origin.append({"name": tpath.name, "sha256": ct.sha256})
        k = int(np.searchsorted(ct.start, slot))
        if k >= len(ct.start) or ct.start[k] != slot:
            step = int(ct.start[1] - ct.start[0]) if len(ct.start) > 1 else 600
            raise fail(tpath, None, f"no window starts at slot_start_s={slot} (windows start at "
                       f"{ct.start[0]}..{ct.start[-1]} every {step} s)")
        win = float(ct.start[k + 1] - slot) if k + 1 < len(ct.start) else (
            float(ct.start[k] - ct.start[k - 1]) if k > 0 else 600.0)
        duration = win if duration is None else min(duration, win)
        if ct.pattern[k] > 0:
            active.append((cid, k, ct))
    assert duration is not None
    if sel.get("duration_s") is not None:
        if sel["duration_s"] > duration + 1e-9:
            raise ConfigError(f"servegen: duration_s={sel['duration_s']} is longer than the "
                              f"{duration:g} s window")
        duration = float(sel["duration_s"])

    loader = _DatasetLoader([d for d in (_dataset_path(files[cid], cid) for cid, _, _ in active)
                             if d is not None])
    try:
        t, inp, out, who, skipped, n_rescaled = _generate(
            active, files, loader, origin, slot, seed, rate_scale, duration, sel["length_match"])
    finally:
        loader.close()
    return _finish(t, inp, out, who, skipped, n_rescaled, origin, active, sel, slot, seed,
                   rate_scale, duration)


def _generate(active, files, loader, origin, slot, seed, rate_scale, duration, length_match):
    """Per active client: arrivals and lengths; returns merged, time-sorted arrays."""
    skipped: list[str] = []
    arrivals, inputs, outputs, owners = [], [], [], []
    n_rescaled = 0
    for cid, k, ct in active:
        tpath = files[cid]
        dpath = _dataset_path(tpath, cid)
        if dpath is None:
            skipped.append(f"servegen-{cid}: no dataset file (chunk-{cid}-dataset.json[.gz]), "
                           "so no length data")
            continue
        ds = loader.get(dpath)
        ts = _choose_timestamp(ds, slot, duration, length_match)
        if ts is None:
            what = ("no dataset entry with data at or before the slot"
                    if length_match == "preceding" else "no dataset entry with data")
            skipped.append(f"servegen-{cid}: {what} in {dpath.name}")
            continue
        origin.append({"name": dpath.name, "sha256": ds.sha256})
        kind, p1, p2 = int(ct.pattern[k]), float(ct.p1[k]), float(ct.p2[k])
        rate = float(ct.rate[k])
        if abs(_fitted_mean(kind, p1, p2) * rate - 1.0) > MEAN_TOL:
            n_rescaled += 1
        rng = np.random.default_rng(np.random.SeedSequence([seed, slot, cid]))
        t = _equilibrium_renewal(rng, kind, p1, 1.0 / (rate * rate_scale), duration)
        n = len(t)
        if n == 0:
            continue  # (with a small rate_scale many clients send nothing: skip their pdfs)
        in_pdf = _pdf(ds, dpath, ts, "input_tokens")
        out_pdf = _pdf(ds, dpath, ts, "output_tokens")
        arrivals.append(t)
        inputs.append(_sample(rng, *in_pdf, n))
        outputs.append(_sample(rng, *out_pdf, n))
        owners.append(np.full(n, f"servegen-{cid}", dtype=object))

    if arrivals:
        t = np.concatenate(arrivals)
        inp = np.concatenate(inputs).astype(np.int64)
        out = np.concatenate(outputs).astype(np.int64)
        who = np.concatenate(owners)
        order = np.argsort(t, kind="stable")
        t, inp, out, who = t[order], inp[order], out[order], who[order]
    else:
        t = np.empty(0)
        inp = np.empty(0, dtype=np.int64)
        out = np.empty(0, dtype=np.int64)
        who = np.empty(0, dtype=object)
    return t, inp, out, who, skipped, n_rescaled


def _finish(t, inp, out, who, skipped, n_rescaled, origin, active, sel, slot, seed, rate_scale,
            duration) -> AdapterResult:
    """Apply the drops and assemble the result."""
    dropped = {ZERO_OUT: 0, ZERO_IN: 0}
    drop = np.zeros(len(t), dtype=bool)
    for reason, mask in ((ZERO_OUT, out == 0), (ZERO_IN, inp == 0)):
        mask = mask & ~drop
        dropped[reason] = int(mask.sum())
        drop |= mask
    if sel.get("max_len") is not None:
        mask = ~drop & (inp + out > sel["max_len"])
        dropped[OVER_MAX] = int(mask.sum())
        drop |= mask
    keep = ~drop
    trace = Trace(arrival_s=t[keep].astype(np.float64), input_tokens=inp[keep],
                  output_tokens=out[keep], client_id=who[keep],
                  name=f"servegen-slot-{slot}-seed-{seed}")
    notes = [
        f"servegen: slot {slot} s, {duration:g} s, {len(active)} active clients, "
        f"{len(active) - len(skipped)} generated, {len(skipped)} skipped without length data",
        f"servegen: {n_rescaled} generated client(s) had a fitted mean inter-arrival off 1/rate "
        f"by more than {MEAN_TOL:.0%}; every client's scale is set so the mean gap is "
        f"1/(rate*rate_scale), shape kept",
        f"servegen: lengths drawn independently from each client's input/output pdfs "
        f"({sel['length_match']} dataset timestamp with data); rate_scale={rate_scale:g}",
    ]
    return AdapterResult(trace=trace, dropped=dropped, skipped=skipped, origin=origin, notes=notes)
