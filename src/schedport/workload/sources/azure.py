"""Azure LLM inference traces -> canonical trace.

Data: Azure LLM inference trace 2023 (github.com/Azure/AzurePublicDataset, CC-BY 4.0),
published with Patel et al., "Splitwise: Efficient generative LLM inference using phase
splitting", ISCA 2024. The 2024 week-long files share the schema.

Schema: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps like
``2023-11-16 18:15:46.6805900`` (seven fractional digits, i.e. 100 ns resolution).
Timestamps are parsed exactly to integer nanoseconds (vectorised) and turned into seconds
relative to the file start (the first row's timestamp) by integer subtraction, so no
precision is lost to large epoch values.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from schedport.workload.sources._common import (
    ZERO_IN, ZERO_OUT, AdapterResult, BadRows, cached_load, check_selection, check_sorted,
    decode_text, origin_entry, parse_int_column, parse_table, read_bytes, Rows, token_reasons,
    window_result,
)

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
DROP_REASONS = (ZERO_OUT, ZERO_IN)
_FORMATS = ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S")


def parse_timestamps(values: np.ndarray, bad: BadRows, column: str = "TIMESTAMP") -> np.ndarray:
    """Azure timestamp strings -> int64 nanoseconds since the epoch (exact; bad rows marked).

    Accepts ``YYYY-MM-DD HH:MM:SS`` with an optional fraction of up to nine digits, as the
    2023 and 2024 files write it; anything else (a time zone, a 'T', garbage) is malformed.
    """
    s = pd.Series(values, dtype=object).astype(str).str.strip()
    out = pd.Series(pd.NaT, index=s.index, dtype="datetime64[ns]")
    todo = np.ones(len(s), dtype=bool)
    for fmt in _FORMATS:
        if not todo.any():
            break
        parsed = pd.to_datetime(s[todo], format=fmt, errors="coerce")
        out[todo] = parsed.astype("datetime64[ns]")
        todo = out.isna().to_numpy()
    nat = out.isna().to_numpy()
    bad.add(nat, lambda i: (f"column {column!r}: missing value" if str(values[i]).strip() == ""
                            else f"column {column!r}: {str(values[i])!r} is not a timestamp "
                                 f"like '2023-11-16 18:15:46.6805900'"))
    ns = out.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    ns[nat] = 0
    return ns


def _parse(table, bad: BadRows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ns = parse_timestamps(table.columns["TIMESTAMP"], bad)
    inp = parse_int_column(table.columns["ContextTokens"], "ContextTokens", bad)
    out = parse_int_column(table.columns["GeneratedTokens"], "GeneratedTokens", bad)
    return ns, inp, out


def _load_file(path: Path, bad_rows: str) -> tuple[np.ndarray, Rows, dict]:
    data = read_bytes(path)
    (ns, inp, out), mask, table = parse_table(
        path, decode_text(path, data), list(COLUMNS), ("ContextTokens", "GeneratedTokens"),
        _parse, bad_rows)
    rows = Rows(time=np.zeros(len(ns)), input_tokens=inp, output_tokens=out, client_id=None,
                bad=mask, reason=token_reasons(inp, out), file_index=np.zeros(len(ns), np.int64),
                lines=table.lines, paths=[path])
    return ns, rows, origin_entry(path, data)


def _read_file(path: Path, bad_rows: str) -> tuple[np.ndarray, Rows, dict]:
    return cached_load("azure", path, bad_rows, _load_file)


def read(paths: list[Path], *, client_id: str | None = None, **selection) -> AdapterResult:
    """Read one or more Azure trace CSVs (concatenated in the order given) into a window.

    Selection (all optional): ``start_s``/``duration_s`` in seconds from the file start (the
    first row's timestamp), or ``rows`` = the first N kept rows from ``start_s``;
    ``max_len`` drops rows whose input + output exceeds it; ``bad_rows="drop"`` counts
    malformed rows as ``unparsable_row`` instead of failing. ``client_id`` labels every
    request (e.g. "azure-conv"); the files themselves carry none.
    Rows with zero context or generated tokens are dropped with a count, never repaired.
    arrival_s is relative to ``start_s`` when given, else to the first kept row.
    """
    sel = check_selection("azure", selection)
    parts, origin, stamps = [], [], []
    for p in paths:
        ns, rows, org = _read_file(Path(p), sel["bad_rows"])
        parts.append(rows)
        origin.append(org)
        stamps.append(ns)
    rows = Rows.concat(parts)
    ns = np.concatenate(stamps)
    usable = ~rows.bad
    if usable.any():
        time = np.where(usable, (ns - ns[usable][0]) / 1e9, np.nan)
    else:
        time = np.full(len(ns), np.nan)
    labels = None if client_id is None else np.full(len(ns), client_id, dtype=object)
    rows = replace(rows, time=time, client_id=labels)  # cached per-file rows stay untouched
    check_sorted(rows, "TIMESTAMP")
    return window_result(rows, sel, paths, origin, rebase_to_first=True,
                         reasons=DROP_REASONS)
