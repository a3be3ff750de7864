"""The canonical trace: one row per request, held as columnar numpy arrays.

Columns: `arrival_s` (float seconds from window start, non-decreasing),
`input_tokens` (int >= 1), `output_tokens` (int >= 1), `client_id` (optional string), and
optionally the prefix identity `hash_ids@<block size>`: per request, one id per block of that
many prompt tokens, chained (equal id = equal whole prefix up to and including that block), and
optionally `warmup` (0/1): 1 for the leading requests a window replays before its measured ones,
to warm the engine's caches; they are simulated but never measured (docs/corpus.md, "Warm caches").
Every public format is converted into this by an adapter; the engine reads only this.

Files are CSV (header `arrival_s,input_tokens,output_tokens[,client_id][,warmup][,hash_ids@N]`,
any column order; a request's ids separated by spaces) or Parquet with the same columns (ids as a
list of int64, `warmup` as bool). A trace without hash ids or warm-up is stored and hashed exactly
as before they existed.
Anything wrong with a file or table is reported as a one-line `TraceError` naming the file
(or source), the line/row and the column, e.g.
``data/t.csv: line 5: column 'input_tokens': 'abc' is not an integer``.
Nothing is silently repaired: the only normalisations are that an empty `client_id`
means "no client" (None) and that an arrival of -0.0 is stored as 0.0.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schedport.common.arrowcols import numpy_of
from schedport.common.atomic import atomic_write
from schedport.errors import TraceError
from schedport.workload.tracecheck import (  # noqa: F401  (COLUMNS, REQUIRED, MAX_*: re-exported)
    COLUMNS, EXPECTED_HEADER, MAX_ARRIVAL_S, MAX_TOKENS, REQUIRED, WARMUP, NumericColumn, Where, bad_mask,
    check_header, check_required, clients_from_any, clients_from_strings, hash_block_size_of, hash_column,
    hash_counts, hash_ids_from_cells, numeric_from_any, numeric_from_strings, warmup_from_cells,
)

_CSV_SUFFIXES = (".csv",)
_PARQUET_SUFFIXES = (".parquet", ".pq")
_SUPPORTED = ".csv, .parquet or .pq"
_HASH_TAG = b"schedport-trace-v1\x00"


@dataclass(frozen=True, eq=False)
class Trace:
    """A validated request trace (immutable columnar arrays).

    `client_id` is an object array of str (or None for requests without a client),
    or None when the trace has no client column at all. `hash_ids` is None (no prefix
    identity) or every request's block ids concatenated in request order (int64): request i
    has ceil(input_tokens[i] / hash_block_size) of them (`hash_ids_of`). `warmup` is how many
    of the first requests are a warm-up: replayed through the engine before the measured ones
    (`measured`), so its caches are warm when they arrive, and left out of every metric.
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    client_id: np.ndarray | None = None
    name: str = "trace"
    hash_ids: np.ndarray | None = None
    hash_block_size: int | None = None
    warmup: int = 0

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def span_s(self) -> float:
        """Time from the first to the last arrival (0 for a one-request trace)."""
        if len(self) == 0:
            return 0.0
        return float(self.arrival_s[-1] - self.arrival_s[0])

    def scaled(self, factor: float) -> "Trace":
        """The same requests with every arrival time multiplied by `factor` (burst shape kept)."""
        return Trace(self.arrival_s * float(factor), self.input_tokens, self.output_tokens,
                     self.client_id, self.name, self.hash_ids, self.hash_block_size, self.warmup)

    def measured(self) -> "Trace":
        """The requests that are measured: the trace without its leading warm-up requests (the
        trace itself when it has none). A window's load, capacity, horizon and every metric are
        those of this part; the warm-up only sets the engine's state when it begins."""
        if not self.warmup:
            return self
        return self.take(np.arange(self.warmup, len(self)))

    def hash_offsets(self) -> np.ndarray:
        """Where each request's ids start in `hash_ids` (n + 1 offsets; the last is the total)."""
        if self.hash_ids is None or self.hash_block_size is None:
            raise ValueError("this trace carries no hash_ids")
        return np.concatenate([[0], np.cumsum(hash_counts(self.input_tokens, self.hash_block_size))])

    def hash_id_lists(self) -> list[np.ndarray] | None:
        """Every request's block ids, one array each (None without prefix identity): the form
        `from_arrays` takes, to rebuild a trace with its ids checked again."""
        if self.hash_ids is None:
            return None
        return np.split(self.hash_ids, self.hash_offsets()[1:-1])

    def hash_ids_of(self, i: int) -> np.ndarray:
        """Request i's block ids (read-only view), one per `hash_block_size` prompt tokens."""
        off = self.hash_offsets()
        return self.hash_ids[off[i]:off[i + 1]]

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_arrays(cls, arrival_s: Any, input_tokens: Any, output_tokens: Any,
                    client_id: Any = None, *, name: str = "trace",
                    source: str = "<arrays>", hash_ids: Any = None,
                    hash_block_size: int | None = None, warmup: int = 0) -> "Trace":
        """Validate columns (array-likes) and build a `Trace` from copies of them.

        This is the one door into the canonical format for in-memory data (adapters,
        generators, tests). Numbers may be given as numeric arrays or as strings;
        `client_id` entries may be str, int (stored as its decimal string) or
        None/NaN/"" (no client). Bad data raises `TraceError` naming `source`, the
        1-based row and the column, e.g. ``<arrays>: row 3: column 'arrival_s': ...``.
        An empty table is an error too: a trace without requests is never useful.
        `hash_ids` (with `hash_block_size`, an integer >= 1) gives each request's block ids as a
        list; they are checked as a file's ``hash_ids@<block size>`` column is. `warmup` is the
        number of leading warm-up requests (0 <= warmup < number of requests).
        """
        where = Where(str(source))
        raw: dict[str, np.ndarray] = {}
        given = {"arrival_s": arrival_s, "input_tokens": input_tokens,
                 "output_tokens": output_tokens}
        if client_id is not None:
            given["client_id"] = client_id
        for col, values in given.items():
            try:
                arr = np.asarray(values)
            except Exception as exc:  # ragged nested lists and the like
                raise TraceError(f"{where.source}: column '{col}': cannot be read as a "
                                 f"column of values ({_one_line(exc)})") from exc
            if arr.ndim != 1:
                raise TraceError(f"{where.source}: column '{col}': expected a one-dimensional "
                                 f"column, got shape {arr.shape}")
            raw[col] = arr
        lengths = {col: len(arr) for col, arr in raw.items()}
        if len(set(lengths.values())) > 1:
            desc = ", ".join(f"{col} has {n}" for col, n in lengths.items())
            raise TraceError(f"{where.source}: columns have different lengths ({desc})")
        if lengths["arrival_s"] == 0:
            raise TraceError(f"{where.source}: no requests (the table has no rows)")
        numeric = {col: numeric_from_any(col, raw[col], where) for col in REQUIRED}
        clients = raw.get("client_id")
        hashes = None
        if hash_ids is not None:
            bs = hash_block_size
            if not isinstance(bs, (int, np.integer)) or isinstance(bs, bool) or not 1 <= bs < 10**9:
                raise TraceError(f"{where.source}: hash_block_size must be an integer >= 1 "
                                 f"(tokens a block id covers), not {bs!r}")
            cells = list(hash_ids)
            if len(cells) != lengths["arrival_s"]:
                raise TraceError(f"{where.source}: columns have different lengths (arrival_s has "
                                 f"{lengths['arrival_s']}, hash_ids has {len(cells)})")
            hashes = (cells, int(bs))
        n = lengths["arrival_s"]
        if not isinstance(warmup, (int, np.integer)) or isinstance(warmup, bool) or not 0 <= warmup < n:
            raise TraceError(f"{where.source}: warmup must be the number of leading warm-up requests, an "
                             f"integer in [0, {n - 1}] (at least one request is measured), not {warmup!r}")
        return _build(numeric, clients, where, name, hashes=hashes, warmup=int(warmup))

    # ----------------------------------------------------------------- views

    def to_frame(self):
        """The trace as a pandas DataFrame with the canonical columns.

        `client_id` (object dtype, None for no client) appears only if the trace has it.
        The prefix identity is not in the frame (`hash_id_lists` gives it per request).
        The frame holds copies, so editing it never changes the trace.
        """
        import pandas as pd

        data = {
            "arrival_s": pd.Series(np.array(self.arrival_s, dtype=np.float64)),
            "input_tokens": pd.Series(np.array(self.input_tokens, dtype=np.int64)),
            "output_tokens": pd.Series(np.array(self.output_tokens, dtype=np.int64)),
        }
        if self.client_id is not None:
            # explicit object dtype: pandas >= 3 would otherwise infer "str" and turn None into NaN
            data["client_id"] = pd.Series(np.array(self.client_id, dtype=object), dtype=object)
        return pd.DataFrame(data)

    def take(self, indices: Any) -> "Trace":
        """The requests at `indices` (integer positions or a boolean mask), in that order.

        Used to cut windows and subsamples. The result must still have non-decreasing
        arrivals; asking for a reordering raises `ValueError` (a programming error,
        not bad user data).
        """
        idx = np.asarray(indices)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise ValueError(f"boolean mask has shape {idx.shape}, trace has {len(self)} rows")
            idx = np.flatnonzero(idx)
        elif idx.size == 0:
            idx = idx.astype(np.int64)
        elif idx.dtype.kind not in "iu":
            raise ValueError(f"indices must be integers or a boolean mask, got {idx.dtype}")
        idx = idx.reshape(-1)
        arrival = self.arrival_s[idx]
        if arrival.size > 1 and bool(np.any(np.diff(arrival) < 0)):
            raise ValueError("take() would put arrivals out of order; indices must keep "
                             "arrival times non-decreasing")
        warm = idx < self.warmup
        nwarm = int(np.count_nonzero(warm))
        if nwarm and not warm[:nwarm].all():
            raise ValueError("take() would put a warm-up request after a measured one")
        clients = None if self.client_id is None else self.client_id[idx]
        ids = None
        if self.hash_ids is not None:
            off = self.hash_offsets()
            counts = (off[1:] - off[:-1])[idx]
            firsts = np.repeat(off[:-1][idx] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
            ids = _frozen(self.hash_ids[firsts + np.arange(int(counts.sum()))])
        return Trace(_frozen(arrival), _frozen(self.input_tokens[idx]),
                     _frozen(self.output_tokens[idx]),
                     None if clients is None else _frozen(clients), self.name, ids, self.hash_block_size,
                     nwarm)

    def head(self, n: int = 5) -> "Trace":
        """The first `n` requests (all of them if the trace is shorter)."""
        if n < 0:
            raise ValueError(f"head() needs n >= 0, got {n}")
        return self.take(np.arange(min(int(n), len(self))))

    def __getitem__(self, key: slice) -> "Trace":
        """`trace[a:b]` is the requests at positions a..b-1 (a `Trace`, via `take`)."""
        if not isinstance(key, slice):
            raise TypeError("a Trace can be sliced (trace[a:b]) but not indexed; "
                            "use take() for a list of positions")
        return self.take(np.arange(len(self))[key])

    def content_sha256(self) -> str:
        """Hex SHA-256 of the trace's content, independent of file format and dtype.

        The serialisation is: a version tag, the row count, arrival_s as little-endian
        float64 (-0.0 folded into 0.0), both token columns as little-endian int64, then a
        presence flag for client_id and, if present, each id as a length-prefixed UTF-8
        string (length 0xFFFFFFFF for "no client"). A trace with prefix identity then adds
        the tag ``hash_ids``, the block size as little-endian uint64 and every id as
        little-endian int64 (nothing is added without it, so such traces hash as before). A trace
        with a warm-up then adds the tag ``warmup`` and its count as little-endian uint64.
        The name is not included, so the same requests saved as CSV or Parquet, under any
        file name, hash the same. Used to key caches and the corpus manifest.
        """
        h = hashlib.sha256(_HASH_TAG)
        h.update(struct.pack("<Q", len(self)))
        h.update(np.ascontiguousarray(np.asarray(self.arrival_s, dtype=np.float64) + 0.0,
                                      dtype="<f8").tobytes())
        h.update(np.ascontiguousarray(self.input_tokens, dtype="<i8").tobytes())
        h.update(np.ascontiguousarray(self.output_tokens, dtype="<i8").tobytes())
        if self.client_id is None:
            h.update(b"\x00")
        else:
            h.update(b"\x01")
            parts = []
            for c in self.client_id.tolist():
                if c is None:
                    parts.append(b"\xff\xff\xff\xff")
                else:
                    b = str(c).encode("utf-8")
                    parts.append(struct.pack("<I", len(b)))
                    parts.append(b)
            h.update(b"".join(parts))
        if self.hash_ids is not None:
            h.update(b"hash_ids")
            h.update(struct.pack("<Q", int(self.hash_block_size)))
            h.update(np.ascontiguousarray(self.hash_ids, dtype="<i8").tobytes())
        if self.warmup:
            h.update(b"warmup")
            h.update(struct.pack("<Q", int(self.warmup)))
        return h.hexdigest()


# ===================================================================== file I/O


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a canonical trace from a CSV or Parquet file (chosen by the file suffix).

    The trace's name is the file stem. Any problem (missing file, wrong suffix, bad
    header, bad value, arrivals going backwards, ragged CSV rows, ...) raises a one-line
    `TraceError` naming the file, the line (CSV, header = line 1) or row (Parquet,
    1-based) and the column. See the module docstring for what is accepted.
    """
    p = Path(path)
    src = os.fspath(path)
    kind = _kind_of(p, src)
    if not p.exists():
        raise TraceError(f"{src}: file not found")
    if p.is_dir():
        raise TraceError(f"{src}: is a directory, not a trace file")
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise TraceError(f"{src}: cannot read file ({exc.strerror or exc})") from exc
    if size == 0:
        raise TraceError(f"{src}: file is empty; expected a header {EXPECTED_HEADER} "
                         "and one row per request")
    if kind == "csv":
        _check_memory(size, CSV_MEMORY_FACTOR, src)
        return _load_csv(p, src)
    return _load_parquet(p, src)


#: Peak memory of loading a canonical CSV, in multiples of its size (measured: 3.4x on a 7M-row
#: file without client ids, including the parse; client ids as Python strings add more).
CSV_MEMORY_FACTOR = 4.0


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux MemAvailable), None if unknown: what
    a trace load (here) and a simulation (`schedport.engine.inputs.check_simulation_memory`) check
    their need against before they start."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _check_memory(size: int, factor: float, src: str) -> None:
    """Refuse, before reading, a file whose load would need more memory than is available."""
    avail = available_memory()
    need = size * factor
    if avail is not None and need > avail:
        raise TraceError(f"{src}: loading this {size / 2**30:.1f} GiB file needs about {need / 2**30:.1f} GiB of "
                         f"memory and {avail / 2**30:.1f} GiB are available; cut it into smaller windows first "
                         f"(e.g. split the CSV by rows)")


def is_canonical_trace_file(path: str | os.PathLike[str]) -> bool:
    """Whether the file at `path` is a canonical trace as `save_trace` writes it (a CSV whose first
    line is the canonical header, or a Parquet file with the canonical columns first): what
    `example` and `trace convert` may replace; any other file is the user's (the output rule,
    `schedport.common.guard.claim_file`). Only the header or the Parquet footer is read."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(4)
            if head == b"PAR1":
                import pyarrow.parquet as pq

                try:
                    names = pq.read_schema(p).names
                except Exception:  # noqa: BLE001 - any unreadable Parquet is not one of ours
                    return False
                return names[:3] == ["arrival_s", "input_tokens", "output_tokens"]
            first = (head + f.readline(4096)).decode("utf-8", errors="replace").strip()
    except OSError:
        return False
    return first in ("arrival_s,input_tokens,output_tokens", "arrival_s,input_tokens,output_tokens,client_id")


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write `trace` as CSV or Parquet (by suffix), atomically and losslessly.

    The file is written to a temporary name in the same directory and then moved into
    place with `os.replace`, so readers never see a half-written file and a failure
    leaves no partial file. CSV floats use Python's shortest round-trip repr, so
    `load_trace(save_trace(t))` reproduces every value exactly; Parquet stores
    float64/int64/string columns. The client_id column is written only if present.
    """
    p = Path(path)
    src = os.fspath(path)
    kind = _kind_of(p, src)
    if len(trace) == 0:
        raise TraceError(f"{src}: cannot write a trace with no requests "
                         "(it could not be loaded again)")
    parent = p.parent
    if not parent.is_dir():
        raise TraceError(f"{src}: cannot write: directory '{parent}' does not exist")
    if p.is_dir():
        raise TraceError(f"{src}: cannot write: is a directory")
    def write(tmp: Path) -> None:
        if kind == "csv":
            tmp.write_bytes(_csv_text(trace).encode("utf-8"))
        else:
            import pyarrow.parquet as pq

            with open(tmp, "wb") as f:
                pq.write_table(_arrow_table(trace), f)

    try:
        atomic_write(p, write)
    except BaseException as exc:
        if isinstance(exc, OSError):
            raise TraceError(f"{src}: cannot write file ({exc.strerror or exc})") from exc
        if isinstance(exc, (TraceError, KeyboardInterrupt, SystemExit)):
            raise
        raise TraceError(f"{src}: cannot write trace ({_one_line(exc)})") from exc


# ===================================================================== internals


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _kind_of(p: Path, src: str) -> str:
    suffix = p.suffix.lower()
    if suffix in _CSV_SUFFIXES:
        return "csv"
    if suffix in _PARQUET_SUFFIXES:
        return "parquet"
    shown = f"'{p.suffix}'" if p.suffix else "(no suffix)"
    raise TraceError(f"{src}: unsupported trace file type {shown}; use {_SUPPORTED}")


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _build(numeric: dict[str, NumericColumn], clients: Any, where: Where, name: str,
           *, clients_are_strings: bool = False, hashes: tuple[Any, int] | None = None,
           warmup: Any = 0) -> Trace:
    """Check the parsed columns and assemble a read-only `Trace`. `warmup` is a count, or a file's
    ``warmup`` column (its cells, checked here)."""
    check_required(numeric, where)
    arrival = numeric["arrival_s"].values.astype(np.float64) + 0.0  # fold -0.0 into 0.0
    inp = numeric["input_tokens"].values.astype(np.int64)
    out = numeric["output_tokens"].values.astype(np.int64)
    cid = None
    if clients is not None:
        cid = (clients_from_strings(clients) if clients_are_strings
               else clients_from_any(clients, where))
        cid = _frozen(cid)
    ids = bs = None
    if hashes is not None:
        cells, bs = hashes
        ids = _frozen(hash_ids_from_cells(cells, inp, bs, where))
    if not isinstance(warmup, (int, np.integer)):
        warmup = warmup_from_cells(warmup, where)
    return Trace(_frozen(arrival), _frozen(inp), _frozen(out), cid, str(name), ids, bs, int(warmup))


def _hash_header(header: list[str]) -> str | None:
    """The header's ``hash_ids@N`` column, if it has one."""
    for c in header:
        if hash_block_size_of(c) is not None:
            return c
    return None


