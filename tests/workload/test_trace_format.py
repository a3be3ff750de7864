"""Tests for the canonical trace: construction, file I/O, hashing and every bad-input message."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedport.errors import SchedportError, TraceError
from schedport.workload.trace import MAX_TOKENS, Trace, load_trace, save_trace

HEADER = "arrival_s,input_tokens,output_tokens\n"
HEADER_C = "arrival_s,input_tokens,output_tokens,client_id\n"


def write(tmp_path: Path, text: str, name: str = "t.csv") -> str:
    """Write `text` verbatim and return the path as a string (as a user would pass it)."""
    p = tmp_path / name
    p.write_bytes(text.encode("utf-8"))
    return str(p)


def error_of(path: str) -> str:
    with pytest.raises(TraceError) as info:
        load_trace(path)
    msg = str(info.value)
    assert "\n" not in msg, "messages must be one line"
    return msg


def write_parquet(tmp_path: Path, columns: dict, name: str = "t.parquet") -> str:
    p = tmp_path / name
    pq.write_table(pa.table(columns), p)
    return str(p)


def same(a: Trace, b: Trace) -> bool:
    ok = (np.array_equal(a.arrival_s, b.arrival_s)
          and np.array_equal(a.input_tokens, b.input_tokens)
          and np.array_equal(a.output_tokens, b.output_tokens)
          and a.arrival_s.dtype == b.arrival_s.dtype == np.float64
          and a.input_tokens.dtype == b.input_tokens.dtype == np.int64
          and a.output_tokens.dtype == b.output_tokens.dtype == np.int64)
    if a.client_id is None or b.client_id is None:
        return ok and a.client_id is None and b.client_id is None
    return ok and a.client_id.tolist() == b.client_id.tolist()


# ------------------------------------------------------------------ good input


def test_load_csv_basic(tmp_path):
    path = write(tmp_path, HEADER_C + "0,10,5,chat\n0.5,20,6,\n1.25,30,7,007\n", "small.csv")
    t = load_trace(path)
    assert t.name == "small"
    assert len(t) == 3
    assert t.arrival_s.dtype == np.float64 and t.input_tokens.dtype == np.int64
    assert t.arrival_s.tolist() == [0.0, 0.5, 1.25]
    assert t.input_tokens.tolist() == [10, 20, 30]
    assert t.output_tokens.tolist() == [5, 6, 7]
    assert t.client_id.tolist() == ["chat", None, "007"]  # numeric-looking id stays a string


def test_any_column_order_and_no_client(tmp_path):
    t = load_trace(write(tmp_path, "output_tokens,arrival_s,input_tokens\n5,0,10\n6,1,20\n"))
    assert t.client_id is None
    assert t.arrival_s.tolist() == [0.0, 1.0]
    assert t.input_tokens.tolist() == [10, 20]
    assert t.output_tokens.tolist() == [5, 6]


def test_crlf_bom_blank_lines_and_integer_valued_floats(tmp_path):
    text = "\ufeffarrival_s,input_tokens,output_tokens\r\n0,3.0,1e2\r\n\r\n2,4,5\r\n"
    t = load_trace(write(tmp_path, text))
    assert t.input_tokens.tolist() == [3, 4]
    assert t.output_tokens.tolist() == [100, 5]


def test_quoted_fields(tmp_path):
    text = HEADER_C + '0,1,1,"a,b"\n1,2,2,"say ""hi"""\n2,3,3,"two\nlines"\n3,4,4,plain\n'
    t = load_trace(write(tmp_path, text))
    assert t.client_id.tolist() == ["a,b", 'say "hi"', "two\nlines", "plain"]


def test_line_numbers_count_physical_lines(tmp_path):
    # a quoted newline and a blank line both shift later records' line numbers
    text = HEADER_C + '0,1,1,"x\ny"\n\n1,abc,1,z\n'
    assert error_of(write(tmp_path, text, "q.csv")) == (
        f"{tmp_path / 'q.csv'}: line 5: column 'input_tokens': 'abc' is not an integer")


def test_negative_zero_arrival_is_zero(tmp_path):
    t = load_trace(write(tmp_path, HEADER + "-0.0,1,1\n"))
    assert np.signbit(t.arrival_s[0]) == np.False_


def test_parquet_round_trip_and_name(tmp_path):
    t = Trace.from_arrays([0.0, 0.1, 0.1], [1, 2, 3], [4, 5, 6], ["a", None, "b"])
    p = tmp_path / "w.pq"
    save_trace(t, p)
    back = load_trace(p)
    assert back.name == "w"
    assert same(t, back)


