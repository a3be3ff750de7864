"""Print a results store's content digest: the sha256 of its cells, sorted by key, every column.

The parts of a store are named by uuid and hold cells in the order workers finished them, so two
stores with the same cells differ file by file; this digest does not. With ``--portability`` it
also prints the sha256 of ``portability.json`` without its ``run_info`` (wall times) and the
provenance fields that name one run of the sweep (``started``, ``ended``, ``git_commit``,
``results_dir``) and the store's creation time (``store.created``): the fields that differ
between two analyses of the same cells. With
``--without simulator`` it leaves that block out too. Used to show that a change leaves the default study bit-identical.

    python tools/store_digest.py results [--portability] [--without simulator]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from schedport.errors import SchedportError
from schedport.study.digest import cells_digest

#: Provenance fields that name one run of the sweep, not what it computed.
RUN_FIELDS = ("started", "ended", "git_commit", "results_dir")


def portability_digest(path: Path, without: list[str]) -> str:
    """sha256 of portability.json's canonical JSON less run_info and the keys in `without`."""
    d = json.loads(path.read_text())
    for k in ["run_info", *without]:
        d.pop(k, None)
    for k in RUN_FIELDS:
        (d.get("provenance") or {}).pop(k, None)
    (d.get("store") or {}).pop("created", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--portability", action="store_true")
    ap.add_argument("--without", action="append", default=[])
    a = ap.parse_args(argv)
    try:
        digest, n = cells_digest(a.store / "runs")
    except SchedportError as e:
        raise SystemExit(f"store_digest: {e}") from None
    print(f"cells {n} sha256 {digest}")
    if a.portability:
        print(f"portability.json sha256 {portability_digest(a.store / 'portability.json', a.without)} "
              f"(without run_info, the run's provenance{''.join(', ' + w for w in a.without)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