# --------------------------------------------------------------------- CSV


def _csv_text(trace: Trace) -> str:
    """Canonical CSV text: header, then one line per request, '\\n' line endings."""
    arrival = np.asarray(trace.arrival_s, dtype=np.float64).tolist()
    inp = np.asarray(trace.input_tokens, dtype=np.int64).tolist()
    out = np.asarray(trace.output_tokens, dtype=np.int64).tolist()
    if trace.hash_ids is not None or trace.warmup:
        return _csv_text_extra(trace, arrival, inp, out)
    if trace.client_id is None:
        head = "arrival_s,input_tokens,output_tokens\n"
        body = [f"{a!r},{i},{o}\n" for a, i, o in zip(arrival, inp, out)]
    else:
        head = "arrival_s,input_tokens,output_tokens,client_id\n"
        body = [f"{a!r},{i},{o},{_csv_field(c)}\n"
                for a, i, o, c in zip(arrival, inp, out, trace.client_id.tolist())]
    return head + "".join(body)


def _csv_text_extra(trace: Trace, arrival: list, inp: list, out: list) -> str:
    """Canonical CSV text of a trace with a warm-up or prefix identity: after the client column,
    ``warmup`` (1 or 0) when the trace has a warm-up, then the ids last, separated by spaces."""
    names = ["arrival_s", "input_tokens", "output_tokens"]
    cols = [[f"{a!r},{i},{o}" for a, i, o in zip(arrival, inp, out)]]
    if trace.client_id is not None:
        names.append("client_id")
        cols.append([_csv_field(c) for c in trace.client_id.tolist()])
    if trace.warmup:
        names.append(WARMUP)
        cols.append(["1" if k < trace.warmup else "0" for k in range(len(trace))])
    if trace.hash_ids is not None:
        off = trace.hash_offsets().tolist()
        ids = trace.hash_ids.tolist()
        names.append(hash_column(trace.hash_block_size))
        cols.append([" ".join(map(str, ids[a:b])) for a, b in zip(off[:-1], off[1:])])
    return ",".join(names) + "\n" + "".join(",".join(row) + "\n" for row in zip(*cols))


