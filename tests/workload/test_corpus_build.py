"""Tests for schedport.workload.corpus and the modeled BurstGPT source: spec rules, atomic builds,
verification of every kind of tampering, the CLI, and (marked `data`) the full 120-window
study corpus built from the mirror."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from schedport.cli.corpus import corpus_app
from schedport.workload import corpus as cp
from schedport.workload import corpus_expected
from schedport.workload.datadir import resolve_data_dir
from schedport.errors import ConfigError, DataError
from schedport.workload.sources import burstgpt_model as bm
from _cli import cli, error_line
from _paths import MIRROR as SHARED_MIRROR

MIRROR = resolve_data_dir(None)
HAVE_MIRROR = all((MIRROR / rel).is_file() for rel in (
    "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv",
    "azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv",
    "servegen-language-m-large/chunk-0-trace.csv.gz"))
needs_mirror = pytest.mark.skipif(not HAVE_MIRROR, reason="public data mirror not present")


@pytest.fixture(autouse=True)
def _no_network_no_cache(monkeypatch, tmp_path_factory):
    """Isolate the user cache and make any download attempt fail like an offline machine."""
    from schedport.workload import datadir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))

    def offline(url, dest):
        raise OSError("network is unreachable (test)")

    monkeypatch.setattr(datadir, "_fetch", offline)


def one_line(exc: BaseException) -> str:
    msg = str(exc)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def write_jsonl(path: Path, n: int = 300, seed: int = 0, gap_ms: int = 200) -> Path:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.integers(1, 2 * gap_ms, n))
    with open(path, "w") as f:
        for ts in t:
            f.write(json.dumps({"timestamp": int(ts), "input_length": int(rng.integers(1, 3000)),
                                "output_length": int(rng.integers(1, 500)), "hash_ids": [1]}) + "\n")
    return path


def write_spec(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


JSONL_SPEC = """
name = "mine"
[[sources]]
name = "mine"
adapter = "jsonl"
files = ["my-trace.jsonl"]
windows = { rule = "contiguous", count = 4, duration_s = 10 }
"""


# =========================================================================== rules


def test_stratified_start_covers_days_blocks_and_hours():
    starts = [cp.stratified_start(k, 40, 14) for k in range(40)]
    days = [d for d, _ in starts]
    hours = [h for _, h in starts]
    assert days == sorted(days) and days[0] == 0 and days[-1] == 13
    assert set(days) == set(range(14))  # every day, 2-3 windows each
    assert sorted({h // 3: sum(1 for x in hours if x // 3 == h // 3) for h in hours}.values()) == [5] * 8
    assert set(hours) == set(range(24))
    assert [h // 3 for h in hours[:8]] == [0, 3, 6, 1, 4, 7, 2, 5]
    assert len(set(starts)) == 40


def test_tile_windows_are_contiguous_and_cover_the_span():
    starts, length = cp.tile_windows(0.0, 3435.948056, 20)
    assert len(starts) == 20 and starts[0] == 0.0
    assert all(abs((b - a) - length) < 1e-6 for a, b in zip(starts, starts[1:]))
    assert starts[-1] + length > 3435.948056
    assert 171 < length < 172


def test_derive_seed_is_stable():
    assert cp.derive_seed(20250514, 36000) == cp.derive_seed(20250514, 36000)
    assert cp.derive_seed(20250514, 36000) != cp.derive_seed(20250514, 36600)
    assert 0 <= cp.derive_seed(1, 2) < 2**31


# =========================================================================== modeled BurstGPT


def test_modeled_burstgpt_is_deterministic_labeled_and_a_cut_of_one_trace():
    a = bm.generate(start_s=10 * 86400 + 15 * 3600, rows=500, seed=3)
    b = bm.generate(start_s=10 * 86400 + 15 * 3600, rows=500, seed=3)
    assert a.trace.content_sha256() == b.trace.content_sha256()
    assert len(a.trace) == 500 and a.trace.arrival_s[0] >= 0
    assert a.dropped["failed_response"] >= 0 and a.skipped == []
    assert "not the real BurstGPT" in a.notes[0] and bm.LABEL in a.notes[0]
    assert a.origin[0]["sha256"] == bm.params_sha256()
    longer = bm.generate(start_s=10 * 86400 + 15 * 3600, rows=800, seed=3)
    assert np.array_equal(longer.trace.arrival_s[:500], a.trace.arrival_s)  # same virtual trace
    other = bm.generate(start_s=10 * 86400 + 15 * 3600, rows=500, seed=4)
    assert other.trace.content_sha256() != a.trace.content_sha256()
    assert set(a.trace.client_id) <= {s["client_id"] for s in bm.DEFAULT_PARAMS["streams"]}


def test_modeled_burstgpt_follows_the_published_shapes():
    res = [bm.generate(start_s=d * 86400 + h * 3600, rows=1000, seed=11)
           for d, h in ((1, 10), (2, 15), (3, 3), (8, 20))]
    cid = np.concatenate([r.trace.client_id for r in res])
    out = np.concatenate([r.trace.output_tokens for r in res])
    inp = np.concatenate([r.trace.input_tokens for r in res])
    conv = np.array(["Conversation" in c for c in cid])
    assert 0.02 < conv.mean() < 0.4  # API dominates (~0.24 of ~0.27 req/s)
    assert np.median(out[conv]) > 3 * np.median(out[~conv])  # API answers are short
    assert 350 < inp.mean() < 900 and inp.min() >= 1 and out.min() >= 1
    failed = sum(r.dropped["failed_response"] for r in res)
    assert 0.005 < failed / (failed + 4000) < 0.04  # ~1.8 %
    for r in res:  # rate ~0.27 req/s on average: 1,000 requests take a while
        assert 300 < r.trace.arrival_s[-1] < 40 * 3600


def test_modeled_burstgpt_rejects_bad_selection():
    with pytest.raises(ConfigError, match="unknown selection option"):
        bm.generate(slot_start_s=0)
    with pytest.raises(ConfigError, match="rows must be an integer"):
        bm.generate(rows=0)


# =========================================================================== spec


@pytest.mark.parametrize("body, msg", [
    ("[[sources]]\nname='x'\nadapter='jsonl'\nfiles=['a']\nwindows={rule='nope', count=1}\n",
     "windows.rule must be one of"),
    ("[[sources]]\nname='x'\nadapter='jsonl'\nfiles=['a']\n", "windows is missing"),
    ("[[sources]]\nname='X y'\nadapter='jsonl'\nfiles=['a']\nwindows={rule='tile', count=2}\n",
     "name must be lower-case"),
    ("[[sources]]\nname='x'\nadapter='csv'\nfiles=['a']\nwindows={rule='tile', count=2}\n",
     "adapter must be one of"),
    ("[[sources]]\nname='x'\nadapter='servegen'\nseed=1\nfiles=['a/']\n"
     "windows={rule='stratified', count=2, days=2}\n", "exactly one of target_requests"),
    ("[[sources]]\nname='burstgpt-modeled'\nadapter='burstgpt-modeled'\n"
     "windows={rule='stratified', count=2, days=2, rows=10}\n", "needs a seed"),
    ("[[sources]]\nname='fake'\nadapter='burstgpt-modeled'\nseed=1\n"
     "windows={rule='stratified', count=2, days=2, rows=10}\n", "must be named 'burstgpt-modeled"),
    ("[[sources]]\nname='x'\nadapter='jsonl'\nfiles=['a']\nwindows={rule='tile', count=2, rows=3}\n",
     "unknown key(s) rows"),
    ("colour = 1\n", "unknown key(s) colour"),
    ("[[sources]\n", "malformed TOML"),
])
def test_spec_errors_are_one_line(tmp_path, body, msg):
    spec = write_spec(tmp_path / "s.toml", body)
    with pytest.raises(ConfigError) as info:
        cp.build_corpus(spec, tmp_path, tmp_path / "out")
    assert msg in one_line(info.value) and "s.toml" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_extends_default_appends_a_users_source(tmp_path):
    spec = write_spec(tmp_path / "s.toml", 'extends = "default"\n' + JSONL_SPEC.replace('name = "mine"\n[[', '[[', 1))
    raw, spec_dir = cp.load_spec(spec)
    assert [s["name"] for s in raw["sources"]] == ["azure", "bailian", "burstgpt", "mine"]
    assert spec_dir == tmp_path


# =========================================================================== building


def test_user_jsonl_spec_builds_verifies_and_lists(tmp_path):
    write_jsonl(tmp_path / "my-trace.jsonl")
    spec = write_spec(tmp_path / "mine.toml", JSONL_SPEC)
    corpus = cp.build_corpus(spec, tmp_path / "nodata", tmp_path / "c")
    assert [w.window_id for w in corpus.windows] == [f"mine-{k:02d}" for k in range(4)]
    e = corpus.windows[1].meta
    assert e["selection"] == {"start_s": 10, "duration_s": 10} and e["origin_file"] == "my-trace.jsonl"
    assert e["origin_sha256"] == cp.file_sha256(tmp_path / "my-trace.jsonl")
    assert e["duration_s"] == 10.0 and e["mean_rate_rps"] == e["n_requests"] / 10
    for k in ("input_mean", "input_p50", "input_p99", "output_mean", "output_p50", "output_p99",
              "index_of_dispersion", "dropped", "seed", "code_version"):
        assert k in e or k in corpus.manifest
    assert corpus.reproduction["status"] == "none"
    assert cp.verify_corpus(tmp_path / "c") == []
    t = corpus.trace("mine-02")
    assert t.content_sha256() == corpus.windows[2].sha256 and t.arrival_s.max() < 10
    assert [w.window_id for w in corpus.select(n_per_source=2)] == ["mine-00", "mine-01"]
    with pytest.raises(ConfigError, match="unknown source"):
        corpus.select(["azure"])
    assert not list(tmp_path.glob(".c.*"))  # no temp dirs left behind


def test_rebuild_replaces_atomically_and_a_failure_leaves_the_old_corpus(tmp_path):
    write_jsonl(tmp_path / "my-trace.jsonl")
    spec = write_spec(tmp_path / "mine.toml", JSONL_SPEC)
    cp.build_corpus(spec, tmp_path, tmp_path / "c")
    before = (tmp_path / "c" / "manifest.json").read_bytes()
    cp.build_corpus(spec, tmp_path, tmp_path / "c")  # rebuild: byte-identical
    assert (tmp_path / "c" / "manifest.json").read_bytes() == before
    bad = write_spec(tmp_path / "bad.toml", JSONL_SPEC.replace("count = 4", "count = 400"))
    with pytest.raises(DataError, match="no requests in this window"):
        cp.build_corpus(bad, tmp_path, tmp_path / "c")
    assert (tmp_path / "c" / "manifest.json").read_bytes() == before
    assert cp.verify_corpus(tmp_path / "c") == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_refuses_to_overwrite_a_directory_that_is_not_a_corpus(tmp_path):
    write_jsonl(tmp_path / "my-trace.jsonl")
    spec = write_spec(tmp_path / "mine.toml", JSONL_SPEC)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "precious.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="refusing to replace"):
        cp.build_corpus(spec, tmp_path, tmp_path / "c")
    assert (tmp_path / "c" / "precious.txt").read_text() == "keep me"


def test_missing_public_file_offline_is_one_line_naming_file_url_and_place(tmp_path):
    spec = write_spec(tmp_path / "s.toml", """
