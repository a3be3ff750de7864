"""Atomic file writes: the one way schedport replaces a file.

A file is written under a temporary name beside it (``.NAME.XXXXXXXX.tmp``, made by `mkstemp`
so two writers never share one), given the permissions a plain `open()` would give under the
current umask (0644 under the usual 022; `mkstemp`'s 0600 would hide results from the rest of
the group), flushed to disk when `durable`, and renamed over the target, so a reader sees the
old file or the new one, never half of one. On any failure the temporary file is removed and
the exception propagates unchanged: each caller turns an `OSError` into its own one-line error
(`schedport.common.outputs.writing`, a `StoreError`, a `TraceError`). The results store's
clean-up of a crashed writer's leftovers (`schedport.study.store`) knows these names.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from schedport.common.outputs import file_mode


def fsync_dir(path) -> None:
    """fsync a directory so a rename inside it survives a power loss (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, write: Callable[[Path], object], *, durable: bool = True) -> Path:
    """Replace `path` atomically with what `write(tmp)` puts into the temporary file `tmp`.

    The parent directory is created if missing. With `durable` the file and its directory are
    fsynced, so the rename survives a power loss (what a results store needs; a cache that can
    be recomputed may pass False). Returns `path` as a `Path`; raises whatever `write` or the
    file system raised, after removing the temporary file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, file_mode())
        if durable:
            _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def atomic_write_bytes(path, data: bytes, *, durable: bool = True) -> Path:
    """Replace `path` atomically with `data` (see `atomic_write`)."""
    return atomic_write(path, lambda p: p.write_bytes(data), durable=durable)


def atomic_write_text(path, text: str, *, durable: bool = True) -> Path:
    """Replace `path` atomically with `text`, encoded as UTF-8 (see `atomic_write`)."""
    return atomic_write(path, lambda p: p.write_bytes(text.encode("utf-8")), durable=durable)