def _csv_field(c: Any) -> str:
    if c is None:
        return ""
    s = str(c)
    if any(ch in s for ch in ',"\r\n\x00'):
        return '"' + s.replace('"', '""') + '"'
    return s


def _decode(data: bytes, src: str) -> str:
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(f"{src}: line {line}: not valid UTF-8 text (byte "
                         f"{data[exc.start]:#04x})") from exc


def _load_csv(p: Path, src: str) -> Trace:
    """Read a CSV trace: structure pass (exact line numbers), then values.

    The structure pass finds the header, skips blank lines and rejects ragged rows,
    recording the physical line on which each record starts. Files without quote
    characters are split line by line (fast); quoted files go through the csv module
    so quoted commas and newlines are handled. Values are then parsed with typed columns
    (fast path: by Arrow where the file is plain ASCII without quotes, else or where Arrow
    refuses by pandas); if anything fails, every column is read as text and checked cell
    by cell so the first bad cell can be named exactly.
    """
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TraceError(f"{src}: cannot read file ({exc.strerror or exc})") from exc
    if data.isascii() and not any(c in data for c in (b'"', b"\x00", b"\r")):
        # the common case, read without a text copy: structure on the bytes, values by Arrow (else pandas)
        shape = _structure_plain_bytes(data, src)
        if shape is not None and not _check_header_quietly(shape[0]):
            fast = _csv_arrow(data, shape[0], shape[1], p.stem)
            if fast is None:
                fast = _csv_fast(data, shape[0], shape[1], p.stem, None)
            if fast is not None:
                return fast
    text = _decode(data, src)
    columns: dict[str, np.ndarray] | None = None
    if '"' in text or "\x00" in text:
        header, lines, columns = _structure_quoted(text, src)
    else:
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        header, lines = _structure_plain(text, src)
    buf = text.encode("utf-8")
    name = p.stem
    if "\x00" not in text:
        fast = _csv_fast(buf, header, len(lines), name, columns)
        if fast is not None:
            return fast
    if columns is None:
        import pandas as pd

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                df = pd.read_csv(io.BytesIO(buf), dtype=str, na_filter=False,
                                 index_col=False, skip_blank_lines=True, engine="c")
        except Exception as exc:
            raise TraceError(f"{src}: malformed CSV ({_one_line(exc)})") from exc
        if len(df) != len(lines):
            raise TraceError(f"{src}: malformed CSV (read {len(df)} rows, "
                             f"expected {len(lines)})")
        columns = {c: df[c].to_numpy(dtype=object) for c in header}
    numeric = {}
    for c in REQUIRED:
        obj = columns[c]
        numeric[c] = NumericColumn(numeric_from_strings(obj), lambda i, obj=obj: obj[i])
    hcol = _hash_header(list(header))
    hashes = None if hcol is None else (columns[hcol], hash_block_size_of(hcol))
    return _build(numeric, columns.get("client_id"), Where(src, lines), name,
                  clients_are_strings=True, hashes=hashes, warmup=columns.get(WARMUP, 0))


