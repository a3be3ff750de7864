"""A user's names, files and servers get the right result or a one-line refusal: source names are
identities (a user's source is never cited or analysed as a built-in one), corpus specs and their
CSVs follow one set of rules, and the analysis and real-engine commands refuse what they cannot
do truthfully. Every test runs the `schedport` command as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _synthstore import MANIFEST, REGIONS6, SCHEDULERS13, make_runs, write_store


def cli(*args, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def one_line_error(p: subprocess.CompletedProcess, code: int | None = None) -> str:
    assert p.returncode != 0, (p.stdout, p.stderr)
    if code is not None:
        assert p.returncode == code, (p.returncode, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr and "Warning" not in p.stderr
    return lines[0]


def canonical_csv(path: Path, rows: list[tuple], header: str = "arrival_s,input_tokens,output_tokens") -> Path:
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


def spec(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def user_source(name: str, files: str = '["mine.csv"]', windows: str = 'windows = { rule = "tile", count = 2 }',
                cite: str = "our own trace, 2025") -> str:
    return (f'[[sources]]\nname = "{name}"\nadapter = "canonical"\ncite = "{cite}"\nfiles = {files}\n'
            f'{windows}\n')


ROWS = [(i * 0.5, 10 + i, 5 + i) for i in range(40)]


# ============================================================================ 1. names are identities


def test_a_user_source_may_not_take_a_built_in_name(tmp_path):
    canonical_csv(tmp_path / "mine.csv", ROWS)
    for name in ("burstgpt", "azure", "bailian", "burstgpt-modeled-mine"):
        s = spec(tmp_path / f"{name}.toml", user_source(name))
        line = one_line_error(cli("corpus", "build", "--spec", s, "--data-dir", tmp_path / "nodata",
                                  "--out", tmp_path / f"c-{name}"))
        assert f"name {name!r} is reserved" in line and f"{name}.toml" in line, line
        assert not (tmp_path / f"c-{name}").exists()
    # a name of its own builds, and its cite is in the manifest
    s = spec(tmp_path / "ok.toml", user_source("my-burstgpt"))
    r = cli("corpus", "build", "--spec", s, "--data-dir", tmp_path / "nodata", "--out", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    man = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert man["sources"]["my-burstgpt"]["cite"] == "our own trace, 2025"


def test_a_user_source_is_cited_as_its_own_and_never_enters_a_built_in_claim(tmp_path):
    """Sources named like the built-in ones (substrings) are a user's: their own cite in
    data_sources and the report, and no claim about BurstGPT or Azure/Bailian reads them."""
    names = ["azure-mine", "bailian2", "my-burstgpt"]
    runs = make_runs(sources=names, schedulers=SCHEDULERS13[:4], n_windows=5, regions=REGIONS6[:2])
    store = write_store(tmp_path / "store", runs)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    cites = {n: f"cite of {n}" for n in names}
    (corpus / "manifest.json").write_text(json.dumps({
        "corpus_sha256": MANIFEST["corpus_sha256"],
        "sources": {n: {"adapter": "canonical", "cite": cites[n], "modeled": False} for n in names},
        "windows": [{"source": n, "window_id": f"{n}-{w:02d}", "n_requests": 10} for n in names
                    for w in range(5)]}))
    r = cli("analyze", "--results", store, "--out", tmp_path / "out", "--corpus", corpus, "--boot", "50",
            "--splits", "10", "--no-robustness")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "out" / "portability.json").read_text())
    ds = {d["source"]: d for d in res["provenance"]["data_sources"]}
    for n in names:
        assert ds[n]["citation"] == cites[n] and ds[n]["name"] == n and ds[n]["modeled"] is False, ds[n]
    claims = {c["id"]: c for c in res["study_form"]["claims"]}
    assert claims["azure_bailian"]["verdict"] == "not comparable"
    assert claims["burstgpt_low"]["verdict"] == "not comparable"
    html = (tmp_path / "out" / "report.html").read_text()
    assert "cite of my-burstgpt" in html and "KDD 2025" not in html and "Splitwise" not in html


# ============================================================================ 5. validate with no completions


def _validate_inputs(tmp_path: Path) -> tuple[Path, Path, list[int]]:
    lengths = [100, 101, 102, 103, 104]
    tr = canonical_csv(tmp_path / "trace.csv", [(1.0 * i, n, 20) for i, n in enumerate(lengths)])
    eng = tmp_path / "engine.toml"
    eng.write_text("# the defaults of docs/engine.md\n")
    return tr, eng, lengths


def test_validate_that_completes_nothing_exits_non_zero(tmp_path):
    """A server that answers the speed probe but never a request, and one that hangs with
    --no-speed-probe: one line, exit 2, and no agreement table read from timeouts."""
    from test_replay import FakeServer

    tr, eng, lengths = _validate_inputs(tmp_path)
    server = FakeServer()
    server.start()
    try:
        server.configure(modes={n: "stall0" for n in lengths})     # the 256-token probe is answered
        for k, probe in enumerate(("--speed-probe", "--no-speed-probe")):
            out = tmp_path / f"v{k}"
            r = cli("validate", "--endpoint", server.url, "--engine", eng, "--trace", tr, "--out", out,
                    "--schedulers", "vllm-fcfs,sjf", "--regions", "low=0.03", "--request-timeout", "0.5",
                    probe, timeout=120)
            lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
            assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
            assert "2 of 2 replays completed less than 50%" in lines[0] and "0 of 5 completed" in lines[0]
            assert "top-1" not in r.stdout
            v = json.loads((out / "validation.json").read_text())
            assert v["completion"]["ok"] is False and v["completion"]["worst"]["n_completed"] == 0
        # a bad share is one line before any replay
        r = cli("validate", "--endpoint", server.url, "--engine", eng, "--trace", tr, "--out", tmp_path / "v9",
                "--schedulers", "vllm-fcfs,sjf", "--min-completed", "1.5", "--no-speed-probe")
        assert "--min-completed must be a share in (0, 1]" in one_line_error(r, 2)
    finally:
        server.close()


# ============================================================================ 10, 12, 17. one rule for CSV input


def _build(tmp_path: Path, name: str, csv_text: str, windows: str = 'windows = { rule = "tile", count = 2 }'):
    (tmp_path / f"{name}.csv").write_text(csv_text)
    s = spec(tmp_path / f"{name}.toml", user_source("mine", files=f'["{name}.csv"]', windows=windows))
    return cli("corpus", "build", "--spec", s, "--data-dir", tmp_path / "nodata", "--out", tmp_path / f"c-{name}")


def _windows(tmp_path: Path, name: str) -> list[dict]:
    return json.loads((tmp_path / f"c-{name}" / "manifest.json").read_text())["windows"]


def test_corpus_build_refuses_a_duplicate_column_as_trace_check_does(tmp_path):
    text = "arrival_s,input_tokens,output_tokens,input_tokens\n" + "".join(
        f"{i},{10 + i},5,99\n" for i in range(6))
    line = one_line_error(_build(tmp_path, "dup", text), 2)
    assert line == "error: dup.csv: line 1: column 'input_tokens' appears more than once"
    (tmp_path / "dup.csv").write_text(text)
    assert one_line_error(cli("trace", "check", tmp_path / "dup.csv"), 2).endswith(
        "line 1: column 'input_tokens' appears more than once")
    assert not (tmp_path / "c-dup").exists()


def test_zero_token_rows_are_counted_wherever_they_are(tmp_path):
    """A zero-token row first, in the middle or last is dropped and counted in its window."""
    rows = [(i, 10 + i, 5) for i in range(8)]
    for where, k in (("first", 0), ("middle", 3), ("last", 7)):
        body = [list(r) for r in rows]
        body[k][1] = 0
        r = _build(tmp_path, where, "arrival_s,input_tokens,output_tokens\n"
                   + "".join(",".join(map(str, b)) + "\n" for b in body))
        assert r.returncode == 0, r.stderr
        wins = _windows(tmp_path, where)
        assert sum(w["dropped"]["zero_input_tokens"] for w in wins) == 1, (where, wins)
        assert sum(w["n_requests"] for w in wins) == 7, (where, wins)


def test_a_token_count_beyond_the_limit_is_too_large_not_negative(tmp_path):
    for n in ("99999999999999999999", "3000000000"):
        r = _build(tmp_path, "big", f"arrival_s,input_tokens,output_tokens\n0,10,5\n1,{n},5\n2,12,5\n3,13,5\n")
        line = one_line_error(r, 2)
        assert line == (f"error: big.csv: line 3: column 'input_tokens': '{n}' is too large; "
                        "token counts must be <= 2147483647"), line


# ============================================================================ 13. extends cycles


def test_an_extends_cycle_is_one_line(tmp_path):
    canonical_csv(tmp_path / "mine.csv", ROWS)
    spec(tmp_path / "a.toml", 'extends = "b.toml"\n' + user_source("mine"))
    spec(tmp_path / "b.toml", 'extends = "sub/c.toml"\n')
    (tmp_path / "sub").mkdir()
    spec(tmp_path / "sub" / "c.toml", 'extends = "../a.toml"\n')
    line = one_line_error(cli("corpus", "build", "--spec", tmp_path / "a.toml", "--out", tmp_path / "c"), 2)
    assert "comes back to a spec that extends it" in line and "RecursionError" not in line, line
    assert f"{tmp_path / 'a.toml'} -> {tmp_path / 'b.toml'} -> {tmp_path / 'sub' / 'c.toml'} -> " in line


# ============================================================================ 18, 21. spec file paths


def _spec_with_file(tmp_path: Path, entry: str) -> subprocess.CompletedProcess:
    folder = tmp_path / "specs"
    folder.mkdir(exist_ok=True)
    s = spec(folder / "s.toml", user_source("mine", files=json.dumps([entry])))
    return cli("corpus", "build", "--spec", s, "--data-dir", tmp_path / "data", "--out", tmp_path / "c")


SECRET = "secret-first-line,not,a,trace"


def test_spec_files_stay_beside_the_spec_or_in_the_data_directory(tmp_path):
    (tmp_path / "outside").mkdir()
    secret = tmp_path / "outside" / "secret.csv"
    secret.write_text(SECRET + "\n1,2,3,4\n")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "link.csv").symlink_to(secret)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dlink.csv").symlink_to(secret)
    for entry in ("../outside/secret.csv", "link.csv", "dlink.csv", "../" * 30 + "etc/passwd"):
        r = _spec_with_file(tmp_path, entry)
        line = one_line_error(r, 2)
        if entry.endswith("passwd") and not Path("/etc/passwd").exists():
            continue
        assert f"file {entry!r} leads outside" in line and "give an absolute path" in line, line
        assert "secret-first-line" not in r.stderr + r.stdout
    assert not (tmp_path / "c").exists()
    # an absolute path is read on purpose, and its header is not echoed in the error
    r = _spec_with_file(tmp_path, str(secret))
    line = one_line_error(r, 2)
    assert "missing column 'arrival_s' (header has 4 other names" in line, line
    assert "secret" not in line.split("secret.csv", 1)[1] and "secret-first-line" not in r.stderr


def test_a_folder_named_as_a_file_is_one_line_naming_it(tmp_path):
    (tmp_path / "data").mkdir()
    for entry in (".", "sub"):
        (tmp_path / "specs" / "sub").mkdir(parents=True, exist_ok=True)
        line = one_line_error(_spec_with_file(tmp_path, entry), 2)
        want = (tmp_path / "specs" / entry).resolve()
        assert line == f"error: source mine: file {entry!r} is a directory ({want}), expected a file", line


# ============================================================================ 3. --compare checks each region's rho


def test_compare_flags_a_region_redefined_at_another_rho(tmp_path):
    quick = ("--boot", "50", "--splits", "10", "--no-robustness")
    outs = {}
    for label, rho in (("a", 0.6), ("b", 1.5)):
        runs = make_runs(sources=["azure", "bailian"], schedulers=SCHEDULERS13[:4], n_windows=5,
                         regions=[("light", 0.3), ("moderate", rho)])
        store = write_store(tmp_path / f"store-{label}", runs)
        outs[label] = tmp_path / f"out-{label}"
        args = ["analyze", "--results", store, "--out", outs[label], *quick]
        if label == "b":
            args += ["--compare", outs["a"] / "portability.json"]
        r = cli(*args)
        assert r.returncode == 0, r.stderr
    rc = json.loads((outs["b"] / "portability.json").read_text())["region_comparison"]
    assert rc["selection_differs"] is True
    assert "moderate is rho 1.5 here and 0.6 in the other" in rc["selection_note"], rc["selection_note"]
    assert "light" not in rc["selection_note"]
    assert "moderate is rho 1.5 here and 0.6 in the other" in r.stdout + r.stderr


# ============================================================================ 4. analyze holds its folder's lock


def test_analyze_refuses_a_folder_another_analysis_is_writing(tmp_path):
    """While another process holds the output folder's lock (a second `analyze`, or `run`
    writing its store there), analyze is refused with one line and writes nothing."""
    import fcntl
    import os

    runs = make_runs(sources=["azure", "bailian"], schedulers=SCHEDULERS13[:4], n_windows=5, regions=REGIONS6[:2])
    store = write_store(tmp_path / "store", runs)
    quick = ("--boot", "50", "--splits", "10", "--no-robustness")
    for out in (tmp_path / "out", store):          # an analysis folder, and the store itself
        out.mkdir(exist_ok=True)
        fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            r = cli("analyze", "--results", store, "--out", out, *quick)
            line = one_line_error(r, 2)
            assert "is writing here right now" in line and str(out) in line, line
            assert not (out / "portability.json").exists() and not (out / "report.html").exists()
        finally:
            os.close(fd)
        r = cli("analyze", "--results", store, "--out", out, *quick)   # free again
        assert r.returncode == 0, r.stderr
        assert (out / "portability.json").exists() and (out / "report.html").exists()


# ============================================================================ 16. calibrate --request-timeout


def test_calibrate_fails_fast_against_a_server_that_never_answers(tmp_path):
    """A socket that accepts and never answers, and a server that lists its model but never
    answers a completion: with --request-timeout 1, one line within seconds, nothing written."""
    import socket
    import threading
    import time

    from test_replay import FakeServer

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    held = []

    def accept_forever():
        while True:
            try:
                held.append(silent.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept_forever, daemon=True).start()
    server = FakeServer()
    server.start()
    server.configure(modes={n: "stall0" for n in range(1, 600)})
    known = ("--block-size", "16", "--num-gpu-blocks", "100", "--max-num-seqs", "8",
             "--max-num-batched-tokens", "512", "--max-model-len", "512")   # the fake has no /metrics
    try:
        for url, fragment in ((f"http://127.0.0.1:{silent.getsockname()[1]}", "/v1/models: no answer within 1 s"),
                              (server.url, "a probe did not finish within 1 s (--request-timeout)")):
            t0 = time.monotonic()
            r = cli("calibrate", "--endpoint", url, "--out", tmp_path / "eng.toml", "--request-timeout", "1",
                    *known, timeout=120)
            line = one_line_error(r, 2)
            assert fragment in line, line
            assert time.monotonic() - t0 < 60          # not the 300 s default (nor silence until then)
            assert not (tmp_path / "eng.toml").exists()
        r = cli("calibrate", "--endpoint", server.url, "--out", tmp_path / "eng.toml", "--request-timeout", "0")
        assert "--request-timeout must be a positive number of seconds" in one_line_error(r, 2)
    finally:
        server.close()
        silent.close()
        for c in held:
            c.close()
