"""A results store's content digest: the sha256 of its cells, sorted by key, every column.

The parts of a store are named by uuid and hold cells in the order workers finished them, so two
stores with the same cells differ file by file; this digest does not. It names the store that a
generated page (docs/study.md) was written from, and shows that a change leaves a study
bit-identical (tools/store_digest.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schedport.errors import SchedportError
from schedport.study.store import KEY_COLUMNS

__all__ = ["cells_digest"]


def cells_digest(runs: Path) -> tuple[str, int]:
    """(sha256, rows) of every results part under `runs` (a store's ``runs/``), sorted by the cell
    key; a store without parts is an error."""
    parts = sorted(Path(runs).glob("part-*.parquet"))
    if not parts:
        raise SchedportError(f"{runs}: no results parts (part-*.parquet) to digest")
    table = pa.concat_tables([pq.read_table(p).replace_schema_metadata(None) for p in parts])
    table = table.sort_by([(k, "ascending") for k in KEY_COLUMNS])
    h = hashlib.sha256(json.dumps(table.schema.names).encode())
    for name in table.schema.names:
        col = table.column(name).combine_chunks()
        for buf in col.buffers():
            if buf is not None:
                h.update(buf.to_pybytes())
    return h.hexdigest(), table.num_rows
