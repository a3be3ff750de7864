"""Prefix identity derived from BurstGPT's sessions (issue 62, item 3, "Sessions without hashes").

The rule (docs/corpus.md, "Prefix identity from sessions"): each turn's prompt is assumed to be the
previous turn's prompt and reply plus new tokens, in blocks of 16 tokens. A turn inherits the ids of
the previous turn's full prompt blocks; every other block of it gets a fresh id. A turn whose prompt
is shorter than the previous prompt + reply contradicts the assumption: it is counted and shares
nothing. The expected ids below are written out by hand from the fixture's token counts.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from schedport.errors import ConfigError, DataError
from schedport.workload import sources
from schedport.workload.trace import load_trace, save_trace
from _paths import FIXTURES, MIRROR

FIX = FIXTURES / "sources"
SESSIONS = FIX / "burstgpt_sessions.csv"
SLICE = MIRROR / "burstgpt-slices" / "BurstGPT_3.first400.csv"

# The fixture's kept rows (the failed row at t=25 is dropped and is not a turn), with their ids.
# Blocks of 16 tokens; ceil(prompt / 16) ids per request; fresh ids are numbered in row order.
#   t=10 sess-a  p=20 r=20  first turn                                 -> [0, 1]
#   t=12 (none)  p=10 r=5   no session                                 -> [2]
#   t=15 sess-b  p=40 r=10  first turn                                 -> [3, 4, 5]
#   t=20 sess-a  p=45 r=8   45 >= 20+20: inherits floor(20/16)=1 block -> [0, 6, 7]
#   t=30 sess-b  p=30 r=12  30 <  40+10: CONTRADICTS, shares nothing   -> [8, 9]
#   t=35 sess-a  p=70 r=3   70 >= 45+8 (the failed row is skipped): inherits floor(45/16)=2 -> [0, 6, 10, 11, 12]
#   t=40 sess-b  p=48 r=4   48 >= 30+12: inherits floor(30/16)=1 block -> [8, 13, 14]
#   t=45 sess-a  p=73 r=10  73 >= 70+3 (equal is consistent): inherits floor(70/16)=4 -> [0, 6, 10, 11, 15]
EXPECTED_IDS = [[0, 1], [2], [3, 4, 5], [0, 6, 7], [8, 9], [0, 6, 10, 11, 12], [8, 13, 14], [0, 6, 10, 11, 15]]
EXPECTED_RECORD = {
    "derived_from": "sessions", "assumed": True, "block_tokens": 16,
    "requests": 8, "in_sessions": 7, "later_turns": 5, "contradicting": 1,
    "in_sessions_share": 0.875, "contradicting_share": 0.125,
    "shared_blocks": 8, "blocks": 24, "shared_block_share": 0.333333,
}


def error_of(path, **kw) -> str:
    with pytest.raises((DataError, ConfigError)) as info:
        sources.read("burstgpt", path if isinstance(path, list) else [path], **kw)
    msg = str(info.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_fixture_ids_are_the_hand_derived_ones():
    res = sources.read("burstgpt", [SESSIONS], prefix="sessions")
    t = res.trace
    assert t.input_tokens.tolist() == [20, 10, 40, 45, 30, 70, 48, 73]
    assert res.dropped["failed_response"] == 1
    assert t.hash_block_size == 16
    assert [t.hash_ids_of(i).tolist() for i in range(len(t))] == EXPECTED_IDS
    rec = res.prefix
    assert {k: rec[k] for k in EXPECTED_RECORD} == EXPECTED_RECORD
    assert rec["assumption"].startswith("each turn's prompt is the previous turn's prompt and reply")
    assert rec["origin"] == res.origin


def test_without_the_option_nothing_changes():
    plain = sources.read("burstgpt", [SESSIONS])
    assert plain.trace.hash_ids is None and plain.prefix is None
    derived = sources.read("burstgpt", [SESSIONS], prefix="sessions").trace
    assert plain.trace.input_tokens.tolist() == derived.input_tokens.tolist()
    assert plain.trace.content_sha256() != derived.content_sha256()
    assert sources.read("burstgpt", [SESSIONS], prefix="none").trace.content_sha256() == plain.trace.content_sha256()


def test_a_window_keeps_the_ids_derived_over_the_whole_file():
    """Sessions are followed over every row of the file, so a window's turns keep the ids that
    their earlier turns, before the window, gave them; the record counts the whole file."""
    res = sources.read("burstgpt", [SESSIONS], prefix="sessions", start_s=30, duration_s=12)
    t = res.trace
    assert t.input_tokens.tolist() == [30, 70, 48]
    assert [t.hash_ids_of(i).tolist() for i in range(len(t))] == [EXPECTED_IDS[4], EXPECTED_IDS[5], EXPECTED_IDS[6]]
    assert res.prefix["requests"] == 8 and res.prefix["contradicting"] == 1


def test_the_derived_ids_are_a_consistent_chain_and_survive_a_canonical_file(tmp_path):
    from schedport.workload.prefix import engine_block_keys

    t = sources.read("burstgpt", [SESSIONS], prefix="sessions").trace
    for name in ("s.csv", "s.parquet"):
        save_trace(t, tmp_path / name)
        back = load_trace(tmp_path / name)   # load_trace checks the chain
        assert back.hash_ids.tolist() == t.hash_ids.tolist() and back.hash_block_size == 16
        assert back.content_sha256() == t.content_sha256()
    # at 16 tokens an id is one engine block: the turn at t=35 has 4 full engine blocks
    assert engine_block_keys(t, 5) == [(0, 0, 16), (6, 0, 16), (10, 0, 16), (11, 0, 16)]


def test_the_derivation_is_deterministic():
    a = sources.read("burstgpt", [SESSIONS], prefix="sessions")
    sources.clear_cache()
    b = sources.read("burstgpt", [SESSIONS], prefix="sessions")
    assert a.trace.content_sha256() == b.trace.content_sha256() and a.prefix == b.prefix


def test_sessions_continue_across_files_read_together(tmp_path):
    lines = SESSIONS.read_text().splitlines()
    first = tmp_path / "one.csv"
    second = tmp_path / "two.csv"
    first.write_text("\n".join(lines[:5]) + "\n")
    second.write_text("\n".join([lines[0], *lines[5:]]) + "\n")
    t = sources.read("burstgpt", [first, second], prefix="sessions").trace
    assert [t.hash_ids_of(i).tolist() for i in range(len(t))] == EXPECTED_IDS


# --------------------------------------------------------------------------- the mirror's slice


def _independent_counts(path: Path) -> dict:
    """Straight from the CSV with the csv module, not the adapter: kept rows (non-zero tokens), rows
    with a session, turns with an earlier kept turn, those whose prompt is shorter than the earlier
    turn's prompt + reply, and the blocks of 16 tokens the rule shares."""
    last: dict[str, tuple[int, int]] = {}
    n = in_s = later = contra = shared = blocks = 0
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            p, r = int(row["Request tokens"]), int(row["Response tokens"])
            if p == 0 or r == 0:
                continue
            n += 1
            blocks += -(-p // 16)
            s = row["Session ID"].strip()
            if not s:
                continue
            in_s += 1
            if s in last:
                later += 1
                pp, pr = last[s]
                if p < pp + pr:
                    contra += 1
                else:
                    shared += pp // 16
            last[s] = (p, r)
    return {"requests": n, "in_sessions": in_s, "later_turns": later, "contradicting": contra,
            "shared_blocks": shared, "blocks": blocks}


@pytest.mark.skipif(not SLICE.is_file(), reason="BurstGPT slices not in the mirror")
def test_the_slice_contradiction_share_is_the_independent_count():
    res = sources.read("burstgpt", [SLICE], prefix="sessions")
    want = _independent_counts(SLICE)
    rec = res.prefix
    assert {k: rec[k] for k in want} == want
    assert rec["contradicting_share"] == round(want["contradicting"] / want["requests"], 6)
    assert rec["in_sessions_share"] == round(want["in_sessions"] / want["requests"], 6)
    # the figures docs/corpus.md quotes
    assert (want["requests"], want["in_sessions"], want["later_turns"], want["contradicting"]) == (399, 393, 259, 71)
    t = res.trace
    assert len(t) == 399 and t.hash_block_size == 16
    assert sum(len(t.hash_ids_of(i)) for i in range(len(t))) == want["blocks"]
    # ids seen before = the shared blocks, and nothing else (fresh ids are never reused by chance)
    seen: set[int] = set()
    again = 0
    for x in t.hash_ids.tolist():
        again += x in seen
        seen.add(x)
    assert again == want["shared_blocks"]


# --------------------------------------------------------------------------- bad input


def test_a_file_without_session_ids_is_one_line_when_sessions_are_asked():
    assert error_of(FIX / "burstgpt_v1.csv", prefix="sessions") == (
        "burstgpt_v1.csv: line 1: missing column 'Session ID' (prefix = \"sessions\" derives the prefix "
        "identity from sessions: BurstGPT_3's layout)")
    # without the option the same file reads as before
    assert len(sources.read("burstgpt", [FIX / "burstgpt_v1.csv"]).trace) > 0


@pytest.mark.parametrize("value", ["session", "hashes", 1, True])
def test_an_unknown_prefix_option_is_one_line(value):
    assert error_of(SESSIONS, prefix=value) == (
        f"burstgpt: prefix must be \"sessions\" or \"none\", not {value!r}")


@pytest.mark.parametrize("cell, why", [
    ("sess a", "'sess a' is not a session id (one word of printable characters, no spaces)"),
    ("sess\u00a0a", "'sess\\xa0a' is not a session id (one word of printable characters, no spaces)"),
])
def test_a_malformed_session_id_names_file_line_and_column(tmp_path, cell, why):
    lines = SESSIONS.read_text().splitlines()
    lines[4] = lines[4].replace("sess-a", cell)
    p = tmp_path / "bad.csv"
    p.write_text("\n".join(lines) + "\n")
    assert error_of(p, prefix="sessions") == f"bad.csv: line 5: column 'Session ID': {why}"
    # dropped as an unparsable row when asked, and the session goes on without it
    res = sources.read("burstgpt", [p], prefix="sessions", bad_rows="drop")
    assert res.dropped["unparsable_row"] == 1 and len(res.trace) == 7
    # without sessions the column is not read
    assert len(sources.read("burstgpt", [p]).trace) == 8


def test_other_adapters_do_not_take_the_option():
    with pytest.raises(ConfigError, match="unknown selection option"):
        sources.read("azure", [FIX / "azure_conv_small.csv"], prefix="sessions")


# --------------------------------------------------------------------------- command line


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=600)


