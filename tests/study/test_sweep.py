"""The sweep: selection, determinism across worker counts, resume after SIGKILL and Ctrl-C,
refusal of a mismatched store, corrupt-store detection, and the `run` command.

Everything runs on a tiny synthetic corpus (2 sources x 2 windows x 40 requests) and three
schedulers (one of them, ltr, seed-dependent) so the whole file stays well under a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

import _gate

from schedport.engine.core.config import EngineConfig
from schedport.errors import SchedportError
from schedport.study.store import KEY_COLUMNS, StoreError, StoreMismatch, read_results
from schedport.cli import study as cli_study
from schedport.cli.study import run_command
from schedport.study.sweep import QUICK, load_corpus, make_executor, run_sweep, select, write_demo_corpus

SCHEDS = "vllm-fcfs,sjf,ltr"
SEEDS = 2
N_CELLS = 3 * 4 * 6 * SEEDS  # schedulers x windows x regions x seeds
PY = sys.executable


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_demo_corpus(tmp_path_factory.mktemp("corpus") / "corpus", windows_per_source=2,
                             requests_per_window=40)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """A clean, uninterrupted in-process run of the whole test matrix."""
    out = tmp_path_factory.mktemp("ref") / "results"
    res = run_sweep(corpus, out, schedulers=SCHEDS, seeds=SEEDS, workers=1, progress=False, flush_cells=24)
    assert res.cells_run == N_CELLS and res.status == "finished"
    return out, _sorted(read_results(out))


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(KEY_COLUMNS)).reset_index(drop=True)


def _assert_same(df: pd.DataFrame, ref: pd.DataFrame) -> None:
    df = _sorted(df)
    assert not df.duplicated(list(KEY_COLUMNS)).any()
    pd.testing.assert_frame_equal(df, ref, check_exact=True)


def _script(corpus, out, **kw) -> str:
    args = dict(schedulers=SCHEDS, seeds=SEEDS, progress=False)
    args.update(kw)
    return textwrap.dedent(f"""
        from schedport.study.sweep import run_sweep
        if __name__ == "__main__":
            run_sweep({str(corpus)!r}, {str(out)!r}, **{args!r})
    """)


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid`, from /proc."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d.name))
    return out


# ---------------------------------------------------------------------------- selection


def test_selection(corpus):
    c = load_corpus(corpus)
    sel = select(c)
    assert sel.n_cells == 13 * 4 * 6 and len(sel.windows) == 4
    sel = select(c, schedulers="sjf,vllm-fcfs", sources="demo-b", regions="light,severe", windows=1, seeds=3)
    assert [w.window_id for w in sel.windows] == ["demo-b-00"]
    assert sel.schedulers == ("sjf", "vllm-fcfs") and sel.seeds == (0, 1, 2) and sel.n_cells == 12
    sel = select(c, windows=1)
    assert [w.window_id for w in sel.windows] == ["demo-a-00", "demo-b-00"]
    q = select(c, quick=True)
    assert q.schedulers == QUICK["schedulers"] and list(q.regions) == list(QUICK["regions"])
    assert len(q.windows) == 4 and QUICK["windows"] >= 2  # all of this corpus's 2 per source
    assert select(c, quick=True, schedulers="sjf", windows=1).n_cells == 1 * 2 * 3
    for kw, msg in [({"schedulers": "nope"}, "unknown scheduler"), ({"sources": "azure"}, "unknown source"),
                    ({"regions": "hot"}, "unknown region"), ({"windows": 0}, "--windows"),
                    ({"seeds": 0}, "--seeds"), ({"schedulers": "sjf,sjf"}, "twice")]:
        with pytest.raises(SchedportError, match=msg):
            select(c, **kw)


def test_bad_corpus_and_executor_inputs(tmp_path, corpus):
    with pytest.raises(SchedportError, match="not a corpus directory"):
        run_sweep(tmp_path, tmp_path / "out", progress=False)
    with pytest.raises(SchedportError, match="--executor"):
        run_sweep(corpus, tmp_path / "out", executor="mpi", progress=False)
    with pytest.raises(SchedportError, match="--workers"):
        run_sweep(corpus, tmp_path / "out", workers=0, progress=False)
    with pytest.raises(SchedportError, match="--ray-address only applies"):
        make_executor("local", 2, "ray://x:1")
    tampered = tmp_path / "tampered"
    shutil.copytree(corpus, tampered)
    shutil.copy(tampered / "windows" / "demo-a-01.parquet", tampered / "windows" / "demo-a-00.parquet")
    with pytest.raises(SchedportError, match="does not match its manifest sha256"):
        run_sweep(tampered, tmp_path / "out2", schedulers="sjf", progress=False)


def test_missing_ray_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SchedportError, match=r"pip install 'schedport\[ray\]'"):
        make_executor("ray", 2)


# ---------------------------------------------------------------------------- determinism, resume


def test_two_workers_bit_identical_to_one(corpus, reference, tmp_path):
    _, ref = reference
    out = tmp_path / "results"
    res = run_sweep(corpus, out, schedulers=SCHEDS, seeds=SEEDS, workers=2, progress=False, flush_seconds=0.0)
    assert res.cells_run == N_CELLS and res.workers == 2
    assert len(list((out / "runs").glob("part-*.parquet"))) > 1
    _assert_same(read_results(out), ref)
    # a finished sweep, rerun: no simulation at all
    res = run_sweep(corpus, out, schedulers=SCHEDS, seeds=SEEDS, workers=2, progress=False)
    assert (res.cells_run, res.cells_skipped, res.capacities_measured) == (0, N_CELLS, 0)
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "finished" and m["cells_done"] == N_CELLS and len(m["runs"]) == 2
    assert m["runs"][-1]["cells_run"] == 0


def test_resume_after_sigkill(corpus, reference, tmp_path):
    _, ref = reference
    out, gate = tmp_path / "results", tmp_path / "gate"
    gate.mkdir()
    # the first window's chunks run, every other chunk is held at the gate: when both workers
    # hold one, the first window's cells are all handed out and the rest are provably pending
    body = _script(corpus, out, workers=2, flush_cells=1)
    proc = subprocess.Popen([PY, "-c", _gate.driver(gate, ["demo-a-00"], body)], env=_gate.env(),
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _gate.wait_held(gate, 2, proc)
        first_window = 3 * 6 * SEEDS  # schedulers x regions x seeds
        _wait_rows(out, first_window, proc)  # every one of them written (flush_cells=1)
        proc.kill()  # SIGKILL the driver only, mid-sweep
        proc.wait()
        # its worker processes notice and exit by themselves (no orphans computing forever); the
        # limit is a hang guard: a worker checks for its driver every second
        deadline = time.monotonic() + 60
        while _group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _group_members(proc.pid)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the processes this test started
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    partial = read_results(out)
    assert len(partial) == first_window and set(partial.window_id) == {"demo-a-00"}
    assert json.loads((out / "manifest.json").read_text())["status"] == "running"  # it never got to finish

    res = run_sweep(corpus, out, schedulers=SCHEDS, seeds=SEEDS, workers=1, progress=False)
    assert res.cells_skipped == len(partial) and res.cells_run == N_CELLS - len(partial)
    assert res.capacities_measured == 0  # measured before the kill, reused from capacity.json
    _assert_same(read_results(out), ref)


def _wait_rows(out: Path, n: int, proc, limit_s: float = 300.0) -> None:
    """Wait until the store holds `n` rows (the limit only turns a hang into a failure)."""
    end = time.monotonic() + limit_s
    while True:
        try:
            if len(read_results(out)) >= n:
                return
        except Exception:  # a part being renamed into place, or no store yet
            pass
        assert proc.poll() is None and time.monotonic() < end, f"the store never reached {n} rows"
        time.sleep(0.01)


def test_ctrl_c_keeps_finished_cells_and_exits_130(corpus, reference, tmp_path):
    _, ref = reference
    out, gate = tmp_path / "results", tmp_path / "gate"
    gate.mkdir()
    # A Ctrl-C at a terminal: when the tests themselves run in a background job, the shell
    # started them with SIGINT ignored, which the child would inherit (and rightly honour).
    # The first window's chunks run and the next one is held at the gate, so the signal comes
    # while finished cells wait to be flushed and others are still to do, however fast the machine.
    body = textwrap.dedent("""
        import signal, sys, typer
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from schedport.errors import SchedportError
        from schedport.cli.study import run_command
        app = typer.Typer()
        app.callback()(lambda: None)
        app.command("run")(run_command)
        try:
            app()
        except SchedportError as e:
            print("error:", e, file=sys.stderr); sys.exit(2)
    """)
    args = [PY, "-c", _gate.driver(gate, ["demo-a-00"], body), "run", "--corpus", str(corpus), "--out", str(out),
            "--schedulers", SCHEDS, "--seeds", str(SEEDS), "--workers", "1"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_gate.env())
    try:
        _gate.wait_held(gate, 1, proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)  # a hang guard: the driver exits at once on SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted: kept" in err and "Traceback" not in err
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "interrupted" and m["runs"][-1]["status"] == "interrupted"
    kept = read_results(out)
    assert len(kept) == 3 * 6 * SEEDS and set(kept.window_id) == {"demo-a-00"} and m["cells_done"] == len(kept)
    assert f"interrupted: kept {len(kept)} finished cells" in err

    res = run_sweep(corpus, out, schedulers=SCHEDS, seeds=SEEDS, workers=1, progress=False)
    assert res.cells_run == N_CELLS - len(kept)
    _assert_same(read_results(out), ref)


# ---------------------------------------------------------------------------- refusal, corruption


def test_mismatched_engine_config_refused(corpus, reference, tmp_path):
    ref_out, _ = reference
    out = tmp_path / "results"
    shutil.copytree(ref_out, out)
    other = EngineConfig(max_num_seqs=64)
    with pytest.raises(StoreMismatch, match="engine config") as e:
        run_sweep(corpus, out, schedulers="sjf", regions="light", windows=1, engine=other, progress=False)
    assert "\n" not in str(e.value)
    assert len(read_results(out)) == N_CELLS  # untouched
    res = run_sweep(corpus, out, schedulers="sjf", regions="light", windows=1, engine=other, force=True,
                    workers=1, progress=False)
    assert res.moved_aside is not None and len(read_results(res.moved_aside)) == N_CELLS
    assert res.cells_run == 2 and len(read_results(out)) == 2


def test_corrupt_store_detected(corpus, reference, tmp_path):
    ref_out, _ = reference
    out = tmp_path / "results"
    shutil.copytree(ref_out, out)
    part = sorted((out / "runs").glob("part-*.parquet"))[0]
    part.write_bytes(b"PAR1" + os.urandom(200))
    with pytest.raises(StoreError, match="corrupt results part"):
        run_sweep(corpus, out, schedulers=SCHEDS, seeds=SEEDS, progress=False)
    # moving the bad part away reruns exactly its cells
    part.unlink()
    res = run_sweep(corpus, out, schedulers=SCHEDS, seeds=SEEDS, workers=1, progress=False)
    assert 0 < res.cells_run < N_CELLS
    _assert_same(read_results(out), reference[1])


def test_region_rho_conflict_refused(corpus, tmp_path):
    out = tmp_path / "results"
    run_sweep(corpus, out, schedulers="sjf", regions="mid=0.7", windows=1, workers=1, progress=False)
    with pytest.raises(SchedportError, match="was run at rho=0.7"):
        run_sweep(corpus, out, schedulers="sjf", regions="mid=0.75", windows=1, workers=1, progress=False)


def test_keep_requests(corpus, tmp_path):
    out = tmp_path / "results"
    run_sweep(corpus, out, schedulers="vtc", regions="overload", windows=1, keep_requests=True, workers=1,
               progress=False)
    runs = read_results(out)
    reqs = pd.read_parquet(out / "requests")
    assert len(reqs) == runs["n_requests"].sum()
    assert set(reqs.columns[:5]) == set(KEY_COLUMNS)
    done = reqs[reqs["status"] == "completed"].groupby("window_id").size()
    assert (done == runs.set_index("window_id")["n_completed"]).all()


# ---------------------------------------------------------------------------- the command


def _app():
    app = typer.Typer()
    app.callback()(lambda: None)
    app.command("run")(run_command)
    return app


def test_run_command(corpus, tmp_path, monkeypatch):
    calls = []
    # a stand-in for the analysis, which needs more windows than this selection has
    monkeypatch.setattr(cli_study.api, "check_analysable", lambda sel: None)
    monkeypatch.setattr(cli_study.api, "analyze", lambda r, o, **kw: calls.append((r, o)))
    out = tmp_path / "results"
    args = ["run", "--corpus", str(corpus), "--out", str(out), "--schedulers", "sjf", "--regions", "light",
            "--windows", "1", "--workers", "1"]
    r = CliRunner().invoke(_app(), args)
    assert r.exit_code == 0, r.output
    assert "2 runs (0 already done, 2 in the selection)" in r.output and str(out / "runs") in r.output
    assert calls == [(out, out)]
    r = CliRunner().invoke(_app(), args)
    assert r.exit_code == 0 and "nothing to run: all 2 cells are already in" in r.output
    r = CliRunner().invoke(_app(), args + ["--engine", str(tmp_path / "missing.toml")])
    assert isinstance(r.exception, SchedportError) and "missing.toml" in str(r.exception)
    assert "--quick" in CliRunner().invoke(_app(), ["run", "--help"]).output


def test_run_command_missing_corpus(tmp_path, corpus, monkeypatch):
    missing = tmp_path / "corpus"
    args = ["run", "--corpus", str(missing), "--out", str(tmp_path / "r"), "--schedulers", "sjf",
            "--regions", "light", "--windows", "1", "--workers", "1", "--no-analyze"]
    built = []

    def build_corpus(spec, data_dir, out, progress=None):
        built.append((spec, data_dir, out))
        shutil.copytree(corpus, out)

    import schedport.workload.corpus as real

    monkeypatch.setattr(real, "build_corpus", build_corpus)
    r = CliRunner().invoke(_app(), args + ["--data-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert built == [(None, tmp_path, missing)]
    assert f"no corpus at {missing}/: building it" in r.output and "corpus corpus" not in r.output


def test_a_prefix_caching_engine_stores_its_hit_rate(corpus, tmp_path):
    """With `[engine] enable_prefix_caching` every stored row holds the run's hit rate (the demo
    corpus has no prefix identity: only a preempted request's return could hit, so it is small)."""
    apc = EngineConfig(enable_prefix_caching=True)
    out = tmp_path / "results"
    res = run_sweep(corpus, out, schedulers="vllm-fcfs", regions="light", windows=1, engine=apc, workers=1,
                    progress=False)
    df = read_results(out)
    assert res.cells_run == len(df) > 0
    assert {"prefix_hit_rate", "prefix_cached_tokens", "prefix_prompt_tokens"} <= set(df.columns)
    assert (df.prefix_hit_rate >= 0).all() and (df.prefix_prompt_tokens > 0).all()
    assert "prefix_hit_rate" not in read_results(run_sweep(corpus, tmp_path / "plain", schedulers="vllm-fcfs",
                                                           regions="light", windows=1, workers=1,
                                                           progress=False).out).columns
