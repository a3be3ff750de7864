"""The checks every canonical trace passes, cell by cell, whatever it is read from.

A column is parsed to float64 (`NumericColumn`, NaN where a cell is not a number) and then
checked (`check_required`): arrival times finite, >= 0 and <= `MAX_ARRIVAL_S`, non-decreasing;
token counts integers in [1, `MAX_TOKENS`]. The first bad cell is reported as one line naming the
source, the line or row (`Where`) and the column, with why it is refused (`why_bad`). Client ids
(`clients_from_any`) and a file's header (`check_header`) are checked here too.
`schedport.workload.trace` builds every `Trace` through these checks.
"""

from __future__ import annotations

import difflib
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
    allowed = ", ".join(COLUMNS)
    for n in names:
        if n not in COLUMNS:
            if n.strip() == "":
                what = "an empty column name (a stray comma?)"
            else:
                close = difflib.get_close_matches(n.strip(), COLUMNS, n=1, cutoff=0.6)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                what = f"unknown column '{n}'{hint}"
            raise TraceError(f"{src}: {prefix}{what}; allowed columns are {allowed}")
    for c in REQUIRED:
        if c not in seen:
            raise TraceError(f"{src}: {prefix}missing required column '{c}'; expected "
                             f"header {EXPECTED_HEADER}")
