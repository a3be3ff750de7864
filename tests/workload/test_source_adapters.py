"""Tests for schedport.workload.sources: hand-written fixtures per format, every malformed-input
message, the ServeGen generator's statistics, and (marked `data`) the mirrored public files."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedport.workload import sources
from schedport.errors import ConfigError, DataError
from schedport.workload.sources import burstgpt
from schedport.workload.sources import servegen as sg
from _paths import FIXTURES, MIRROR

FIX = FIXTURES / "sources"
POOL = FIX / "servegen_pool"
AZURE = MIRROR / "azure-llm-inference-2023"
SERVEGEN = MIRROR / "servegen-language-m-large"

needs_azure = pytest.mark.skipif(not (AZURE / "AzureLLMInferenceTrace_conv.csv").is_file(),
                                 reason="Azure mirror not present")
needs_servegen = pytest.mark.skipif(not SERVEGEN.is_dir(), reason="ServeGen mirror not present")


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def error_of(fmt: str, path: Path | list, **kw) -> str:
    with pytest.raises(DataError) as info:
        sources.read(fmt, path if isinstance(path, list) else [path], **kw)
    msg = str(info.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


# --------------------------------------------------------------------------- dispatch


def test_formats_and_dispatch():
    assert sources.FORMATS == ("azure", "burstgpt", "servegen", "jsonl", "mooncake", "canonical")
    with pytest.raises(ConfigError, match="unknown source format 'csv'"):
        sources.read("csv", [FIX / "canonical_small.csv"])
    with pytest.raises(ConfigError, match="no input files"):
        sources.read("azure", [])
    with pytest.raises(ConfigError, match="unknown selection option"):
        sources.read("azure", [FIX / "azure_conv_small.csv"], slot_start_s=0)
    with pytest.raises(ConfigError, match="duration_s or rows"):
        sources.read("azure", [FIX / "azure_conv_small.csv"], duration_s=5, rows=3)
    with pytest.raises(ConfigError, match="bad_rows"):
        sources.read("azure", [FIX / "azure_conv_small.csv"], bad_rows="skip")
    # a single path is accepted too
    assert len(sources.read("azure", FIX / "azure_conv_small.csv").trace) == 8


def test_missing_file_is_one_line_error(tmp_path):
    msg = error_of("azure", tmp_path / "nope.csv")
    assert msg.startswith("nope.csv: file not found")


# --------------------------------------------------------------------------- azure


def test_azure_fixture_exact_times_and_origin():
    res = sources.read("azure", [FIX / "azure_conv_small.csv"])
    t = res.trace
    assert len(t) == 8 and t.client_id is None
    # 7 fractional digits parsed exactly: differences are multiples of 100 ns
    np.testing.assert_array_equal(t.arrival_s[:6],
                                  [0.0, 4.314579, 4.541877, 4.710427, 5.3194101, 8.81941])
    assert t.arrival_s[-1] == pytest.approx(83.4428667, abs=1e-9)
    assert t.input_tokens.dtype == np.int64 and t.input_tokens[:3].tolist() == [374, 396, 879]
    assert t.output_tokens[:3].tolist() == [44, 109, 55]
    assert res.dropped == {"unparsable_row": 0, "zero_output_tokens": 0, "zero_input_tokens": 0}
    data = (FIX / "azure_conv_small.csv").read_bytes()
    import hashlib
    assert res.origin == [{"name": "azure_conv_small.csv",
                           "sha256": hashlib.sha256(data).hexdigest()}]


def test_azure_selection_start_duration_rows():
    f = [FIX / "azure_conv_small.csv"]
    w = sources.read("azure", f, start_s=4.5, duration_s=1.0).trace
    # rows at 4.541877, 4.710427, 5.3194101 (< 5.5); arrival relative to the window start
    np.testing.assert_allclose(w.arrival_s, [0.041877, 0.210427, 0.8194101], atol=1e-9)
    r = sources.read("azure", f, start_s=4.5, rows=2).trace
    assert r.input_tokens.tolist() == [879, 91]
    head = sources.read("azure", f, rows=3).trace
    assert head.arrival_s[0] == 0.0 and len(head) == 3
    assert len(sources.read("azure", f, rows=100).trace) == 8  # at most N
    late = sources.read("azure", f, start_s=1000.0).trace
    assert len(late) == 0
    labelled = sources.read("azure", f, client_id="azure-conv").trace
    assert set(labelled.client_id) == {"azure-conv"}


def test_azure_dirty_file_every_drop_reason():
    res = sources.read("azure", [FIX / "azure_dirty.csv"], bad_rows="drop", max_len=2048)
    assert res.dropped == {"unparsable_row": 3, "zero_output_tokens": 2,
                           "zero_input_tokens": 1, "over_max_len": 1}
    assert res.trace.input_tokens.tolist() == [374, 250]
    assert res.trace.arrival_s.tolist() == [0.0, 7.31941]
    # both zero counts once, under zero_output_tokens (precedence)
    assert sum(res.dropped.values()) + len(res.trace) == 9


def test_azure_dirty_file_errors_on_first_bad_line():
    msg = error_of("azure", FIX / "azure_dirty.csv")
    assert msg == "azure_dirty.csv: line 6: column 'ContextTokens': 'x' is not an integer"


@pytest.mark.parametrize("body, expected", [
    ("2023-11-16 18:15:46.6805900,374,44\n" * 5 + "2023-11-16 18:15:47.0,x,1\n",
     "conv.csv: line 7: column 'ContextTokens': 'x' is not an integer"),
    ("2023-11-16 18:15:46.6805900,374,4.5\n",
     "conv.csv: line 2: column 'GeneratedTokens': '4.5' is not an integer"),
    ("2023-11-16 18:15:46.6805900,-3,4\n",
     "conv.csv: line 2: column 'ContextTokens': '-3' is negative"),
    ("2023-11-16 18:15:46.6805900,,4\n",
     "conv.csv: line 2: column 'ContextTokens': missing value"),
    ("2023-11-16 18:15:46.6805900,3\n", "conv.csv: line 2: expected 3 fields, found 2"),
    ("2023-11-16 18:15:46.6805900,3,\n",
     "conv.csv: line 2: column 'GeneratedTokens': missing value"),
    ("2023-11-16 18:15:46.6805900,3,4,5\n", "conv.csv: line 2: expected 3 fields, found 4"),
    ("2023-11-16 18:15:46.6805900,3,4\n2023-11-16 18:15:47.0,3,4,5\n",
     "conv.csv: line 3: expected 3 fields, found 4"),
    ("16/11/2023 18:15,3,4\n",
     "conv.csv: line 2: column 'TIMESTAMP': '16/11/2023 18:15' is not a timestamp like "
     "'2023-11-16 18:15:46.6805900'"),
    ("2023-11-16 18:15:46.6805900,3,4\n2023-11-16 18:15:46.6805899,3,4\n",
     "conv.csv: line 3: column 'TIMESTAMP': time goes backwards (-0.0000001 s after 0 s); "
     "the file must be sorted by time"),
])
def test_azure_malformed_messages(tmp_path, body, expected):
    p = write(tmp_path, "conv.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + body)
    assert error_of("azure", p) == expected


def test_azure_missing_column_and_empty(tmp_path):
    p = write(tmp_path, "conv.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6,3\n")
    assert error_of("azure", p) == ("conv.csv: line 1: missing column 'GeneratedTokens' "
                                    "(header has: TIMESTAMP, ContextTokens)")
    assert error_of("azure", write(tmp_path, "e.csv", "")) == "e.csv: empty file (no header and no rows)"


def test_azure_gzip_and_truncated_gzip(tmp_path):
    raw = (FIX / "azure_conv_small.csv").read_bytes()
    gz = tmp_path / "conv.csv.gz"
    gz.write_bytes(gzip.compress(raw))
    assert len(sources.read("azure", [gz]).trace) == 8
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress(raw * 50)[:-40])
    assert error_of("azure", cut).startswith("cut.csv.gz: truncated gzip stream")
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(b"\x1f\x8b" + b"\x00" * 30)
    assert error_of("azure", bad).startswith("bad.csv.gz: corrupt gzip data")


def test_azure_non_utf8_names_line(tmp_path):
    p = tmp_path / "c.csv"
    p.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,3,4\n\xff\xfe,1,1\n")
    assert error_of("azure", p) == "c.csv: line 3: not valid UTF-8 text"


def test_azure_two_files_concatenate_and_must_stay_sorted(tmp_path):
    a = FIX / "azure_conv_small.csv"
    later = write(tmp_path, "later.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:20:00.0000000,10,10\n")
    both = sources.read("azure", [a, later])
    assert len(both.trace) == 9 and [o["name"] for o in both.origin] == [a.name, "later.csv"]
    assert both.trace.arrival_s[-1] == pytest.approx(253.31941)
    earlier = write(tmp_path, "earlier.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:00:00.0000000,10,10\n")
    assert error_of("azure", [a, earlier]).startswith("earlier.csv: line 2: column 'TIMESTAMP': "
                                                      "time goes backwards")


# --------------------------------------------------------------------------- burstgpt


def test_burstgpt_documented_first_rows():
    res = sources.read("burstgpt", [FIX / "burstgpt_v1.csv"])
    t = res.trace
    assert t.arrival_s[:3].tolist() == [0.0, 40.0, 113.0]  # 5, 45, 118 s from the first kept row
    assert t.input_tokens[:3].tolist() == [472, 1087, 417]
    assert t.output_tokens[:3].tolist() == [18, 230, 276]
    assert t.client_id[:3].tolist() == ["ChatGPT/Conversation log", "ChatGPT/Conversation log",
                                        "GPT-4/Conversation log"]
    assert res.dropped == {"unparsable_row": 0, "failed_response": 2, "zero_input_tokens": 0}
    assert t.client_id[-1] == "GPT-4/API log"


def test_burstgpt_time_origin_is_the_files_own():
    t = sources.read("burstgpt", [FIX / "burstgpt_v1.csv"], start_s=40, duration_s=100).trace
    assert t.arrival_s.tolist() == [5.0, 78.0]  # 45 and 118 relative to 40


def test_burstgpt_v3_header_read_by_name():
    v1 = sources.read("burstgpt", [FIX / "burstgpt_v1.csv"], rows=3).trace
    v3 = sources.read("burstgpt", [FIX / "burstgpt_v3.csv"]).trace
    for col in ("arrival_s", "input_tokens", "output_tokens", "client_id"):
        assert getattr(v1, col).tolist() == getattr(v3, col).tolist()


def test_burstgpt_dirty_file_every_drop_reason():
    res = sources.read("burstgpt", [FIX / "burstgpt_dirty.csv"], bad_rows="drop", max_len=4096)
    assert res.dropped == {"unparsable_row": 3, "failed_response": 2, "zero_input_tokens": 1,
                           "over_max_len": 1}
    assert res.trace.input_tokens.tolist() == [472, 250]
    assert res.trace.client_id.tolist() == ["ChatGPT/Conversation log", "ChatGPT/API log"]


@pytest.mark.parametrize("body, expected", [
    ("5,ChatGPT,472,18,490,Conversation log\n4,ChatGPT,1,1,2,API log\n",
     "b.csv: line 3: column 'Timestamp': time goes backwards (4 s after 5 s); "
     "the file must be sorted by time"),
    ("5,ChatGPT,472,x,490,Conversation log\n",
     "b.csv: line 2: column 'Response tokens': 'x' is not an integer"),
    ("soon,ChatGPT,472,18,490,Conversation log\n",
     "b.csv: line 2: column 'Timestamp': 'soon' is not a finite number"),
    ("-5,ChatGPT,472,18,490,Conversation log\n",
     "b.csv: line 2: column 'Timestamp': '-5' is negative"),
    ("5,,472,18,490,Conversation log\n", "b.csv: line 2: column 'Model': missing value"),
])
def test_burstgpt_malformed_messages(tmp_path, body, expected):
    p = write(tmp_path, "b.csv",
              "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + body)
    assert error_of("burstgpt", p) == expected


def test_burstgpt_missing_column(tmp_path):
    p = write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens\n5,ChatGPT,1,2\n")
    assert error_of("burstgpt", p).startswith("b.csv: line 1: missing column 'Log Type'")


SLICES = MIRROR / "burstgpt-slices"
needs_slices = pytest.mark.skipif(not (SLICES / "BurstGPT_3.first400.csv").is_file(),
                                  reason="BurstGPT slices not in the data mirror")


@needs_slices
def test_burstgpt_mirror_slices_through_the_adapter():
    # BurstGPT_1's slice: 17 zero-token rows (failures), BurstGPT_3's: 1 (slices' README)
    one = sources.read("burstgpt", [SLICES / "BurstGPT_1.first400.csv"])
    three = sources.read("burstgpt", [SLICES / "BurstGPT_3.first400.csv"])
    assert (len(one.trace), one.dropped["failed_response"]) == (383, 17)
    assert (len(three.trace), three.dropped["failed_response"]) == (399, 1)
    rec = burstgpt.read_records([SLICES / "BurstGPT_3.first400.csv"], sessions=True)
    conv = rec.log_type == "Conversation log"
    assert rec.has_sessions and len(set(rec.session[conv])) == 135
    assert all(s is None for s in rec.session[~conv])  # API rows have no session
    assert np.nanmedian(rec.elapsed) == 3 and rec.dropped["failed_response"] == 1
    assert (rec.reason != "").sum() == 1 and rec.kept.sum() == 399


V3_HEAD = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


@pytest.mark.parametrize("body, expected", [
    ("5,ChatGPT,472,18,491,Conversation log\n",
     "b.csv: line 2: column 'Total tokens': 491 is not Request tokens + Response tokens "
     "(472 + 18 = 490)"),
    ("5,ChatGPT,-3,18,15,Conversation log\n",
     "b.csv: line 2: column 'Request tokens': '-3' is negative"),
    ("5,ChatGPT,3,-18,-15,Conversation log\n",
     "b.csv: line 2: column 'Response tokens': '-18' is negative"),
])
def test_burstgpt_token_checks(tmp_path, body, expected):
    p = write(tmp_path, "b.csv",
              "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "4,ChatGPT,1,1,2,API log\n" + body)
    assert error_of("burstgpt", p) == expected.replace("line 2", "line 3")


def test_burstgpt_v3_checks(tmp_path):
    p = write(tmp_path, "b.csv", V3_HEAD + "5,s1,2.5,ChatGPT,10,20,30,Conversation log\n"
              "6,s1,-1,ChatGPT,10,20,30,Conversation log\n")
    assert error_of("burstgpt", p) == "b.csv: line 3: column 'Elapsed time': -1 is negative"
    p = write(tmp_path, "c.csv", "Timestamp,Elapsed time,Model,Request tokens,Response tokens,"
              "Total tokens,Log Type\n5,2.5,ChatGPT,10,20,30,Conversation log\n")
    assert error_of("burstgpt", p).startswith("c.csv: line 1: missing column 'Session ID'")
    v1 = FIX / "burstgpt_v1.csv"
    with pytest.raises(DataError) as info:
        burstgpt.read_records([v1], sessions=True)
    assert str(info.value).startswith("burstgpt_v1.csv: line 1: missing column 'Session ID'")
    rec = burstgpt.read_records([FIX / "burstgpt_v3.csv"], sessions=True)
    assert rec.session.tolist() == ["s-001", "s-001", "s-002"] and rec.elapsed.tolist() == [1.8, 6.2, 12.9]
    rec1 = burstgpt.read_records([v1])
    assert not rec1.has_sessions and rec1.dropped == {"failed_response": 2, "zero_input_tokens": 0}


# --------------------------------------------------------------------------- jsonl


def test_jsonl_mooncake_fixture():
    res = sources.read("jsonl", [FIX / "mooncake_small.jsonl"])
    t = res.trace
    assert t.arrival_s.tolist() == [0.0, 0.0, 1.25, 3.0, 61.0]
    assert t.input_tokens.tolist() == [6955, 6472, 8334, 7590, 512]
    assert t.output_tokens.tolist() == [52, 26, 18, 47, 300]
    assert t.client_id is None
    w = sources.read("jsonl", [FIX / "mooncake_small.jsonl"], start_s=1.0, duration_s=10).trace
    assert w.arrival_s.tolist() == [0.25, 2.0]


def test_jsonl_dirty_every_drop_reason():
    res = sources.read("jsonl", [FIX / "jsonl_dirty.jsonl"], bad_rows="drop", max_len=8192)
    assert res.dropped == {"unparsable_row": 3, "zero_output_tokens": 1, "zero_input_tokens": 1,
                           "over_max_len": 1}
    assert res.trace.arrival_s.tolist() == [0.0, 3.5]


@pytest.mark.parametrize("lines, expected", [
    (['{"timestamp": 1, "input_length": 2, "output_length": 3}', '{"timestamp": 2, "input_le'],
     "t.jsonl: line 2: bad JSON (Unterminated string starting at at column 16)"),
    (['[1, 2, 3]'], "t.jsonl: line 1: expected a JSON object, found list"),
    (['{"timestamp": 1, "output_length": 3}'], "t.jsonl: line 1: missing key 'input_length'"),
    (['{"timestamp": 1, "input_length": "2", "output_length": 3}'],
     "t.jsonl: line 1: key 'input_length': '2' is not an integer"),
    (['{"timestamp": 1, "input_length": 2.5, "output_length": 3}'],
     "t.jsonl: line 1: key 'input_length': 2.5 is not an integer"),
    (['{"timestamp": 1, "input_length": 2, "output_length": -3}'],
     "t.jsonl: line 1: key 'output_length': -3 is negative"),
    (['{"timestamp": null, "input_length": 2, "output_length": 3}'],
     "t.jsonl: line 1: key 'timestamp': None is not a finite number"),
    (['{"timestamp": 5000, "input_length": 2, "output_length": 3}',
      '{"timestamp": 4000, "input_length": 2, "output_length": 3}'],
     "t.jsonl: line 2: key 'timestamp': time goes backwards (-1 s after 0 s); "
     "the file must be sorted by time"),
])
def test_jsonl_malformed_messages(tmp_path, lines, expected):
    p = write(tmp_path, "t.jsonl", "\n".join(lines) + "\n")
    msg = error_of("jsonl", p)
    if "bad JSON" in expected:
        assert msg.startswith("t.jsonl: line 2: bad JSON (")
    else:
        assert msg == expected


def test_jsonl_gzip(tmp_path):
    gz = tmp_path / "m.jsonl.gz"
    gz.write_bytes(gzip.compress((FIX / "mooncake_small.jsonl").read_bytes()))
    assert len(sources.read("jsonl", [gz]).trace) == 5


# --------------------------------------------------------------------------- mooncake (prefix identity)

MOONCAKE = MIRROR / "mooncake-fast25" / "conversation_trace.jsonl"


def test_mooncake_keeps_the_block_ids():
    res = sources.read("mooncake", [FIX / "mooncake_prefix.jsonl"])
    t = res.trace
    assert t.arrival_s.tolist() == [0.0, 0.0, 1.5, 2.25, 61.0]
    assert t.input_tokens.tolist() == [1200, 1024, 1700, 1200, 2100]
    assert res.dropped == {"unparsable_row": 0, "zero_output_tokens": 1, "zero_input_tokens": 0}
    assert t.hash_block_size == 512
    assert [t.hash_ids_of(i).tolist() for i in range(len(t))] == [
        [0, 1, 2], [0, 3], [0, 1, 4, 5], [0, 1, 2], [0, 1, 4, 5, 7]]
    w = sources.read("mooncake", [FIX / "mooncake_prefix.jsonl"], start_s=1.0, duration_s=10).trace
    assert w.arrival_s.tolist() == [0.5, 1.25] and w.hash_ids.tolist() == [0, 1, 4, 5, 0, 1, 2]
    # the jsonl adapter reads the same requests and leaves the ids out
    plain = sources.read("jsonl", [FIX / "mooncake_prefix.jsonl"]).trace
    assert plain.hash_ids is None and plain.input_tokens.tolist() == t.input_tokens.tolist()


def test_mooncake_ids_survive_a_canonical_file(tmp_path):
    from schedport.workload.trace import load_trace, save_trace

    t = sources.read("mooncake", [FIX / "mooncake_prefix.jsonl"]).trace
    for name in ("m.csv", "m.parquet"):
        save_trace(t, tmp_path / name)
        back = load_trace(tmp_path / name)
        assert back.hash_ids.tolist() == t.hash_ids.tolist() and back.hash_block_size == 512
        assert back.content_sha256() == t.content_sha256()


@pytest.mark.parametrize("lines, expected", [
    (['{"timestamp": 0, "input_length": 10, "output_length": 3}'], "t.jsonl: line 1: missing key 'hash_ids'"),
    (['{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": 7}'],
     "t.jsonl: line 1: key 'hash_ids': 7 is not a list of block ids"),
    (['{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [-1]}'],
     "t.jsonl: line 1: key 'hash_ids': element 1 (-1) is not a non-negative integer"),
    (['{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, "1"]}'],
     "t.jsonl: line 1: key 'hash_ids': element 2 ('1') is not a non-negative integer"),
    (['{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [0]}',
      '{"timestamp": 0, "input_length": 1025, "output_length": 3, "hash_ids": [0, 1]}'],
     "t.jsonl: line 2: key 'hash_ids': 2 ids for 1025 input tokens; expected ceil(1025 / 512) = 3"),
    (['{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}', '',
      '{"timestamp": 0, "input_length": 1024, "output_length": 3, "hash_ids": [1, 2]}'],
     "t.jsonl: line 3: key 'hash_ids': id 1 is block 1 here but block 2 on line 1; an id names the whole "
     "prefix up to its block, so it cannot change place or parent"),
    (['{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}',
      '{"timestamp": 1, "input_length": 1024, "output_length": 3, "hash_ids": [5, 1]}'],
     "t.jsonl: line 2: key 'hash_ids': id 1 follows id 5 here but id 0 on line 1; an id names the whole "
     "prefix up to its block, so it cannot change place or parent"),
])
def test_mooncake_malformed_ids(tmp_path, lines, expected):
    p = write(tmp_path, "t.jsonl", "\n".join(lines) + "\n")
    assert error_of("mooncake", p) == expected


def test_mooncake_bad_ids_can_be_dropped_but_a_broken_chain_cannot(tmp_path):
    good = '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}'
    p = write(tmp_path, "t.jsonl", good + '\n{"timestamp": 1, "input_length": 10, "output_length": 3, '
              '"hash_ids": [0, 1]}\n')
    res = sources.read("mooncake", [p], bad_rows="drop")
    assert res.dropped["unparsable_row"] == 1 and res.trace.hash_ids.tolist() == [0, 1]
    q = write(tmp_path, "u.jsonl", '{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1, 0]}\n')
    assert error_of("mooncake", [p, q], bad_rows="drop") == (
        "u.jsonl: line 1: key 'hash_ids': id 1 is block 1 here but block 2 on line 1 of t.jsonl; an id names "
        "the whole prefix up to its block, so it cannot change place or parent")


def _seen_before_share(path: Path) -> tuple[int, float, list[list[int]]]:
    """Requests, share of 512-token blocks whose id appeared in an earlier block, and every id list:
    straight from the JSON, without the adapter."""
    seen: set[int] = set()
    total = hits = 0
    ids = []
    for line in path.read_text().splitlines():
        if line.strip():
            h = json.loads(line)["hash_ids"]
            ids.append(h)
            for x in h:
                total += 1
                hits += x in seen
                seen.add(x)
    return len(ids), hits / total, ids


@pytest.mark.data
@pytest.mark.skipif(not MOONCAKE.is_file(), reason="Mooncake mirror not present")
def test_mooncake_conversation_trace_converts_with_its_prefix_identity(tmp_path):
    from schedport.workload import datadir
    from schedport.workload.trace import load_trace, save_trace

    datadir.verify_sha256(MOONCAKE, datadir.lookup("conversation_trace.jsonl").sha256)
    n, share, ids = _seen_before_share(MOONCAKE)
    assert n == 12_031 and round(100 * share, 1) == 36.6
    res = sources.read("mooncake", [MOONCAKE])
    assert res.n_dropped == 0
    save_trace(res.trace, tmp_path / "m.parquet")
    t = load_trace(tmp_path / "m.parquet")
    assert len(t) == 12_031 and t.hash_block_size == 512
    assert t.hash_ids.tolist() == [x for h in ids for x in h]
    _, first = np.unique(t.hash_ids, return_index=True)
    assert round(100 * (1 - len(first) / len(t.hash_ids)), 1) == 36.6


# --------------------------------------------------------------------------- canonical


def test_canonical_csv_keeps_arrivals_and_clients():
    t = sources.read("canonical", [FIX / "canonical_small.csv"]).trace
    assert t.arrival_s.tolist() == [0.5, 0.5, 1.25, 4.0]
    assert t.client_id.tolist() == ["alice", "bob", None, "alice"]
    w = sources.read("canonical", [FIX / "canonical_small.csv"], start_s=1.0).trace
    assert w.arrival_s.tolist() == [0.25, 3.0]


def test_canonical_parquet_roundtrip_and_errors(tmp_path):
    table = pa.table({"arrival_s": [0.0, 1.5, 2.0], "input_tokens": [10, 20, 30],
                      "output_tokens": [1, 2, 0], "client_id": ["a", None, "c"]})
    p = tmp_path / "w.parquet"
    pq.write_table(table, p)
    res = sources.read("canonical", [p])
    assert res.trace.input_tokens.tolist() == [10, 20]
    assert res.trace.client_id.tolist() == ["a", None]
    assert res.dropped["zero_output_tokens"] == 1
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"arrival_s": [0.0, 1.0], "input_tokens": [1, None],
                             "output_tokens": [1, 1]}), bad)
    assert error_of("canonical", bad) == "bad.parquet: row 2: column 'input_tokens': missing value"
    typed = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"arrival_s": [0.0], "input_tokens": ["10"], "output_tokens": [1]}), typed)
    assert error_of("canonical", typed) == ("typed.parquet: column 'input_tokens' has type string, "
                                            "expected numbers")
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(p.read_bytes()[:-30])
    assert error_of("canonical", cut) == "cut.parquet: truncated Parquet file (no footer)"
    nocol = tmp_path / "nocol.parquet"
    pq.write_table(pa.table({"arrival_s": [0.0], "input_tokens": [1]}), nocol)
    assert error_of("canonical", nocol).startswith("nocol.parquet: missing column 'output_tokens'")


@pytest.mark.parametrize("body, expected", [
    ("0.0,1,1\nnan,1,1\n", "c.csv: line 3: column 'arrival_s': 'nan' is not a finite number"),
    ("1.0,1,1\n0.5,1,1\n", "c.csv: line 3: column 'arrival_s': time goes backwards (0.5 s after "
                           "1 s); the file must be sorted by time"),
    ("-1.0,1,1\n", "c.csv: line 2: column 'arrival_s': '-1.0' is negative"),
])
def test_canonical_malformed_messages(tmp_path, body, expected):
    p = write(tmp_path, "c.csv", "arrival_s,input_tokens,output_tokens\n" + body)
    assert error_of("canonical", p) == expected


# --------------------------------------------------------------------------- servegen


@pytest.fixture(autouse=True)
def _fresh_servegen_cache():
    sg.clear_cache()
    yield
    sg.clear_cache()


def test_servegen_pool_slot_clients_skips_and_origin():
    res = sources.read("servegen", [POOL], slot_start_s=0, seed=3)
    t = res.trace
    assert set(t.client_id) == {"servegen-1", "servegen-2"}
    assert np.all(np.diff(t.arrival_s) >= 0) and t.arrival_s[0] >= 0 and t.arrival_s[-1] < 600
    assert res.skipped == [
        "servegen-3: no dataset file (chunk-3-dataset.json[.gz]), so no length data",
        "servegen-4: no dataset entry with data in chunk-4-dataset.json",
    ]
    names = [o["name"] for o in res.origin]
    assert names == [f"chunk-{i}-trace.csv" for i in range(1, 6)] + [
        "chunk-1-dataset.json", "chunk-2-dataset.json"]
    assert all(len(o["sha256"]) == 64 for o in res.origin)
    # lengths come only from the pdf supports of the chosen timestamp (slot 0 -> entry "0")
    c1 = t.client_id == "servegen-1"
    assert set(t.input_tokens[c1]) <= {100, 200} and set(t.output_tokens[c1]) <= {10, 20}
    assert set(t.input_tokens[~c1]) <= {50, 60} and set(t.output_tokens[~c1]) == {5}
    assert res.dropped == {"zero_output_tokens": 0, "zero_input_tokens": 0}
    assert any("fitted mean" in n for n in res.notes)


def test_servegen_deterministic_and_seed_sensitive():
    a = sources.read("servegen", [POOL], slot_start_s=0, seed=7).trace
    b = sources.read("servegen", [POOL], slot_start_s=0, seed=7).trace
    c = sources.read("servegen", [POOL], slot_start_s=0, seed=8).trace
    for col in ("arrival_s", "input_tokens", "output_tokens", "client_id"):
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))
    assert len(a) != len(c) or not np.array_equal(a.arrival_s, c.arrival_s)


def test_servegen_client_subset_does_not_change_other_clients():
    full = sources.read("servegen", [POOL], slot_start_s=0, seed=5).trace
    only1 = sources.read("servegen", [POOL], slot_start_s=0, seed=5, clients=[1]).trace
    mask = full.client_id == "servegen-1"
    np.testing.assert_array_equal(full.arrival_s[mask], only1.arrival_s)
    np.testing.assert_array_equal(full.input_tokens[mask], only1.input_tokens)
    single = sources.read("servegen", [POOL / "chunk-2-trace.csv"], slot_start_s=0, seed=5).trace
    np.testing.assert_array_equal(full.arrival_s[~mask], single.arrival_s)


def test_servegen_gzip_pool_matches_plain(tmp_path):
    for f in POOL.iterdir():
        (tmp_path / (f.name + ".gz")).write_bytes(gzip.compress(f.read_bytes()))
    a = sources.read("servegen", [POOL], slot_start_s=1800, seed=1).trace
    b = sources.read("servegen", [tmp_path], slot_start_s=1800, seed=1).trace
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.output_tokens, b.output_tokens)


def _one_client_pool(tmp_path: Path, row: str, pdf_in="{100: 1.0}", pdf_out="{10: 1.0}") -> Path:
    d = tmp_path / "pool"
    d.mkdir(exist_ok=True)
    (d / "chunk-9-trace.csv").write_text(f"0,{row}\n600,0,0,,0,0\n")
    (d / "chunk-9-dataset.json").write_text(json.dumps(
        {"0": {"input_tokens": pdf_in, "output_tokens": pdf_out}}))
    return d


@pytest.mark.parametrize("row, cv", [
    ("2.0,3.0,Gamma,0.1111111111111111,4.5", 3.0),   # mean 0.5 = 1/rate
    ("2.0,3.0,Gamma,0.1111111111111111,9.0", 3.0),   # fitted mean 1.0 != 1/rate: rescaled
    ("1.5,1.0,Gamma,1.0,0.6666666666666666", 1.0),   # Poisson
])
def test_servegen_gamma_renewal_rate_and_cv(tmp_path, row, cv):
    pool = _one_client_pool(tmp_path, row)
    counts, gaps = [], []
    for seed in range(40):
        t = sources.read("servegen", [pool], slot_start_s=0, seed=seed).trace.arrival_s
        counts.append(len(t))
        gaps.append(np.diff(t))
    rate = float(row.split(",")[0])
    assert np.mean(counts) == pytest.approx(rate * 600, rel=0.05)  # stationary start: unbiased
    g = np.concatenate(gaps)
    assert g.std() / g.mean() == pytest.approx(cv, rel=0.12)


def test_servegen_weibull_mean_matched_to_rate(tmp_path):
    # Weibull(c=0.6, scale=2.0) has mean 3.0 s, but the window's rate is 1 rps: the scale is
    # rescaled so the mean gap is 1 s, keeping c (CV of Weibull(0.6) ~ 1.76).
    pool = _one_client_pool(tmp_path, "1.0,1.76,Weibull,0.6,2.0")
    res = [sources.read("servegen", [pool], slot_start_s=0, seed=s) for s in range(40)]
    counts = [len(r.trace) for r in res]
    assert np.mean(counts) == pytest.approx(600, rel=0.06)
    g = np.concatenate([np.diff(r.trace.arrival_s) for r in res])
    assert g.std() / g.mean() == pytest.approx(1.76, rel=0.15)
    assert "1 generated client(s) had a fitted mean" in res[0].notes[1]


def test_servegen_rate_scale_keeps_shape(tmp_path):
    pool = _one_client_pool(tmp_path, "10.0,2.0,Gamma,0.25,0.4")
    full = [len(sources.read("servegen", [pool], slot_start_s=0, seed=s).trace) for s in range(20)]
    small = [len(sources.read("servegen", [pool], slot_start_s=0, seed=s, rate_scale=0.1).trace)
             for s in range(20)]
    assert np.mean(full) == pytest.approx(6000, rel=0.05)
    assert np.mean(small) == pytest.approx(600, rel=0.1)


def test_servegen_independent_length_marginals(tmp_path):
    pool = _one_client_pool(tmp_path, "20.0,1.0,Gamma,1.0,0.05",
                            pdf_in="{100: 0.25, 200: 0.75}", pdf_out="{10: 0.6, 20: 0.4}")
    t = sources.read("servegen", [pool], slot_start_s=0, seed=1).trace
    assert len(t) > 10_000
    assert np.mean(t.input_tokens == 100) == pytest.approx(0.25, abs=0.02)
    assert np.mean(t.output_tokens == 10) == pytest.approx(0.6, abs=0.02)
    # independent, not comonotonic: short inputs do get long outputs
    assert np.mean((t.input_tokens == 100) & (t.output_tokens == 20)) == pytest.approx(0.1, abs=0.02)


def test_servegen_length_match_nearest_vs_preceding(tmp_path):
    d = tmp_path / "pool"
    d.mkdir()
    rows = "\n".join(f"{s},1.0,1.0,Gamma,1.0,1.0" for s in range(0, 43800, 600))
    (d / "chunk-1-trace.csv").write_text(rows + "\n")
    (d / "chunk-1-dataset.json").write_text(json.dumps({
        "0": {"input_tokens": "{11: 1.0}", "output_tokens": "{1: 1.0}"},
        "21600": {"input_tokens": "{}", "output_tokens": "{}"},
        "43200": {"input_tokens": "{33: 1.0}", "output_tokens": "{3: 1.0}"},
    }))
    near = sources.read("servegen", [d], slot_start_s=36000, seed=0).trace
    prev = sources.read("servegen", [d], slot_start_s=36000, seed=0, length_match="preceding").trace
    assert set(near.input_tokens) == {33} and set(prev.input_tokens) == {11}
    early = sources.read("servegen", [d], slot_start_s=600, seed=0).trace
    assert set(early.input_tokens) == {11}


def test_servegen_zero_token_pdf_mass_is_dropped_and_counted():
    res = sources.read("servegen", [POOL], slot_start_s=1200, seed=2, max_len=320)
    # client 1 at 1200: output pdf {30: 0.9, 0: 0.1}; input 300 -> 330 > 320 all over max_len
    assert res.dropped["zero_output_tokens"] > 0
    assert res.dropped["over_max_len"] > 0 and len(res.trace) == 0
    res2 = sources.read("servegen", [POOL], slot_start_s=1200, seed=2)
    n = len(res2.trace) + res2.dropped["zero_output_tokens"]
    assert res2.dropped["zero_output_tokens"] / n == pytest.approx(0.1, abs=0.05)
    assert set(res2.trace.output_tokens) == {30}


def test_servegen_selection_errors():
    with pytest.raises(ConfigError, match="slot_start_s is required"):
        sources.read("servegen", [POOL])
    with pytest.raises(ConfigError, match="rate_scale"):
        sources.read("servegen", [POOL], slot_start_s=0, rate_scale=0)
    with pytest.raises(ConfigError, match="longer than the 600 s window"):
        sources.read("servegen", [POOL], slot_start_s=0, duration_s=900)
    with pytest.raises(ConfigError, match="no trace file for client"):
        sources.read("servegen", [POOL], slot_start_s=0, clients=[42])
    with pytest.raises(ConfigError, match="unknown selection"):
        sources.read("servegen", [POOL], slot_start_s=0, rows=10)
    assert error_of("servegen", POOL, slot_start_s=300) == (
        "chunk-1-trace.csv: no window starts at slot_start_s=300 (windows start at 0..1800 every "
        "600 s)")
    short = sources.read("servegen", [POOL], slot_start_s=0, seed=1, duration_s=60).trace
    assert short.arrival_s.max() < 60


def _bad_pool(tmp_path: Path, trace: str | None = None, dataset: str | None = None,
              gz: bool = False) -> Path:
    d = tmp_path / "bad"
    d.mkdir(exist_ok=True)
    tr = trace if trace is not None else "0,1.0,1.0,Gamma,1.0,1.0\n600,0,0,,0,0\n"
    ds = dataset if dataset is not None else json.dumps(
        {"0": {"input_tokens": "{5: 1.0}", "output_tokens": "{5: 1.0}"}})
    if gz:
        (d / "chunk-7-trace.csv.gz").write_bytes(gzip.compress(tr.encode()))
        (d / "chunk-7-dataset.json.gz").write_bytes(gzip.compress(ds.encode()))
    else:
        (d / "chunk-7-trace.csv").write_text(tr)
        (d / "chunk-7-dataset.json").write_text(ds)
    return d


def _pdfs(i: str, o: str = "{5: 1.0}") -> str:
    return json.dumps({"0": {"input_tokens": i, "output_tokens": o}})


@pytest.mark.parametrize("trace, expected", [
    ("0,1.0,1.0,Gamma,1.0,1.0\n600,0,0,Poisson,0,0\n",
     "chunk-7-trace.csv: line 2: column 'pattern': 'Poisson' is not Gamma, Weibull or empty"),
    ("0,1.0,1.0,Gamma,1.0\n", "chunk-7-trace.csv: line 1: expected 6 fields, found 5"),
    ("0,1.0,1.0,Gamma,1.0,1.0,9\n", "chunk-7-trace.csv: line 1: expected 6 fields, found 7"),
    ("0,fast,1.0,Gamma,1.0,1.0\n", "chunk-7-trace.csv: line 1: column 'rate_rps': 'fast' is not a "
                                   "finite number"),
    ("0,1.0,1.0,Gamma,1.0,1.0\n0,1.0,1.0,Gamma,1.0,1.0\n",
     "chunk-7-trace.csv: line 2: column 'window_start_s': 0 does not follow 0 (window starts "
     "must increase)"),
    ("0,0,1.0,Gamma,1.0,1.0\n", "chunk-7-trace.csv: line 1: an active window (Gamma/Weibull) needs "
                                "rate_rps, param1 and param2 > 0"),
    ("0,1.0,-1.0,Gamma,1.0,1.0\n", "chunk-7-trace.csv: line 1: column 'cv': -1.0 is negative"),
])
def test_servegen_malformed_trace_messages(tmp_path, trace, expected):
    assert error_of("servegen", _bad_pool(tmp_path, trace=trace), slot_start_s=0) == expected


@pytest.mark.parametrize("dataset, expected", [
    ('{"0": {"input_tokens": "{5: 1.0}", ', "chunk-7-dataset.json: line 1: bad JSON ("),
    ('{"zero": {}}', "chunk-7-dataset.json: key 'zero': is not an integer window start"),
    ('{"0": {"input_tokens": "{5: 1.0}"}}', "chunk-7-dataset.json: key '0': missing field "
                                            "'output_tokens'"),
    ('{"0": {"input_tokens": {"5": 1.0}, "output_tokens": "{5: 1.0}"}}',
     "chunk-7-dataset.json: key '0' field 'input_tokens': expected a string holding a dict "
     "literal, found dict"),
    (_pdfs("__import__('os').system('echo hacked')"),
     "chunk-7-dataset.json: key '0' field 'input_tokens': not a Python-literal dict (ValueError)"),
    (_pdfs("{5: 0.5, 6: 'half'}"), "chunk-7-dataset.json: key '0' field 'input_tokens': "
                                   "probability 'half' for 6 tokens is not a finite number >= 0"),
    (_pdfs("{5: 1.5, 6: -0.5}"), "chunk-7-dataset.json: key '0' field 'input_tokens': "
                                 "probability -0.5 for 6 tokens is not a finite number >= 0"),
    (_pdfs("{5: 0.5, 6: 0.4}"), "chunk-7-dataset.json: key '0' field 'input_tokens': "
                                "probabilities sum to 0.9, not 1"),
    (_pdfs("{5.5: 1.0}"), "chunk-7-dataset.json: key '0' field 'input_tokens': token count 5.5 "
                          "is not an integer >= 0"),
    (_pdfs("{-5: 1.0}"), "chunk-7-dataset.json: key '0' field 'input_tokens': token count -5 "
                         "is not an integer >= 0"),
    (_pdfs("[5, 1.0]"), "chunk-7-dataset.json: key '0' field 'input_tokens': expected a dict "
                        "{tokens: probability}, found list"),
    (_pdfs("{5: 1.0}", "{5: 1.0"), "chunk-7-dataset.json: key '0' field 'output_tokens': not a "
                                   "Python-literal dict (SyntaxError)"),
])
def test_servegen_malformed_dataset_messages(tmp_path, dataset, expected):
    msg = error_of("servegen", _bad_pool(tmp_path, dataset=dataset), slot_start_s=0)
    assert msg.startswith(expected)


def test_servegen_never_evaluates_pdf_text(tmp_path):
    marker = tmp_path / "pwned"
    pdf = f"open({str(marker)!r}, 'w').write('x') or {{5: 1.0}}"
    with pytest.raises(DataError):
        sources.read("servegen", [_bad_pool(tmp_path, dataset=_pdfs(pdf))], slot_start_s=0)
    assert not marker.exists()


def test_servegen_truncated_gzip(tmp_path):
    d = _bad_pool(tmp_path, gz=True)
    big = json.dumps({str(600 * i): {"input_tokens": "{5: 1.0}", "output_tokens": "{5: 1.0}"}
                      for i in range(200)})
    (d / "chunk-7-dataset.json.gz").write_bytes(gzip.compress(big.encode())[:-50])
    assert error_of("servegen", d, slot_start_s=0).startswith(
        "chunk-7-dataset.json.gz: truncated gzip stream")


def test_servegen_cache_reflects_changed_files(tmp_path):
    d = _bad_pool(tmp_path)
    assert set(sources.read("servegen", [d], slot_start_s=0).trace.input_tokens) == {5}
    # one byte longer: the cache key (path, size, mtime) changes whatever the clock's resolution
    (d / "chunk-7-dataset.json").write_text(_pdfs("{6: 1.0}") + " ")
    assert set(sources.read("servegen", [d], slot_start_s=0).trace.input_tokens) == {6}


def test_servegen_no_trace_files(tmp_path):
    assert "no chunk-<id>-trace.csv[.gz] files found" in error_of("servegen", tmp_path,
                                                                  slot_start_s=0)


# --------------------------------------------------------------------------- real data


@pytest.mark.data
@needs_azure
def test_real_azure_conv_first_three_minutes_and_whole_hour():
    f = AZURE / "AzureLLMInferenceTrace_conv.csv"
    hour = sources.read("azure", [f])
    assert len(hour.trace) == 19366 and hour.n_dropped == 0
    assert hour.trace.input_tokens.mean() == pytest.approx(1155, rel=0.01)
    assert hour.trace.output_tokens.mean() == pytest.approx(211, rel=0.01)
    assert len(hour.trace) / hour.trace.span_s == pytest.approx(5.5, rel=0.05)
    w = sources.read("azure", [f], start_s=0, duration_s=180)
    assert 500 <= len(w.trace) <= 1500
    assert w.trace.arrival_s.max() < 180
    assert 500 < w.trace.input_tokens.mean() < 2500 and 50 < w.trace.output_tokens.mean() < 500
    assert w.origin[0]["sha256"] == (
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8")


@pytest.mark.data
@needs_azure
def test_real_azure_code_is_burstier_with_short_outputs():
    code = sources.read("azure", [AZURE / "AzureLLMInferenceTrace_code.csv"]).trace
    assert len(code) == 8819
    assert code.input_tokens.mean() == pytest.approx(2048, rel=0.01)
    assert code.output_tokens.mean() == pytest.approx(28, rel=0.02)
    counts = np.bincount(code.arrival_s.astype(int))
    assert counts.var() / counts.mean() > 5  # README: index of dispersion ~13


@pytest.mark.data
@needs_servegen
def test_real_servegen_slot_mixes_clients_at_their_summed_rate():
    res = sources.read("servegen", [SERVEGEN], slot_start_s=36000, seed=1)
    skipped = {s.split(":")[0] for s in res.skipped}
    expected = 0.0
    for cid, path in sg._find_trace_files([SERVEGEN]).items():
        ct = sg.load_client_trace(path)
        k = int(np.searchsorted(ct.start, 36000))
        if ct.pattern[k] > 0 and f"servegen-{cid}" not in skipped:
            expected += ct.rate[k] * 600
    assert len(set(res.trace.client_id)) >= 10
    assert len(res.trace) == pytest.approx(expected, rel=0.1)
    assert all("no dataset file" in s or "no dataset entry" in s for s in res.skipped)
    scaled = sources.read("servegen", [SERVEGEN], slot_start_s=36000, seed=1,
                          rate_scale=1000 / expected)
    assert 600 <= len(scaled.trace) <= 1600
    assert scaled.trace.arrival_s.max() < 600


@pytest.mark.data
@needs_servegen
def test_real_servegen_second_slot_reads_no_file(monkeypatch):
    """A second slot of the same pool is served from the parsed files the process keeps: no file
    is read again (the cold and warm times are in benchmarks/bench_io.py)."""
    sg.clear_cache()
    reads = []
    real = sg._read_text
    monkeypatch.setattr(sg, "_read_text", lambda p: reads.append(p) or real(p))
    first = sources.read("servegen", [SERVEGEN], slot_start_s=600000, seed=0)
    n_cold = len(reads)
    again = sources.read("servegen", [SERVEGEN], slot_start_s=600000, seed=1)
    assert n_cold > 0 and len(reads) == n_cold
    assert len(first.trace) > 0 and len(again.trace) > 0


@pytest.mark.data
@needs_servegen
def test_real_servegen_copy_with_a_missing_dataset_lists_it(tmp_path):
    sg.clear_cache()
    for cid in (0, 1, 2):
        for kind in ("trace.csv.gz", "dataset.json.gz"):
            src = SERVEGEN / f"chunk-{cid}-{kind}"
            if src.exists():
                shutil.copy(src, tmp_path / src.name)
    (tmp_path / "chunk-0-dataset.json.gz").unlink()  # client 0 is active in the first slot
    res = sources.read("servegen", [tmp_path], slot_start_s=0, seed=0)
    assert "servegen-0: no dataset file (chunk-0-dataset.json[.gz]), so no length data" in res.skipped
    assert "servegen-0" not in set(res.trace.client_id)


# --------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5), st.integers(0, 5)),
                     min_size=1, max_size=40),
       start=st.none() | st.integers(0, 120), dur=st.none() | st.integers(1, 80),
       n=st.none() | st.integers(1, 10), max_len=st.none() | st.integers(1, 10))
def test_window_selection_invariants(tmp_path_factory, rows, start, dur, n, max_len):
    if dur is not None and n is not None:
        n = None
    gaps = np.cumsum([r[0] for r in rows])
    body = "".join(f"{t},{i},{o}\n" for t, (_, i, o) in zip(gaps, rows))
    p = tmp_path_factory.mktemp("c") / "c.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n" + body)
    res = sources.read("canonical", [p], start_s=start, duration_s=dur, rows=n, max_len=max_len)
    t = res.trace
    assert np.all(np.diff(t.arrival_s) >= 0)
    assert np.all(t.input_tokens >= 1) and np.all(t.output_tokens >= 1)
    if max_len is not None:
        assert np.all(t.input_tokens + t.output_tokens <= max_len)
    lo = 0 if start is None else start
    if start is not None:
        assert np.all(t.arrival_s >= 0)
    if dur is not None:
        assert np.all(t.arrival_s + (0 if start is None else start) < lo + dur)
    if n is not None:
        assert len(t) <= n
    # kept + dropped = the rows the window covered (all rows when no bound is given)
    if start is None and dur is None and n is None:
        assert len(t) + res.n_dropped == len(rows)


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.integers(0, 10**6), st.floats(0.001, 1.0), min_size=1, max_size=30))
def test_pdf_parse_matches_the_literal(tmp_path_factory, weights):
    total = sum(weights.values())
    pdf = {k: v / total for k, v in weights.items()}
    if abs(sum(pdf.values()) - 1.0) > 1e-9:
        return
    toks, cdf = sg.parse_pdf(repr(pdf), "key '0' field 'input_tokens'", Path("x.json"))
    assert toks.tolist() == sorted(pdf)
    assert np.all(np.diff(cdf) >= 0) and cdf[-1] == 1.0
    probs = np.diff(np.r_[0.0, cdf])
    np.testing.assert_allclose(probs, [pdf[k] for k in sorted(pdf)], atol=1e-12)


def test_tabular_cache_sees_a_rewritten_file(tmp_path):
    p = write(tmp_path, "c.csv", "arrival_s,input_tokens,output_tokens\n0.0,1,1\n")
    assert len(sources.read("canonical", [p]).trace) == 1
    p.write_text("arrival_s,input_tokens,output_tokens\n0.0,1,1\n1.0,2,2\n")
    assert len(sources.read("canonical", [p]).trace) == 2


def test_mooncake_rows_of_equal_id_counts(tmp_path):
    p = write(tmp_path, "eq.jsonl", "".join(
        f'{{"timestamp": {k}, "input_length": 1000, "output_length": 3, "hash_ids": [0, {k + 1}]}}\n'
        for k in range(3)))
    assert sources.read("mooncake", [p]).trace.hash_ids.tolist() == [0, 1, 0, 2, 0, 3]


def test_canonical_adapter_keeps_hash_ids(tmp_path):
    from schedport.workload.trace import save_trace

    t = sources.read("mooncake", [FIX / "mooncake_prefix.jsonl"]).trace
    for name in ("k.csv", "k.parquet"):
        save_trace(t, tmp_path / name)
        back = sources.read("canonical", [tmp_path / name]).trace
        assert back.hash_block_size == 512 and back.content_sha256() == t.content_sha256()
    w = sources.read("canonical", [tmp_path / "k.csv"], start_s=1.0, duration_s=10).trace
    assert w.hash_ids.tolist() == [0, 1, 4, 5, 0, 1, 2]
    bad = write(tmp_path, "b.csv", "arrival_s,input_tokens,output_tokens,hash_ids@512\n0,600,1,0 1\n1,600,1,0\n")
    assert error_of("canonical", bad) == ("b.csv: line 3: column 'hash_ids@512': 1 ids for 600 input tokens; "
                                          "expected ceil(600 / 512) = 2")
    plain = write(tmp_path, "p.csv", "arrival_s,input_tokens,output_tokens\n20,5,1\n")
    assert error_of("canonical", [tmp_path / "k.csv", plain]) == (
        "p.csv: has no hash_ids column but k.csv has hash_ids@512; files read together must carry the same "
        "prefix identity")
    other = write(tmp_path, "o.csv", "arrival_s,input_tokens,output_tokens,hash_ids@512\n99,600,1,1 0\n")
    assert error_of("canonical", [tmp_path / "k.csv", other]).startswith(
        "o.csv: line 2: column 'hash_ids@512': id 1 is block 1 here but block 2 on line 2 of k.csv")
