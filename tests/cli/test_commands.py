"""The command line as a user meets it: outputs, exit codes, and one-line errors (no tracebacks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from schedport.engine.policies.schedulers import REGISTRY
from _paths import FIXTURES


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


def one_line_error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ex")
    p = d / "example.csv"
    r = cli("example", "--out", p, "--requests", "300")
    assert r.returncode == 0, r.stderr
    return p


def test_schedulers_lists_all_thirteen():
    r = cli("schedulers")
    assert r.returncode == 0
    names = [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]
    assert names == list(REGISTRY) and len(names) == 13


def test_simulate_writes_requests_and_summary(example, tmp_path):
    out = tmp_path / "run"
    r = cli("simulate", "--trace", example, "--scheduler", "sarathi", "--load", "0.8", "--out", out)
    assert r.returncode == 0, r.stderr
    df = pd.read_parquet(out / "requests.parquet")
    assert list(df.columns) == ["request_id", "client_id", "arrival_s", "input_tokens", "output_tokens",
                                "status", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s",
                                "preemptions", "cached_tokens", "recomputed_tokens", "reject_reason"]
    assert len(df) == 300 and set(df.status) <= {"completed", "rejected", "unfinished"}
    s = json.loads((out / "summary.json").read_text())
    for k in ("n_requests", "n_completed", "n_rejected", "makespan_s", "throughput_rps",
              "output_tokens_per_s", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
              "tpot_mean_s", "tpot_p50_s", "tpot_p99_s", "e2e_mean_s", "e2e_p99_s",
              "norm_latency_mean_s", "slowdown_jain", "preemptions", "iterations",
              "completed_within_horizon", "slo_attainment_strict", "goodput_standard_rps",
              "slo_attainment_relaxed"):
        assert k in s, k
    assert s["n_requests"] == 300


def test_exact_and_fast_cli_runs_agree(example, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out, extra in ((a, []), (b, ["--exact"])):
        r = cli("simulate", "--trace", example, "--scheduler", "hrrn", "--load", "1.2", "--out", out, *extra)
        assert r.returncode == 0, r.stderr
    assert pd.read_parquet(a / "requests.parquet").equals(pd.read_parquet(b / "requests.parquet"))


def test_unknown_scheduler(example, tmp_path):
    msg = one_line_error(cli("simulate", "--trace", example, "--scheduler", "fifo", "--out", tmp_path))
    assert "unknown scheduler 'fifo'" in msg and "vllm-fcfs" in msg


def test_bad_engine_key(example, tmp_path):
    eng = tmp_path / "engine.toml"
    eng.write_text("[engine]\nmax_num_seq = 4\n")
    msg = one_line_error(cli("simulate", "--trace", example, "--scheduler", "vllm-fcfs",
                             "--engine", eng, "--out", tmp_path / "o"))
    assert "engine.toml" in msg and "max_num_seq" in msg


def test_impossible_engine_value(example, tmp_path):
    eng = tmp_path / "engine.toml"
    eng.write_text("[engine]\nmax_num_seqs = -3\n")
    msg = one_line_error(cli("simulate", "--trace", example, "--scheduler", "vllm-fcfs",
                             "--engine", eng, "--out", tmp_path / "o"))
    assert "max_num_seqs" in msg and "-3" in msg


def test_unknown_scheduler_parameter(example, tmp_path):
    eng = tmp_path / "engine.toml"
    eng.write_text("[scheduler.ltr]\ntaux = 0.5\n")
    msg = one_line_error(cli("simulate", "--trace", example, "--scheduler", "ltr",
                             "--engine", eng, "--out", tmp_path / "o"))
    assert "taux" in msg and "tau" in msg


@pytest.mark.parametrize("body,where", [
    ("arrival_s,input_tokens,output_tokens\n0,10,5\n1,x,5\n", "line 3"),
    ("arrival_s,input_tokens,output_tokens\n0,10,5\n1,0,5\n", "line 3"),
    ("arrival_s,input_tokens\n0,10\n", "output_tokens"),
    ("arrival_s,input_tokens,output_tokens\n2,10,5\n1,10,5\n", "line 3"),
    ("", "empty"),
])
def test_bad_trace(tmp_path, body, where):
    t = tmp_path / "bad.csv"
    t.write_text(body)
    msg = one_line_error(cli("simulate", "--trace", t, "--scheduler", "vllm-fcfs", "--out", tmp_path / "o"))
    assert "bad.csv" in msg and where in msg


def test_load_must_be_positive(example, tmp_path):
    msg = one_line_error(cli("simulate", "--trace", example, "--scheduler", "vllm-fcfs", "--load", "-1",
                             "--out", tmp_path / "o"))
    assert "--load" in msg


def test_simulate_region_def_names_what_load_is_relative_to(tmp_path):
    trace = tmp_path / "t.csv"
    assert cli("example", "--out", trace, "--requests", "200").returncode == 0
    got = {}
    for d in ("sustainable", "drain"):
        p = cli("simulate", "--trace", trace, "--scheduler", "vllm-fcfs", "--load", "1.6", "--region-def", d,
                "--out", tmp_path / d)
        assert p.returncode == 0, p.stderr
        got[d] = json.loads((tmp_path / d / "summary.json").read_text())["backlog_at_last_arrival"]
    assert got["sustainable"] > got["drain"]      # the drain's lower capacity is a lighter "overload"
    p = cli("simulate", "--trace", trace, "--scheduler", "vllm-fcfs", "--region-def", "drain", "--out", tmp_path / "x")
    assert p.returncode != 0 and "give --load too" in p.stderr and "Traceback" not in p.stderr


def test_version_prints_the_package_version():
    from schedport.__about__ import __version__

    r = cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"schedport {__version__}"
    assert "--version" in cli("--help").stdout


HEAVY = ("numpy", "pandas", "pyarrow", "scipy", "matplotlib", "rich", "schedport.api")  # (pydantic: typer's own)


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["run", "--help"], ["analyze", "--help"],
                                  ["explain", "--help"], ["conformance", "--help"], ["corpus", "list", "--help"]])
def test_help_and_version_import_no_heavy_module(args):
    # `schedport --help` starts at once: numpy, pandas, scipy, rich and schedport.api are imported
    # by the commands that use them, never to list or describe the commands
    code = ("import sys\nsys.argv = ['schedport', *sys.argv[1:]]\nfrom schedport.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print('LOADED', sorted(m for m in sys.modules if m in {HEAVY!r} or m.split('.')[0] in {HEAVY!r}))")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "LOADED []", r.stdout.splitlines()[-1]


def test_cli_defaults_copied_for_a_fast_start_match_the_library():
    # the command modules keep literal copies of a few library constants (to avoid importing the
    # library at start-up); they must not drift from the originals
    from schedport.analysis.explain import DEFAULT_BOOT, FEATURES
    from schedport.cli import conformance as cli_conformance, corpus as cli_corpus, explain as cli_explain
    from schedport.cli import study as cli_study
    from schedport.realengine.conformance import VLLM_POLICY
    from schedport.study import sweep
    from schedport.workload import corpus as corpus_lib

    assert cli_explain.DEFAULT_BOOT == DEFAULT_BOOT
    assert cli_explain.FEATURES == tuple(FEATURES)
    assert cli_conformance.VLLM_SCHEDULERS == tuple(VLLM_POLICY)
    assert cli_corpus.DEFAULT_OUT == corpus_lib.DEFAULT_OUT
    assert (cli_study.DEFAULT_CORPUS, cli_study.DEFAULT_OUT) == (sweep.DEFAULT_CORPUS, sweep.DEFAULT_OUT)


@pytest.mark.parametrize("group", [[], ["corpus"], ["trace"]])
def test_help_lists_commands_in_pipeline_order_each_on_one_whole_line(group):
    import os

    r = subprocess.run([sys.executable, "-m", "schedport.cli", *group, "--help"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    block = r.stdout.split("Commands:\n", 1)[1].splitlines()
    rows = [ln for ln in block if ln.strip()]
    assert all(ln.startswith("  ") and not ln.startswith("   ") for ln in rows), r.stdout  # no wrapped line
    assert not any(ln.rstrip().endswith("...") for ln in rows), r.stdout                 # none cut off
    names = [ln.split()[0] for ln in rows]
    if not group:
        assert names[:7] == ["corpus", "run", "analyze", "explain", "report", "simulate", "schedulers"]
        assert names.index("calibrate") > names.index("trace") and names[-1] == "conformance"


COMMANDS = [["corpus", "build"], ["corpus", "verify"], ["corpus", "list"], ["run"], ["analyze"], ["explain"], ["report"],
            ["simulate"], ["schedulers"], ["example"], ["trace", "convert"], ["trace", "check"], ["calibrate"],
            ["replay"], ["validate"], ["conformance"]]


def test_every_placeholder_has_one_style():
    # one style for every value placeholder: an upper-case word (FILE, DIR, N, LIST, ...), never
    # typer's `<path>`, `<Path>` or `<list[str]>`
    import os
    import re

    env = {**os.environ, "COLUMNS": "200"}
    for args in COMMANDS:
        r = subprocess.run([sys.executable, "-m", "schedport.cli", *args, "--help"], capture_output=True, text=True,
                           timeout=120, env=env)
        assert r.returncode == 0, (args, r.stderr)
        assert "<" not in r.stdout, (args, r.stdout)
        for m in re.finditer(r"^  (--[\w-]+)(?:, --[\w-]+)* (\S+)", r.stdout, re.M):
            placeholder = m.group(2)
            assert placeholder == "/" or re.fullmatch(r"[A-Z]+", placeholder), (args, m.group(0))


def test_trace_convert_from_mooncake_keeps_prefix_identity_and_simulate_reads_it(tmp_path):
    fixture = FIXTURES / "sources" / "mooncake_prefix.jsonl"
    t = tmp_path / "m.csv"
    r = cli("trace", "convert", fixture, "--from", "mooncake", "--out", t)
    assert r.returncode == 0, r.stderr
    assert "wrote 5 requests" in r.stdout and "zero_output_tokens=1" in r.stdout
    lines = t.read_text().splitlines()
    assert lines[0] == "arrival_s,input_tokens,output_tokens,hash_ids@512"
    assert lines[3] == "1.5,1700,30,0 1 4 5"
    r = cli("simulate", "--trace", t, "--scheduler", "vllm-fcfs", "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    with_ids = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert len(with_ids) == 5
    # the engine does not use the ids (yet): the same requests without them run identically
    plain = tmp_path / "plain.csv"
    assert cli("trace", "convert", fixture, "--from", "jsonl", "--out", plain).returncode == 0
    r = cli("simulate", "--trace", plain, "--scheduler", "vllm-fcfs", "--out", tmp_path / "run-plain")
    assert r.returncode == 0, r.stderr
    pd.testing.assert_frame_equal(with_ids, pd.read_parquet(tmp_path / "run-plain" / "requests.parquet"))
    bad = tmp_path / "bad.csv"
    bad.write_text(lines[0] + "\n0.0,1200,5,0 1\n")
    msg = one_line_error(cli("simulate", "--trace", bad, "--scheduler", "vllm-fcfs", "--out", tmp_path / "r2"))
    assert msg == (f"error: {bad}: line 2: column 'hash_ids@512': 2 ids for 1200 input tokens; "
                   "expected ceil(1200 / 512) = 3")