def test_parquet_accepts_other_numeric_types(tmp_path):
    path = write_parquet(tmp_path, {
        "arrival_s": pa.array([0, 1], pa.int32()),
        "input_tokens": pa.array([3.0, 4.0], pa.float32()),
        "output_tokens": pa.array([1, 2], pa.uint16()),
        "client_id": pa.array([7, None], pa.int64()),
    })
    t = load_trace(path)
    assert t.arrival_s.tolist() == [0.0, 1.0]
    assert t.input_tokens.tolist() == [3, 4]
    assert t.client_id.tolist() == ["7", None]


def test_from_arrays_copies_and_freezes():
    arrival = np.array([0.0, 1.0])
    t = Trace.from_arrays(arrival, [1, 2], [3, 4], name="x")
    arrival[0] = 99.0
    assert t.arrival_s[0] == 0.0 and t.name == "x"
    with pytest.raises(ValueError):
        t.arrival_s[0] = 5.0


def test_from_arrays_client_normalisation():
    t = Trace.from_arrays([0, 1, 2, 3], [1] * 4, [1] * 4, ["a", "", None, 7])
    assert t.client_id.tolist() == ["a", None, None, "7"]
    assert t.arrival_s.dtype == np.float64 and t.input_tokens.dtype == np.int64


def test_views():
    t = Trace.from_arrays([0, 1, 2, 3], [1, 2, 3, 4], [5, 6, 7, 8], ["a", "b", None, "d"])
    df = t.to_frame()
    assert list(df.columns) == ["arrival_s", "input_tokens", "output_tokens", "client_id"]
    assert df["client_id"].tolist() == ["a", "b", None, "d"]
    assert list(Trace.from_arrays([0], [1], [1]).to_frame().columns) == [
        "arrival_s", "input_tokens", "output_tokens"]
    assert t.head(2).input_tokens.tolist() == [1, 2]
    assert len(t.head(10)) == 4 and len(t.head(0)) == 0
    assert t[1:3].output_tokens.tolist() == [6, 7]
    assert t.take([0, 2]).client_id.tolist() == ["a", None]
    assert t.take(np.array([True, False, False, True])).arrival_s.tolist() == [0.0, 3.0]
    with pytest.raises(ValueError):
        t.take([2, 0])  # would reorder arrivals
    with pytest.raises(TypeError):
        t[0]


def test_sha256_depends_on_content_not_name_or_dtype():
    a = Trace.from_arrays([0.0, 1.0], [1, 2], [3, 4], name="a")
    b = Trace.from_arrays(np.array([0, 1], np.int32), [1.0, 2.0], [3, 4], name="b")
    assert a.content_sha256() == b.content_sha256()
    assert len(a.content_sha256()) == 64
    c = Trace.from_arrays([0.0, 1.0], [1, 2], [3, 5])
    d = Trace.from_arrays([0.0, 1.0], [1, 2], [3, 4], [None, None])
    e = Trace.from_arrays([0.0, 1.0], [1, 2], [3, 4], ["x", None])
    assert len({a.content_sha256(), c.content_sha256(), d.content_sha256(),
                e.content_sha256()}) == 4


def test_save_is_atomic_and_leaves_no_temp(tmp_path):
    t = Trace.from_arrays([0.0], [1], [1])
    target = tmp_path / "out.csv"
    target.write_text("old")
    save_trace(t, target)
    assert load_trace(target).input_tokens.tolist() == [1]
    assert sorted(os.listdir(tmp_path)) == ["out.csv"]


def test_save_failure_leaves_nothing(tmp_path, monkeypatch):
    t = Trace.from_arrays([0.0], [1], [1])
    target = tmp_path / "out.parquet"

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(TraceError, match=r"out\.parquet: cannot write file \(No space left"):
        save_trace(t, target)
    assert os.listdir(tmp_path) == []


def test_save_errors(tmp_path):
    t = Trace.from_arrays([0.0], [1], [1])
    with pytest.raises(TraceError, match=r"x\.json: unsupported trace file type '\.json'"):
        save_trace(t, tmp_path / "x.json")
    with pytest.raises(TraceError, match="does not exist"):
        save_trace(t, tmp_path / "nope" / "x.csv")
    with pytest.raises(TraceError, match="no requests"):
        save_trace(t.head(0), tmp_path / "x.csv")
    assert os.listdir(tmp_path) == []