def _no_rows(src: str, has_header: bool) -> TraceError:
    if has_header:
        return TraceError(f"{src}: no requests (the file has a header but no data rows)")
    return TraceError(f"{src}: file is empty; expected a header {EXPECTED_HEADER} "
                      "and one row per request")


def _ragged(src: str, line: int, expected: int, found: int) -> TraceError:
    return TraceError(f"{src}: line {line}: malformed CSV: expected {expected} fields "
                      f"as in the header, found {found}")


def _structure_plain_bytes(data: bytes, src: str) -> tuple[list[str], int] | None:
    """Header and record count of an ASCII, quote-free, '\\n'-only CSV, from its bytes with numpy
    (8 bytes a line, no Python string per line: a large trace loads in about 3x its size in
    memory instead of 10x); None when its rows may be ragged, for the exact pass to report.

    Every record has as many fields as the header when the file's commas number exactly
    (records x (fields - 1)) and no record has more fields (pandas refuses that in `_csv_fast`).
    """
    a = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(a == 10)
    if not len(ends) or ends[-1] != len(a) - 1:
        ends = np.append(ends, len(a))          # a last line without its newline
    starts = np.concatenate([[0], ends[:-1] + 1])
    nonblank = np.flatnonzero(ends > starts)
    del starts
    if len(nonblank) < 2:
        return None
    h = int(nonblank[0])
    first = 0 if h == 0 else int(ends[h - 1]) + 1
    header = data[first:ends[h]].decode("ascii").split(",")
    n = len(nonblank) - 1
    if np.count_nonzero(a == 44) != (n + 1) * (len(header) - 1):
        return None
    return header, n