[[sources]]
name = "azure"
adapter = "azure"
files = ["azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv"]
windows = { rule = "tile", count = 2 }
""")
    with pytest.raises(DataError) as info:
        cp.build_corpus(spec, tmp_path / "empty", tmp_path / "c")
    msg = one_line(info.value)
    assert "AzureLLMInferenceTrace_code.csv" in msg
    assert "https://raw.githubusercontent.com/Azure/AzurePublicDataset" in msg
    assert str(tmp_path / "empty" / "azure-llm-inference-2023") in msg
    assert not (tmp_path / "c").exists()


def _synthetic_burstgpt_csv(path: Path, rows: int) -> None:
    """A file in BurstGPT_1's layout (columns, integer timestamps, failures) for the real-data path."""
    res = bm.generate(start_s=5, rows=rows, seed=5)
    t = np.floor(res.trace.arrival_s + 5).astype(int)
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for k, (ts, i, o, c) in enumerate(zip(t, res.trace.input_tokens, res.trace.output_tokens,
                                          res.trace.client_id)):
        model, log = c.split("/")
        o = 0 if k % 50 == 7 else int(o)  # failures, as in the real file
        lines.append(f"{ts},{model},{i},{o},{i + o},{log}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


BURST_SPEC = """
[[sources]]
name = "burstgpt"
adapter = "burstgpt"
files_any = ["burstgpt/BurstGPT_1.csv", "burstgpt/BurstGPT_without_fails_1.csv"]
windows = { rule = "stratified", count = 6, days = "auto", rows = 100 }
  [sources.fallback]
  name = "burstgpt-modeled"
  adapter = "burstgpt-modeled"
  seed = 9
  windows = { rule = "stratified", count = 6, days = 3, rows = 100 }
"""


def test_burstgpt_real_file_is_used_when_present_and_modeled_otherwise(tmp_path):
    spec = write_spec(tmp_path / "b.toml", BURST_SPEC)
    logs: list[str] = []
    modeled = cp.build_corpus(spec, tmp_path / "data", tmp_path / "m", progress=logs.append)
    assert {w.source for w in modeled.windows} == {"burstgpt-modeled"}
    assert modeled.windows[0].window_id == "burstgpt-modeled-00"
    assert modeled.manifest["sources"]["burstgpt-modeled"]["modeled"] is True
    assert modeled.manifest["sources"]["burstgpt-modeled"]["label"] == bm.LABEL
    assert modeled.manifest["spec"]["sources"][0]["fallback_for"] == "burstgpt"
    assert any("using burstgpt-modeled" in line for line in logs)
    _synthetic_burstgpt_csv(tmp_path / "data" / "burstgpt" / "BurstGPT_1.csv", 60000)
    real = cp.build_corpus(spec, tmp_path / "data", tmp_path / "r")
    assert {w.source for w in real.windows} == {"burstgpt"}
    e = real.windows[2].meta
    assert e["n_requests"] == 100 and e["origin_file"] == "burstgpt/BurstGPT_1.csv"
    assert e["modeled"] is False and e["stratum"]["days"] >= 2
    assert e["selection"] == {"start_s": e["stratum"]["day"] * 86400 + e["stratum"]["hour"] * 3600,
                              "rows": 100}
    assert sum(w.meta["dropped"]["failed_response"] for w in real.windows) > 0
    rep = real.reproduction["sources"]["burstgpt"]
    assert rep["status"] in ("absent", "custom")


def test_load_corpus_errors_are_one_line(tmp_path):
    with pytest.raises(DataError, match="no manifest.json"):
        cp.load_corpus(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="unreadable corpus manifest") as info:
        cp.load_corpus(tmp_path)
    one_line(info.value)
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": 1, "corpus_sha256": "x",
                                                        "windows": [{"window_id": "a"}]}))
    with pytest.raises(DataError, match=r"windows\[0\] needs"):
        cp.load_corpus(tmp_path)
    assert cp.verify_corpus(tmp_path)[0].startswith(str(tmp_path / "manifest.json"))


