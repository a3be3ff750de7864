"""One output rule for every writer, and every derived artefact checked against what it describes.

Each case goes through the command line as a user meets it, on a tiny corpus and store: a file or
folder is created or replaced only if the command made it, never inside a corpus's or a store's own
folders (`schedport.common.guard`); the store's lock covers a whole command; an analysis, a
prediction or a variant-set record that no longer describes its store or corpus is refused in one
line; a symlink loop is one line; --workers is capped at the cells and the cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from schedport.api import analyze
from schedport.study.sweep import run_sweep, write_demo_corpus
from schedport.workload.examples import make_example_trace
from schedport.workload.trace import save_trace
from _cli import cli, error_line, tree_digest


SEL = ["--schedulers", "vllm-fcfs,sjf", "--regions", "light,overload", "--windows", "2"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_demo_corpus(tmp_path_factory.mktemp("corpus") / "corpus", windows_per_source=2,
                             requests_per_window=40)


@pytest.fixture(scope="module")
def store(corpus, tmp_path_factory) -> Path:
    """An analysed store of two schedulers, two sources of two windows, two regions."""
    out = tmp_path_factory.mktemp("store") / "res"
    run_sweep(corpus, out, schedulers="vllm-fcfs,sjf", regions="light,overload", workers=1, progress=False)
    analyze(out, out, n_boot=50, n_splits=10, robustness=False)
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def _own_corpus(tmp_path: Path) -> tuple[Path, Path]:
    """A spec of one source of the user's own (a canonical CSV beside it): builds in a second."""
    save_trace(make_example_trace(n_requests=240, seed=3), tmp_path / "mine.csv")
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "mine-study"\n[[sources]]\nname = "mine"\nadapter = "canonical"\ncite = "ours"\n'
                    'files = ["mine.csv"]\nwindows = { rule = "tile", count = 3 }\n')
    return spec, tmp_path


# ============================================================================ 1. corpus build keeps what it did not make


def test_rebuilding_a_corpus_keeps_what_else_is_in_its_folder(tmp_path):
    spec, data = _own_corpus(tmp_path)
    c = tmp_path / "c"
    p = cli("corpus", "build", "--spec", spec, "--data-dir", data, "--out", c)
    assert p.returncode == 0, p.stderr
    (c / "NOTES.txt").write_text("n\n")
    (c / "res").mkdir()
    (c / "res" / "keep.txt").write_text("mine\n")
    before = tree_digest(c, skip=(".lock",))
    msg = error_line(cli("corpus", "build", "--spec", spec, "--data-dir", data, "--out", c))
    assert "NOTES.txt" in msg and "res" in msg and "would delete" in msg
    assert tree_digest(c, skip=(".lock",)) == before
    # the corpus's own files alone: rebuilt as before
    shutil.rmtree(c / "res")
    (c / "NOTES.txt").unlink()
    p = cli("corpus", "build", "--spec", spec, "--data-dir", data, "--out", c)
    assert p.returncode == 0, p.stderr


def test_run_out_inside_a_corpus_is_refused(corpus, tmp_path):
    c = _copy(corpus, tmp_path / "c")
    before = tree_digest(c, skip=(".lock",))
    msg = error_line(cli("run", "--corpus", c, "--out", c / "res", *SEL, "--no-analyze", "--workers", "1"))
    assert "inside a corpus" in msg and "--out" in msg
    assert tree_digest(c, skip=(".lock",)) == before and not (c / "res").exists()


# ============================================================================ 2. check-model --json writes only its own file


