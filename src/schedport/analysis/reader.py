"""The one checked reader of ``portability.json``: `read_portability`.

Every command that reads an analysis back (`schedport report`, `explain`, `analyze --compare`,
`validate --predicted`, the study page) reads it here, so a file is checked the same way
wherever it is read: it is there and readable, it is JSON (not nested past what a reader can
walk, no NaN or Infinity, which the analysis never writes), its schema major version is the one
this code reads, its structure conforms to the shipped schema (`schedport.analysis.schema`,
which describes every block a reader reads, the ``simulator`` and ``deployments`` blocks
included), and the names one block uses of another resolve (a ``simulator`` finding's region is
one of ``parameters.regions``). Anything else is refused in one line naming the file, the field
and why, before any reader indexes into it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from schedport.analysis.schema import check_portability
from schedport.common.guard import store_identity
from schedport.errors import SchedportError, read_json

__all__ = ["read_portability", "read_portability_bytes", "check_portability_dict"]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _regions_resolve(res: dict, where) -> None:
    """The ``simulator`` findings name regions of ``parameters.regions`` (what `validate
    --predicted` looks their loads up in)."""
    sim = res.get("simulator")
    if not isinstance(sim, dict):
        return
    known = {r.get("name") for r in res["parameters"].get("regions") or [] if isinstance(r, dict)}
    pred = sim.get("predicted") or {}
    named = [("reversals", i, x) for i, x in enumerate(sim.get("reversals") or [])]
    named += [("stable", i, x) for i, x in enumerate(sim.get("stable") or [])]
    named += [("predicted", k, pred[k]) for k in ("strongest_reversal", "most_stable_ranking") if pred.get(k)]
    for block, i, x in named:
        if x["region"] not in known:
            raise SchedportError(f"{where}: not a valid portability.json at /simulator/{block}/{i}/region: region "
                                 f"{x['region']!r} is not one of parameters.regions")


def check_portability_dict(res: Any, where) -> dict:
    """`res` (a parsed portability.json read from `where`) once checked: its version, its structure
    against the shipped schema and the references between its blocks; else a one-line
    `SchedportError`."""
    try:
        check_portability(res, where)
    except RecursionError:
        raise SchedportError(f"{where}: not a valid portability.json: nested too deeply to check") from None
    _regions_resolve(res, where)
    return res


def read_portability_bytes(path: str | os.PathLike[str], *, hint: str = "",
                           store: Optional[str | os.PathLike[str]] = None) -> tuple[dict, bytes]:
    """(the checked analysis, the file's bytes) of `path` (a ``portability.json`` or the directory
    holding one), as `read_portability` reads it; the bytes are what a page stamps with its digest."""
    p = Path(path)
    if p.is_dir():
        p = p / "portability.json"
    results = store if store is not None else p.parent
    if not p.is_file():
        raise SchedportError(f"{p}: missing; run `schedport analyze --results {results}`{hint}")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise SchedportError(f"{p}: cannot be read ({e.strerror or e}); run `schedport analyze --results "
                             f"{results}`{hint}") from None
    try:
        res = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise SchedportError(f"{p}: not a valid portability.json: nested too deeply to be one") from None
    except ValueError as e:     # invalid JSON, not UTF-8, NaN or Infinity
        raise SchedportError(f"{p}: not valid JSON ({' '.join(str(e).split())})") from None
    if not isinstance(res, dict):
        raise SchedportError(f"{p}: expected a JSON object (the analysis of a results store)")
    check_portability_dict(res, p)
    if store is not None:
        _same_store(res, p, Path(store), hint)
    return res, raw


def _same_store(res: dict, p: Path, store: Path, hint: str) -> None:
    """Refuse the analysis of another store than the one at `store` (its manifest's identity)."""
    mpath = store / "manifest.json"
    if not mpath.is_file():
        return
    man = read_json(mpath)
    if isinstance(man, dict) and res["store"] != store_identity(man):
        raise SchedportError(f"{p}: is the analysis of another results store (created "
                             f"{(res['store'] or {}).get('created')}, this one {man.get('created')}); "
                             f"run `schedport analyze --results {store}`{hint}")


def read_portability(path: str | os.PathLike[str], *, hint: str = "",
                     store: Optional[str | os.PathLike[str]] = None) -> dict:
    """The analysis in `path` (a ``portability.json`` or the directory holding one), checked.

    Missing, unreadable, not JSON, nested too deeply, of another schema major version, breaking
    the shipped schema (a field of the wrong type, a ``simulator`` finding without its scheduler
    pair, ``n_variants: "two"``), or naming a region it does not define: a one-line
    `SchedportError` naming the file, the field and why (then `hint`, what to run). With `store`
    (a results store's directory), the analysis of another store is refused too.
    """
    return read_portability_bytes(path, hint=hint, store=store)[0]