def test_load_20k_rows_round_trips(tmp_path):
    # the time it takes is measured in benchmarks/bench_io.py, not here
    rng = np.random.default_rng(1)
    n = 20_000
    t = Trace.from_arrays(np.cumsum(rng.exponential(0.2, n)), rng.integers(1, 5000, n),
                          rng.integers(1, 500, n), rng.choice(["chat", "code"], n))
    path = tmp_path / "big.csv"
    save_trace(t, path)
    assert same(load_trace(path), t)


# ------------------------------------------------------------------ round-trip property

_clients = st.one_of(
    st.none(),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=8),
    st.sampled_from(["007", "a,b", 'q"', " sp ", "x\ny", "r\rs", "NA", "nan", "-1"]),
)


@st.composite
def traces(draw):
    n = draw(st.integers(1, 30))
    gaps = draw(st.lists(st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False,
                                   allow_subnormal=True), min_size=n, max_size=n))
    start = draw(st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False))
    arrival = start + np.cumsum(np.asarray(gaps, dtype=np.float64))
    tokens = st.integers(1, MAX_TOKENS)
    inp = draw(st.lists(tokens, min_size=n, max_size=n))
    out = draw(st.lists(tokens, min_size=n, max_size=n))
    clients = draw(st.one_of(st.none(), st.lists(_clients, min_size=n, max_size=n)))
    return Trace.from_arrays(arrival, inp, out, clients)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces())
def test_round_trip_csv_and_parquet(tmp_path_factory, trace):
    d = tmp_path_factory.mktemp("rt")
    digest = trace.content_sha256()
    for name in ("x.csv", "x.parquet"):
        save_trace(trace, d / name)
        back = load_trace(d / name)
        assert same(trace, back), name
        assert back.content_sha256() == digest, name


# ------------------------------------------------------------------ bad input: files


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.csv")
    assert error_of(path) == f"{path}: file not found"


def test_unsupported_suffix(tmp_path):
    path = write(tmp_path, HEADER + "0,1,1\n", "t.txt")
    assert error_of(path) == (f"{path}: unsupported trace file type '.txt'; "
                              "use .csv, .parquet or .pq")


def test_directory(tmp_path):
    (tmp_path / "d.csv").mkdir()
    assert error_of(str(tmp_path / "d.csv")).endswith("d.csv: is a directory, not a trace file")


def test_unreadable_file(tmp_path, monkeypatch):
    path = write(tmp_path, HEADER + "0,1,1\n")

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    assert error_of(path) == f"{path}: cannot read file (Permission denied)"


def test_empty_file(tmp_path):
    path = write(tmp_path, "")
    assert error_of(path).startswith(f"{path}: file is empty; expected a header "
                                     "arrival_s,input_tokens,output_tokens[,client_id]")


def test_blank_lines_only(tmp_path):
    path = write(tmp_path, "\n\n")
    assert error_of(path).startswith(f"{path}: file is empty")


def test_header_only(tmp_path):
    path = write(tmp_path, HEADER)
    assert error_of(path) == f"{path}: no requests (the file has a header but no data rows)"


def test_missing_column(tmp_path):
    path = write(tmp_path, "arrival_s,input_tokens\n0,1\n")
    assert error_of(path) == (
        f"{path}: line 1: missing required column 'output_tokens'; expected header "
        "arrival_s,input_tokens,output_tokens[,client_id]")


def test_unknown_column_typo(tmp_path):
    path = write(tmp_path, "arrival_s,input_tokens,output_tokens,clientid\n0,1,1,a\n")
    assert error_of(path) == (
        f"{path}: line 1: unknown column 'clientid' (did you mean 'client_id'?); "
        "allowed columns are arrival_s, input_tokens, output_tokens, client_id, warmup, hash_ids@<block size>")


def test_unknown_column_no_hint(tmp_path):
    path = write(tmp_path, "arrival_s,input_tokens,output_tokens,priority\n0,1,1,3\n")
    assert error_of(path).startswith(f"{path}: line 1: unknown column 'priority'; allowed")


def test_duplicate_column(tmp_path):
    path = write(tmp_path, "arrival_s,input_tokens,input_tokens,output_tokens\n0,1,1,1\n")
    assert error_of(path) == f"{path}: line 1: column 'input_tokens' appears more than once"


def test_trailing_comma_in_header(tmp_path):
    path = write(tmp_path, "arrival_s,input_tokens,output_tokens,\n0,1,1,\n")
    assert error_of(path).startswith(f"{path}: line 1: an empty column name")


