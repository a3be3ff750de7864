"""The project's own canonical trace files (CSV or Parquet) -> canonical trace.

Columns: ``arrival_s`` (seconds from window start, non-decreasing), ``input_tokens``,
``output_tokens`` (integers >= 1) and optionally ``client_id`` (string; empty = none) and the
prefix identity ``hash_ids@<block size>`` (kept, and checked as `load_trace` checks it: a bad
id list is an error whatever ``bad_rows`` says; files read together must agree on having it and
on its block size). CSV has that header; Parquet is recognised by its ``PAR1`` magic. Columns are
read by name; extra columns are ignored. This reader is self-contained for now (pandas/pyarrow); the
project's `trace.load_trace` is meant to replace it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from schedport.errors import DataError
from schedport.workload.sources._common import (
    ZERO_IN, ZERO_OUT, AdapterResult, BadRows, cached_load, check_rows_chain, check_selection, check_sorted,
    decode_text, fail, hash_rows, header_found, object_column, origin_entry, parse_float_column, parse_int_column,
    parse_table, read_all, read_bytes, Rows, token_reasons, window_result,
)
from schedport.workload.tracecheck import hash_block_size_of

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
    hcol = _hash_column(names)
    if hcol is not None:
        cols[hcol] = object_column(table.column(hcol).to_pylist())
    if "client_id" in names:
        cid = table.column("client_id").to_pandas().to_numpy(dtype=object)
        cols["client_id"] = np.array(["" if v is None or v is pd.NA or (isinstance(v, float) and v != v)
                                      else str(v) for v in cid], dtype=object)
    return cols, np.arange(1, table.num_rows + 1, dtype=np.int64)


def _hash_column(names) -> str | None:
    """The file's ``hash_ids@N`` column, if it has one."""
    return next((c for c in (str(n).strip() for n in names) if hash_block_size_of(c) is not None), None)


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
        hcol = _hash_column(cols)
        cells = cols.get(hcol)
    else:
        unit = "line"
        text = decode_text(path, data)
        hcol = _hash_column(text.split("\n", 1)[0].rstrip("\r").split(","))
        (t, inp, out, client), mask, table = parse_table(
            path, text, list(REQUIRED), REQUIRED, _parse, bad_rows,
            optional=("client_id",) + ((hcol,) if hcol else ()))
        lines = table.lines
        cells = table.columns.get(hcol) if hcol else None
    ids = bs = None
    if hcol is not None:
        bs = hash_block_size_of(hcol)
        ids = hash_rows(path, cells, inp, mask, lines if unit == "line" else None, bs, hcol)
    rows = Rows(time=np.where(mask, np.nan, t), input_tokens=inp, output_tokens=out,
                client_id=client, bad=mask, reason=token_reasons(inp, out),
                file_index=np.zeros(len(t), np.int64), lines=lines, paths=[path], unit=unit,
                hash_ids=ids, hash_block_size=bs)
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
    sizes = [_read_file(Path(p), sel["bad_rows"])[0].hash_block_size for p in paths]
    if len(set(sizes)) > 1:
        k = next(i for i, b in enumerate(sizes) if b != sizes[0])
        said = lambda b: "no hash_ids column" if b is None else f"hash_ids@{b}"  # noqa: E731
        raise DataError(f"{Path(paths[k]).name}: has {said(sizes[k])} but {Path(paths[0]).name} has "
                        f"{said(sizes[0])}; files read together must carry the same prefix identity")
    rows, origin = read_all(paths, _read_file, sel["bad_rows"])
    check_sorted(rows, "arrival_s")
    check_rows_chain(rows, f"hash_ids@{sizes[0]}", "column")
    return window_result(rows, sel, paths, origin, rebase_to_first=False,
                         reasons=DROP_REASONS)