# =========================================================================== CLI


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test root"""

    app.add_typer(corpus_app, name="corpus")
    return app


def test_cli_build_verify_list_and_regions(tmp_path):
    write_jsonl(tmp_path / "my-trace.jsonl", n=400, gap_ms=100)
    spec = write_spec(tmp_path / "mine.toml", JSONL_SPEC)
    run = CliRunner().invoke
    app = _app()
    r = run(app, ["corpus", "build", "--spec", str(spec), "--data-dir", str(tmp_path),
                  "--out", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    assert "built 4 windows (mine 4)" in r.output and "corpus_sha256" in r.output
    assert "no expected hashes apply" in r.output
    r = run(app, ["corpus", "verify", "--corpus", str(tmp_path / "c")])
    assert r.exit_code == 0 and r.output.startswith("ok: 4 windows")
    r = run(app, ["corpus", "list", "--corpus", str(tmp_path / "c")])
    assert r.exit_code == 0 and len(r.output.strip().splitlines()) == 5
    r = run(app, ["corpus", "list", "--corpus", str(tmp_path / "c"), "--regions"])
    assert r.exit_code == 0, r.output
    head = r.output.splitlines()[0]
    assert "cap_rps" in head and "light" in head and "severe" in head
    row = r.output.splitlines()[1].split()
    cap, light, severe = float(row[-7]), float(row[-6]), float(row[-1])
    assert cap > 0 and light == pytest.approx(severe * 1.6 / 0.3, rel=2e-3)
    (tmp_path / "c" / "windows" / "mine-01.parquet").unlink()
    r = run(app, ["corpus", "verify", "--corpus", str(tmp_path / "c")])
    assert r.exit_code == 2
    assert "mine-01.parquet: missing" in r.output and "1 problem(s)" in r.output


# =========================================================================== the study corpus


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    if not HAVE_MIRROR:
        pytest.skip("public data mirror not present")
    d = tmp_path_factory.mktemp("study")
    corpus = cp.build_corpus(None, MIRROR, d / "corpus", download=False)
    return corpus, d


@pytest.mark.data
@needs_mirror
def test_study_has_120_windows_40_per_source_and_reproduces_the_frozen_hashes(study):
    corpus, _ = study
    counts = {s: len(corpus.select([s])) for s in corpus.sources}
    assert len(corpus.windows) == 120 and set(counts.values()) == {40}
    assert corpus.sources[:2] == ["azure", "bailian"]
    real_burst = (MIRROR / "burstgpt" / "BurstGPT_1.csv").is_file() or (
        MIRROR / "burstgpt" / "BurstGPT_without_fails_1.csv").is_file()
    assert corpus.sources[2] == ("burstgpt" if real_burst else "burstgpt-modeled")
    ids = [w.window_id for w in corpus.windows]
    assert ids[:2] == ["azure-conv-00", "azure-conv-01"] and "azure-code-19" in ids
    assert ids[-1] == f"{corpus.sources[2]}-39"
    man = corpus.manifest
    assert man["code_version"] and man["schema"] == 1 and man["spec"]["name"] == "schedport-study-v1"
    if not real_burst:
        assert corpus.reproduction["status"] == "exact", corpus.reproduction["message"]
        assert corpus.corpus_sha256 == cp.load_expected()["corpora"]["burstgpt-modeled"]["corpus_sha256"]
    assert len(corpus.select(n_per_source=3)) == 9


@pytest.mark.data
@needs_mirror
def test_study_builds_byte_identically_twice(study, tmp_path):
    corpus, d = study
    again = cp.build_corpus(None, MIRROR, tmp_path / "again", download=False)
    assert again.corpus_sha256 == corpus.corpus_sha256
    assert (tmp_path / "again" / "manifest.json").read_bytes() == (corpus.root / "manifest.json").read_bytes()
    for w in corpus.windows:
        assert (tmp_path / "again" / "windows" / w.path.name).read_bytes() == w.path.read_bytes()


@pytest.mark.data
@needs_mirror
def test_verify_catches_changed_byte_deleted_window_and_tampered_manifest(study, tmp_path):
    corpus, _ = study
    assert cp.verify_corpus(corpus.root) == []

    def fresh(name):
        dst = tmp_path / name
        shutil.copytree(corpus.root, dst)
        return dst

    c = fresh("byte")
    p = c / "windows" / "bailian-07.parquet"
    data = bytearray(p.read_bytes())
    data[len(data) // 3] ^= 0x01
    p.write_bytes(bytes(data))
    probs = cp.verify_corpus(c)
    assert probs and all("bailian-07" in x for x in probs)

    c = fresh("deleted")
    (c / "windows" / "azure-code-03.parquet").unlink()
    assert cp.verify_corpus(c) == ["windows/azure-code-03.parquet: missing (window azure-code-03 of azure)"]

    c = fresh("stats")  # a statistic edited, seal kept consistent: the recomputation catches it
    man = json.loads((c / "manifest.json").read_text())
    man["windows"][5]["output_mean"] = 1.0
    man["manifest_sha256"] = cp.manifest_seal(man)
    (c / "manifest.json").write_text(json.dumps(man))
    assert any("output_mean" in x for x in cp.verify_corpus(c))

    c = fresh("hash")  # a window hash swapped and the seal recomputed: corpus_sha256 catches it
    man = json.loads((c / "manifest.json").read_text())
    man["windows"][0]["sha256"], man["windows"][1]["sha256"] = (man["windows"][1]["sha256"],
                                                                man["windows"][0]["sha256"])
    man["manifest_sha256"] = cp.manifest_seal(man)
    (c / "manifest.json").write_text(json.dumps(man))
    probs = cp.verify_corpus(c)
    assert any("corpus_sha256" in x for x in probs) and any("content sha256" in x for x in probs)

    c = fresh("origin")  # any other edit breaks the seal
    text = (c / "manifest.json").read_text().replace('"seed": 20250514', '"seed": 20250515', 1)
    (c / "manifest.json").write_text(text)
    assert any("manifest_sha256" in x or "corpus_sha256" in x for x in cp.verify_corpus(c))


@pytest.mark.data
@needs_mirror
def test_study_statistics_differ_the_way_the_real_data_do(study):
    corpus, _ = study

    def mean(ws, k):
        return float(np.mean([w.meta[k] for w in ws]))

    conv = [w for w in corpus.windows if w.window_id.startswith("azure-conv")]
    code = [w for w in corpus.windows if w.window_id.startswith("azure-code")]
    assert mean(code, "index_of_dispersion") > 4 * mean(conv, "index_of_dispersion")
    assert mean(code, "output_mean") < mean(conv, "output_mean") / 4
    assert mean(conv, "output_mean") == pytest.approx(211, rel=0.1)
    assert mean(code, "input_mean") == pytest.approx(2048, rel=0.1)
    assert sum(w.meta["n_requests"] for w in conv) == 19366  # tiles cover the whole hour
    assert sum(w.meta["n_requests"] for w in code) == 8819
    bailian = corpus.select(["bailian"])
    n = [w.meta["n_requests"] for w in bailian]
    assert 900 < np.mean(n) < 1100 and min(n) > 500
    assert all(w.meta["skipped"] and w.meta["selection"]["seed"] == w.meta["seed"] for w in bailian)
    assert all(w.meta["expected_requests"] == pytest.approx(1000) for w in bailian)
    assert {w.meta["stratum"]["hour"] for w in bailian} == set(range(24))
    assert {w.meta["stratum"]["day"] for w in bailian} == set(range(14))
    for w in corpus.windows:
        assert w.meta["mean_rate_rps"] > 0 and w.meta["input_p99"] >= w.meta["input_p50"]
        assert len(w.meta["origin_sha256"]) == 64


def test_write_expected_freezes_and_a_rebuild_then_reproduces(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "my-trace.jsonl")
    spec = write_spec(tmp_path / "mine.toml", JSONL_SPEC)
    cp.build_corpus(spec, tmp_path, tmp_path / "c")
    dest = tmp_path / "expected.json"
    dest.write_text(json.dumps({"sources": {"burstgpt": {"definition_sha256": "d", "windows": {"burstgpt-00": "h"}}},
                                "corpora": {"burstgpt": {"corpus_sha256": "real"}}}))
    cp.write_expected(tmp_path / "c", dest)
    doc = json.loads(dest.read_text())
    assert doc["sources"]["burstgpt"]["windows"] == {"burstgpt-00": "h"}  # kept, not marked absent
    assert set(doc["sources"]["mine"]["windows"]) == {f"mine-{k:02d}" for k in range(4)}
    monkeypatch.setattr(corpus_expected, "load_expected", lambda: json.loads(dest.read_text()))
    again = cp.build_corpus(spec, tmp_path, tmp_path / "c2")
    assert again.reproduction["status"] == "exact", again.reproduction
    changed = write_spec(tmp_path / "mine2.toml", JSONL_SPEC.replace("duration_s = 10", "duration_s = 9"))
    other = cp.build_corpus(changed, tmp_path, tmp_path / "c3")
    assert other.reproduction["sources"]["mine"]["status"] == "custom"
    tampered = json.loads(dest.read_text())
    tampered["sources"]["mine"]["windows"]["mine-02"] = "0" * 64
    tampered["corpora"] = {}
    rep = cp.compare_expected(again.manifest, tampered)
    assert rep["status"] == "differs" and "mine-02" in rep["message"]


# =========================================================================== prefix identity (mooncake)


def write_mooncake(path: Path, n: int = 300, seed: int = 0, gap_ms: int = 200) -> Path:
    """A Mooncake-shaped JSONL whose requests share a first block and, half of them, the whole
    prompt of an earlier request (a later turn of one conversation)."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.integers(1, 2 * gap_ms, n))
    earlier: list[tuple[int, list[int]]] = []
    next_id = 1
    with open(path, "w") as f:
        for ts in t:
            if earlier and rng.random() < 0.5:
                inp, ids = earlier[int(rng.integers(len(earlier)))]
                full = inp // 512  # the earlier prompt's full blocks are this one's prefix
                inp, ids = full * 512 + int(rng.integers(1, 2000)), ids[:full]
            else:
                inp, ids = int(rng.integers(1, 3000)), [0]
            while len(ids) < -(-inp // 512):
                ids = ids + [next_id]
                next_id += 1
            earlier.append((inp, ids))
            f.write(json.dumps({"timestamp": int(ts), "input_length": inp,
                                "output_length": int(rng.integers(1, 500)), "hash_ids": ids}) + "\n")
    return path


def test_mooncake_spec_windows_carry_the_block_ids(tmp_path):
    from schedport.workload import sources

    write_mooncake(tmp_path / "my-trace.jsonl")
    spec = write_spec(tmp_path / "mine.toml", JSONL_SPEC.replace('"jsonl"', '"mooncake"'))
    corpus = cp.build_corpus(spec, tmp_path / "nodata", tmp_path / "c")
    assert cp.verify_corpus(tmp_path / "c") == []
    for k, w in enumerate(corpus.windows):
        t = corpus.trace(w.window_id)
        assert t.hash_block_size == 512 and t.content_sha256() == w.sha256
        direct = sources.read("mooncake", [tmp_path / "my-trace.jsonl"], start_s=10 * k, duration_s=10).trace
        m = t.measured()    # the window after its warm-up (the requests before it, docs/corpus.md "Warm caches")
        assert m.hash_ids.tolist() == direct.hash_ids.tolist() and len(m.hash_ids) > len(m)
        before = sources.read("mooncake", [tmp_path / "my-trace.jsonl"], start_s=0, duration_s=10 * k).trace if k else []
        assert t.warmup == len(before)
    plain = cp.build_corpus(write_spec(tmp_path / "plain.toml", JSONL_SPEC), tmp_path / "nodata", tmp_path / "p")
    assert corpus.trace("mine-01").hash_ids is not None and plain.trace("mine-01").hash_ids is None
    assert corpus.windows[1].sha256 != plain.windows[1].sha256


MOONCAKE_MIRROR = SHARED_MIRROR


@pytest.mark.data
@pytest.mark.skipif(not (MOONCAKE_MIRROR / "mooncake-fast25" / "conversation_trace.jsonl").is_file(),
                    reason="Mooncake mirror not present")
def test_mooncake_registered_file_is_held_to_its_sha256(tmp_path):
    spec = write_spec(tmp_path / "m.toml", """
name = "kimi"
[[sources]]
name = "mooncake-conversation"
adapter = "mooncake"
files = ["mooncake-fast25/conversation_trace.jsonl"]
windows = { rule = "contiguous", count = 2, duration_s = 60 }
""")
    corpus = cp.build_corpus(spec, MOONCAKE_MIRROR, tmp_path / "c")
    e = corpus.windows[0].meta
    assert e["origin_file"] == "mooncake-fast25/conversation_trace.jsonl"
    assert e["origin_sha256"] == "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"
    assert corpus.trace(corpus.windows[1].window_id).hash_block_size == 512


# =========================================================================== warm caches (docs/corpus.md)


def write_canonical(path: Path, hashed: bool) -> Path:
    """A canonical CSV of 12 requests, one every 10 s from t = 5 s, each continuing the one before
    (its prompt is the previous prompt's 2 blocks of 16 tokens plus 16 more)."""
    head = "arrival_s,input_tokens,output_tokens" + (",hash_ids@16" if hashed else "") + "\n"
    rows = []
    for k in range(12):
        ids = " ".join(str(j) for j in range(k + 2))
        rows.append(f"{5 + 10 * k},{16 * (k + 2)},{k + 1}" + (f",{ids}" if hashed else "") + "\n")
    path.write_text(head + "".join(rows))
    return path


CANONICAL_SPEC = """
name = "mine"
[[sources]]
name = "mine"
adapter = "canonical"
files = ["my-trace.csv"]
windows = { rule = "contiguous", count = 3, duration_s = 40, start_s = 0WARM }
"""


def test_windows_of_a_prefix_bearing_source_carry_their_warm_up(tmp_path):
    write_canonical(tmp_path / "my-trace.csv", hashed=True)
    spec = write_spec(tmp_path / "s.toml", CANONICAL_SPEC.replace("WARM", ", warmup_s = 25"))
    corpus = cp.build_corpus(spec, tmp_path / "nodata", tmp_path / "c")
    assert cp.verify_corpus(tmp_path / "c") == []
    # windows [0, 40), [40, 80), [80, 120): requests at 5, 15, 25, 35 | 45, ..., 75 | 85, ..., 115.
    # Window 1's warm-up is the requests of [15, 40): at 15, 25 and 35; window 2's those of [55, 80).
    w0, w1, w2 = (corpus.trace(w.window_id) for w in corpus.windows)
    assert (w0.warmup, w1.warmup, w2.warmup) == (0, 3, 3)    # nothing precedes the first window
    assert w1.arrival_s.tolist() == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]   # from 15 s: warm-up, then the window
    assert w1.input_tokens.tolist() == [48, 64, 80, 96, 112, 128, 144]
    assert w1.measured().input_tokens.tolist() == [96, 112, 128, 144]
    assert w1.hash_ids_of(3).tolist() == [0, 1, 2, 3, 4, 5]    # the ids travel with the requests
    e0, e1 = corpus.windows[0].meta, corpus.windows[1].meta
    assert (e0["n_warmup"], e0["warmup_s"]) == (0, 0.0)
    assert (e1["n_warmup"], e1["warmup_s"]) == (3, 25.0)
    # the window's statistics are its measured requests', counted from its own start
    assert e1["n_requests"] == 4 and e1["span_s"] == 30.0 and e1["mean_rate_rps"] == 4 / 40
    # with no warmup_s, the default (600 s) reaches back to the file's start
    dflt = cp.build_corpus(write_spec(tmp_path / "d.toml", CANONICAL_SPEC.replace("WARM", "")),
                           tmp_path / "nodata", tmp_path / "d")
    assert [dflt.trace(w.window_id).warmup for w in dflt.windows] == [0, 4, 8]
    assert dflt.windows[2].meta["warmup_s"] == 80.0
    # warmup_s = 0 switches it off: the windows are the plain cuts
    off = cp.build_corpus(write_spec(tmp_path / "o.toml", CANONICAL_SPEC.replace("WARM", ", warmup_s = 0")),
                          tmp_path / "nodata", tmp_path / "o")
    assert [off.trace(w.window_id).warmup for w in off.windows] == [0, 0, 0]