def test_non_numeric_token(tmp_path):
    path = write(tmp_path, HEADER + "0,1,1\n1,2,3\n2,3,4\n3,abc,5\n", "t.csv")
    assert error_of(path) == f"{path}: line 5: column 'input_tokens': 'abc' is not an integer"


def test_non_numeric_arrival(tmp_path):
    path = write(tmp_path, HEADER + "0,1,1\n1s,1,1\n")
    assert error_of(path) == f"{path}: line 3: column 'arrival_s': '1s' is not a number"


def test_empty_cell(tmp_path):
    path = write(tmp_path, HEADER + "0,1,1\n1,,1\n")
    assert error_of(path) == (f"{path}: line 3: column 'input_tokens': empty cell; "
                              "a value is required")


def test_nan_value(tmp_path):
    path = write(tmp_path, HEADER + "NaN,1,1\n")
    assert error_of(path) == f"{path}: line 2: column 'arrival_s': 'NaN' is not a number (NaN)"


def test_infinite_value(tmp_path):
    path = write(tmp_path, HEADER + "0,1,1\n1,1,inf\n")
    assert error_of(path) == f"{path}: line 3: column 'output_tokens': 'inf' is infinite"


def test_infinite_arrival(tmp_path):
    path = write(tmp_path, HEADER + "0,1,1\n1e400,1,1\n")
    assert error_of(path) == f"{path}: line 3: column 'arrival_s': '1e400' is infinite"


def test_fractional_tokens(tmp_path):
    path = write(tmp_path, HEADER + "0,3.5,1\n")
    assert error_of(path) == f"{path}: line 2: column 'input_tokens': '3.5' is not an integer"


def test_zero_tokens(tmp_path):
    path = write(tmp_path, HEADER + "0,1,1\n0,1,0\n")
    assert error_of(path) == (f"{path}: line 3: column 'output_tokens': '0' is zero; "
                              "token counts must be >= 1")


def test_negative_tokens(tmp_path):
    path = write(tmp_path, HEADER + "0,-3,1\n")
    assert error_of(path) == (f"{path}: line 2: column 'input_tokens': '-3' is negative; "
                              "token counts must be >= 1")


def test_too_many_tokens(tmp_path):
    path = write(tmp_path, HEADER + "0,99999999999,1\n")
    assert error_of(path) == (f"{path}: line 2: column 'input_tokens': '99999999999' is too "
                              f"large; token counts must be <= {MAX_TOKENS}")


def test_negative_arrival(tmp_path):
    path = write(tmp_path, HEADER + "-1.5,1,1\n")
    assert error_of(path) == (f"{path}: line 2: column 'arrival_s': '-1.5' is negative; "
                              "arrival times must be >= 0")


def test_arrival_goes_backwards(tmp_path):
    path = write(tmp_path, HEADER + "0,1,1\n5,1,1\n5,1,1\n4.5,1,1\n")
    assert error_of(path) == (
        f"{path}: line 5: column 'arrival_s': '4.5' is earlier than the previous arrival "
        "'5' (line 4); arrival times must be non-decreasing")


def test_first_bad_row_and_column_order(tmp_path):
    # arrival_s is checked before input_tokens even though its bad row comes later
    path = write(tmp_path, HEADER + "0,1,x\n0,y,1\nz,1,1\n0,w,1\n")
    assert error_of(path) == f"{path}: line 4: column 'arrival_s': 'z' is not a number"
    # within one column, the lowest line wins whatever the reason
    path = write(tmp_path, HEADER + "0,1,1\n0,-1,1\n0,abc,1\n", "u.csv")
    assert error_of(path).startswith(f"{path}: line 3: column 'input_tokens': '-1'")


def test_ragged_short_row(tmp_path):
    path = write(tmp_path, HEADER + "0,1,1\n1,1\n")
    assert error_of(path) == (f"{path}: line 3: malformed CSV: expected 3 fields as in the "
                              "header, found 2")


def test_ragged_long_row(tmp_path):
    path = write(tmp_path, HEADER_C + "0,1,1,a\n1,1,1,b,extra\n")
    assert error_of(path) == (f"{path}: line 3: malformed CSV: expected 4 fields as in the "
                              "header, found 5")


def test_ragged_row_missing_only_client(tmp_path):
    # must not be read as "no client"
    path = write(tmp_path, HEADER_C + "0,1,1,a\n1,1,1\n")
    assert error_of(path).startswith(f"{path}: line 3: malformed CSV: expected 4 fields")