def _error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode != 0 and "Traceback" not in p.stderr + p.stdout, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("reading ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


def test_convert_with_prefix_sessions_writes_the_ids_and_says_they_are_assumed(tmp_path):
    out = tmp_path / "t.csv"
    p = cli("trace", "convert", "--from", "burstgpt", SESSIONS, "--prefix", "sessions", "--out", out)
    assert p.returncode == 0, p.stderr
    said = " ".join(p.stdout.split())
    assert "prefix identity derived from sessions (assumed): each turn's prompt is the previous" in said
    assert "7 of 8 requests in the files are in sessions; 1 of 8 requests (12.5%) contradict it" in said
    t = load_trace(out)
    assert [t.hash_ids_of(i).tolist() for i in range(len(t))] == EXPECTED_IDS
    assert out.read_text().splitlines()[0] == "arrival_s,input_tokens,output_tokens,client_id,hash_ids@16"
    r = cli("simulate", "--trace", out, "--scheduler", "vllm-fcfs", "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr   # simulate reads the derived ids


def test_convert_prefix_bad_input_is_one_line(tmp_path):
    out = tmp_path / "t.csv"
    assert _error_line(cli("trace", "convert", "--from", "burstgpt", FIX / "burstgpt_v1.csv", "--prefix",
                           "sessions", "--out", out)) == (
        "error: burstgpt_v1.csv: line 1: missing column 'Session ID' (prefix = \"sessions\" derives the prefix "
        "identity from sessions: BurstGPT_3's layout)")
    assert _error_line(cli("trace", "convert", "--from", "azure", FIX / "azure_conv_small.csv", "--prefix",
                           "sessions", "--out", out)) == (
        "error: --prefix sessions needs --from burstgpt (a source with session ids), not azure")
    assert _error_line(cli("trace", "convert", "--from", "burstgpt", SESSIONS, "--prefix", "session",
                           "--out", out)) == "error: burstgpt: prefix must be \"sessions\" or \"none\", not 'session'"
    assert not out.exists()


# --------------------------------------------------------------------------- corpus manifest and report

SPEC = """
name = "sess"
[[sources]]
name = "chats"
adapter = "burstgpt"
cite = "BurstGPT_3 (Wang et al., KDD 2025)"
files = ["burstgpt_sessions.csv"]
options = { prefix = "sessions" }
windows = { rule = "contiguous", count = 2, duration_s = 20 }
"""


@pytest.fixture()
def corpus(tmp_path, monkeypatch):
    from schedport.workload import corpus as cp
    from schedport.workload import datadir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(datadir, "_fetch", lambda url, dest: (_ for _ in ()).throw(OSError("offline (test)")))
    (tmp_path / "burstgpt_sessions.csv").write_bytes(SESSIONS.read_bytes())
    (tmp_path / "s.toml").write_text(SPEC)
    return cp.build_corpus(tmp_path / "s.toml", tmp_path / "nodata", tmp_path / "c"), tmp_path / "c"


def test_the_manifest_labels_the_prefix_identity_an_assumption(corpus):
    from schedport.workload import corpus as cp

    c, path = corpus
    assert cp.verify_corpus(path) == []
    src = c.manifest["sources"]["chats"]["prefix"]
    assert {k: src[k] for k in EXPECTED_RECORD} == EXPECTED_RECORD
    for w in c.windows:
        assert w.meta["prefix"] == src
        t = c.trace(w.window_id)
        assert t.hash_block_size == 16
    w1 = c.trace(c.windows[1].window_id)   # [20, 40) s: the turns at 20, 30 and 35 (25 failed)
    # (a prefix-bearing source's window starts with the requests before it as a warm-up)
    assert [w1.hash_ids_of(i).tolist() for i in range(w1.warmup, len(w1))] == EXPECTED_IDS[3:6]


def test_the_report_lists_the_source_with_its_assumed_prefix_identity(corpus):
    from schedport.analysis.provenance import source_info
    from schedport.analysis.store_loading import load_workload

    c, path = corpus
    wl = load_workload(path)
    info = source_info("chats", wl["corpus_sources"])
    assert info["prefix"] == {"derived_from": "sessions", "assumed": True, "block_tokens": 16,
                              "requests": 8, "contradicting": 1, "contradicting_share": 0.125}
    assert ("Prefix identity derived from sessions (assumed: each turn's prompt is the previous turn's prompt "
            "and reply plus new tokens; 1 of 8 requests, 12.5%, contradict it).") in info["note"]
    # a source without it says nothing of the kind
    assert "prefix" not in source_info("azure", {"azure": {"adapter": "azure"}})
    assert json.dumps(info)   # goes into portability.json as it is


def test_the_report_page_shows_the_label_in_its_data_sources(corpus):
    from schedport.analysis.provenance import provenance
    from schedport.analysis.store_loading import load_workload
    from schedport.report.html import _provenance

    c, path = corpus
    prov = provenance({"corpus_sha256": c.corpus_sha256}, ["chats"], None, load_workload(path)["corpus_sources"])
    page = " ".join(_provenance({"provenance": prov}).split())
    assert ("<b>chats</b>: chats. License: unknown (see the citation). Cite: BurstGPT_3 (Wang et al., KDD 2025). "
            "a source of the corpus&#x27;s own spec, cited as the spec cites it. Prefix identity derived from sessions "
            "(assumed: each turn&#x27;s prompt is the previous turn&#x27;s prompt and reply plus new tokens; 1 of 8 "
            "requests, 12.5%, contradict it).") in page
