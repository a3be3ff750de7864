"""Mooncake JSONL with its prefix identity -> canonical trace with ``hash_ids@512``.

The Mooncake FAST'25 traces (github.com/kvcache-ai/Mooncake, ``FAST25-release/traces``; Qin et
al., "Mooncake: Trading More Storage for Less Computation — A KVCache-centric Architecture for
Serving LLM Chatbot", FAST 2025, the Kimi service) hold one JSON object per line:
``{"timestamp": <ms>, "input_length": <int>, "output_length": <int>, "hash_ids": [<int>, ...]}``.
``hash_ids`` names the prompt's blocks of `BLOCK_TOKENS` (512) tokens, one id per block, the last
one possibly partial, so ``len(hash_ids) == ceil(input_length / 512)``. Ids are chained: an equal
id means an equal whole prefix up to and including that block.

This adapter reads what the ``jsonl`` adapter reads (arrival_s = (timestamp - first timestamp) /
1000, the same selection options and drops) and keeps the ids: the trace carries them as its
``hash_ids@512`` column. Every line must have ``hash_ids``; a malformed list (not a list, an
element that is not a non-negative integer, the wrong length) is an error for that line, or an
``unparsable_row`` with ``bad_rows="drop"``. A chain that contradicts itself (an id at two block
positions, or after two different parents), within a file or across the files read together, is
always an error: it is a fault of the data set, not of one row.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from schedport.common.values import is_int
from schedport.workload.sources._common import (
    ZERO_IN, ZERO_OUT, AdapterResult, Rows, cached_load, check_rows_chain, check_selection, check_sorted,
    object_column, origin_entry, read_all, window_result,
)
from schedport.workload.sources.jsonl import parse_lines, record_rows
from schedport.workload.tracecheck import MAX_HASH_ID

#: Prompt tokens one Mooncake block id covers.
BLOCK_TOKENS = 512
DROP_REASONS = (ZERO_OUT, ZERO_IN)
_EMPTY = np.zeros(0, dtype=np.int64)


def _hash_problem(obj: dict) -> str | None:
    """Why a record's ``hash_ids`` is unusable (one line), or None."""
    if "hash_ids" not in obj:
        return "missing key 'hash_ids'"
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        return f"key 'hash_ids': {ids!r:.40} is not a list of block ids"
    for k, x in enumerate(ids):
        if not is_int(x) or x < 0 or x > MAX_HASH_ID:
            return f"key 'hash_ids': element {k + 1} ({x!r:.40}) is not a non-negative integer"
    need = -(-obj["input_length"] // BLOCK_TOKENS)
    if len(ids) != need:
        return (f"key 'hash_ids': {len(ids)} ids for {obj['input_length']} input tokens; expected "
                f"ceil({obj['input_length']} / {BLOCK_TOKENS}) = {need}")
    return None


def _load_file(path: Path, bad_rows: str) -> tuple[Rows, dict]:
    data, lines, records = parse_lines(path, bad_rows, extra_check=_hash_problem)
    ids = object_column([np.asarray(r["hash_ids"], dtype=np.int64) if r is not None else _EMPTY for r in records])
    rows = record_rows(path, lines, records, hash_ids=ids, hash_block_size=BLOCK_TOKENS)
    return rows, origin_entry(path, data)


def _read_file(path: Path, bad_rows: str) -> tuple[Rows, dict]:
    return cached_load("mooncake", path, bad_rows, _load_file)


def read(paths: list[Path], **selection) -> AdapterResult:
    """Read Mooncake JSONL file(s) (concatenated in the order given) into a window with its block ids.

    Selection as for ``jsonl``: ``start_s``/``duration_s`` in seconds from the first record's
    timestamp, or ``rows`` = the first N kept records; ``max_len``; ``bad_rows``. The trace
    carries ``hash_ids`` with ``hash_block_size`` = 512.
    """
    sel = check_selection("mooncake", selection)
    rows, origin = read_all(paths, _read_file, sel["bad_rows"])
    usable = ~rows.bad
    if usable.any():  # new Rows: the cached per-file rows stay untouched
        rows = replace(rows, time=(rows.time - rows.time[usable][0]) / 1000.0)
    check_sorted(rows, "timestamp", kind="key")
    check_rows_chain(rows)
    return window_result(rows, sel, paths, origin, rebase_to_first=True, reasons=DROP_REASONS)
