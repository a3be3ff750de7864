"""Mooncake-style JSONL -> canonical trace.

Format of the Mooncake traces (github.com/kvcache-ai/Mooncake, FAST'25 release; Qin et al.,
"Mooncake: A KVCache-centric Disaggregated Architecture for LLM Serving", FAST 2025) and of
any user's own trace in the same shape: one JSON object per line,
``{"timestamp": <ms>, "input_length": <int>, "output_length": <int>, ...}``; other keys
(``hash_ids``, ...) are ignored (the ``mooncake`` adapter keeps ``hash_ids``). arrival_s = (timestamp - first
timestamp) / 1000.
The file may be gzip-compressed.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from schedport.common.values import is_int
from schedport.workload.sources._common import (
    ZERO_IN, ZERO_OUT, AdapterResult, cached_load, check_selection, check_sorted, decode_text,
    fail, origin_entry, read_all, read_bytes, Rows, token_reasons, window_result,
)

KEYS = ("timestamp", "input_length", "output_length")
DROP_REASONS = (ZERO_OUT, ZERO_IN)


def check_record(obj) -> str | None:
    """Return why a decoded line is unusable, or None."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, found {type(obj).__name__}"
    for k in KEYS:
        if k not in obj:
            return f"missing key {k!r}"
    ts = obj["timestamp"]
    if not (isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts)):
        return f"key 'timestamp': {ts!r} is not a finite number"
    for k in ("input_length", "output_length"):
        v = obj[k]
        if not is_int(v):
            return f"key {k!r}: {v!r} is not an integer"
        if v < 0:
            return f"key {k!r}: {v!r} is negative"
        if v >= 2**53:
            return f"key {k!r}: {v!r} is implausibly large"
    return None


def _read_file(path: Path, bad_rows: str) -> tuple[Rows, dict]:
    return cached_load("jsonl", path, bad_rows, _load_file)


def parse_lines(path: Path, bad_rows: str, extra_check=None) -> tuple[bytes, list[int], list[dict | None]]:
    """A JSONL file's raw bytes, the number of each non-blank line and its record (None where the
    line is unusable and `bad_rows` is "drop"). A record passes `check_record` and, when given,
    `extra_check` (a record's problem in one line, or None); with `bad_rows` "error" the first
    problem is a one-line error naming file and line. Shared by the JSONL adapters."""
    data = read_bytes(path)
    text = decode_text(path, data)
    lines: list[int] = []
    records: list[dict | None] = []
    # Split on "\n" only: str.splitlines() would also split inside strings at U+2028 etc.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            why = check_record(obj)
            if why is None and extra_check is not None:
                why = extra_check(obj)
        except json.JSONDecodeError as exc:
            why = f"bad JSON ({exc.msg} at column {exc.colno})"
        except RecursionError:
            why = "bad JSON (nested too deeply)"
        lines.append(lineno)
        if why is not None:
            if bad_rows == "error":
                raise fail(path, f"line {lineno}", why)
            obj = None
        records.append(obj)
    return data, lines, records


def record_rows(path: Path, lines: list[int], records: list[dict | None], **extra) -> Rows:
    """The `Rows` of parsed records (an unusable one is a bad row of no tokens); `extra` adds
    columns such as the block ids."""
    ok = [r is not None for r in records]
    ts = np.asarray([float(r["timestamp"]) if r is not None else math.nan for r in records], dtype=np.float64)
    inp = np.asarray([r["input_length"] if r is not None else 0 for r in records], dtype=np.int64)
    out = np.asarray([r["output_length"] if r is not None else 0 for r in records], dtype=np.int64)
    return Rows(time=ts, input_tokens=inp, output_tokens=out, client_id=None, bad=~np.asarray(ok, dtype=bool),
                reason=token_reasons(inp, out), file_index=np.zeros(len(records), np.int64),
                lines=np.asarray(lines, dtype=np.int64), paths=[path], **extra)


def _load_file(path: Path, bad_rows: str) -> tuple[Rows, dict]:
    data, lines, records = parse_lines(path, bad_rows)
    return record_rows(path, lines, records), origin_entry(path, data)


def read(paths: list[Path], **selection) -> AdapterResult:
    """Read Mooncake-style JSONL file(s) (concatenated in the order given) into a window.

    Selection (all optional): ``start_s``/``duration_s`` in seconds from the first record's
    timestamp, or ``rows`` = the first N kept records from ``start_s``; ``max_len`` drops
    records whose input + output exceeds it; ``bad_rows="drop"`` counts malformed lines as
    ``unparsable_row`` instead of failing. Zero-length inputs/outputs are dropped with a count.
    Timestamps must not go backwards. arrival_s is relative to ``start_s`` when given, else
    to the first kept record.
    """
    sel = check_selection("jsonl", selection)
    rows, origin = read_all(paths, _read_file, sel["bad_rows"])
    usable = ~rows.bad
    if usable.any():  # new Rows: the cached per-file rows stay untouched
        rows = replace(rows, time=(rows.time - rows.time[usable][0]) / 1000.0)
    check_sorted(rows, "timestamp", kind="key")
    return window_result(rows, sel, paths, origin, rebase_to_first=True,
                         reasons=DROP_REASONS)