def test_windows_of_a_source_without_hash_ids_are_unchanged_byte_for_byte(tmp_path):
    """A source without hash_ids gets no warm-up and its windows are what they were before
    warm-ups existed: the content sha256s below come from a build by the code before them, each
    file holds the bytes of the plain cut written as a window always was, and the manifest
    entries have no warm-up field."""
    from schedport.workload import sources
    from schedport.workload.trace import Trace, save_trace

    write_canonical(tmp_path / "my-trace.csv", hashed=False)
    spec = write_spec(tmp_path / "s.toml", CANONICAL_SPEC.replace("WARM", ""))
    corpus = cp.build_corpus(spec, tmp_path / "nodata", tmp_path / "c")
    assert {w.window_id: w.sha256 for w in corpus.windows} == BEFORE_WARMUP
    for k, w in enumerate(corpus.windows):
        cut = sources.read("canonical", [tmp_path / "my-trace.csv"], start_s=40 * k, duration_s=40).trace
        save_trace(Trace.from_arrays(cut.arrival_s, cut.input_tokens, cut.output_tokens, name=w.window_id),
                   tmp_path / f"{w.window_id}.parquet")
        assert w.path.read_bytes() == (tmp_path / f"{w.window_id}.parquet").read_bytes()
        assert "warmup_s" not in w.meta and "n_warmup" not in w.meta
        assert corpus.trace(w.window_id).warmup == 0


