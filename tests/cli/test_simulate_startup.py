"""The start-up of one simulation, guarded without timing it (benchmarks/bench_startup.py times it).

`schedport simulate` reads its trace and writes `requests.parquet` without pandas: these tests check
that the command's path imports none of pandas, scipy or matplotlib, and that the pandas-free table
writer, trace reader and client codes give exactly what pandas gave.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import schedport
from schedport.common.arrowcols import arrow_of, numpy_of
from schedport.engine.core.metrics import _client_codes, arrow_table_of, request_columns, table_of
from schedport.workload.examples import make_example_trace
from schedport.workload.trace import Trace, load_trace, save_trace

SRC = str(Path(schedport.__file__).resolve().parents[1])
HEAVY = ("pandas", "scipy", "matplotlib")


def _imported_after(code: str) -> list[str]:
    """The top-level packages of `HEAVY` a fresh interpreter has imported after running `code`."""
    probe = code + f"\nimport sys, json; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_simulate_command_imports_no_analysis_stack(tmp_path):
    """The whole `schedport simulate` command, trace read to files written, imports no pandas, scipy
    or matplotlib, from a CSV trace with clients and from a Parquet one; the files are written."""
    trace = make_example_trace(300)
    save_trace(trace, tmp_path / "t.csv")
    save_trace(trace, tmp_path / "t.parquet")
    for name in ("t.csv", "t.parquet"):
        out = tmp_path / f"out-{name}"
        code = ("import sys\nfrom schedport.cli import main\n"
                f"sys.argv = ['schedport', 'simulate', '--trace', {str(tmp_path / name)!r}, '--scheduler', 'vtc', "
                f"'--out', {str(out)!r}]\n"
                "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n")
        assert _imported_after(code) == [], name
        assert (out / "requests.parquet").is_file() and (out / "summary.json").is_file()


def test_engine_api_import_is_light():
    """Importing the simulation API (what `schedport simulate` imports first) imports none of them."""
    assert _imported_after("import schedport.engine.runner, schedport.cli") == []


def _pandas_bytes(columns: dict, path: Path) -> bytes:
    """The file as a simulation wrote it with pandas: `table_of`, then `reject_reason` as an object column."""
    base = {k: v for k, v in columns.items() if k != "reject_reason"}
    t = table_of(base)
    if "reject_reason" in columns:
        t["reject_reason"] = pd.Series(list(columns["reject_reason"]), dtype=object, index=t.index)
    t.to_parquet(path, index=False)
    return path.read_bytes()


def _arrow_bytes(columns: dict, path: Path) -> bytes:
    table = arrow_table_of(columns)
    assert table is not None
    pq.write_table(table, path, compression="snappy")
    return path.read_bytes()


def _columns(n: int, clients, reasons=None, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.random(n) * 10)
    status = np.array(rng.choice(["completed", "rejected", "unfinished"], n, p=[0.8, 0.1, 0.1]), dtype=object)
    first = np.where(status != "rejected", arrival + rng.random(n), np.nan)
    finish = np.where(status == "completed", first + rng.random(n), np.nan)
    cols = request_columns(arrival_s=arrival, input_tokens=rng.integers(1, 100, n),
                           output_tokens=rng.integers(1, 50, n), client_id=clients, status=status,
                           first_token_s=first, finish_s=finish, preemptions=rng.integers(0, 3, n))
    if reasons is not None:
        cols["reject_reason"] = np.array(reasons, dtype=object)
    return cols


@pytest.mark.parametrize("case", ["no-clients", "clients", "missing-clients", "nan-clients", "int-clients",
                                  "reasons", "no-reasons", "one-row", "unicode"])
def test_arrow_table_writes_the_bytes_pandas_writes(tmp_path, case):
    """`arrow_table_of` + `write_table` gives the same file, byte for byte, as the DataFrame's
    `to_parquet`: the same columns, nulls and pandas metadata; and it reads back to the same frame."""
    n = 1 if case == "one-row" else 57
    clients = {"no-clients": None,
               "clients": np.array([f"c{i % 4}" for i in range(n)], dtype=object),
               "missing-clients": np.array([None if i % 3 else f"c{i % 2}" for i in range(n)], dtype=object),
               "nan-clients": np.array([math.nan if i % 5 == 0 else "x" for i in range(n)], dtype=object),
               "int-clients": np.array([i % 3 for i in range(n)], dtype=object),
               "unicode": np.array(["é客" if i % 2 else "naïve" for i in range(n)], dtype=object),
               }.get(case)
    reasons = ({"reasons": [None if i % 4 else "too long for the KV cache" for i in range(n)],
                "no-reasons": [None] * n}.get(case))
    cols = _columns(n, clients, reasons)
    expected = _pandas_bytes(cols, tmp_path / "pandas.parquet")
    assert _arrow_bytes(cols, tmp_path / "arrow.parquet") == expected
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "arrow.parquet"), pd.read_parquet(tmp_path / "pandas.parquet"))


def test_arrow_table_refuses_what_it_does_not_cover():
    """A column of another type (int32, objects that are not text) is left to pandas: None."""
    cols = _columns(5, None)
    assert arrow_table_of({**cols, "extra": np.arange(5, dtype=np.int32)}) is None
    assert arrow_table_of({**cols, "extra": np.array([1, "a", None, 2.5, None], dtype=object)}) is None


def test_arrow_of_matches_pyarrow():
    """`arrow_of` builds what `pyarrow.array(..., from_pandas=True)` does; `numpy_of` reads it back."""
    cases = [np.array([1.5, np.nan, -0.0, 3.25] * 5), np.arange(-3, 17, dtype=np.int64),
             np.array(["a", None, "", "ü"] * 3, dtype=object), np.array([None] * 4, dtype=object),
             np.zeros(0), np.array([2.0, 4.0, 8.0])[::2]]
    for values in cases:
        ours = arrow_of(values)
        assert ours.equals(pa.array(values, from_pandas=True)), values
        if values.dtype != object:
            back = numpy_of(pa.chunked_array([ours[:2], ours[2:]], type=ours.type), values.dtype)
            np.testing.assert_array_equal(back, values)
    assert arrow_of(np.arange(3, dtype=np.int32)) is None
    assert numpy_of(pa.array([1, None, 3]), np.int64) is None       # an integer null has no NumPy value
    assert numpy_of(pa.array(["a"]), np.float64) is None


def _pandas_codes(clients: np.ndarray) -> tuple[np.ndarray, int]:
    """Client codes as they were computed with pandas: factorize, then ids equal as str merged."""
    codes, uniques = pd.factorize(clients, use_na_sentinel=True)
    first: dict[str, int] = {}
    remap = np.array([first.setdefault(str(u), len(first)) for u in uniques], dtype=np.intp)
    return (np.where(codes >= 0, remap[codes], -1) if len(uniques) else codes), len(first)


@pytest.mark.parametrize("clients", [
    ["a", "b", "a", None, "c", "b"],
    [None, None],
    ["x", math.nan, "y", float("nan"), np.nan, "x"],
    [1, "1", 1.0, 2, None, "2"],
    [pd.NA, "a", "a", pd.NA],
    [f"client-{i % 7}" for i in range(200)],
])
def test_client_codes_match_pandas_factorize(clients):
    """The codes of `_client_codes` (no pandas) are pd.factorize's, ids equal as str merged."""
    arr = np.array(clients + [None], dtype=object)[:-1]   # an object array, even of one kind
    codes, k = _client_codes(arr)
    ref_codes, ref_k = _pandas_codes(arr)
    assert k == ref_k
    np.testing.assert_array_equal(codes, ref_codes)


