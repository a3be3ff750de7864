"""Bad numbers, bad paths and faults, met the way a user meets them: through the command line.

Every case ends within seconds, non-zero, with ONE line ``error: ...`` on stderr (never a
traceback, a hang or silent nonsense), or works as a user would expect. Faults that need a
full or read-only file system use a real tmpfs where the test may mount one (root with
CAP_SYS_ADMIN) and an injected OSError otherwise, so both paths are covered somewhere.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import _gate
import schedport
from schedport.errors import SchedportError
from schedport.workload.examples import make_example_trace
from schedport.study.sweep import PlainProgress, run_sweep, write_demo_corpus
from schedport.workload.trace import save_trace
from _paths import FIXTURES as FIXTURE_ROOT

FIXTURES = FIXTURE_ROOT / "sources"


def cli(*args, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    """Run `schedport ARGS` as a user would. The timeout only turns a hang into a failure: these
    commands end in seconds, and 600 s is far beyond what a busy or slow machine adds to that."""
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, **kw)


def one_line_error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode != 0, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    # the error is one line, the last; progress lines of work done before it may precede it
    assert lines and lines[-1].startswith("error: "), p.stderr
    assert sum(ln.startswith("error") for ln in lines) == 1, p.stderr
    assert all(ln.startswith(("capacities: ", "runs: ")) for ln in lines[:-1]), p.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def trace_csv(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("trace") / "t.csv"
    save_trace(make_example_trace(200), p)
    return p


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_demo_corpus(tmp_path_factory.mktemp("corpus") / "corpus", windows_per_source=2,
                             requests_per_window=40)


@pytest.fixture(scope="module")
def store(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("store") / "res"
    run_sweep(corpus, out, schedulers="vllm-fcfs,sjf", regions="light,overload", workers=1, progress=False)
    return out


def _can_mount() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "geteuid") and os.geteuid() == 0 \
        and shutil.which("mount") is not None


@contextmanager
def tmpfs(path: Path, size: str, readonly: bool = False):
    """A real small (or read-only) file system at `path`; skips the test where none can be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    if not _can_mount():
        pytest.skip("mounting a tmpfs needs root")
    opts = f"size={size}" + (",ro" if readonly else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


# ============================================================================ 1. numbers where they enter


@pytest.mark.parametrize("load,why", [("1e-320", "not a positive finite"), ("1e-310", "time scale"),
                                      ("1e-15", "2^32"), ("1e9", "metrics horizon"), ("nan", "--load")])
def test_extreme_loads_are_refused_with_the_reason(trace_csv, tmp_path, load, why):
    # refused, not spinning (a hang ran for minutes): cli's timeout fails a hang, by its state
    msg = one_line_error(cli("simulate", "--trace", trace_csv, "--scheduler", "vllm-fcfs", "--load", load,
                             "--out", tmp_path / "o"))
    assert why in msg
    assert not (tmp_path / "o").exists()


def test_time_scale_of_the_python_api_must_be_positive_and_finite():
    t = make_example_trace(100)
    for bad in (float("nan"), float("inf"), -1.0, 0.0):
        with pytest.raises(SchedportError, match="time_scale must be a positive, finite number"):
            schedport.simulate(t, "vllm-fcfs", time_scale=bad)
    ok = schedport.simulate(t, "vllm-fcfs", time_scale=2.0)
    assert ok.summary["n_completed"] == 100


def test_an_arrival_beyond_the_clocks_resolution_is_refused(tmp_path):
    p = tmp_path / "far.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1e300,10,5\n")
    msg = one_line_error(cli("simulate", "--trace", p, "--scheduler", "vllm-fcfs", "--out", tmp_path / "o"))
    assert "far.csv: line 3" in msg and "arrival_s" in msg and "too large" in msg


@pytest.mark.parametrize("region,why", [("tiny=1e-320", "time scale"), ("huge=1e9", "metrics horizon")])
def test_an_extreme_custom_region_is_refused_before_any_cell_runs(corpus, tmp_path, region, why):
    out = tmp_path / "res"
    msg = one_line_error(cli("run", "--corpus", corpus, "--out", out, "--schedulers", "vllm-fcfs,sjf",
                             "--regions", region, "--workers", "1"))
    assert f"region {region.split('=')[0]}" in msg and why in msg
    assert not list((out / "runs").glob("part-*"))