#: The windows' content sha256s, built by the code before warm-ups (commit f58792c).
BEFORE_WARMUP = {"mine-00": "8c64ed7601e4264fc1f35ae28fb60ca5bdcd6789ef7e3d3e13b8fcd304ae2238",
                 "mine-01": "2a174de8247bd3e5944d53ae63c4854f0d5b2742679dd007eb4b461a0b25e89d",
                 "mine-02": "36b5c4d4b9eb5174d2aff14ef10c3b1e47b9eccd1fd9c674375a70deb289eced"}


@pytest.mark.parametrize("body, msg", [
    ("adapter = 'canonical'\nfiles = ['my-trace.csv']\nwindows = { rule = 'tile', count = 2, warmup_s = -1 }",
     "windows.warmup_s (seconds of requests replayed before each window) must be a number >= 0, not -1"),
    ("adapter = 'canonical'\nfiles = ['my-trace.csv']\nwindows = { rule = 'tile', count = 2, warmup_s = 'long' }",
     "must be a number >= 0, not 'long'"),
    ("adapter = 'jsonl'\nfiles = ['my-trace.jsonl']\nwindows = { rule = 'tile', count = 2, warmup_s = 60 }",
     "windows.warmup_s: a warm-up fills the prefix cache, so it applies to a source whose trace carries "
     "hash_ids (adapter mooncake or canonical), not 'jsonl'"),
])
def test_warmup_s_is_validated_in_one_line(tmp_path, body, msg):
    spec = write_spec(tmp_path / "s.toml", f"[[sources]]\nname = 'x'\n{body}\n")
    with pytest.raises(ConfigError) as info:
        cp.build_corpus(spec, tmp_path, tmp_path / "out")
    assert msg in one_line(info.value) and "s.toml: sources[0] (x)" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_warmup_s_for_a_trace_without_hash_ids_is_refused(tmp_path):
    write_canonical(tmp_path / "my-trace.csv", hashed=False)
    spec = write_spec(tmp_path / "s.toml", CANONICAL_SPEC.replace("WARM", ", warmup_s = 30"))
    with pytest.raises(DataError) as info:
        cp.build_corpus(spec, tmp_path / "nodata", tmp_path / "c")
    assert "windows.warmup_s = 30: its trace carries no hash_ids" in one_line(info.value)
    assert not (tmp_path / "c").exists()


def test_cli_refuses_a_bad_warmup_s_with_one_line(tmp_path):
    write_canonical(tmp_path / "my-trace.csv", hashed=True)
    spec = write_spec(tmp_path / "s.toml", CANONICAL_SPEC.replace("WARM", ", warmup_s = -5"))
    line = error_line(cli("corpus", "build", "--spec", spec, "--out", tmp_path / "c", "--data-dir", tmp_path))
    assert "s.toml: sources[0] (mine): windows.warmup_s" in line and "not -5" in line
    assert not (tmp_path / "c").exists()