def test_check_model_json_never_replaces_an_input_a_manifest_or_an_analysis(corpus, store, tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
    msg = error_line(cli("corpus", "check-model", "--rows", rows, "--json", rows))
    assert "input" in msg and "--json" in msg
    c = _copy(corpus, tmp_path / "c")
    s = _copy(store, tmp_path / "s")
    a = tmp_path / "analysis"
    a.mkdir()
    (a / "portability.json").write_text((store / "portability.json").read_text())
    for target in (c / "manifest.json", s / "portability.json", a / "portability.json"):
        before = target.read_bytes()
        msg = error_line(cli("corpus", "check-model", "--rows", rows, "--json", target))
        assert str(target) in msg and ("inside" in msg or "not written by" in msg), msg
        assert target.read_bytes() == before


# ============================================================================ 3. nothing else writes into a store's folders


def test_report_and_corpus_build_refuse_a_stores_runs_folder(store, tmp_path):
    s = _copy(store, tmp_path / "s")
    before = tree_digest(s, skip=(".lock",))
    msg = error_line(cli("report", "--results", s, "--study-md", s / "runs" / "x.md", "--no-html"))
    assert "inside a results store" in msg and "--study-md" in msg
    spec, data = _own_corpus(tmp_path)
    msg = error_line(cli("corpus", "build", "--spec", spec, "--data-dir", data, "--out", s / "runs" / "c"))
    assert "inside a results store" in msg
    assert tree_digest(s, skip=(".lock",)) == before
    p = cli("analyze", "--results", s, "--boot", "50", "--splits", "10", "--no-robustness")
    assert p.returncode == 0, p.stderr


# ============================================================================ 7. a stale analysis is not stamped with the store's digest


def test_study_page_of_a_stale_analysis_is_refused(store, corpus, tmp_path):
    s = _copy(store, tmp_path / "s")
    page = tmp_path / "study.md"
    p = cli("run", "--corpus", corpus, "--out", s, "--schedulers", "vllm-fcfs,sjf,ltr", "--regions", "light,overload",
            "--no-analyze", "--workers", "1")
    assert p.returncode == 0, p.stderr
    msg = error_line(cli("report", "--results", s, "--study-md", page, "--no-html"))
    assert "analyses the store as it was at 16 cells; it now holds 24" in msg and "schedport analyze" in msg
    assert not page.exists()


def test_study_page_of_a_current_analysis_is_written(store, tmp_path):
    s = _copy(store, tmp_path / "s")
    page = tmp_path / "study.md"
    p = cli("report", "--results", s, "--study-md", page, "--no-html")
    assert p.returncode == 0, p.stderr
    assert page.read_text().startswith("# The study's figures\n")


# ============================================================================ 8. validate --predicted against --corpus


def test_validate_predicted_of_another_corpus_is_refused(store, corpus, tmp_path):
    res = json.loads((store / "portability.json").read_text())
    res["store"]["corpus_sha256"] = "f" * 64
    pred = tmp_path / "portability.json"
    pred.write_text(json.dumps(res))
    eng = tmp_path / "engine.toml"
    eng.write_text("")
    msg = error_line(cli("validate", "--endpoint", "http://127.0.0.1:9", "--engine", eng, "--out", tmp_path / "v",
                         "--corpus", corpus, "--predicted", pred))
    assert "analyses a store of corpus ffffffffffff" in msg and str(corpus) in msg


# ============================================================================ 14. a symlink loop is one line


@pytest.mark.parametrize("args", [
    ["simulate", "--trace", "{t}", "--scheduler", "sjf", "--out", "{loop}"],
    ["simulate", "--trace", "{t}", "--scheduler", "sjf", "--out", "{loop}/x"],
    ["corpus", "build", "--out", "{loop}"],
    ["run", "--out", "{loop}", "--corpus", "{c}"],
    ["run", "--out", "{o}", "--corpus", "{loop}"],
])
def test_a_symlink_loop_is_one_line(tmp_path, args):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    save_trace(make_example_trace(50), tmp_path / "t.csv")
    fill = {"t": tmp_path / "t.csv", "loop": tmp_path / "a", "c": tmp_path / "c", "o": tmp_path / "o"}
    msg = error_line(cli(*[a.format(**fill) for a in args]))
    assert "loop of symbolic links" in msg
    assert not (tmp_path / "c").exists() and not (tmp_path / "o").exists()


# ============================================================================ 9. variants/set.json against the stores it describes


TWO = ('name = "two"\n[variants.decode-up]\nwhy = "decode dearer"\noverlay = { latency = { decode_scale = 1.1 } }\n'
       '[variants.cpu-up]\nwhy = "cpu dearer"\noverlay = { latency = { prefill_scale = 1.3 } }\n')


@pytest.fixture(scope="module")
def variant_study(tmp_path_factory) -> Path:
    from test_simulator_axis import write_variant_study

    d = tmp_path_factory.mktemp("vstudy")
    (d / "two.toml").write_text(TWO)
    write_variant_study(d / "s", d / "two.toml")
    return d / "s"


def _edit_overlay(s: Path) -> None:
    rec = json.loads((s / "variants" / "set.json").read_text())
    rec["variants"][0]["overlay"]["latency"]["decode_scale"] = 1.5
    (s / "variants" / "set.json").write_text(json.dumps(rec))


def _drop_variant(s: Path) -> None:
    rec = json.loads((s / "variants" / "set.json").read_text())
    rec["variants"] = rec["variants"][:1]
    rec["engine_hashes"].pop("cpu-up")
    (s / "variants" / "set.json").write_text(json.dumps(rec))


def _swap_folders(s: Path) -> None:
    rec = json.loads((s / "variants" / "set.json").read_text())
    a, b = s / "variants" / "decode-up", s / "variants" / "cpu-up"
    a.rename(s / "variants" / "tmp")
    b.rename(a)
    (s / "variants" / "tmp").rename(b)
    h = rec["engine_hashes"]
    h["decode-up"], h["cpu-up"] = h["cpu-up"], h["decode-up"]     # the record made to agree with the folders
    (s / "variants" / "set.json").write_text(json.dumps(rec))


def test_the_variant_study_as_run_is_analysed(variant_study, tmp_path):
    s = _copy(variant_study, tmp_path / "s")
    p = cli("analyze", "--results", s, "--boot", "50", "--splits", "10", "--no-robustness")
    assert p.returncode == 0, p.stderr
    assert "survive all 2 engine variants of two" in p.stdout


@pytest.mark.parametrize("change, needle", [(_edit_overlay, "edited after the run"),
                                            (_drop_variant, "edited after the run"),
                                            (_swap_folders, "swapped or replaced")])
def test_a_changed_variant_record_or_store_is_refused(variant_study, tmp_path, change, needle):
    s = _copy(variant_study, tmp_path / "s")
    change(s)
    msg = error_line(cli("analyze", "--results", s, "--boot", "50", "--splits", "10", "--no-robustness"))
    assert needle in msg
    assert not (s / "portability.json").exists()


# ============================================================================ 18. --workers capped at the cells and the cores


def test_workers_are_capped_at_the_cells_and_the_cores_and_the_run_says_so(corpus, tmp_path):
    import time

    from schedport.study.sweep import cap_workers, usable_cores

    t0 = time.monotonic()
    p = cli("run", "--corpus", corpus, "--out", tmp_path / "r", *SEL, "--no-analyze", "--workers", "100000")
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 120
    n = min(16, usable_cores())
    assert f"--workers 100000: using {n}, the most that can work at once" in p.stdout
    assert f", {n} local workers)" in p.stdout
    assert cap_workers(40, 4, local_cores=False) == (4, "--workers 40: using 4, the most that can work at once "
                                                        "(the 4 cells to run)")
    assert cap_workers(2, 4, local_cores=False) == (2, None)
    assert cap_workers(40, 4, given=False, local_cores=False) == (4, None)


# ============================================================================ 4. the store's lock covers the whole command


def test_a_forced_run_cannot_take_a_store_while_its_variants_run(corpus, tmp_path):
    """`run --variants` holds its store's lock through the variant phase: a `run --force` of another
    engine into the same --out, started then, is refused in one line and moves nothing aside."""
    import time

    from typer.testing import CliRunner

    from schedport.cli import _register, app
    from schedport.errors import SchedportError

    _register()
    vset = tmp_path / "six.toml"
    vset.write_text('name = "six"\n'
                    + "".join(f'[variants.d{i}]\nwhy = "w"\noverlay = {{ latency = {{ decode_scale = {1 + i / 10} }} }}\n'
                              for i in range(1, 7)))
    other = tmp_path / "other.toml"
    other.write_text("[latency]\nprefill_scale = 1.2\n")
    out = tmp_path / "x"
    first = subprocess.Popen([sys.executable, "-m", "schedport.cli", "run", "--corpus", str(corpus), "--out", str(out),
                              *SEL, "--no-analyze", "--workers", "1", "--variants", str(vset)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not (out / "variants" / "set.json").exists():      # the default's sweep is done: variant phase
            assert first.poll() is None and time.monotonic() - t0 < 240, first.communicate()
            time.sleep(0.05)
        # in this process, so that it starts at once (a second interpreter takes seconds to start)
        second = CliRunner().invoke(app, ["run", "--corpus", str(corpus), "--out", str(out), *SEL, "--no-analyze",
                                          "--workers", "1", "--force", "--engine", str(other)])
    finally:
        so, se = first.communicate(timeout=300)
    assert first.returncode == 0, se
    assert isinstance(second.exception, SchedportError), second.output
    msg = str(second.exception)
    assert str(out) in msg and "is writing this results store right now" in msg
    assert not list(tmp_path.glob("x.old-*"))
    assert sorted(p.name for p in (out / "variants").iterdir()) == ["d1", "d2", "d3", "d4", "d5", "d6", "set.json"]


# ============================================================================ every other file writer: only its own files


@pytest.mark.parametrize("command, what", [
    (["example", "--requests", "20", "--out", "{f}"], "schedport example"),
    (["trace", "convert", "{t}", "--from", "canonical", "--out", "{f}"], "schedport trace convert"),
    (["calibrate", "--endpoint", "http://127.0.0.1:9", "--out", "{f}"], "schedport calibrate"),
    (["explain", "--results", "{s}", "--pair", "vllm-fcfs,sjf", "--metric", "e2e_mean_s", "--region", "overload",
      "--sources", "demo-a,demo-b", "--out", "{f}"], "schedport explain --out"),
    (["conformance", "--trace", "{t}", "--out", "{f}"], "schedport conformance --out"),
])
def test_a_file_writer_never_replaces_a_users_file(store, tmp_path, command, what):
    save_trace(make_example_trace(50), tmp_path / "t.csv")
    mine = tmp_path / "mine.csv"
    mine.write_text("my,own\n1,2\n")
    args = [a.format(f=mine, t=tmp_path / "t.csv", s=store) for a in command]
    msg = error_line(cli(*args))
    assert f"was not written by `{what}`" in msg and str(mine) in msg
    assert mine.read_text() == "my,own\n1,2\n"


def test_example_and_trace_convert_replace_a_trace_they_wrote(tmp_path):
    for suffix in ("csv", "parquet"):
        out = tmp_path / f"t.{suffix}"
        for n in ("20", "30"):
            p = cli("example", "--requests", n, "--out", out)
            assert p.returncode == 0, p.stderr
        p = cli("trace", "convert", out, "--from", "canonical", "--out", tmp_path / f"u.{suffix}")
        assert p.returncode == 0, p.stderr
        p = cli("trace", "convert", out, "--from", "canonical", "--out", tmp_path / f"u.{suffix}")
        assert p.returncode == 0, p.stderr


def test_explain_into_the_stores_own_cache_holds_the_stores_lock(store, tmp_path):
    import fcntl

    s = _copy(store, tmp_path / "s")
    fd = os.open(s / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)     # another process writing the store
    try:
        msg = error_line(cli("explain", "--results", s, "--pair", "vllm-fcfs,sjf", "--metric", "e2e_mean_s",
                             "--region", "overload", "--sources", "demo-a,demo-b", "--workers", "1"))
    finally:
        os.close(fd)
    assert str(s) in msg and "is writing this results store right now" in msg
    assert not (s / "explain").exists()


def test_a_refused_run_leaves_no_lock_file_in_a_users_folder(corpus, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("n\n")
    msg = error_line(cli("run", "--corpus", corpus, "--out", mine, *SEL, "--no-analyze", "--workers", "1"))
    assert "not a schedport results store" in msg
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
