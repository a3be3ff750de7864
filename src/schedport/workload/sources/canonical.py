"""The project's own canonical trace files (CSV or Parquet) -> canonical trace.

Columns: ``arrival_s`` (seconds from window start, non-decreasing), ``input_tokens``,
``output_tokens`` (integers >= 1) and optionally ``client_id`` (string; empty = none).
CSV has that header; Parquet is recognised by its ``PAR1`` magic. Columns are read by name;
extra columns are ignored. This reader is self-contained for now (pandas/pyarrow); the
project's `trace.load_trace` is meant to replace it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from schedport.workload.sources._common import (
    ZERO_IN, ZERO_OUT, AdapterResult, BadRows, cached_load, check_selection, check_sorted,
    decode_text, fail, header_found, origin_entry, parse_float_column, parse_int_column, parse_table,
    read_all, read_bytes, Rows, token_reasons, window_result,
)

REQUIRED = ("arrival_s", "input_tokens", "output_tokens")
DROP_REASONS = (ZERO_OUT, ZERO_IN)
PARQUET_MAGIC = b"PAR1"


def _columns_from_parquet(path: Path, data: bytes) -> tuple[dict[str, np.ndarray], np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not data.endswith(PARQUET_MAGIC) or len(data) < 12:
        raise fail(path, None, "truncated Parquet file (no footer)")
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise fail(path, None, f"unreadable Parquet file ({msg})") from None
    names = list(table.column_names)
    for c in REQUIRED:
        if c not in names:
            raise fail(path, None, f"missing column {c!r} ({header_found(names, REQUIRED)})")
    cols: dict[str, np.ndarray] = {}
    for c in REQUIRED:
        typ = table.schema.field(c).type
        if not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
            raise fail(path, None, f"column {c!r} has type {typ}, expected numbers")
        cols[c] = table.column(c).to_pandas().to_numpy(dtype=object)
    if "client_id" in names:
        cid = table.column("client_id").to_pandas().to_numpy(dtype=object)
        cols["client_id"] = np.array(["" if v is None or v is pd.NA or (isinstance(v, float) and v != v)
                                      else str(v) for v in cid], dtype=object)
    return cols, np.arange(1, table.num_rows + 1, dtype=np.int64)


def _parse(cols_holder, bad: BadRows):
    cols = cols_holder.columns if hasattr(cols_holder, "columns") else cols_holder
    t = parse_float_column(cols["arrival_s"], "arrival_s", bad)
    bad.add(np.nan_to_num(t, nan=0.0) < 0,
            lambda i: f"column 'arrival_s': {cols['arrival_s'][i]!r} is negative")
    inp = parse_int_column(cols["input_tokens"], "input_tokens", bad)
    out = parse_int_column(cols["output_tokens"], "output_tokens", bad)
    client = None
    if "client_id" in cols:
        raw = pd.Series(cols["client_id"], dtype=object).astype(str).str.strip().to_numpy()
        client = np.where(raw == "", None, raw).astype(object)
    return t, inp, out, client


def _load_file(path: Path, bad_rows: str) -> tuple[Rows, dict]:
    data = read_bytes(path)
    if data.startswith(PARQUET_MAGIC):
        cols, lines = _columns_from_parquet(path, data)
        unit = "row"
        bad = BadRows(path, lines, bad_rows, unit=unit)
        t, inp, out, client = _parse(cols, bad)
        mask = bad.finish()
    else:
        unit = "line"
        (t, inp, out, client), mask, table = parse_table(
            path, decode_text(path, data), list(REQUIRED), REQUIRED, _parse, bad_rows,
            optional=("client_id",))
        lines = table.lines
    rows = Rows(time=np.where(mask, np.nan, t), input_tokens=inp, output_tokens=out,
                client_id=client, bad=mask, reason=token_reasons(inp, out),
                file_index=np.zeros(len(t), np.int64), lines=lines, paths=[path], unit=unit)
    return rows, origin_entry(path, data)


def _read_file(path: Path, bad_rows: str) -> tuple[Rows, dict]:
    return cached_load("canonical", path, bad_rows, _load_file)


def read(paths: list[Path], **selection) -> AdapterResult:
    """Read canonical CSV/Parquet file(s) (concatenated in the order given) into a window.

    Selection (all optional): ``start_s``/``duration_s`` on the file's own ``arrival_s``
    axis, or ``rows`` = the first N kept rows from ``start_s``; ``max_len`` and
    ``bad_rows="drop"`` as for the other adapters. Rows with zero tokens are dropped with a
    count. arrival_s is kept as in the file unless ``start_s`` is given (then it is
    relative to ``start_s``).
    """
    sel = check_selection("canonical", selection)
    rows, origin = read_all(paths, _read_file, sel["bad_rows"])
    check_sorted(rows, "arrival_s")
    return window_result(rows, sel, paths, origin, rebase_to_first=False,
                         reasons=DROP_REASONS)
