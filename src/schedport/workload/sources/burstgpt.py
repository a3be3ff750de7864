"""BurstGPT CSV -> canonical trace.

Data: BurstGPT (github.com/HPMLL/BurstGPT, release assets ``BurstGPT_1.csv`` etc.), from
Wang et al., "BurstGPT: A Real-World Workload Dataset to Optimize LLM Serving Systems",
KDD 2025 (arXiv 2401.17644): Azure OpenAI GPT usage of a regional campus service.

Columns are read by name, so both layouts work:
v1/v2 ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`` and v3, which
inserts ``Session ID,Elapsed time`` after ``Timestamp``. ``Timestamp`` is seconds from 0:00
of the first day, which is also this adapter's time origin (so ``start_s=36000`` is 10:00 on
day one). The client id is ``f"{Model}/{Log Type}"`` (e.g. ``ChatGPT/Conversation log``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from schedport.workload.sources._common import (
    FAILED, ZERO_IN, AdapterResult, BadRows, cached_load, check_selection, check_sorted,
    decode_text, origin_entry, parse_float_column, parse_int_column, parse_table, read_all,
    read_bytes, Rows, token_reasons, window_result,
)

REQUIRED = ("Timestamp", "Model", "Request tokens", "Response tokens", "Log Type")
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
    m_codes, m_labels = _labels(cols["Model"], "Model", bad)
    l_codes, l_labels = _labels(cols["Log Type"], "Log Type", bad)
    # client id = "<Model>/<Log Type>", built once per distinct pair
    pair = m_codes.astype(np.int64) * (len(l_labels) + 1) + l_codes
    uniq, inverse = np.unique(pair, return_inverse=True)
    names = np.array([f"{m_labels[u // (len(l_labels) + 1)]}/{l_labels[u % (len(l_labels) + 1)]}"
                      for u in uniq], dtype=object)
    return t, req, resp, names[inverse.reshape(-1)]


def _load_file(path: Path, bad_rows: str) -> tuple[Rows, dict]:
    data = read_bytes(path)
    (t, req, resp, client), mask, table = parse_table(
        path, decode_text(path, data), list(REQUIRED), NUMERIC, _parse, bad_rows)
    # A failure is a row with 0 response tokens (the BurstGPT README's definition); a row that
    # got a response but has 0 request tokens is dropped under its own reason.
    reason = token_reasons(req, resp, failed=resp == 0)
    rows = Rows(time=np.where(mask, np.nan, t), input_tokens=req, output_tokens=resp,
                client_id=client, bad=mask, reason=reason,
                file_index=np.zeros(len(t), np.int64), lines=table.lines, paths=[path])
    return rows, origin_entry(path, data)


def _read_file(path: Path, bad_rows: str) -> tuple[Rows, dict]:
    return cached_load("burstgpt", path, bad_rows, _load_file)


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
    """
    sel = check_selection("burstgpt", selection)
    rows, origin = read_all(paths, _read_file, sel["bad_rows"])
    check_sorted(rows, "Timestamp")
    return window_result(rows, sel, paths, origin, rebase_to_first=True,
                         reasons=DROP_REASONS)
