"""Columns between NumPy and Arrow without pandas.

pyarrow imports pandas (about half of a simulation's start-up) the first time `pyarrow.array`
or `Array.to_numpy` runs, to ask whether its argument is a pandas object. These build Arrow
arrays from their buffers and read NumPy arrays out of them, which asks nothing of pandas,
so a simulation can read its trace and write its ``requests.parquet`` without importing it.
Each returns None for what it does not cover; the caller then takes pyarrow's (or pandas')
own path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Arrow's 32-bit string offsets: a column of more text bytes than this is left to pyarrow.
_MAX_STRING_BYTES = 2**31 - 1


def numpy_of(column: Any, dtype: Any) -> np.ndarray | None:
    """The values of a numeric Arrow (chunked) array of `dtype`'s width as a new NumPy array,
    NaN where null for floats; None for an integer column with nulls or another width."""
    dtype = np.dtype(dtype)
    chunks = column.chunks if hasattr(column, "chunks") else [column]
    parts = []
    for ch in chunks:
        try:
            if ch.type.bit_width != 8 * dtype.itemsize:
                return None
        except ValueError:  # a type without a fixed width (text, null)
            return None
        validity, data = ch.buffers()[:2]
        vals = np.frombuffer(data, dtype=dtype, count=ch.offset + len(ch))[ch.offset:] if len(ch) else \
            np.zeros(0, dtype)
        if ch.null_count:
            if dtype.kind != "f":
                return None
            bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
            vals = np.where(bits[ch.offset:ch.offset + len(ch)].astype(bool), vals, np.nan)
        parts.append(vals)
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def arrow_of(values: np.ndarray) -> Any:
    """The Arrow array `pyarrow.array(values, from_pandas=True)` gives for a 1-D float64, int64
    or object (str or None) array: NaN as null, an object column of None alone of the null
    type, one of text a string column; None for any other array."""
    import pyarrow as pa

    if values.ndim != 1:
        return None
    n = len(values)
    if values.dtype == np.float64:
        nan = np.isnan(values)
        nulls = int(np.count_nonzero(nan))
        validity = pa.py_buffer(np.packbits(~nan, bitorder="little")) if nulls else None
        return pa.Array.from_buffers(pa.float64(), n, [validity, pa.py_buffer(np.ascontiguousarray(values))],
                                     null_count=nulls)
    if values.dtype == np.int64:
        return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(np.ascontiguousarray(values))],
                                     null_count=0)
    if values.dtype != object:
        return None
    items = values.tolist()
    if not all(v is None or type(v) is str for v in items):
        return None
    valid = np.fromiter((v is not None for v in items), dtype=bool, count=n)
    nulls = n - int(np.count_nonzero(valid))
    if nulls == n:
        return pa.nulls(n)
    try:
        encoded = [v.encode("utf-8") if v is not None else b"" for v in items]
    except UnicodeEncodeError:  # a lone surrogate: pyarrow's own error
        return None
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=n), out=offsets[1:])
    if offsets[-1] > _MAX_STRING_BYTES:
        return None
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(pa.string(), n, [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                  pa.py_buffer(b"".join(encoded))], null_count=nulls)
