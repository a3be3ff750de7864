"""Shared machinery of the source adapters: reading bytes, parsing columns, selecting a window.

Every adapter follows the same contract (see `schedport.workload.sources`): read the whole input,
validate it, and either return a complete result or raise one `DataError` whose message is a
single line naming the file, the line (or row) and the column at fault. Nothing here repairs
a value: a row that cannot be used is either an error (the default, ``bad_rows="error"``) or,
when the caller asked for ``bad_rows="drop"``, counted under ``unparsable_row``.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import math
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from schedport.errors import ConfigError, DataError, TraceError
from schedport.workload.trace import Trace
from schedport.workload.tracecheck import MAX_TOKENS, Where, check_hash_chain, hash_ids_from_cells

# Drop reasons, in precedence order: a dropped row is counted once, under the first reason
# that applies to it.
UNPARSABLE = "unparsable_row"
FAILED = "failed_response"
ZERO_OUT = "zero_output_tokens"
ZERO_IN = "zero_input_tokens"
OVER_MAX = "over_max_len"
DROP_REASONS = (UNPARSABLE, FAILED, ZERO_OUT, ZERO_IN, OVER_MAX)

BAD_ROW_MODES = ("error", "drop")
GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class AdapterResult:
    """What an adapter produced from public files.

    trace:   the canonical trace (arrival_s from the window start, tokens >= 1).
    dropped: rows left out, counted per named reason (every reason the adapter checks is
             present, with 0 when nothing was dropped for it).
    skipped: things skipped as a whole, one human-readable line each (e.g. a ServeGen
             client without length data).
    origin:  the files read, each ``{"name": <file name>, "sha256": <hex of the bytes on disk>}``,
             in the order they were read.
    notes:   how the adapter handled known quirks of the data in this call (for manifests).
    prefix:  where the trace's prefix identity was derived rather than read (BurstGPT's sessions):
             the manifest's record of that assumption (`schedport.workload.prefix.session_prefix_record`);
             None when the ids are the data's own or there are none.
    clock:   (first, last) time of the files' rows that have one, kept or dropped, on the files'
             own clock (tabular formats; None otherwise): where a rule that tiles a file starts
             and ends, so a dropped first or last row falls inside a window and is counted.
    """

    trace: Trace
    dropped: dict[str, int]
    skipped: list[str]
    origin: list[dict]
    notes: list[str] = field(default_factory=list)
    clock: tuple[float, float] | None = None
    prefix: dict | None = None

    @property
    def n_dropped(self) -> int:
        """Total number of rows dropped, over all reasons."""
        return int(sum(self.dropped.values()))


def fail(path: Path | str, where: str | None, message: str) -> DataError:
    """Build the one-line `DataError` every adapter raises: ``<file>: <where>: <message>``."""
    name = Path(path).name
    text = f"{name}: {where}: {message}" if where else f"{name}: {message}"
    return DataError(" ".join(text.split("\n")))


def read_bytes(path: Path) -> bytes:
    """The file's bytes exactly as stored on disk (what the origin sha256 is taken of)."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise fail(path, None, f"file not found ({path})") from None
    except IsADirectoryError:
        raise fail(path, None, f"is a directory, expected a file ({path})") from None
    except OSError as exc:
        raise fail(path, None, f"cannot read: {exc.strerror or exc}") from None


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def origin_entry(path: Path, data: bytes) -> dict:
    """One `AdapterResult.origin` entry for a file read from disk."""
    return {"name": Path(path).name, "sha256": sha256_hex(data)}