def test_simulation_files_identical_whether_or_not_the_frame_was_built(tmp_path):
    """`SimulationResult.save` writes the same bytes from its columns as from the built DataFrame
    (a trace with clients, rejected requests with reasons and unfinished ones)."""
    t = make_example_trace(400, seed=3)
    inp = np.array(t.input_tokens)
    inp[::9] = 100_000   # never fits: rejected at arrival, with a reason
    trace = Trace(t.arrival_s, inp, t.output_tokens, t.client_id, "mixed")
    for scheduler in ("vllm-fcfs", "fastserve"):
        res = schedport.simulate(trace, scheduler, load=1.2, horizon_s=40.0)
        res.save(tmp_path / f"{scheduler}-columns")
        assert res.requests.reject_reason.notna().sum() > 0
        res.save(tmp_path / f"{scheduler}-frame")
        for name in ("requests.parquet", "summary.json"):
            a = (tmp_path / f"{scheduler}-columns" / name).read_bytes()
            b = (tmp_path / f"{scheduler}-frame" / name).read_bytes()
            assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest(), (scheduler, name)


def test_csv_trace_reads_the_same_by_arrow_and_pandas(tmp_path):
    """A plain CSV trace (read by Arrow) loads to the same arrays as its quoted twin (which the
    pandas path reads), to the last bit."""
    trace = make_example_trace(500, seed=7)
    save_trace(trace, tmp_path / "plain.csv")
    text = (tmp_path / "plain.csv").read_text()
    lines = text.splitlines()
    quoted = "\n".join([lines[0]] + [ln.rsplit(",", 1)[0] + ',"' + ln.rsplit(",", 1)[1] + '"' for ln in lines[1:]])
    (tmp_path / "quoted.csv").write_text(quoted + "\n")
    a, b = load_trace(tmp_path / "plain.csv"), load_trace(tmp_path / "quoted.csv")
    assert a.arrival_s.tobytes() == b.arrival_s.tobytes() == np.asarray(trace.arrival_s).tobytes()
    np.testing.assert_array_equal(a.input_tokens, b.input_tokens)
    np.testing.assert_array_equal(a.output_tokens, b.output_tokens)
    assert a.client_id.tolist() == b.client_id.tolist() == trace.client_id.tolist()
