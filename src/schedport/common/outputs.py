"""Output paths: checked before any work starts, and every I/O failure reported as one line.

A command that would write results only after minutes of work checks its output location
first (`output_dir`, `output_file`): an empty name, an existing file where a directory is
wanted (``/dev/null`` included), a directory or a device where a file is wanted, a path
under a read-only file system or one without write permission is refused at once, naming
the path and the cause. Failures that can only happen while writing (a full disk) are turned
into the same kind of one-line error by `io_error` / `writing`, and every temporary file
is removed (`removing_on_failure`), so a rerun starts from a clean directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from pathlib import Path

from schedport.errors import SchedportError

_ERRNO_IN_TEXT = re.compile(r"\[errno (\d+)\]", re.IGNORECASE)


def cause(e: BaseException) -> str:
    """The reason of an I/O error in a few words ("No space left on device").

    Python's OSError carries `strerror`; pyarrow's I/O errors carry only a message with
    ``[errno N]`` inside it, which is mapped to the system's text for N.
    """
    text = " ".join(str(e).split())
    m = _ERRNO_IN_TEXT.search(text)
    if m:
        return os.strerror(int(m.group(1)))
    if isinstance(e, OSError) and e.strerror:
        return " ".join(str(e.strerror).split())
    return text[:200] or type(e).__name__


def io_error(path, e: BaseException, action: str = "write") -> SchedportError:
    """A one-line error naming `path`, what was being done and why it failed."""
    return SchedportError(f"{path}: cannot {action} ({cause(e)})")


@contextlib.contextmanager
def writing(path, action: str = "write"):
    """Turn any OSError raised inside the block into a one-line error naming `path`."""
    try:
        yield
    except OSError as e:
        raise io_error(getattr(e, "filename", None) or path, e, action) from None


@contextlib.contextmanager
def removing_on_failure(*paths):
    """Remove the given (temporary) files if the block fails, whatever the failure."""
    try:
        yield
    except BaseException:
        for p in paths:
            with contextlib.suppress(OSError):
                os.unlink(p)
        raise


def _require_name(path, option: str) -> Path:
    raw = os.fspath(path) if path is not None else ""
    if raw.strip() == "":
        raise SchedportError(f"{option}: empty path; give a file or directory name")
    return Path(raw)


def _probe_writable(d: Path, target: Path | None = None) -> None:
    """Create and remove a temporary file in `d`: the only check that sees every cause
    (read-only mounts, permissions, quotas, special file systems), also for root."""
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".schedport-probe-", suffix=".tmp")
    except OSError as e:
        if target is not None and target != d:
            raise SchedportError(f"{target}: cannot be written: cannot create files in {d} "
                                 f"({cause(e)})") from None
        raise SchedportError(f"{d}: cannot write into this directory ({cause(e)})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def output_dir(path, option: str = "--out", create: bool = True) -> Path:
    """Check that `path` is (or can be made) a writable directory; create it when `create`.

    Raises a one-line `SchedportError` naming the path and the cause otherwise. Returns the
    path as given (a `Path`).
    """
    p = _require_name(path, option)
    if p.exists() and not p.is_dir():
        raise SchedportError(f"{p}: exists and is not a directory; choose another {option}")
    if not p.exists():
        if not create:
            _probe_writable(_existing_ancestor(p), p)
            return p
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SchedportError(f"{p}: cannot create the directory ({cause(e)})") from None
    _probe_writable(p)
    return p


def output_file(path, option: str = "--out") -> Path:
    """Check that a file can be written (atomically, beside itself) at `path`.

    Refuses an existing directory, an existing non-regular file (a device such as
    ``/dev/null``, which an atomic rename would replace) and a location whose directory
    cannot be created or written. The parent directory is created if missing.
    """
    p = _require_name(path, option)
    if p.is_dir():
        raise SchedportError(f"{p}: is a directory; {option} needs a file name")
    if p.exists() and not p.is_file():
        raise SchedportError(f"{p}: exists and is not a regular file; choose another {option}")
    parent = p.parent
    if parent.exists() and not parent.is_dir():
        raise SchedportError(f"{parent}: is not a directory, so {p} cannot be written")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SchedportError(f"{p}: cannot be written: cannot create the directory {parent} "
                             f"({cause(e)})") from None
    _probe_writable(parent, p)
    return p


def _existing_ancestor(p: Path) -> Path:
    q = p.absolute()
    while not q.exists():
        q = q.parent
    if not q.is_dir():
        raise SchedportError(f"{q}: is not a directory, so {p} cannot be created")
    return q


def process_alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, killed but not yet reaped, counts as gone):
    whose temporary files may be removed, and whose driver a worker outlives."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def file_mode() -> int:
    """The permission bits a plain `open()` would give a new file under the current umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def parse_out_path(value) -> Path:
    """An output path option's value as a Path, refusing an empty name, which `Path("")` would
    silently turn into the current directory (and scatter the outputs there).

    Raises `SchedportError` for an empty name; the command line wraps this function
    (`schedport.cli.params.out_path_parser`) to report it as a usage error.
    """
    if not isinstance(value, Path) and not str(value).strip():
        raise SchedportError("empty path; give a file or directory name")
    p = Path(value)
    check_no_symlink_loop(p)
    return p


def check_no_symlink_loop(path) -> None:
    """Refuse, in one line, a path that runs into a symbolic-link loop (``a -> b -> a``, itself or
    in one of its folders): every later look at it (`Path.resolve`, `exists`) would fail with a
    traceback, after work had started."""
    p = Path(path)
    try:
        p.resolve()
        os.stat(p)
    except RuntimeError:
        raise SchedportError(f"{p}: is a loop of symbolic links; give a real file or directory") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SchedportError(f"{p}: is a loop of symbolic links; give a real file or directory") from None