def decompress(path: Path, data: bytes) -> bytes:
    """Gunzip `data` when it starts with the gzip magic; a truncated or corrupt stream is a `DataError`."""
    if not data.startswith(GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except EOFError:
        raise fail(path, None, "truncated gzip stream (the file ends before the end-of-stream "
                               "marker; re-download it)") from None
    except (gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise fail(path, None, f"corrupt gzip data ({exc})") from None


def decode_text(path: Path, data: bytes) -> str:
    """Decompress if gzip, then decode UTF-8 (a leading BOM is ignored); bad bytes name their line."""
    raw = decompress(path, data)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise fail(path, f"line {line}", "not valid UTF-8 text") from None


def check_bad_rows(mode: str) -> str:
    """Validate the ``bad_rows`` option."""
    if mode not in BAD_ROW_MODES:
        raise ConfigError(f"bad_rows must be one of {', '.join(BAD_ROW_MODES)}, not {mode!r}")
    return mode


# --------------------------------------------------------------------------- CSV tables


@dataclass
class Table:
    """A CSV file read column by column, with exact line numbers.

    Columns hold strings, except that a *typed* table (see `read_csv_table`'s `numeric`)
    holds float64 arrays for its numeric columns. `lines` holds each row's 1-based line
    number in the file; `bad` marks rows already known to be malformed (wrong number of
    fields), with `bad_msg` the message per bad line.
    """

    path: Path
    columns: dict[str, np.ndarray]
    lines: np.ndarray
    bad: np.ndarray
    bad_msg: dict[int, str]
    typed: bool = False

    def __len__(self) -> int:
        return int(self.lines.shape[0])


def _header_names(text: str) -> list[str]:
    first = text.split("\n", 1)[0].rstrip("\r")
    return first.split(",")


def read_csv_table(path: Path, text: str, *, header: bool = True,
                   names: list[str] | None = None, numeric: tuple[str, ...] = (),
                   usecols: list[str] | None = None) -> Table:
    """Read CSV `text` into a `Table`, keeping exact line numbers.

    With `numeric` column names, first try a typed read (pandas' C parser straight to
    float64, no blank lines allowed, only `usecols` kept): the fast path for large, clean
    files. If that fails,
    or without `numeric`, every column is read as strings (blank lines kept so row i is
    line i+1+header, then ignored). Whenever the field count of some row may be wrong (a
    parser error, a comma count that is not exactly fields-1 per line, or quoting that
    makes counting unsafe), the csv module re-reads the file and marks each row with a
    wrong field count in `Table.bad` (the caller's `BadRows` then raises for the earliest
    bad line, or counts it as an `unparsable_row` in drop mode).
    """
    if not text.strip():
        raise fail(path, None, "empty file (no header and no rows)")
    if header:
        _check_unique_header(path, text)
    if numeric and '"' not in text:
        typed = _read_typed(text, header=header, names=names, numeric=numeric, usecols=usecols)
        if typed is not None:
            cols, arrays, n = typed
            first = 2 if header else 1
            return Table(path, arrays, np.arange(first, first + n, dtype=np.int64),
                         np.zeros(n, dtype=bool), {}, typed=True)
    try:
        df = pd.read_csv(io.StringIO(text), dtype=object, na_filter=False,
                         skip_blank_lines=False, header=0 if header else None,
                         names=None if header else names, engine="c")
    except pd.errors.ParserError:
        return _read_csv_slow(path, text, header=header, names=names)
    except pd.errors.EmptyDataError:
        raise fail(path, None, "empty file (no header and no rows)") from None
    cols = [str(c).strip() for c in df.columns] if header else list(names or [])
    arrays = {c: df.iloc[:, i].to_numpy(dtype=object) for i, c in enumerate(cols)}
    first = 2 if header else 1
    lines = np.arange(first, first + len(df), dtype=np.int64)
    # Drop blank lines (every field empty); rows with only some fields empty stay (malformed).
    blank = np.ones(len(df), dtype=bool)
    for a in arrays.values():
        blank &= (a == "")
    # pandas quietly turns an extra leading field into an index, or pads a short row: when the
    # file's comma count is not exactly (fields - 1) per line (or quoting makes counting
    # unsafe), the csv module re-reads it and marks every row with a wrong field count.
    n_lines = int((~blank).sum()) + (1 if header else 0)
    if '"' in text or text.count(",") != (len(cols) - 1) * n_lines \
            or not isinstance(df.index, pd.RangeIndex):
        return _read_csv_slow(path, text, header=header, names=names)
    if blank.any():
        keep = ~blank
        arrays = {c: a[keep] for c, a in arrays.items()}
        lines = lines[keep]
    return Table(path, arrays, lines, np.zeros(len(lines), dtype=bool), {})


def _check_unique_header(path: Path, text: str) -> None:
    """A column named twice in the header is refused, as `trace check` refuses it: pandas would
    rename the second one (``x.1``) and a reader would silently take the first."""
    try:
        first = next(csv.reader(io.StringIO(text.split("\n", 1)[0].rstrip("\r"))), [])
    except csv.Error:
        return  # the reader reports the malformed line with its number
    seen: set[str] = set()
    for c in (c.strip() for c in first):
        if c in seen:
            raise fail(path, "line 1", f"column {c!r} appears more than once")
        seen.add(c)


def _read_typed(text: str, *, header: bool, names: list[str] | None, numeric: tuple[str, ...],
                usecols: list[str] | None = None
                ) -> tuple[list[str], dict[str, np.ndarray], int] | None:
    """Typed fast read; None whenever anything is unusual (the string path then decides).

    Only `usecols` (default: all) are converted, numeric ones straight to float64.
    """
    raw = _header_names(text) if header else list(names or [])
    cols = [c.strip() for c in raw]
    if len(set(cols)) != len(cols) or not set(numeric) <= set(cols):
        return None
    want = [c for c in cols if usecols is None or c in usecols]
    if "\n\n" in text or "\n\r\n" in text or text.startswith(("\n", "\r\n")):
        return None  # blank lines: keep exact line numbers via the string path
    raw_of = dict(zip(cols, raw))
    dtypes = {raw_of[c]: (np.float64 if c in numeric else object) for c in want}
    try:
        df = pd.read_csv(io.StringIO(text), dtype=dtypes, na_filter=False,
                         header=0 if header else None, names=None if header else raw,
                         usecols=[raw_of[c] for c in want], engine="c")
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return None
    n = len(df)
    if text.count(",") != (len(cols) - 1) * (n + (1 if header else 0)) \
            or not isinstance(df.index, pd.RangeIndex) or len(df.columns) != len(want):
        return None
    arrays = {}
    for c in want:
        col = df[raw_of[c]]
        arrays[c] = col.to_numpy(dtype=np.float64) if c in numeric else col.to_numpy(dtype=object)
    return want, arrays, n


def parse_table(path: Path, text: str, required: list[str], numeric: tuple[str, ...],
                parse, bad_rows: str, *, header: bool = True, names: list[str] | None = None,
                optional: tuple[str, ...] = ()):
    """Read a CSV and run `parse(table, bad)` over it with exact error reporting.

    The typed fast path is tried first; if `parse` marks any row bad there, the file is
    re-read as strings so messages quote the text as written and drop counts are exact.
    Returns ``(parse result, bad-row mask, table)``; raises in ``bad_rows="error"`` mode.
    """
    table = read_csv_table(path, text, header=header, names=names, numeric=numeric,
                           usecols=[*required, *optional])
    require_columns(table, required)
    if table.typed:
        probe = BadRows(path, table.lines, "drop")
        out = parse(table, probe)
        if not probe.mask.any():
            return out, probe.mask, table
        table = read_csv_table(path, text, header=header, names=names)
    bad = BadRows(path, table.lines, bad_rows, initial=table.bad, initial_msg=table.bad_msg)
    out = parse(table, bad)
    return out, bad.finish(), table


def _read_csv_slow(path: Path, text: str, *, header: bool, names: list[str] | None) -> Table:
    """csv-module reader used when some rows may have a wrong number of fields."""
    reader = csv.reader(io.StringIO(text))
    rows: list[list[str]] = []
    lines: list[int] = []
    cols: list[str] | None = None if header else list(names or [])
    bad_msg: dict[int, str] = {}
    bad: list[bool] = []
    try:
        for rec in reader:
            line = reader.line_num
            if cols is None:
                cols = [c.strip() for c in rec]
                continue
            if not rec or all(f == "" for f in rec):
                continue
            lines.append(line)
            if len(rec) != len(cols):
                # Marked, not raised: the caller reports the earliest bad line of any kind.
                bad_msg.setdefault(line, f"expected {len(cols)} fields, found {len(rec)}")
                bad.append(True)
                rows.append([""] * len(cols))
            else:
                bad.append(False)
                rows.append(rec)
    except csv.Error as exc:
        raise fail(path, f"line {reader.line_num}", f"unreadable CSV ({exc})") from None
    if cols is None:
        raise fail(path, None, "empty file (no header and no rows)")
    mat = np.array(rows, dtype=object).reshape(len(rows), len(cols))
    arrays = {c: mat[:, i] for i, c in enumerate(cols)}
    return Table(path, arrays, np.asarray(lines, dtype=np.int64), np.asarray(bad, dtype=bool),
                 bad_msg)


def require_columns(table: Table, wanted: list[str]) -> None:
    """Raise a one-line error naming the first missing column and the header that was found."""
    for c in wanted:
        if c not in table.columns:
            raise fail(table.path, "line 1", f"missing column {c!r} ({header_found(table.columns, wanted)})")


def header_found(names, wanted) -> str:
    """What a header holds, for an error: the expected names it has, and only the number of the
    others (an error never echoes a file's contents: the first line of a file that is no trace
    at all may be anything)."""
    names = list(names)
    known = [n for n in names if n in wanted]
    others = len(names) - len(known)
    more = f"{others} other name{'s' if others != 1 else ''}" if others else ""
    if known:
        return f"header has: {', '.join(known)}" + (f" and {more}" if more else "")
    return f"header has {more or 'no names'}, none of {', '.join(wanted)}"


class BadRows:
    """Collects malformed rows of one file: raise on the earliest (error mode) or mark them (drop mode)."""

    def __init__(self, path: Path, lines: np.ndarray, mode: str, unit: str = "line",
                 initial: np.ndarray | None = None, initial_msg: dict[int, str] | None = None):
        self.path = path
        self.lines = lines
        self.mode = mode
        self.unit = unit
        self.mask = np.zeros(len(lines), dtype=bool) if initial is None else initial.copy()
        self.first: tuple[int, str] | None = None
        for line, msg in (initial_msg or {}).items():
            self._note(line, msg)

    def _note(self, line: int, msg: str) -> None:
        if self.first is None or line < self.first[0]:
            self.first = (line, msg)

    def add(self, mask: np.ndarray, message_for) -> None:
        """Mark rows in `mask` bad; `message_for(i)` builds the message for row index i."""
        mask = mask & ~self.mask
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            self._note(int(self.lines[i]), message_for(i))
            self.mask |= mask

    def finish(self) -> np.ndarray:
        """In error mode raise for the earliest bad row; return the bad-row mask."""
        if self.mode == "error" and self.first is not None:
            line, msg = self.first
            raise fail(self.path, f"{self.unit} {line}", msg)
        return self.mask


def _show(value) -> str:
    s = repr(value) if isinstance(value, str) else str(value)
    return s if len(s) <= 40 else s[:37] + "..."


def _to_float(values: np.ndarray) -> np.ndarray:
    """Numbers as float64 (NaN where a string is not a number); typed columns pass through."""
    if values.dtype.kind in "fiu":
        return values.astype(np.float64, copy=False)
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=float)


def _is_missing(v) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    if isinstance(v, str):
        return v.strip() == ""
    return isinstance(v, float) and v != v  # a null read from Parquet as NaN


def _missing(values: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Which not-ok entries are absent (empty field, null) rather than wrong."""
    out = np.zeros(len(values), dtype=bool)
    for i in np.flatnonzero(~ok):
        out[i] = _is_missing(values[i])
    return out


def parse_int_column(values: np.ndarray, name: str, bad: BadRows, most: int = MAX_TOKENS,
                     what: str = "token counts") -> np.ndarray:
    """Strings (or numbers) -> int64 array of non-negative integers; others are marked bad.

    Integral decimal spellings ("472", " 472 ", "472.0") are accepted; empty, non-numeric,
    fractional, infinite, negative values and values above `most` (default the largest token
    count a trace accepts, as `trace check` says: "too large") are not. Bad entries become 0
    in the result, so nothing overflows the int64 cast.
    """
    num = _to_float(values)
    ok = np.isfinite(num)
    with np.errstate(invalid="ignore"):
        integral = ok & (np.floor(num) == num)
    missing = _missing(values, ok)
    bad.add(missing, lambda i: f"column {name!r}: missing value")
    bad.add(~integral, lambda i: f"column {name!r}: {_show(values[i])} is not an integer")
    bad.add(integral & (num < 0), lambda i: f"column {name!r}: {_show(values[i])} is negative")
    bad.add(integral & (num > most),
            lambda i: f"column {name!r}: {_show(values[i])} is too large; {what} must be <= {most}")
    out = np.where(integral & (num >= 0) & (num <= most), num, 0.0)
    return out.astype(np.int64)


def parse_float_column(values: np.ndarray, name: str, bad: BadRows) -> np.ndarray:
    """Strings (or numbers) -> float64 array of finite numbers; others marked bad (NaN in result)."""
    num = _to_float(values)
    ok = np.isfinite(num)
    missing = _missing(values, ok)
    bad.add(missing, lambda i: f"column {name!r}: missing value")
    bad.add(~ok, lambda i: f"column {name!r}: {_show(values[i])} is not a finite number")
    return np.where(ok, num, np.nan)


# --------------------------------------------------------------------------- rows -> window


@dataclass
class Rows:
    """Parsed rows of one or more files, in file order, before window selection.

    time: seconds in the format's own time base (NaN where the row is bad).
    reason: per-row index into DROP_REASONS + 1 of a format-level drop (0 = usable).
    hash_ids: per row, its prompt's block ids (an int64 array; empty where the row is bad), or
              None when the format carries no prefix identity; `hash_block_size` tokens a block.
    """

    time: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    client_id: np.ndarray | None
    bad: np.ndarray
    reason: np.ndarray
    file_index: np.ndarray
    lines: np.ndarray
    paths: list[Path]
    unit: str = "line"
    hash_ids: np.ndarray | None = None
    hash_block_size: int | None = None

    @staticmethod
    def concat(parts: list["Rows"]) -> "Rows":
        """Concatenate per-file rows (file indices are offset so each row keeps its file)."""
        if len(parts) == 1:
            return parts[0]
        paths: list[Path] = []
        fidx = []
        for p in parts:
            fidx.append(p.file_index + len(paths))
            paths.extend(p.paths)
        clients = None
        if any(p.client_id is not None for p in parts):
            clients = np.concatenate([
                p.client_id if p.client_id is not None else np.full(len(p.time), None, dtype=object)
                for p in parts])
        return Rows(
            time=np.concatenate([p.time for p in parts]),
            input_tokens=np.concatenate([p.input_tokens for p in parts]),
            output_tokens=np.concatenate([p.output_tokens for p in parts]),
            client_id=clients,
            bad=np.concatenate([p.bad for p in parts]),
            reason=np.concatenate([p.reason for p in parts]),
            file_index=np.concatenate(fidx),
            lines=np.concatenate([p.lines for p in parts]),
            paths=paths,
            unit=parts[0].unit,
            hash_ids=_concat_hash_ids(parts),
            hash_block_size=parts[0].hash_block_size,
        )


def _concat_hash_ids(parts: list[Rows]) -> np.ndarray | None:
    """Every part's per-row ids in order (parts of one format all carry them or none does)."""
    if parts[0].hash_ids is None:
        return None
    out = np.empty(sum(len(p.time) for p in parts), dtype=object)
    at = 0
    for p in parts:
        out[at:at + len(p.time)] = p.hash_ids
        at += len(p.time)
    return out


_ROWS_CACHE: OrderedDict = OrderedDict()
ROWS_CACHE_SIZE = 4


def cached_load(kind: str, path: Path, bad_rows: str, loader):
    """`loader(path, bad_rows)` memoised per file (path, size, mtime) for the last few files.

    A corpus cuts many windows out of one large file (e.g. 40 from BurstGPT's 1.4 M rows);
    parsing it once per process keeps that cheap. Cached values must not be mutated.
    """
    try:
        st = Path(path).stat()
    except OSError:
        return loader(path, bad_rows)  # let the loader report the problem
    key = (kind, str(Path(path).resolve()), st.st_size, st.st_mtime_ns, bad_rows)
    hit = _ROWS_CACHE.get(key)
    if hit is not None:
        _ROWS_CACHE.move_to_end(key)
        return hit
    value = loader(path, bad_rows)
    _ROWS_CACHE[key] = value
    while len(_ROWS_CACHE) > ROWS_CACHE_SIZE:
        _ROWS_CACHE.popitem(last=False)
    return value


def cached_load_many(kind: str, paths: list[Path], bad_rows: str, loader):
    """`loader(paths, bad_rows)` memoised, as `cached_load` is, for files read together (what is
    derived across files, such as sessions that go on from one file to the next)."""
    key = [kind, bad_rows]
    for p in paths:
        try:
            st = Path(p).stat()
        except OSError:
            return loader(paths, bad_rows)
        key.append((str(Path(p).resolve()), st.st_size, st.st_mtime_ns))
    key = tuple(key)
    hit = _ROWS_CACHE.get(key)
    if hit is not None:
        _ROWS_CACHE.move_to_end(key)
        return hit
    value = loader(paths, bad_rows)
    _ROWS_CACHE[key] = value
    while len(_ROWS_CACHE) > ROWS_CACHE_SIZE:
        _ROWS_CACHE.popitem(last=False)
    return value


def clear_cache() -> None:
    """Forget the parsed tabular files kept by `cached_load` and `cached_load_many`."""
    _ROWS_CACHE.clear()


def reason_code(name: str) -> int:
    """Code stored in `Rows.reason` for a drop reason."""
    return DROP_REASONS.index(name) + 1


def token_reasons(input_tokens: np.ndarray, output_tokens: np.ndarray,
                  failed: np.ndarray | None = None) -> np.ndarray:
    """Per-row drop code for zero-token rows (and format-specific failures), in precedence order."""
    reason = np.zeros(len(input_tokens), dtype=np.int8)
    reason[input_tokens == 0] = reason_code(ZERO_IN)
    reason[output_tokens == 0] = reason_code(ZERO_OUT)
    if failed is not None:
        reason[failed] = reason_code(FAILED)
    return reason


class _RowOfFile(Where):
    """Where a usable row is, for prefix-identity errors: its file, its line (or row), the field."""

    def __init__(self, rows: Rows, at: np.ndarray, field: str) -> None:
        super().__init__(rows.paths[0].name)
        self.rows, self.at, self.field = rows, at, field

    def label(self, i: int) -> str:
        """``line N`` (or ``row N``) of the row's file, with the file's name when several were read."""
        j = int(self.at[i])
        text = f"{self.rows.unit} {int(self.rows.lines[j])}"
        if len(self.rows.paths) > 1:
            text += f" of {self.rows.paths[int(self.rows.file_index[j])].name}"
        return text

    def cell(self, i: int, col: str) -> str:
        """``<file>: line N: <field> '<col>'`` for usable row `i`."""
        j = int(self.at[i])
        return (f"{self.rows.paths[int(self.rows.file_index[j])].name}: {self.rows.unit} "
                f"{int(self.rows.lines[j])}: {self.field} '{col}'")


def check_rows_chain(rows: Rows, col: str = "hash_ids", field: str = "key") -> None:
    """The usable rows' block ids, over every file read, must form one consistent chain
    (`schedport.workload.tracecheck.check_hash_chain`); a contradiction is one `DataError`."""
    if rows.hash_ids is None:
        return
    at = np.flatnonzero(~rows.bad)
    chosen = rows.hash_ids[at]
    counts = np.fromiter((len(a) for a in chosen), dtype=np.int64, count=len(at))
    flat = np.concatenate([np.zeros(0, np.int64), *chosen])
    try:
        check_hash_chain(flat, counts, _RowOfFile(rows, at, field), col)
    except TraceError as exc:
        raise DataError(str(exc)) from None


def hash_rows(path: Path, cells, input_tokens: np.ndarray, bad: np.ndarray, lines: np.ndarray | None,
              block_size: int, col: str) -> np.ndarray:
    """Per-row block ids (an object array of int64 arrays) from a file's ``hash_ids@N`` cells,
    checked as `load_trace` checks them (bad rows get none); one `DataError` naming file, line
    (or row, `lines` None) and column otherwise."""
    cells = ["" if b else c for c, b in zip(list(cells), bad)]
    inp = np.where(bad, 0, np.asarray(input_tokens)).astype(np.int64)
    try:
        flat = hash_ids_from_cells(cells, inp, block_size, Where(Path(path).name, lines), col)
    except TraceError as exc:
        raise DataError(str(exc)) from None
    counts = -(-inp // int(block_size))
    return object_column(np.split(flat, np.cumsum(counts)[:-1]) if len(cells) else [])


def object_column(arrays: list) -> np.ndarray:
    """A 1-D object array holding `arrays` as they are (numpy would stack equal-length ones)."""
    out = np.empty(len(arrays), dtype=object)
    for k, a in enumerate(arrays):
        out[k] = a
    return out


def check_sorted(rows: Rows, what: str, kind: str = "column") -> None:
    """Time must not go backwards (over usable rows, across files): error names the offending line."""
    ok = ~rows.bad
    t = rows.time[ok]
    if len(t) < 2:
        return
    back = np.flatnonzero(np.diff(t) < 0)
    if len(back):
        j = np.flatnonzero(ok)[back[0] + 1]
        prev = np.flatnonzero(ok)[back[0]]
        path = rows.paths[rows.file_index[j]]
        raise fail(path, f"{rows.unit} {rows.lines[j]}",
                   f"{kind} {what!r}: time goes backwards ({_fmt_t(rows.time[j])} s after "
                   f"{_fmt_t(rows.time[prev])} s); the file must be sorted by time")


def _fmt_t(x: float) -> str:
    return f"{x:.7f}".rstrip("0").rstrip(".")


SELECTION_KEYS = ("start_s", "duration_s", "rows", "max_len", "bad_rows")


def check_selection(fmt: str, selection: dict, allowed: tuple[str, ...] = SELECTION_KEYS) -> dict:
    """Validate selection options; unknown names and impossible values are a `ConfigError`."""
    unknown = sorted(set(selection) - set(allowed))
    if unknown:
        raise ConfigError(f"{fmt}: unknown selection option(s) {', '.join(unknown)} "
                          f"(accepted: {', '.join(allowed)})")
    s = dict(selection)
    for k in ("start_s", "duration_s"):
        v = s.get(k)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                              or not math.isfinite(v) or v < 0):
            raise ConfigError(f"{fmt}: {k} must be a finite number >= 0, not {v!r}")
    if s.get("duration_s") is not None and s["duration_s"] <= 0:
        raise ConfigError(f"{fmt}: duration_s must be > 0, not {s['duration_s']!r}")
    for k in ("rows", "max_len"):
        v = s.get(k)
        if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"{fmt}: {k} must be an integer >= 1, not {v!r}")
    if s.get("rows") is not None and s.get("duration_s") is not None:
        raise ConfigError(f"{fmt}: give duration_s or rows, not both")
    s["bad_rows"] = check_bad_rows(s.get("bad_rows", "error"))
    return s


def select_window(rows: Rows, *, start_s: float | None = None, duration_s: float | None = None,
                  rows_n: int | None = None, max_len: int | None = None,
                  rebase_to_first: bool = True, reasons: tuple[str, ...] = (),
                  name: str = "trace") -> tuple[Trace, dict[str, int]]:
    """Cut the window out of validated, time-sorted rows and apply the drops.

    The window is the contiguous run of rows from the first usable row with time >= start_s
    (the first row when no start is given) up to, excluding, the first usable row with time
    >= start_s + duration_s, or up to the `rows_n`-th kept row. Drops are counted inside the
    window only. arrival_s is relative to start_s when given, else to the first kept row
    (`rebase_to_first`) or left in the file's own time base.
    """
    n = len(rows.time)
    usable = ~rows.bad
    pos = np.flatnonzero(usable)
    tv = rows.time[usable]
    i0 = 0
    if start_s is not None:
        k0 = int(np.searchsorted(tv, start_s, side="left"))
        i0 = int(pos[k0]) if k0 < len(pos) else n
    i1 = n
    if duration_s is not None:
        lo = 0.0 if start_s is None else start_s
        k1 = int(np.searchsorted(tv, lo + duration_s, side="left"))
        i1 = int(pos[k1]) if k1 < len(pos) else n
    i1 = max(i1, i0)
    code = np.where(rows.bad, reason_code(UNPARSABLE), rows.reason).astype(np.int8)
    if max_len is not None:
        over = (code == 0) & (rows.input_tokens + rows.output_tokens > max_len)
        code[over] = reason_code(OVER_MAX)
    if rows_n is not None:
        kept_pos = i0 + np.flatnonzero(code[i0:i1] == 0)
        if len(kept_pos) > rows_n:
            i1 = int(kept_pos[rows_n - 1]) + 1
    win = code[i0:i1]
    keep = np.flatnonzero(win == 0) + i0
    counts = np.bincount(win, minlength=len(DROP_REASONS) + 1)
    wanted = [UNPARSABLE, *reasons] + ([OVER_MAX] if max_len is not None else [])
    dropped = {r: int(counts[reason_code(r)]) for r in DROP_REASONS if r in wanted}
    t = rows.time[keep]
    if start_s is not None:
        t = t - start_s
    elif rebase_to_first and len(t):
        t = t - t[0]
    t = np.asarray(t, dtype=np.float64) + 0.0  # normalise -0.0
    clients = rows.client_id[keep] if rows.client_id is not None else None
    ids = None
    if rows.hash_ids is not None:
        ids = np.concatenate([np.zeros(0, np.int64), *rows.hash_ids[keep]]).astype(np.int64)
    trace = Trace(arrival_s=t, input_tokens=rows.input_tokens[keep].astype(np.int64),
                  output_tokens=rows.output_tokens[keep].astype(np.int64), client_id=clients,
                  name=name, hash_ids=ids, hash_block_size=None if ids is None else rows.hash_block_size)
    return trace, dropped


def trace_name(paths: list[Path]) -> str:
    """Default trace name: the first file's name without its extensions."""
    if not paths:
        return "trace"
    name = Path(paths[0]).name
    for ext in (".gz", ".csv", ".jsonl", ".json", ".parquet"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    return name


def read_all(paths, read_file, bad_rows: str) -> tuple["Rows", list[dict]]:
    """Read every file with the format's `read_file` and concatenate their rows in order."""
    parts, origin = [], []
    for p in paths:
        rows, org = read_file(Path(p), bad_rows)
        parts.append(rows)
        origin.append(org)
    return Rows.concat(parts), origin


def window_result(rows: "Rows", sel: dict, paths, origin: list[dict], *,
                  rebase_to_first: bool, reasons: tuple[str, ...]) -> AdapterResult:
    """Cut the selected window out of sorted rows and package it with its drop counts and origin."""
    trace, dropped = select_window(
        rows, start_s=sel.get("start_s"), duration_s=sel.get("duration_s"),
        rows_n=sel.get("rows"), max_len=sel.get("max_len"), rebase_to_first=rebase_to_first,
        reasons=reasons, name=trace_name(list(map(Path, paths))))
    timed = rows.time[~rows.bad]
    clock = (float(timed[0]), float(timed[-1])) if len(timed) else None
    return AdapterResult(trace=trace, dropped=dropped, skipped=[], origin=origin, clock=clock)
