"""The command line as the tests meet it: one process per command, as a user runs it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path


def cli(*args, cwd=None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`schedport ARGS` in a fresh interpreter (the timeout only turns a hang into a failure)."""
    return subprocess.run([sys.executable, "-m", "schedport.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def error_line(p: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a refused command: a non-zero exit, no traceback, the last line said."""
    assert p.returncode != 0, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: "), p.stderr
    assert sum(ln.startswith("error") for ln in lines) == 1, p.stderr
    return lines[-1]


def tree_digest(d: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file under `d` (but those named in `skip`) with its sha256: a folder came through untouched."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(d).rglob("*")) if p.is_file() and p.name not in skip}