def test_ragged_row_in_quoted_file(tmp_path):
    path = write(tmp_path, HEADER_C + '0,1,1,"a\nb"\n1,1,1\n')
    assert error_of(path).startswith(f"{path}: line 4: malformed CSV: expected 4 fields")


def test_unclosed_quote(tmp_path):
    path = write(tmp_path, HEADER_C + '0,1,1,a\n1,1,1,"oops\n')
    assert error_of(path).startswith(f"{path}: line 3: malformed CSV (unexpected end of data")


def test_not_utf8(tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes(HEADER.encode() + b"0,1,1\n1,\xff,1\n")
    assert error_of(str(p)) == f"{p}: line 3: not valid UTF-8 text (byte 0xff)"


def test_client_id_empty_cell_is_no_client_not_an_error(tmp_path):
    t = load_trace(write(tmp_path, HEADER_C + "0,1,1,\n"))
    assert t.client_id.tolist() == [None]


# ------------------------------------------------------------------ bad input: Parquet


def test_parquet_not_parquet(tmp_path):
    path = write(tmp_path, "hello, world", "t.parquet")
    assert error_of(path).startswith(f"{path}: not a readable Parquet file (")


def test_parquet_empty_file(tmp_path):
    path = write(tmp_path, "", "t.pq")
    assert error_of(path).startswith(f"{path}: file is empty")


def test_parquet_missing_column(tmp_path):
    path = write_parquet(tmp_path, {"arrival_s": [0.0], "output_tokens": [1]})
    assert error_of(path) == (f"{path}: missing required column 'input_tokens'; expected "
                              "header arrival_s,input_tokens,output_tokens[,client_id]")


def test_parquet_unknown_column(tmp_path):
    path = write_parquet(tmp_path, {"arrival_s": [0.0], "input_tokens": [1],
                                    "output_tokens": [1], "client": ["a"]})
    assert error_of(path).startswith(f"{path}: unknown column 'client' (did you mean "
                                     "'client_id'?)")


def test_parquet_no_rows(tmp_path):
    path = write_parquet(tmp_path, {"arrival_s": pa.array([], pa.float64()),
                                    "input_tokens": pa.array([], pa.int64()),
                                    "output_tokens": pa.array([], pa.int64())})
    assert error_of(path) == f"{path}: no requests (the file has the columns but no rows)"


def test_parquet_null_value(tmp_path):
    path = write_parquet(tmp_path, {"arrival_s": [0.0, 1.0], "input_tokens": [1, None],
                                    "output_tokens": [1, 1]})
    assert error_of(path) == (f"{path}: row 2: column 'input_tokens': missing value (null); "
                              "a value is required")


def test_parquet_nan_and_fraction(tmp_path):
    path = write_parquet(tmp_path, {"arrival_s": [0.0, float("nan")], "input_tokens": [1, 1],
                                    "output_tokens": [1, 1]})
    assert error_of(path) == f"{path}: row 2: column 'arrival_s': 'nan' is not a number (NaN)"
    path = write_parquet(tmp_path, {"arrival_s": [0.0, 1.0], "input_tokens": [1, 1],
                                    "output_tokens": [1.0, 2.5]}, "u.parquet")
    assert error_of(path) == f"{path}: row 2: column 'output_tokens': '2.5' is not an integer"


def test_parquet_backwards(tmp_path):
    path = write_parquet(tmp_path, {"arrival_s": [0.0, 2.0, 1.0], "input_tokens": [1, 1, 1],
                                    "output_tokens": [1, 1, 1]})
    assert error_of(path) == (
        f"{path}: row 3: column 'arrival_s': '1.0' is earlier than the previous arrival "
        "'2.0' (row 2); arrival times must be non-decreasing")


def test_parquet_string_numbers(tmp_path):
    path = write_parquet(tmp_path, {"arrival_s": ["0", "1"], "input_tokens": ["1", "abc"],
                                    "output_tokens": [1, 1]})
    assert error_of(path) == f"{path}: row 2: column 'input_tokens': 'abc' is not an integer"


def test_parquet_wrong_type(tmp_path):
    path = write_parquet(tmp_path, {"arrival_s": [0.0], "input_tokens": [True],
                                    "output_tokens": [1]})
    assert error_of(path) == (f"{path}: column 'input_tokens' has Parquet type bool; "
                              "expected numbers")


# ------------------------------------------------------------------ bad input: arrays


def arrays_error(*args, **kwargs) -> str:
    with pytest.raises(TraceError) as info:
        Trace.from_arrays(*args, **kwargs)
    return str(info.value)


def test_arrays_bad_value_names_source_row_column():
    assert arrays_error([0, 1, 2], [1, 1, 1], [1, 0, 1], source="azure adapter") == (
        "azure adapter: row 2: column 'output_tokens': '0' is zero; token counts must be >= 1")


def test_arrays_nan_none_and_strings():
    assert arrays_error([0, np.nan], [1, 1], [1, 1]) == (
        "<arrays>: row 2: column 'arrival_s': 'nan' is not a number (NaN)")
    assert arrays_error([0, 1], [1, None], [1, 1]) == (
        "<arrays>: row 2: column 'input_tokens': missing value (null); a value is required")
    assert arrays_error([0, "x"], [1, 1], [1, 1]) == (
        "<arrays>: row 2: column 'arrival_s': 'x' is not a number")
    assert arrays_error([0, 1], [1, 2.5], [1, 1]) == (
        "<arrays>: row 2: column 'input_tokens': '2.5' is not an integer")


def test_arrays_backwards():
    assert arrays_error([0.0, 2.0, 1.0], [1] * 3, [1] * 3) == (
        "<arrays>: row 3: column 'arrival_s': '1.0' is earlier than the previous arrival "
        "'2.0' (row 2); arrival times must be non-decreasing")


def test_arrays_shape_problems():
    assert arrays_error([0, 1], [1], [1, 1]) == (
        "<arrays>: columns have different lengths (arrival_s has 2, input_tokens has 1, "
        "output_tokens has 2)")
    assert arrays_error([], [], []) == "<arrays>: no requests (the table has no rows)"
    assert arrays_error([[0.0]], [1], [1]).startswith(
        "<arrays>: column 'arrival_s': expected a one-dimensional column")
    assert arrays_error([0], [True], [1]) == (
        "<arrays>: column 'input_tokens': expected numbers, got values of type bool")


def test_arrays_bad_client():
    assert arrays_error([0, 1], [1, 1], [1, 1], np.array(["a", 2.5], dtype=object)) == (
        "<arrays>: row 2: column 'client_id': '2.5' is not a string (got float)")
    assert "not valid Unicode" in arrays_error([0], [1], [1], ["\ud800"])


def test_trace_error_is_user_error():
    assert issubclass(TraceError, SchedportError)


# ----------------------------------------------------------------- prefix identity (hash_ids@N)

HASHED = Trace.from_arrays([0.0, 1.5, 2.0], [600, 1024, 100], [1, 2, 3], ["a", None, "b"],
                           hash_ids=[[0, 1], [0, 2], [3]], hash_block_size=512)
HEADER_H = "arrival_s,input_tokens,output_tokens,hash_ids@512\n"


def test_hash_ids_round_trip_csv_and_parquet(tmp_path):
    for name in ("t.csv", "t.parquet"):
        save_trace(HASHED, tmp_path / name)
        back = load_trace(tmp_path / name)
        assert back.hash_block_size == 512
        assert back.hash_ids.tolist() == [0, 1, 0, 2, 3]
        assert back.hash_ids_of(1).tolist() == [0, 2]
        assert back.client_id.tolist() == ["a", None, "b"]
        assert back.content_sha256() == HASHED.content_sha256()
    assert (tmp_path / "t.csv").read_text().splitlines() == [
        "arrival_s,input_tokens,output_tokens,client_id,hash_ids@512",
        "0.0,600,1,a,0 1", "1.5,1024,2,,0 2", "2.0,100,3,b,3"]


def test_hash_ids_enter_the_content_hash_only_when_present(tmp_path):
    plain = Trace.from_arrays([0.0, 1.5, 2.0], [600, 1024, 100], [1, 2, 3], ["a", None, "b"])
    assert HASHED.content_sha256() != plain.content_sha256()
    other = Trace.from_arrays([0.0, 1.5, 2.0], [600, 1024, 100], [1, 2, 3], ["a", None, "b"],
                              hash_ids=[[0, 1], [0, 2], [4]], hash_block_size=512)
    assert other.content_sha256() != HASHED.content_sha256()
    # a trace without ids is written exactly as before they existed
    save_trace(plain, tmp_path / "p.csv")
    assert (tmp_path / "p.csv").read_text() == HEADER_C + "0.0,600,1,a\n1.5,1024,2,\n2.0,100,3,b\n"
    assert load_trace(tmp_path / "p.csv").hash_ids is None


def test_hash_ids_follow_take_and_scaled():
    sub = HASHED.take([1, 2])
    assert sub.hash_ids.tolist() == [0, 2, 3] and sub.hash_block_size == 512
    assert HASHED[0:1].hash_ids.tolist() == [0, 1]
    assert HASHED.scaled(2.0).hash_ids.tolist() == [0, 1, 0, 2, 3]
    assert HASHED.take(np.zeros(3, dtype=bool)).hash_ids.tolist() == []


def test_hash_ids_not_a_list(tmp_path):
    path = write_parquet(tmp_path, {"arrival_s": [0.0, 1.0], "input_tokens": [10, 10],
                                    "output_tokens": [1, 1], "hash_ids@512": [0, 1]})
    assert error_of(path) == (f"{path}: row 1: column 'hash_ids@512': '0' is not a list of block ids "
                              "(got int)")


def test_hash_ids_element_not_a_non_negative_integer(tmp_path):
    path = write(tmp_path, HEADER_H + "0,600,1,0 1\n1,600,1,0 x\n")
    assert error_of(path) == (f"{path}: line 3: column 'hash_ids@512': element 2 'x' is not a "
                              "non-negative integer (at most 9223372036854775807)")
    path = write(tmp_path, HEADER_H + "0,600,1,0 -1\n", "neg.csv")
    assert "line 2: column 'hash_ids@512': element 2 '-1' is not a non-negative integer" in error_of(path)
    with pytest.raises(TraceError, match=r"row 1: column 'hash_ids@16': element 1 'True' is not"):
        Trace.from_arrays([0], [5], [1], hash_ids=[[True]], hash_block_size=16)


def test_hash_ids_wrong_length(tmp_path):
    path = write(tmp_path, HEADER_H + "0,600,1,0 1\n1,1025,1,0 2\n")
    assert error_of(path) == (f"{path}: line 3: column 'hash_ids@512': 2 ids for 1025 input tokens; "
                              "expected ceil(1025 / 512) = 3")


def test_hash_ids_same_id_at_two_positions(tmp_path):
    path = write(tmp_path, HEADER_H + "0,600,1,0 1\n\n1,1024,1,1 2\n")
    assert error_of(path) == (
        f"{path}: line 4: column 'hash_ids@512': id 1 is block 1 here but block 2 on line 2; an id "
        "names the whole prefix up to its block, so it cannot change place or parent")


def test_hash_ids_same_id_after_different_parents(tmp_path):
    path = write(tmp_path, HEADER_H + "0,600,1,0 1\n1,1024,1,5 1\n")
    assert error_of(path) == (
        f"{path}: line 3: column 'hash_ids@512': id 1 follows id 5 here but id 0 on line 2; an id "
        "names the whole prefix up to its block, so it cannot change place or parent")


def test_hash_ids_column_name_needs_the_block_size(tmp_path):
    path = write(tmp_path, "arrival_s,input_tokens,output_tokens,hash_ids\n0,1,1,0\n")
    assert error_of(path) == (f"{path}: line 1: column 'hash_ids': the prefix-identity column is named "
                              "'hash_ids@<block size>' with the block size in tokens, e.g. 'hash_ids@512'")
    path = write(tmp_path, "arrival_s,input_tokens,output_tokens,hash_ids@16,hash_ids@512\n0,1,1,0,0\n", "two.csv")
    assert "a trace has one hash_ids column" in error_of(path)
    with pytest.raises(TraceError, match="hash_block_size must be an integer >= 1"):
        Trace.from_arrays([0], [5], [1], hash_ids=[[0]], hash_block_size=0)


def test_engine_block_keys_map_512_token_ids_to_16_token_blocks():
    from schedport.workload.prefix import engine_block_keys

    # requests 0 and 3: same prompt of 1200 tokens; request 2 shares its first two full blocks
    t = Trace.from_arrays([0, 1, 2, 3, 4], [1200, 1200, 1100, 1200, 1030], [1] * 5,
                          hash_ids=[[0, 1, 2], [0, 1, 9], [0, 1, 5], [0, 1, 2], [0, 1, 2]], hash_block_size=512)
    k0 = engine_block_keys(t, 0)
    assert len(k0) == 1200 // 16 == 75
    assert k0[0] == (0, 0, 512) and k0[31] == (0, 31, 512) and k0[32] == (1, 0, 512)
    assert k0[64:] == [(2, o, 176) for o in range(11)]  # 176 tokens in the partial block: 11 full engine blocks
    assert engine_block_keys(t, 3) == k0
    assert engine_block_keys(t, 2)[:64] == k0[:64] and engine_block_keys(t, 2)[64] == (5, 0, 76)
    # same last id, different length: the partial block's engine blocks are not shared
    k4 = engine_block_keys(t, 4)
    assert len(k4) == 64 and k4 == k0[:64]
    with pytest.raises(ValueError, match="not a multiple"):
        engine_block_keys(t, 0, 24)
    with pytest.raises(ValueError, match="no hash_ids"):
        engine_block_keys(Trace.from_arrays([0], [5], [1]), 0)


# ----------------------------------------------------------------- warm-up (docs/corpus.md, "Warm caches")

WARM = Trace.from_arrays([0.0, 1.5, 2.0, 4.0], [600, 1024, 100, 30], [1, 2, 3, 4], ["a", None, "b", "c"],
                         hash_ids=[[0, 1], [0, 2], [3], [4]], hash_block_size=512, warmup=2)


def test_warmup_round_trips_csv_and_parquet(tmp_path):
    for name in ("t.csv", "t.parquet"):
        save_trace(WARM, tmp_path / name)
        back = load_trace(tmp_path / name)
        assert back.warmup == 2 and back.content_sha256() == WARM.content_sha256()
        assert back.hash_ids.tolist() == WARM.hash_ids.tolist()
    assert (tmp_path / "t.csv").read_text().splitlines() == [
        "arrival_s,input_tokens,output_tokens,client_id,warmup,hash_ids@512",
        "0.0,600,1,a,1,0 1", "1.5,1024,2,,1,0 2", "2.0,100,3,b,0,3", "4.0,30,4,c,0,4"]
    assert pq.read_table(tmp_path / "t.parquet").column("warmup").to_pylist() == [True, True, False, False]


def test_a_trace_without_warmup_is_written_and_hashed_as_before(tmp_path):
    plain = Trace.from_arrays([0.0, 1.5], [600, 1024], [1, 2])
    assert plain.warmup == 0 and plain.measured() is plain
    assert Trace.from_arrays([0.0, 1.5], [600, 1024], [1, 2], warmup=1).content_sha256() != plain.content_sha256()
    save_trace(plain, tmp_path / "p.csv")
    assert (tmp_path / "p.csv").read_text() == "arrival_s,input_tokens,output_tokens\n0.0,600,1\n1.5,1024,2\n"
    save_trace(plain, tmp_path / "p.parquet")
    assert pq.read_table(tmp_path / "p.parquet").column_names == ["arrival_s", "input_tokens", "output_tokens"]


def test_measured_take_and_scaled_keep_the_warmup_in_front():
    m = WARM.measured()
    assert m.warmup == 0 and m.input_tokens.tolist() == [100, 30] and m.hash_ids.tolist() == [3, 4]
    assert WARM.take([1, 2, 3]).warmup == 1 and WARM[2:].warmup == 0 and WARM.head(1).warmup == 1
    assert WARM.scaled(2.0).warmup == 2
    same_time = Trace.from_arrays([0.0, 0.0, 0.0], [1, 1, 1], [1, 1, 1], warmup=1)
    with pytest.raises(ValueError, match="warm-up request after a measured one"):
        same_time.take([1, 0])


@pytest.mark.parametrize("cells, msg", [
    (["1", "0", "1"], "line 4: column 'warmup': a warm-up request after a measured one (line 3); "
                      "the warm-up requests come first"),
    (["1", "yes", "0"], "line 3: column 'warmup': 'yes' is not 0 or 1 (true or false)"),
    (["1", "", "0"], "line 3: column 'warmup': '' is not 0 or 1 (true or false)"),
    (["1", "true", "TRUE"], "column 'warmup': every request is a warm-up request; a trace needs at least one "
                            "measured request"),
])
def test_bad_warmup_cells_are_one_line(tmp_path, cells, msg):
    rows = "".join(f"{k},1,1,{c}\n" for k, c in enumerate(cells))
    path = write(tmp_path, "arrival_s,input_tokens,output_tokens,warmup\n" + rows)
    assert error_of(path) == f"{path}: {msg}"


def test_warmup_count_is_checked_in_memory():
    with pytest.raises(TraceError, match=r"warmup must be the number of leading warm-up requests, an integer "
                                         r"in \[0, 1\] \(at least one request is measured\), not 2"):
        Trace.from_arrays([0, 1], [1, 1], [1, 1], warmup=2)
    assert Trace.from_arrays([0, 1], [1, 1], [1, 1], warmup=np.int64(1)).warmup == 1