def test_the_engine_fails_in_one_line_instead_of_spinning_on_a_clock_that_cannot_advance():
    from schedport.engine.core.config import load_engine_config
    from schedport.engine.modes import make_simulator
    from schedport.engine.core.latency import make_latency_model
    from schedport.engine.policies.schedulers import get_policy
    from schedport.workload.trace import Trace

    t = make_example_trace(5)
    broken = Trace(np.array([0.0, 1.0, np.nan, np.nan, np.nan]), t.input_tokens, t.output_tokens)
    cfg = load_engine_config(None)
    with pytest.raises(SchedportError, match="makes no progress"):
        make_simulator(broken, get_policy("vllm-fcfs"), cfg, make_latency_model(cfg)).run()


def test_negative_seed_is_one_line(trace_csv, tmp_path):
    msg = one_line_error(cli("simulate", "--trace", trace_csv, "--scheduler", "ltr", "--seed", "-1",
                             "--out", tmp_path / "o"))
    assert "--seed must be a non-negative integer" in msg


# ============================================================================ 2. analyze verifies every part


def _copy(store: Path, tmp_path: Path) -> Path:
    d = tmp_path / "copy"
    shutil.copytree(store, d, ignore=shutil.ignore_patterns(".lock"))
    return d


def test_analyze_refuses_a_part_with_a_flipped_bit_as_run_does(store, corpus, tmp_path):
    d = _copy(store, tmp_path)
    part = sorted((d / "runs").glob("part-*.parquet"))[0]
    meta = pq.ParquetFile(part).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    col = meta.row_group(0).column(names.index("throughput_rps"))
    at = col.data_page_offset + col.total_compressed_size - 1  # inside the last data page's values
    data = bytearray(part.read_bytes())
    data[at] ^= 0x01
    part.write_bytes(bytes(data))
    msg = one_line_error(cli("analyze", "--results", d))
    assert part.name in msg and "corrupt results part" in msg
    msg = one_line_error(cli("run", "--corpus", corpus, "--out", d, "--schedulers", "vllm-fcfs,sjf",
                             "--regions", "light,overload", "--workers", "1"))
    assert part.name in msg and "corrupt results part" in msg


