"""The checks every canonical trace passes, cell by cell, whatever it is read from.

A column is parsed to float64 (`NumericColumn`, NaN where a cell is not a number) and then
checked (`check_required`): arrival times finite, >= 0 and <= `MAX_ARRIVAL_S`, non-decreasing;
token counts integers in [1, `MAX_TOKENS`]. The first bad cell is reported as one line naming the
source, the line or row (`Where`) and the column, with why it is refused (`why_bad`). Client ids
(`clients_from_any`) and a file's header (`check_header`) are checked here too.
Warm-up (`warmup_from_cells`): an optional column ``warmup`` marks the leading requests a window
replays before its measured ones, to warm the engine's caches (docs/corpus.md, "Warm caches").
Prefix identity (`hash_ids_from_cells`, `check_hash_chain`): an optional column named
``hash_ids@<block size>`` gives each request one id per block of that many prompt tokens,
chained (an equal id names an equal whole prefix up to and including that block).
`schedport.workload.trace` builds every `Trace` through these checks.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from schedport.errors import TraceError

COLUMNS = ("arrival_s", "input_tokens", "output_tokens", "client_id")
REQUIRED = ("arrival_s", "input_tokens", "output_tokens")

#: Largest token count accepted for one request. Far above any real model context; it
#: keeps every value exactly representable and safe from overflow in downstream sums.
MAX_TOKENS = 2**31 - 1

#: Latest arrival accepted, in seconds (about 136 years; Unix timestamps fit). Up to here a
#: float64 number of seconds still resolves a microsecond, so the engine's clock can add a
#: millisecond step to an arrival without losing it to rounding.
MAX_ARRIVAL_S = float(2**32)


#: The optional warm-up column: 1 (true) for a request replayed before the window to warm the
#: engine's caches and never measured, 0 (false) for a measured one; the warm-up requests come first.
WARMUP = "warmup"

#: The optional prefix-identity column: ``hash_ids@<block size>``, e.g. ``hash_ids@512``.
HASH_PREFIX = "hash_ids"
_HASH_NAME_RE = re.compile(r"^hash_ids@([1-9][0-9]{0,8})$")

#: Largest block id accepted (ids are stored as int64).
MAX_HASH_ID = 2**63 - 1


#: The header a canonical CSV has, as error messages state it.
EXPECTED_HEADER = "arrival_s,input_tokens,output_tokens[,client_id]"


class Where:
    """Where a row lives, for error messages: `line N` (CSV) or `row N` (1-based)."""

    def __init__(self, source: str, lines: np.ndarray | None = None) -> None:
        self.source = source
        self.lines = lines

    def label(self, i: int) -> str:
        """Where record `i` (0-based) is: ``line N`` of a CSV file, else ``row N`` (1-based)."""
        if self.lines is not None:
            return f"line {int(self.lines[i])}"
        return f"row {i + 1}"

    def cell(self, i: int, col: str) -> str:
        """The message prefix naming the source, record `i` and column `col`."""
        return f"{self.source}: {self.label(i)}: column '{col}'"


class NumericColumn:
    """A required column parsed to float64 (NaN where unparseable/missing).

    `raw_at(i)` returns the original cell for error messages (str, None, or a number).
    """

    def __init__(self, values: np.ndarray, raw_at: Callable[[int], Any]) -> None:
        self.values = values
        self.raw_at = raw_at


def show_cell(raw: Any) -> str:
    """A cell as it appears in messages: quoted, one line, not too long."""
    text = raw if isinstance(raw, str) else str(raw)
    if len(text) > 40:
        text = text[:37] + "..."
    return repr(text)


def is_null(raw: Any) -> bool:
    """Is the cell a null (None, pandas' NA or NaT), as opposed to an empty or bad value?"""
    if raw is None:
        return True
    try:
        import pandas as pd

        return raw is pd.NA or raw is pd.NaT
    except ImportError:  # pragma: no cover - pandas is a dependency
        return False


def bad_mask(col: str, vals: np.ndarray) -> np.ndarray:
    """True where a parsed value is not acceptable for `col` (NaN counts as bad)."""
    with np.errstate(invalid="ignore"):
        if col == "arrival_s":
            ok = np.isfinite(vals) & (vals >= 0) & (vals <= MAX_ARRIVAL_S)
        else:
            ok = np.isfinite(vals) & (vals >= 1) & (vals <= MAX_TOKENS) & (np.floor(vals) == vals)
    return ~ok


def why_bad(col: str, value: float, raw: Any) -> str:
    """Why the cell `raw` (parsed as `value`) is not acceptable, as a message tail."""
    integer = col != "arrival_s"
    kind = "an integer" if integer else "a number"
    if is_null(raw):
        return "missing value (null); a value is required"
    if isinstance(raw, str):
        stripped = raw.strip()
        if stripped == "":
            return "empty cell; a value is required"
        if np.isnan(value):
            if stripped.lower().lstrip("+-") == "nan":
                return f"{show_cell(raw)} is not a number (NaN)"
            return f"{show_cell(raw)} is not {kind}"
    elif np.isnan(value):
        return f"{show_cell(raw)} is not a number (NaN)"
    if np.isinf(value):
        return f"{show_cell(raw)} is infinite"
    if integer:
        if value != np.floor(value):
            return f"{show_cell(raw)} is not an integer"
        if value == 0:
            return f"{show_cell(raw)} is zero; token counts must be >= 1"
        if value < 0:
            return f"{show_cell(raw)} is negative; token counts must be >= 1"
        return f"{show_cell(raw)} is too large; token counts must be <= {MAX_TOKENS}"
    if value > MAX_ARRIVAL_S:
        return (f"{show_cell(raw)} is too large; arrival times must be <= {MAX_ARRIVAL_S:.0f} s (2^32), "
                f"where the clock still resolves a microsecond")
    return f"{show_cell(raw)} is negative; arrival times must be >= 0"


def numeric_from_strings(obj: np.ndarray) -> np.ndarray:
    """Parse an object array of str (or mixed objects) to float64, NaN where impossible."""
    import pandas as pd

    parsed = pd.to_numeric(pd.Series(obj, dtype=object, copy=False), errors="coerce")
    return np.asarray(parsed, dtype=np.float64)


def numeric_from_any(col: str, arr: np.ndarray, where: Where) -> NumericColumn:
    """Turn one in-memory column (numeric, string or object array) into `NumericColumn`."""
    kind = arr.dtype.kind
    if kind in "iuf":
        values = arr.astype(np.float64)
        return NumericColumn(values, lambda i: arr[i].item())
    if kind in "OUS":
        obj = arr.astype(object) if kind != "O" else arr
        if kind == "S":
            obj = np.array([b.decode("utf-8", "replace") for b in arr.tolist()], dtype=object)
        return NumericColumn(numeric_from_strings(obj), lambda i: obj[i])
    raise TraceError(f"{where.source}: column '{col}': expected numbers, got values of "
                     f"type {arr.dtype}")


def check_required(numeric: dict[str, NumericColumn], where: Where) -> None:
    """Raise for the first bad cell; columns in order arrival_s, input_tokens, output_tokens."""
    for col in REQUIRED:
        num = numeric[col]
        bad = bad_mask(col, num.values)
        if bad.any():
            i = int(np.argmax(bad))
            raise TraceError(f"{where.cell(i, col)}: {why_bad(col, num.values[i], num.raw_at(i))}")
        if col == "arrival_s" and num.values.size > 1:
            back = np.diff(num.values) < 0
            if back.any():
                i = int(np.argmax(back)) + 1
                raise TraceError(
                    f"{where.cell(i, col)}: {show_cell(num.raw_at(i))} is earlier than the "
                    f"previous arrival {show_cell(num.raw_at(i - 1))} ({where.label(i - 1)}); "
                    "arrival times must be non-decreasing")


def clients_from_any(values: Any, where: Where) -> np.ndarray:
    """client_id cells -> object array of str/None ("" and null mean no client)."""
    seq = values.tolist() if isinstance(values, np.ndarray) else list(values)
    out = np.empty(len(seq), dtype=object)
    for i, x in enumerate(seq):
        if isinstance(x, str):
            if x == "":
                out[i] = None
                continue
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                raise TraceError(f"{where.cell(i, 'client_id')}: {show_cell(x)} is not valid "
                                 "Unicode text (cannot be stored as UTF-8)") from None
            out[i] = str(x)
        elif x is None or is_null(x) or (isinstance(x, float) and x != x):
            out[i] = None
        elif isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
            out[i] = str(int(x))
        else:
            raise TraceError(f"{where.cell(i, 'client_id')}: {show_cell(x)} is not a string "
                             f"(got {type(x).__name__})")
    return out


def clients_from_strings(obj: np.ndarray) -> np.ndarray:
    """Fast path for an object array that holds only str: "" becomes None."""
    out = np.array(obj, dtype=object, copy=True)
    out[out == ""] = None
    return out


def check_header(names: Sequence[str], src: str, prefix: str) -> None:
    """Duplicate, unknown (with a did-you-mean hint) or missing columns -> TraceError."""
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise TraceError(f"{src}: {prefix}column '{n}' appears more than once")
        seen.add(n)
    allowed = ", ".join(COLUMNS) + f", {WARMUP}, {HASH_PREFIX}@<block size>"
    hashed = [n for n in names if hash_block_size_of(n) is not None]
    if len(hashed) > 1:
        raise TraceError(f"{src}: {prefix}columns '{hashed[0]}' and '{hashed[1]}': a trace has one "
                         "hash_ids column (one block size)")
    for n in names:
        if n.startswith(HASH_PREFIX) and hash_block_size_of(n) is None:
            raise TraceError(f"{src}: {prefix}column '{n}': the prefix-identity column is named "
                             f"'{HASH_PREFIX}@<block size>' with the block size in tokens, e.g. "
                             f"'{HASH_PREFIX}@512'")
        if n not in COLUMNS and n not in hashed and n != WARMUP:
            if n.strip() == "":
                what = "an empty column name (a stray comma?)"
            else:
                close = difflib.get_close_matches(n.strip(), (*COLUMNS, WARMUP), n=1, cutoff=0.6)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                what = f"unknown column '{n}'{hint}"
            raise TraceError(f"{src}: {prefix}{what}; allowed columns are {allowed}")
    for c in REQUIRED:
        if c not in seen:
            raise TraceError(f"{src}: {prefix}missing required column '{c}'; expected "
                             f"header {EXPECTED_HEADER}")


# ===================================================================== warm-up


_TRUE = {"1", "true"}
_FALSE = {"0", "false"}


def _warmup_flag(x: Any) -> bool | None:
    """A `warmup` cell as a bool: 0/1, a boolean, or (text) '0', '1', 'true', 'false' in any case;
    None when it is none of these."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return bool(x) if x in (0, 1) else None
    if isinstance(x, str):
        t = x.strip().lower()
        return True if t in _TRUE else (False if t in _FALSE else None)
    return None


def warmup_from_cells(cells: Any, where: Where) -> int:
    """The number of leading warm-up requests a ``warmup`` column gives (0 when none is true).

    Every cell is 0 or 1 (a boolean, or the text '0', '1', 'true', 'false'); the warm-up requests
    (1) come before every measured one (0), and at least one request is measured. The first fault
    is one `TraceError` naming the source, the line or row and the column.
    """
    seq = cells.tolist() if isinstance(cells, np.ndarray) else list(cells)
    count = 0
    for i, x in enumerate(seq):
        flag = _warmup_flag(x)
        if flag is None:
            raise TraceError(f"{where.cell(i, WARMUP)}: {show_cell(x)} is not 0 or 1 (true or false)")
        if flag and count < i:
            raise TraceError(f"{where.cell(i, WARMUP)}: a warm-up request after a measured one "
                             f"({where.label(count)}); the warm-up requests come first")
        count += flag
    if seq and count == len(seq):
        raise TraceError(f"{where.source}: column '{WARMUP}': every request is a warm-up request; a trace "
                         "needs at least one measured request")
    return count


# ===================================================================== prefix identity


def hash_column(block_size: int) -> str:
    """The column name that carries block ids of `block_size` tokens: ``hash_ids@<block_size>``."""
    return f"{HASH_PREFIX}@{int(block_size)}"


def hash_block_size_of(name: str) -> int | None:
    """The block size a column name ``hash_ids@N`` states, or None if it is not such a name."""
    m = _HASH_NAME_RE.match(name)
    return int(m.group(1)) if m else None


def hash_counts(input_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """Ids each request has: ceil(input_tokens / block_size) (a partial last block has an id)."""
    inp = np.asarray(input_tokens, dtype=np.int64)
    return -(-inp // int(block_size))


def _ids_of_cell(cell: Any, where: Where, i: int, col: str) -> np.ndarray:
    """One request's ids: a list/tuple/array of non-negative integers, or (CSV) ids separated by
    spaces. Anything else is one line naming where and why."""
    if isinstance(cell, str):
        items: list[Any] = cell.split()
        for k, x in enumerate(items):
            if not (x.isascii() and x.isdigit()) or int(x) > MAX_HASH_ID:
                raise TraceError(f"{where.cell(i, col)}: element {k + 1} {show_cell(x)} is not a "
                                 f"non-negative integer (at most {MAX_HASH_ID})")
        return np.array([int(x) for x in items], dtype=np.int64)
    if isinstance(cell, np.ndarray):
        cell = cell.tolist()
    if not isinstance(cell, (list, tuple)):
        got = "null" if is_null(cell) else type(cell).__name__
        raise TraceError(f"{where.cell(i, col)}: {show_cell(cell)} is not a list of block ids (got {got})")
    for k, x in enumerate(cell):
        if (not isinstance(x, (int, np.integer)) or isinstance(x, (bool, np.bool_))
                or x < 0 or x > MAX_HASH_ID):
            raise TraceError(f"{where.cell(i, col)}: element {k + 1} {show_cell(x)} is not a "
                             f"non-negative integer (at most {MAX_HASH_ID})")
    return np.array(cell, dtype=np.int64)


def hash_ids_from_cells(cells: Any, input_tokens: np.ndarray, block_size: int, where: Where,
                        col: str | None = None) -> np.ndarray:
    """Check every request's block ids and return them concatenated (int64, request order).

    Request i must have exactly ceil(input_tokens[i] / block_size) ids, each a non-negative
    integer, and the ids must form a consistent chain (`check_hash_chain`). The first fault is
    one `TraceError` naming the source, the line or row and the column (`col`, by default
    ``hash_ids@<block size>``).
    """
    bs = int(block_size)
    col = col or hash_column(bs)
    cells = cells.tolist() if isinstance(cells, np.ndarray) and cells.dtype != object else list(cells)
    need = hash_counts(input_tokens, bs)
    if len(cells) != len(need):
        raise TraceError(f"{where.source}: column '{col}' has {len(cells)} entries for {len(need)} requests")
    parts = []
    for i, cell in enumerate(cells):
        ids = _ids_of_cell(cell, where, i, col)
        if len(ids) != need[i]:
            raise TraceError(f"{where.cell(i, col)}: {len(ids)} ids for {int(input_tokens[i])} input tokens; "
                             f"expected ceil({int(input_tokens[i])} / {bs}) = {int(need[i])}")
        parts.append(ids)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    check_hash_chain(flat, need, where, col)
    return flat


def check_hash_chain(flat: np.ndarray, counts: np.ndarray, where: Where, col: str) -> None:
    """Refuse a chain that contradicts itself: an id must always stand at the same block position
    and after the same parent id (or always first), since it names the whole prefix up to its block.

    The first request (in order) that breaks this is named, with the request where the id was
    first seen.
    """
    n = len(flat)
    if n == 0:
        return
    counts = np.asarray(counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    row = np.repeat(np.arange(len(counts)), counts)
    pos = np.arange(n) - starts[row]
    parent = np.full(n, -1, dtype=np.int64)
    parent[1:] = flat[:-1]
    parent[pos == 0] = -1
    _, first, inv = np.unique(flat, return_index=True, return_inverse=True)
    f = first[inv.reshape(-1)]
    bad = (pos != pos[f]) | (parent != parent[f])
    if not bad.any():
        return
    k = int(np.argmax(bad))
    j = int(f[k])
    there = where.label(int(row[j]))
    if pos[k] != pos[j]:
        why = f"is block {int(pos[k]) + 1} here but block {int(pos[j]) + 1} on {there}"
    else:
        def after(p: int) -> str:
            return "the start" if p < 0 else f"id {p}"
        why = f"follows {after(int(parent[k]))} here but {after(int(parent[j]))} on {there}"
    raise TraceError(f"{where.cell(int(row[k]), col)}: id {int(flat[k])} {why}; an id names the whole "
                     "prefix up to its block, so it cannot change place or parent")
