"""BurstGPT CSV -> canonical trace.

Data: BurstGPT (github.com/HPMLL/BurstGPT, release assets ``BurstGPT_1.csv`` etc.), from
Wang et al., "BurstGPT: A Real-World Workload Dataset to Optimize LLM Serving Systems",
KDD 2025 (arXiv 2401.17644): Azure OpenAI GPT usage of a regional campus service.

Columns are read by name, so both layouts work:
v1/v2 ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`` and v3, which
inserts ``Session ID,Elapsed time`` after ``Timestamp``. ``Timestamp`` is seconds from 0:00
of the first day, which is also this adapter's time origin (so ``start_s=36000`` is 10:00 on
day one). The client id is ``f"{Model}/{Log Type}"`` (e.g. ``ChatGPT/Conversation log``).

Checked on every row, besides the columns' types: ``Total tokens`` (when the file has it) must
equal ``Request tokens + Response tokens``; a file with ``Elapsed time`` has BurstGPT_3's
layout and must have ``Session ID`` too; ``Elapsed time`` must be a number >= 0. Each is a
one-line error naming file, line and column. `read_records` returns every row with its session,
elapsed time, model, log type and drop reason (the fidelity check of the modeled source,
`schedport.workload.modelcheck`, reads the mirror's slices with it); `read` cuts a window of the
same rows, so a user with the full files and the slices go through one code path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from schedport.errors import ConfigError
from schedport.workload.prefix import SESSION_BLOCK_TOKENS, session_prefix_ids, session_prefix_record
from schedport.workload.sources._common import (
    DROP_REASONS as ALL_REASONS, FAILED, ZERO_IN, AdapterResult, BadRows, cached_load,
    cached_load_many, check_selection, check_sorted, decode_text, fail, object_column, origin_entry,
    parse_float_column, parse_int_column, parse_table, read_all, read_bytes, Rows, token_reasons, window_result,
)

REQUIRED = ("Timestamp", "Model", "Request tokens", "Response tokens", "Log Type")
SESSION, ELAPSED, TOTAL = "Session ID", "Elapsed time", "Total tokens"
OPTIONAL = (SESSION, ELAPSED, TOTAL)
DROP_REASONS = (FAILED, ZERO_IN)


NUMERIC = ("Timestamp", "Request tokens", "Response tokens")


def _labels(values: np.ndarray, name: str, bad: BadRows) -> tuple[np.ndarray, np.ndarray]:
    """Factorised, stripped string column: (codes, unique labels); empty labels are bad."""
    codes, uniques = pd.factorize(pd.Series(values, dtype=object), sort=False)
    labels = np.array([str(u).strip() for u in uniques], dtype=object)
    empty = np.flatnonzero(labels == "")
    if len(empty):
        bad.add(np.isin(codes, empty), lambda i: f"column {name!r}: missing value")
    return codes, labels


def _parse(table, bad: BadRows):
    cols = table.columns
    t = parse_float_column(cols["Timestamp"], "Timestamp", bad)
    bad.add(np.nan_to_num(t, nan=0.0) < 0,
            lambda i: f"column 'Timestamp': {cols['Timestamp'][i]!r} is negative")
    req = parse_int_column(cols["Request tokens"], "Request tokens", bad)
    resp = parse_int_column(cols["Response tokens"], "Response tokens", bad)
    if TOTAL in cols:
        total = parse_int_column(cols[TOTAL], TOTAL, bad, most=2 * int(np.iinfo(np.int32).max))
        bad.add(total != req + resp,
                lambda i: f"column {TOTAL!r}: {int(total[i])} is not Request tokens + Response "
                          f"tokens ({int(req[i])} + {int(resp[i])} = {int(req[i] + resp[i])})")
    elapsed = np.full(len(t), np.nan)
    if ELAPSED in cols:
        elapsed = parse_float_column(cols[ELAPSED], ELAPSED, bad)
        bad.add(np.nan_to_num(elapsed, nan=0.0) < 0,
                lambda i: f"column {ELAPSED!r}: {float(elapsed[i]):g} is negative")
    m_codes, m_labels = _labels(cols["Model"], "Model", bad)
    l_codes, l_labels = _labels(cols["Log Type"], "Log Type", bad)
    # client id = "<Model>/<Log Type>", built once per distinct pair
    pair = m_codes.astype(np.int64) * (len(l_labels) + 1) + l_codes
    uniq, inverse = np.unique(pair, return_inverse=True)
    names = np.array([f"{m_labels[u // (len(l_labels) + 1)]}/{l_labels[u % (len(l_labels) + 1)]}"
                      for u in uniq], dtype=object)
    return t, req, resp, names[inverse.reshape(-1)], elapsed


@dataclass(frozen=True)
class _Parsed:
    rows: Rows
    origin: dict
    session: np.ndarray | None  # None: the file has no Session ID column
    elapsed: np.ndarray


def _header(path: Path, text: str) -> list[str]:
    return [c.strip().strip('"') for c in text.split("\n", 1)[0].rstrip("\r").split(",")]


def _load_file(path: Path, bad_rows: str) -> _Parsed:
    data = read_bytes(path)
    text = decode_text(path, data)
    head = _header(path, text)
    if ELAPSED in head and SESSION not in head:
        raise fail(path, "line 1", f"missing column {SESSION!r} (a file with {ELAPSED!r} has "
                                   "BurstGPT_3's layout, which has Session ID too)")
    numeric = NUMERIC + tuple(c for c in (TOTAL, ELAPSED) if c in head)
    (t, req, resp, client, elapsed), mask, table = parse_table(
        path, text, list(REQUIRED), numeric, _parse, bad_rows, optional=OPTIONAL)
    # A failure is a row with 0 response tokens (the BurstGPT README's definition); a row that
    # got a response but has 0 request tokens is dropped under its own reason.
    reason = token_reasons(req, resp, failed=resp == 0)
    rows = Rows(time=np.where(mask, np.nan, t), input_tokens=req, output_tokens=resp,
                client_id=client, bad=mask, reason=reason,
                file_index=np.zeros(len(t), np.int64), lines=table.lines, paths=[path])
    session = None
    if SESSION in table.columns:
        s = pd.Series(table.columns[SESSION], dtype=object).astype(str).str.strip()
        session = np.where(s.to_numpy() == "", None, s.to_numpy()).astype(object)
    return _Parsed(rows, origin_entry(path, data), session, elapsed)


def _parsed(path: Path, bad_rows: str) -> _Parsed:
    return cached_load("burstgpt", path, bad_rows, _load_file)


def _read_file(path: Path, bad_rows: str) -> tuple[Rows, dict]:
    p = _parsed(path, bad_rows)
    return p.rows, p.origin


@dataclass(frozen=True)
class Records:
    """Every row of BurstGPT file(s) with what the canonical trace leaves out.

    Arrays per row, in file order: ``timestamp`` (s, the files' own clock), ``model``,
    ``log_type``, ``request``, ``response`` (tokens), ``session`` (the Session ID, None where
    the row has none or the file has no such column), ``elapsed`` (s; NaN without the column),
    ``reason`` (the drop reason's name, "" for a kept row) and ``line`` (its line in its file);
    ``files`` the file names and ``origin`` their sha256s; ``dropped`` the count per reason;
    ``has_sessions`` whether every file has a Session ID column.
    """

    timestamp: np.ndarray
    model: np.ndarray
    log_type: np.ndarray
    request: np.ndarray
    response: np.ndarray
    session: np.ndarray
    elapsed: np.ndarray
    reason: np.ndarray
    line: np.ndarray
    files: list[str]
    origin: list[dict]
    dropped: dict[str, int]
    has_sessions: bool

    @property
    def kept(self) -> np.ndarray:
        """Mask of the rows the adapter keeps (non-zero tokens)."""
        return self.reason == ""


def read_records(paths: list[Path], *, sessions: bool = False) -> Records:
    """Every row of BurstGPT CSV file(s), parsed and checked as `read` does, with its extra columns.

    Zero-token rows stay in, marked with their drop reason (``failed_response``: 0 response
    tokens, BurstGPT's failures; ``zero_input_tokens``), and are counted in ``dropped``, so a
    caller can measure the failure share. With `sessions`, every file must have a ``Session ID``
    column (the BurstGPT_3 layout); a file without one is a one-line error naming it.
    Malformed rows are errors (file, line, column), never dropped here.
    """
    parts = [_parsed(Path(p), "error") for p in paths]
    if sessions:
        for p, part in zip(paths, parts):
            if part.session is None:
                raise fail(p, "line 1", f"missing column {SESSION!r} (needed for the session "
                                        "statistics: BurstGPT_3's layout)")
    rows = Rows.concat([p.rows for p in parts])
    if not len(rows.time):
        raise fail(", ".join(Path(p).name for p in paths), None, "no data rows (a header only)")
    check_sorted(rows, "Timestamp")
    model_log = pd.Series(rows.client_id, dtype=object).str.split("/", n=1, expand=True)
    reason = np.array([""] + list(ALL_REASONS), dtype=object)[rows.reason.astype(np.int64)]
    session = np.concatenate([p.session if p.session is not None
                              else np.full(len(p.rows.time), None, dtype=object) for p in parts])
    dropped = {r: int((reason == r).sum()) for r in DROP_REASONS}
    return Records(timestamp=rows.time, model=model_log[0].to_numpy(dtype=object),
                   log_type=model_log[1].to_numpy(dtype=object), request=rows.input_tokens,
                   response=rows.output_tokens, session=session,
                   elapsed=np.concatenate([p.elapsed for p in parts]), reason=reason,
                   line=rows.lines, files=[Path(p).name for p in paths],
                   origin=[p.origin for p in parts], dropped=dropped,
                   has_sessions=all(p.session is not None for p in parts))


PREFIX_MODES = ("sessions", "none")


def _bad_session_id(s: str) -> bool:
    """A session id is one word of printable characters (BurstGPT_3's are UUIDs): a space, a tab
    or a control character means the column holds something else."""
    return not s.isprintable() or any(c.isspace() for c in s)


def _session_rows(paths: list[Path], bad_rows: str) -> tuple[Rows, list[dict], dict]:
    """The files' rows with block ids derived from their sessions (`session_prefix_ids`), the
    files' origin and the manifest's record of the assumption.

    Every file needs a ``Session ID`` column; a session id that is not one word of printable
    characters is an error naming file, line and column (an ``unparsable_row`` with
    ``bad_rows="drop"``). Turns are the kept rows in file order (time order: the files are
    sorted); dropped rows (failures, zero input, unparsable) are not turns.
    """
    parts = [_parsed(p, bad_rows) for p in paths]
    for p, part in zip(paths, parts):
        if part.session is None:
            raise fail(p, "line 1", f"missing column {SESSION!r} (prefix = \"sessions\" derives the prefix "
                                    "identity from sessions: BurstGPT_3's layout)")
    rows = Rows.concat([p.rows for p in parts])
    origin = [p.origin for p in parts]
    check_sorted(rows, "Timestamp")
    session = np.concatenate([p.session for p in parts])
    wrong = np.array([s is not None and _bad_session_id(s) for s in session], dtype=bool) & ~rows.bad
    if wrong.any():
        j = int(np.flatnonzero(wrong)[0])
        if bad_rows == "error":
            raise fail(rows.paths[int(rows.file_index[j])], f"{rows.unit} {int(rows.lines[j])}",
                       f"column {SESSION!r}: {session[j]!r} is not a session id (one word of printable "
                       "characters, no spaces)")
        bad = rows.bad | wrong   # a new Rows: the cached per-file rows stay untouched
        rows = replace(rows, bad=bad, time=np.where(bad, np.nan, rows.time))
    turns = np.flatnonzero(~rows.bad & (rows.reason == 0))
    ids, counts = session_prefix_ids(session[turns], rows.input_tokens[turns], rows.output_tokens[turns])
    empty = np.zeros(0, dtype=np.int64)
    per_row = object_column([empty] * len(rows.time))
    per_row[turns] = ids
    rows = replace(rows, hash_ids=per_row, hash_block_size=SESSION_BLOCK_TOKENS)
    return rows, origin, session_prefix_record(counts, origin)


def _prefix_mode(selection: dict) -> bool:
    """Pop and check the ``prefix`` option: True for ``"sessions"``, False for ``"none"`` or absent."""
    mode = selection.pop("prefix", "none")
    if not isinstance(mode, str) or mode not in PREFIX_MODES:
        raise ConfigError(f"burstgpt: prefix must be \"sessions\" or \"none\", not {mode!r}")
    return mode == "sessions"


def read(paths: list[Path], **selection) -> AdapterResult:
    """Read BurstGPT CSV file(s) (concatenated in the order given) into a window.

    Selection (all optional): ``start_s``/``duration_s`` in seconds of the file's own clock
    (seconds from 0:00 of the first day), or ``rows`` = the first N kept rows from
    ``start_s``; ``max_len`` drops rows whose request + response tokens exceed it;
    ``bad_rows="drop"`` counts malformed rows as ``unparsable_row`` instead of failing.
    Dropped with a count: ``failed_response`` (0 response tokens, BurstGPT's failures) and
    ``zero_input_tokens`` (a response to 0 request tokens). Timestamps must not go backwards
    (the published files are sorted); a row that does is an error naming its line.
    arrival_s is relative to ``start_s`` when given, else to the first kept row.

    ``prefix="sessions"`` gives the trace a prefix identity derived from the files' ``Session ID``
    (``hash_ids@16``, `schedport.workload.prefix.session_prefix_ids`), over every row of the files
    so a window's turns keep what their earlier turns gave them; `AdapterResult.prefix` records
    that it is an assumption and how many requests contradict it. ``"none"`` (the default) reads
    no session.
    """
    selection = dict(selection)
    sessions = _prefix_mode(selection)
    sel = check_selection("burstgpt", selection)
    if not sessions:
        rows, origin = read_all(paths, _read_file, sel["bad_rows"])
        check_sorted(rows, "Timestamp")
        return window_result(rows, sel, paths, origin, rebase_to_first=True, reasons=DROP_REASONS)
    rows, origin, record = cached_load_many("burstgpt-sessions", [Path(p) for p in paths], sel["bad_rows"],
                                            _session_rows)
    res = window_result(rows, sel, paths, origin, rebase_to_first=True, reasons=DROP_REASONS)
    res.prefix = dict(record)
    return res