def test_an_engine_config_edited_without_its_hash_is_refused_by_analyze_and_run(store, corpus, tmp_path):
    d = _copy(store, tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    m["engine_config"]["engine"]["max_num_seqs"] = 7  # engine_hash left alone
    (d / "manifest.json").write_text(json.dumps(m))
    for p in (cli("analyze", "--results", d),
              cli("run", "--corpus", corpus, "--out", d, "--schedulers", "vllm-fcfs,sjf", "--regions",
                  "light,overload", "--workers", "1")):
        msg = one_line_error(p)
        assert "engine_config" in msg and "edited" in msg


def test_analyze_of_a_sound_store_still_works(store, tmp_path):
    d = _copy(store, tmp_path)
    p = cli("analyze", "--results", d, "--boot", "50")
    assert p.returncode == 0, p.stderr
    assert (d / "report.html").is_file() and (d / "portability.json").is_file()


# ============================================================================ 3. output paths and I/O errors


def _commands(trace_csv: Path, corpus: Path, store: Path, out) -> dict[str, list]:
    return {
        "simulate": ["simulate", "--trace", trace_csv, "--scheduler", "vllm-fcfs", "--out", out],
        "analyze": ["analyze", "--results", store, "--out", out],
        "corpus build": ["corpus", "build", "--spec", "/nonexistent-is-not-reached.toml", "--out", out],
        "run": ["run", "--corpus", corpus, "--out", out, "--schedulers", "vllm-fcfs,sjf", "--workers", "1"],
        "example": ["example", "--out", out],
    }


@pytest.mark.parametrize("command", ["simulate", "analyze", "corpus build", "run"])
@pytest.mark.parametrize("target", ["existing file", "/dev/null", "/proc"])
def test_an_unusable_output_directory_is_refused_up_front(trace_csv, corpus, store, tmp_path, command, target):
    if target == "existing file":
        out = tmp_path / "a-file"
        out.write_text("mine\n")
    elif target == "/dev/null":
        if not os.path.exists("/dev/null"):
            pytest.skip("no /dev/null")
        out = Path("/dev/null")
    else:
        if not os.path.isdir("/proc/self"):
            pytest.skip("no /proc")
        out = Path("/proc/self/schedport-out")
    msg = one_line_error(cli(*_commands(trace_csv, corpus, store, out)[command]))
    assert str(out) in msg
    if target == "existing file":
        assert out.read_text() == "mine\n"


def test_file_outputs_refuse_a_directory_and_a_device(tmp_path):
    msg = one_line_error(cli("example", "--out", tmp_path))
    assert "is a directory" in msg
    if os.path.exists("/dev/null"):
        msg = one_line_error(cli("example", "--out", "/dev/null"))
        assert "not a regular file" in msg
        assert Path("/dev/null").exists() and not Path("/dev/null").is_file()


@pytest.mark.parametrize("command", ["simulate", "analyze", "run", "example"])
def test_a_read_only_file_system_is_one_line(trace_csv, corpus, store, tmp_path, command):
    with tmpfs(tmp_path / "ro", "1m", readonly=True) as ro:
        out = ro / ("x.csv" if command == "example" else "out")
        msg = one_line_error(cli(*_commands(trace_csv, corpus, store, out)[command]))
        assert str(out) in msg and "Read-only file system" in msg


def test_a_full_disk_during_run_is_one_line_leaves_no_temp_file_and_the_rerun_resumes(corpus, tmp_path):
    with tmpfs(tmp_path / "full", "300k") as full:
        out = full / "res"
        args = ["run", "--corpus", corpus, "--out", out, "--schedulers", "vllm-fcfs,sjf", "--workers", "1"]
        msg = one_line_error(cli(*args))
        assert "No space left on device" in msg
        assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
        # free the space (as a user would) and rerun: the finished cells are kept, the analysis is written
        moved = tmp_path / "res"
        shutil.copytree(out, moved)
    p = cli("run", "--corpus", corpus, "--out", moved, "--schedulers", "vllm-fcfs,sjf", "--workers", "1",
            timeout=120)
    assert p.returncode == 0, p.stderr
    assert (moved / "report.html").is_file()
    m = json.loads((moved / "manifest.json").read_text())
    assert m["status"] == "finished" and all(r["status"] != "running" for r in m["runs"])


def test_a_full_disk_during_corpus_build_is_one_line_and_leaves_nothing(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "mine.jsonl").write_text("".join(
        json.dumps({"timestamp": 100 * i, "input_length": int(rng.integers(1, 3000)), "output_length": 50}) + "\n"
        for i in range(20000)))
    spec = tmp_path / "mine.toml"
    spec.write_text('name = "mine"\n[[sources]]\nname = "mine"\nadapter = "jsonl"\nfiles = ["mine.jsonl"]\n'
                    'windows = { rule = "contiguous", count = 8, duration_s = 200 }\n')
    with tmpfs(tmp_path / "full", "64k") as full:
        msg = one_line_error(cli("corpus", "build", "--spec", spec, "--data-dir", tmp_path, "--out", full / "c",
                                 timeout=120))
        assert str(full / "c") in msg and "No space left on device" in msg
        assert list(full.iterdir()) == []


def _main(argv, monkeypatch, capsys) -> tuple[int, str]:
    """Run the console entry point in-process (so a fault can be injected); (exit code, stderr)."""
    from schedport import cli as cli_mod

    monkeypatch.setattr(sys, "argv", ["schedport", *map(str, argv)])
    with pytest.raises(SystemExit) as ex:
        cli_mod.main()
    return ex.value.code, capsys.readouterr().err


def test_a_full_disk_while_simulate_writes_is_one_line_and_leaves_no_temp_file(trace_csv, tmp_path,
                                                                                 monkeypatch, capsys):
    import pandas as pd
    import pyarrow.parquet as pq

    def full(table, path, *a, **k):
        with open(path, "wb") as f:
            f.write(b"PAR1")
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    # simulate writes requests.parquet with pyarrow from the run's columns (the DataFrame's writer
    # where a column is not covered): the disk is full for both
    monkeypatch.setattr(pq, "write_table", full)
    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    out = tmp_path / "o"
    code, err = _main(["simulate", "--trace", trace_csv, "--scheduler", "vllm-fcfs", "--out", out],
                      monkeypatch, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err
    assert lines[0] == f"error: {out / 'requests.parquet'}: cannot write (No space left on device)"
    assert list(out.iterdir()) == []


def test_a_full_disk_while_the_analysis_writes_removes_its_temp_files(store, tmp_path, monkeypatch, capsys):
    d = _copy(store, tmp_path)
    real_write_bytes = Path.write_bytes

    def write_bytes(self, data):   # what the one atomic write (schedport.common.atomic) writes with
        if self.name.endswith(".tmp"):
            real_write_bytes(self, data[: len(data) // 2])  # half written, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_bytes(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    code, err = _main(["analyze", "--results", d, "--boot", "20"], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and "No space left on device" in err
    assert not list(d.glob("*.tmp"))


def test_a_killed_sweep_leaves_no_running_entry_after_the_next_run(tmp_path):
    corpus = write_demo_corpus(tmp_path / "corpus", windows_per_source=2, requests_per_window=40)
    out, gate = tmp_path / "res", tmp_path / "gate"
    gate.mkdir()
    args = ["run", "--corpus", str(corpus), "--out", str(out), "--schedulers", "vllm-fcfs,sjf,ltr", "--seeds", "2",
            "--workers", "1"]
    # the second window's first chunk is held at the gate: the kill comes mid-sweep, on any machine
    body = "from schedport.cli import main\nsys.argv = ['schedport', *sys.argv[1:]]\nmain()"
    proc = subprocess.Popen([sys.executable, "-c", _gate.driver(gate, ["demo-a-00"], body), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_gate.env())
    try:
        _gate.wait_held(gate, 1, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert json.loads((out / "manifest.json").read_text())["runs"][-1]["status"] == "running"
    p = cli(*args, timeout=300)
    assert p.returncode == 0, p.stderr
    runs = json.loads((out / "manifest.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["abandoned", "finished"]


def test_a_manifest_whose_runs_is_not_a_list_is_one_line(store, corpus, tmp_path):
    d = _copy(store, tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    m["runs"] = {"not": "a list"}
    (d / "manifest.json").write_text(json.dumps(m))
    msg = one_line_error(cli("run", "--corpus", corpus, "--out", d, "--schedulers", "vllm-fcfs,sjf",
                             "--regions", "light,overload", "--workers", "1"))
    assert "'runs'" in msg and "manifest.json" in msg


# ============================================================================ 4. own pools, token ranges


def test_a_users_own_servegen_style_pool_is_not_held_to_the_public_hashes(tmp_path):
    pool = tmp_path / "my-pool"
    shutil.copytree(FIXTURES / "servegen_pool", pool)  # named like the public chunk-N files, other bytes
    spec = tmp_path / "mine.toml"
    spec.write_text('name = "mine"\n[[sources]]\nname = "mypool"\nadapter = "servegen"\nseed = 1\n'
                    'files = ["my-pool/"]\nwindows = { rule = "stratified", count = 1, days = 1, '
                    'target_requests = 50 }\n')
    p = cli("corpus", "build", "--spec", spec, "--data-dir", tmp_path / "nodata", "--out", tmp_path / "c",
            timeout=120)
    assert p.returncode == 0, p.stderr
    man = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert man["windows"][0]["origin_files"] >= 1 and len(man["windows"][0]["origin_sha256"]) == 64


def test_token_counts_beyond_the_run_limit_are_refused_at_build_time(tmp_path):
    (tmp_path / "big.jsonl").write_text(
        "".join(json.dumps({"timestamp": 1000 * i, "input_length": 3_000_000_000 if i == 3 else 100,
                            "output_length": 10}) + "\n" for i in range(20)))
    spec = tmp_path / "big.toml"
    spec.write_text('name = "big"\n[[sources]]\nname = "big"\nadapter = "jsonl"\nfiles = ["big.jsonl"]\n'
                    'windows = { rule = "contiguous", count = 1, duration_s = 30 }\n')
    msg = one_line_error(cli("corpus", "build", "--spec", spec, "--data-dir", tmp_path, "--out", tmp_path / "c",
                             timeout=120))
    assert "window big-00" in msg and "input_tokens" in msg and "2147483647" in msg
    assert not (tmp_path / "c").exists()


# ============================================================================ 6. the smaller items


def test_reject_reasons_are_in_requests_parquet(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,900000,5\n2,10,5\n")
    r = cli("simulate", "--trace", p, "--scheduler", "vllm-fcfs", "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    import pandas as pd

    df = pd.read_parquet(tmp_path / "o" / "requests.parquet")
    assert df.status.tolist() == ["completed", "rejected", "completed"]
    assert "max_model_len" in df.reject_reason[1] and df.reject_reason[[0, 2]].isna().all()


def test_simulate_writes_files_with_the_umask_permissions(trace_csv, tmp_path):
    r = subprocess.run([sys.executable, "-c", "import os, sys; os.umask(0o022); "
                        "from schedport.cli import main; sys.argv = sys.argv[1:]; main()",
                        "schedport", "simulate", "--trace", str(trace_csv), "--scheduler", "vllm-fcfs",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name in ("requests.parquet", "summary.json"):
        assert (tmp_path / "o" / name).stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("option", ["--schedulers", "--sources", "--regions"])
def test_an_empty_selector_is_an_error_not_everything(corpus, tmp_path, option):
    msg = one_line_error(cli("run", "--corpus", corpus, "--out", tmp_path / "r", option, ""))
    assert option in msg and "no name given" in msg


def test_a_selection_the_analysis_cannot_use_fails_before_running_anything(corpus, tmp_path):
    out = tmp_path / "r"
    msg = one_line_error(cli("run", "--corpus", corpus, "--out", out, "--windows", "1", "--schedulers",
                             "vllm-fcfs,sjf"))
    assert "--windows" in msg and "at least 2 windows" in msg
    msg = one_line_error(cli("run", "--corpus", corpus, "--out", out, "--schedulers", "sjf"))
    assert "--schedulers" in msg and "at least 2" in msg
    assert not (out / "runs").exists()


def test_an_empty_out_is_refused(trace_csv, corpus, tmp_path):
    for args in (["simulate", "--trace", trace_csv, "--scheduler", "vllm-fcfs", "--out", ""],
                 ["run", "--corpus", corpus, "--out", ""], ["corpus", "build", "--out", ""],
                 ["example", "--out", ""], ["analyze", "--results", corpus, "--out", ""]):
        msg = one_line_error(cli(*args, cwd=tmp_path))
        assert "--out" in msg and "empty path" in msg
    assert list(tmp_path.iterdir()) == []


def test_exact_is_shown_and_used_as_a_flag(trace_csv, tmp_path):
    h = cli("simulate", "--help")
    assert h.returncode == 0 and "--exact / --fast" in h.stdout and "<bool>" not in h.stdout
    msg = one_line_error(cli("simulate", "--trace", trace_csv, "--scheduler", "vllm-fcfs", "--out",
                             tmp_path / "o", "--exact", "false"))
    assert "false" in msg and "--help" in msg
    r = cli("simulate", "--trace", trace_csv, "--scheduler", "vllm-fcfs", "--out", tmp_path / "o", "--exact")
    assert r.returncode == 0, r.stderr


def test_a_usage_error_is_one_line(tmp_path):
    msg = one_line_error(cli("simulate", "--no-such-option"))
    assert "--no-such-option" in msg


def test_run_reports_progress_as_plain_lines_when_not_on_a_terminal(corpus, tmp_path):
    r = cli("run", "--corpus", corpus, "--out", tmp_path / "r", "--schedulers", "vllm-fcfs,sjf", "--workers", "1",
            timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("runs: ")]
    assert lines and lines[-1].startswith("runs: 48/48 (100.0%), ") and "runs/s" in lines[-1] \
        and "elapsed" in lines[-1] and lines[-1].endswith("done")
    assert "\x1b[" not in r.stderr  # no terminal control sequences in a log


def test_plain_progress_prints_done_total_rate_and_eta_every_interval():
    from rich.console import Console

    now = [0.0]
    con = Console(record=True, width=200, force_terminal=False)
    bar = PlainProgress(con, every=5.0, clock=lambda: now[0])
    task = bar.add_task("runs", total=100)
    for _ in range(10):
        now[0] += 1.0
        bar.advance(task, 2)
    bar.refresh()
    now[0] += 6.0
    bar.refresh()  # a long chunk: the idle tick still reports
    now[0] += 1.0
    bar.advance(task, 80)
    lines = con.export_text().splitlines()
    assert lines == ["runs: 10/100 (10.0%), 2.0 runs/s, elapsed 5.0 s, ETA 45.0 s",
                     "runs: 20/100 (20.0%), 2.0 runs/s, elapsed 10.0 s, ETA 40.0 s",
                     "runs: 20/100 (20.0%), 1.2 runs/s, elapsed 16.0 s, ETA 1 min 04 s",
                     "runs: 100/100 (100.0%), 5.9 runs/s, elapsed 17.0 s, done"]