def _check_header_quietly(header: list[str]) -> str:
    """The header's problem ('' if none), for the fast path to leave to the exact one."""
    try:
        check_header(header, "", "")
    except TraceError as e:
        return str(e) or "bad header"
    return ""


def _structure_plain(text: str, src: str) -> tuple[list[str], np.ndarray]:
    """Header and record start lines of a quote-free CSV with '\\n' line endings."""
    lines = text.split("\n")
    nonblank = [k for k, line in enumerate(lines) if line != ""]
    if not nonblank:
        raise _no_rows(src, False)
    h = nonblank[0]
    header = lines[h].split(",")
    check_header(header, src, f"line {h + 1}: ")
    rec = nonblank[1:]
    if not rec:
        raise _no_rows(src, True)
    nfields = np.fromiter((lines[k].count(",") + 1 for k in rec), dtype=np.int64,
                          count=len(rec))
    ragged = nfields != len(header)
    if ragged.any():
        j = int(np.argmax(ragged))
        raise _ragged(src, rec[j] + 1, len(header), int(nfields[j]))
    return header, np.asarray(rec, dtype=np.int64) + 1


def _structure_quoted(text: str, src: str
                      ) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
    """Header, record start lines and text columns of a CSV that uses quoting."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows: list[list[str]] = []
    ends: list[int] = []
    try:
        for row in reader:
            rows.append(row)
            ends.append(reader.line_num)
    except csv.Error as exc:
        line = (ends[-1] if ends else 0) + 1
        hint = "; is a quote left open?" if "end of data" in str(exc) else ""
        raise TraceError(f"{src}: line {line}: malformed CSV ({exc}{hint})") from exc
    starts = [1] + [e + 1 for e in ends[:-1]]
    keep = [k for k, row in enumerate(rows) if row]  # [] is a blank line
    if not keep:
        raise _no_rows(src, False)
    header = rows[keep[0]]
    check_header(header, src, f"line {starts[keep[0]]}: ")
    rec = keep[1:]
    if not rec:
        raise _no_rows(src, True)
    width = len(header)
    for k in rec:
        if len(rows[k]) != width:
            raise _ragged(src, starts[k], width, len(rows[k]))
    flat = list(zip(*(rows[k] for k in rec)))
    columns = {c: np.array(flat[j], dtype=object) for j, c in enumerate(header)}
    lines = np.fromiter((starts[k] for k in rec), dtype=np.int64, count=len(rec))
    return header, lines, columns


#: The Arrow type of each canonical column, for `_csv_arrow`.
_ARROW_TYPES = {"arrival_s": "float64", "input_tokens": "int64", "output_tokens": "int64", "client_id": "string"}


def _csv_arrow(data: bytes, header: list[str], nrows: int, name: str) -> Trace | None:
    """Typed Arrow parse of an ASCII, quote-free CSV that passed `_structure_plain_bytes`: the
    trace `_csv_fast` would return, or None when anything is off (then `_csv_fast` decides, as
    before). Arrow's number parsing is strict (an integer column refuses '3.0', '+3' and
    '1e3'; a float reads to the nearest double, as pandas' does), so where it accepts a file
    the values are those pandas reads; it loads a trace without importing pandas (the
    start-up of one ``schedport simulate``) and in Arrow's parallel reader.
    """
    try:
        import pyarrow as pa
        import pyarrow.csv as pcsv

        types = {c: getattr(pa, _ARROW_TYPES[c])() for c in header}
        table = pcsv.read_csv(
            pa.BufferReader(data),
            read_options=pcsv.ReadOptions(autogenerate_column_names=False),
            parse_options=pcsv.ParseOptions(quote_char=False, double_quote=False, escape_char=False,
                                            newlines_in_values=False, ignore_empty_lines=True),
            convert_options=pcsv.ConvertOptions(column_types=types, null_values=[], true_values=[],
                                                false_values=[], strings_can_be_null=False,
                                                quoted_strings_can_be_null=False))
    except Exception:
        return None
    if table.num_rows != nrows or table.column_names != list(header) or any(
            table.column(c).null_count for c in header):
        return None
    ints = {c: numpy_of(table.column(c), np.int64) for c in ("input_tokens", "output_tokens")}
    vals = {"arrival_s": numpy_of(table.column("arrival_s"), np.float64)}
    if vals["arrival_s"] is None or any(v is None for v in ints.values()):
        return None
    vals.update({c: v.astype(np.float64) for c, v in ints.items()})
    if any(bad_mask(c, vals[c]).any() for c in REQUIRED):
        return None
    if nrows > 1 and bool(np.any(np.diff(vals["arrival_s"]) < 0)):
        return None
    cid = None
    if "client_id" in header:
        cid = _frozen(clients_from_strings(np.array(table.column("client_id").to_pylist(), dtype=object)))
    arrival = vals["arrival_s"] + 0.0  # fold -0.0 into 0.0
    return Trace(_frozen(arrival), _frozen(ints["input_tokens"]), _frozen(ints["output_tokens"]), cid, name)


def _csv_fast(buf: bytes, header: list[str], nrows: int, name: str,
              text_columns: dict[str, np.ndarray] | None) -> Trace | None:
    """Typed pandas parse of a structurally valid CSV; None if anything is off.

    When `text_columns` (the csv-module parse of a quoted file) is given, pandas' row
    count and client_id column must agree with it exactly, a guard against the two
    tokenizers reading quoting differently.
    """
    import pandas as pd

    if _hash_header(header) is not None or WARMUP in header:
        return None  # the ids and flags are checked cell by cell, with their lines, by the exact path
    typed = {"arrival_s": "float64", "input_tokens": "int64", "output_tokens": "int64",
             "client_id": object}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = pd.read_csv(io.BytesIO(buf), dtype=typed, na_filter=False,
                             index_col=False, skip_blank_lines=True, engine="c")
    except Exception:
        return None
    if len(df) != nrows or list(df.columns) != list(header):
        return None
    vals = {c: df[c].to_numpy(dtype=np.float64) for c in REQUIRED}
    if any(bad_mask(c, vals[c]).any() for c in REQUIRED):
        return None
    if nrows > 1 and bool(np.any(np.diff(vals["arrival_s"]) < 0)):
        return None
    cid = None
    if "client_id" in header:
        raw = df["client_id"].to_numpy(dtype=object)
        if text_columns is not None and not np.array_equal(raw, text_columns["client_id"]):
            return None
        cid = _frozen(clients_from_strings(raw))
    arrival = vals["arrival_s"] + 0.0  # fold -0.0 into 0.0
    inp = df["input_tokens"].to_numpy(dtype=np.int64)
    out = df["output_tokens"].to_numpy(dtype=np.int64)
    return Trace(_frozen(arrival), _frozen(inp), _frozen(out), cid, name)


# --------------------------------------------------------------------- Parquet


def _load_parquet(p: Path, src: str) -> Trace:
    try:
        import pyarrow.parquet as pq

        with pq.ParquetFile(p) as f:   # as read_table, without its dataset layer (which imports pandas)
            table = f.read()
    except OSError as exc:
        if getattr(exc, "strerror", None):
            raise TraceError(f"{src}: cannot read file ({exc.strerror})") from exc
        raise TraceError(f"{src}: not a readable Parquet file ({_one_line(exc)})") from exc
    except Exception as exc:
        raise TraceError(f"{src}: not a readable Parquet file ({_one_line(exc)})") from exc
    check_header(list(table.column_names), src, "")
    if table.num_rows == 0:
        raise TraceError(f"{src}: no requests (the file has the columns but no rows)")
    where = Where(src)
    try:
        numeric = {c: _numeric_from_arrow(c, table.column(c), where) for c in REQUIRED}
        clients = None
        if "client_id" in table.column_names:
            clients = _clients_from_arrow(table.column("client_id"), where)
        hcol = _hash_header(list(table.column_names))
        hashes = None if hcol is None else (table.column(hcol).to_pylist(), hash_block_size_of(hcol))
        warm = table.column(WARMUP).to_pylist() if WARMUP in table.column_names else 0
        return _build(numeric, clients, where, p.stem, hashes=hashes, warmup=warm)
    except TraceError:
        raise
    except Exception as exc:  # arrow conversion surprises
        raise TraceError(f"{src}: cannot read Parquet columns ({_one_line(exc)})") from exc


def _numeric_from_arrow(col: str, chunked: Any, where: Where) -> NumericColumn:
    import pyarrow as pa

    t = chunked.type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        values = numpy_of(chunked.cast(pa.float64(), safe=False), np.float64)
        return NumericColumn(values, lambda i: chunked[i].as_py())
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        obj = np.array(chunked.to_pylist(), dtype=object)
        return NumericColumn(numeric_from_strings(obj), lambda i: obj[i])
    raise TraceError(f"{where.source}: column '{col}' has Parquet type {t}; expected numbers")


def _clients_from_arrow(chunked: Any, where: Where) -> list[Any]:
    import pyarrow as pa

    t = chunked.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
            or pa.types.is_null(t)):
        return chunked.to_pylist()
    raise TraceError(f"{where.source}: column 'client_id' has Parquet type {t}; "
                     "expected strings")


def _arrow_table(trace: Trace) -> Any:
    import pyarrow as pa

    data = {
        "arrival_s": pa.array(np.asarray(trace.arrival_s, dtype=np.float64), pa.float64()),
        "input_tokens": pa.array(np.asarray(trace.input_tokens, dtype=np.int64), pa.int64()),
        "output_tokens": pa.array(np.asarray(trace.output_tokens, dtype=np.int64), pa.int64()),
    }
    if trace.client_id is not None:
        data["client_id"] = pa.array(
            [None if c is None else str(c) for c in trace.client_id.tolist()], pa.string())
    if trace.warmup:
        data[WARMUP] = pa.array(np.arange(len(trace)) < trace.warmup, pa.bool_())
    if trace.hash_ids is not None:
        data[hash_column(trace.hash_block_size)] = pa.ListArray.from_arrays(
            pa.array(trace.hash_offsets(), pa.int32()), pa.array(np.asarray(trace.hash_ids, np.int64), pa.int64()))
    return pa.table(data)
