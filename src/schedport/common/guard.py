"""What an output location already holds, and whether a command may write there.

One rule for every command that writes: before writing, it asks `claim_dir` (a directory) or
`check_file_target` (a file). The command may replace only what it made itself, of the same kind,
recognised by the marker that kind writes (a manifest's ``kind``, or the fixed file names of a
run's outputs); anything else is refused with one line naming the path and what is there, and
no command may write onto one of its own inputs. The kinds:

============  ==================================================================
corpus        ``manifest.json`` with kind ``schedport-corpus`` (`corpus build`)
results       ``manifest.json`` with kind ``schedport-results`` (`run`)
analysis      ``portability.json`` without a manifest (`analyze --out`)
run           ``summary.json`` + ``requests.parquet`` (`simulate`, `replay`)
validation    ``validation.json`` (`validate`)
explain       ``cells/``, ``variants/``, ``capacity.json`` of an explain cache (`explain --cache`)
foreign       a manifest.json of another kind, or files of a kind listed above
              mixed with others: something schedport did not make, or not alone
empty         a missing or empty directory
other         a directory with files, none of them schedport's
============  ==================================================================
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path

from schedport.errors import SchedportError

WHAT = {"corpus": "a corpus (manifest kind schedport-corpus)",
        "results": "a results store (manifest kind schedport-results)",
        "analysis": "an analysis (portability.json)",
        "run": "a simulate/replay output (summary.json, requests.parquet)",
        "validation": "a validation (validation.json)",
        "explain": "an explain cache (cells/, variants/)",
        "foreign": "files schedport did not make",
        "other": "other files"}

_MANIFEST_KINDS = {"schedport-corpus": "corpus", "schedport-results": "results"}


def dir_kind(path) -> str:
    """The kind of what the directory at `path` holds (see the module docstring)."""
    p = Path(path)
    if not p.exists():
        return "empty"
    if not p.is_dir():
        return "file"
    try:
        names = {q.name for q in p.iterdir() if not q.name.startswith(".")}
    except OSError:
        return "other"
    if not names:
        return "empty"
    if "manifest.json" in names:
        try:
            man = json.loads((p / "manifest.json").read_text(encoding="utf-8"))
            kind = man.get("kind")
        except (OSError, ValueError, AttributeError):
            return "foreign"
        if kind is None and (p / "runs").is_dir():
            return "results"  # a store written by hand (no kind): read page by page, never replaced
        if kind is None and isinstance(man.get("windows"), list) and "corpus_sha256" in man:
            return "corpus"   # a corpus written by a test or an older version (no kind)
        return _MANIFEST_KINDS.get(kind, "foreign")
    if "portability.json" in names:
        return "analysis"
    if {"summary.json", "requests.parquet"} & names:
        return "run" if names <= {"summary.json", "requests.parquet"} else "foreign"
    if "validation.json" in names:
        return "validation"
    if names <= {"cells", "variants", "capacity.json"} and (p / "cells").is_dir():
        return "explain"
    return "other"


def check_not_input(target, inputs, option: str = "--out") -> None:
    """Refuse a `target` that is one of the command's `inputs`, or a folder holding one (writing
    or replacing it would destroy the input). A target inside an input folder is left to the
    kind checks: a new folder there destroys nothing."""
    t = Path(target)
    for src in inputs:
        if src is None:
            continue
        s = Path(src)
        if not s.exists():
            continue
        tr, sr = t.resolve(), s.resolve()
        if tr == sr or tr in sr.parents:
            rel = "is" if tr == sr else "holds"
            raise SchedportError(f"{t}: {option} {rel} this command's input {s}; writing there would "
                                 f"destroy it (choose another {option})")


#: What a corpus folder holds of its own (`corpus build`, `corpus list --regions`'s cache): a
#: rebuild replaces the folder whole, so anything else there would be lost with it.
CORPUS_OWN = frozenset({"manifest.json", "build.json", "windows", "capacity-cache.json"})
_OWN_TMP = re.compile(r"\.(manifest|build|capacity-cache)\.json\..+\.tmp")


def container_of(path) -> tuple[str, Path] | None:
    """(kind, folder) of the corpus or results store that `path` lies strictly inside, or None:
    the nearest folder above `path` whose manifest.json names it one of them."""
    p = Path(path).absolute()
    for d in p.parents:
        if (d / "manifest.json").is_file():
            kind = dir_kind(d)
            if kind in ("corpus", "results"):
                return kind, d
    return None


def check_not_inside(path, option: str = "--out", own=None) -> None:
    """Refuse a folder or file `path` inside a corpus or a results store: those folders are the
    corpus's and the store's own (a rebuild replaces a corpus whole; `run` and `analyze` refuse a
    store with foreign files among its parts). `own` (a store) is the one store whose inside the
    command may use (`explain --cache` in its own store)."""
    inside = container_of(path)
    if inside is None:
        return
    kind, d = inside
    if own is not None and Path(own).exists() and d.resolve() == Path(own).resolve():
        return
    raise SchedportError(f"{path}: is inside {WHAT[kind]} at {d}; refusing to write there (choose another {option})")


def check_only_own(path, own=CORPUS_OWN, what: str = "a corpus rebuild") -> None:
    """Refuse to replace the folder `path` whole when it holds anything besides `own` (names a
    user or another command put there: notes, a results store): one line naming them."""
    p = Path(path)
    try:
        names = sorted(q.name for q in p.iterdir() if q.name not in own and not _OWN_TMP.fullmatch(q.name))
    except (FileNotFoundError, NotADirectoryError):
        return
    if names:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise SchedportError(f"{p}: also holds {shown}, which {what} would delete; move them out of it or choose "
                             f"another --out")


def claim_dir(path, may_replace: set[str], option: str = "--out", inputs=(), allow_other: bool = True,
              own=None) -> str:
    """Check that a command may write into the directory `path`; return its kind.

    Allowed: a missing or empty directory, one of the kinds in `may_replace`, and (when
    `allow_other`) a directory with none of schedport's files, where the command's own
    file names are checked by `claim_names`; never one inside a corpus or a results store
    (`check_not_inside`, `own` as there). Anything else is a one-line `SchedportError`
    naming the path and what is there.
    """
    check_not_input(path, inputs, option)
    check_not_inside(path, option, own)
    kind = dir_kind(path)
    if kind in ("empty", *may_replace) or (kind == "other" and allow_other):
        return kind
    if kind == "file":
        raise SchedportError(f"{path}: exists and is not a directory; choose another {option}")
    raise SchedportError(f"{path}: holds {WHAT[kind]}; refusing to replace it (choose another {option})")


def claim_names(path, names, option: str = "--out") -> None:
    """In a directory of kind "other", refuse to overwrite a file of one of the `names` the
    command writes: it was not made by this command."""
    for n in names:
        if (Path(path) / n).exists():
            raise SchedportError(f"{Path(path) / n}: exists and was not written by schedport; refusing to "
                                 f"replace it (choose another {option})")


def check_file_target(path, inputs=(), option: str = "--out") -> None:
    """A file output: never one of the inputs, never a file inside a corpus or a results store."""
    check_not_input(path, inputs, option)
    check_not_inside(path, option)


def claim_file(path, *, made_by, command: str, inputs=(), option: str = "--out") -> Path:
    """Check that a command may write the file `path`; return it as a Path.

    The one rule for a file output: never one of the command's inputs, never inside a corpus or
    a results store (`check_file_target`), and an existing file only if this command wrote it,
    which `made_by(path)` tells from its content (`starts_with`, `json_with_keys`). Anything else
    is a one-line `SchedportError`; nothing is written here."""
    check_file_target(path, inputs, option)
    p = Path(path)
    if p.is_file():
        try:
            mine = made_by(p)
        except OSError as e:
            raise SchedportError(f"{p}: cannot be read to check what it is ({e.strerror or e})") from None
        if not mine:
            raise SchedportError(f"{p}: exists and was not written by `{command}`; refusing to replace it "
                                 f"(choose another {option}; nothing was overwritten)")
    return p


def starts_with(*marks: str, within: int = 400):
    """A `claim_file` test: the file's first `within` characters begin with `marks[0]` and hold
    every other mark."""
    def test(p: Path) -> bool:
        with open(p, "rb") as f:
            head = f.read(within * 4).decode("utf-8", errors="replace")[:within]
        return head.startswith(marks[0]) and all(m in head for m in marks[1:])
    return test


def json_with_keys(*keys: str):
    """A `claim_file` test: the file is a JSON object with every one of `keys`."""
    def test(p: Path) -> bool:
        try:
            d = json.loads(p.read_bytes())
        except ValueError:
            return False
        return isinstance(d, dict) and all(k in d for k in keys)
    return test


def store_identity(manifest: dict) -> dict:
    """What identifies a results store for the artefacts derived from it: its corpus, engine,
    selection and creation time (a store made again gets a new identity)."""
    return {"corpus_sha256": manifest.get("corpus_sha256"), "engine_hash": manifest.get("engine_hash"),
            "created": manifest.get("created")}


def check_analysis_current(res: dict, store_dir, path) -> None:
    """Refuse (one line) an analysis `res` (read from `path`) that no longer describes the results
    store at `store_dir`: the store was made again (`store_identity`), or cells were added after
    the analysis (the manifest's ``cells_done`` against the one the analysis recorded). A page
    stamped with the store's digest must show that store's analysis, not an older one."""
    try:
        man = json.loads((Path(store_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return      # no readable manifest: the readers of the store say why
    if not isinstance(man, dict):
        return
    redo = f"run `schedport analyze --results {store_dir}` first"
    if isinstance(res.get("store"), dict) and res["store"] != store_identity(man):
        raise SchedportError(f"{path}: is the analysis of another store (created {res['store'].get('created')}) "
                             f"than the one now at {store_dir} (created {man.get('created')}); {redo}")
    prov = res.get("provenance") if isinstance(res.get("provenance"), dict) else {}
    then, now = prov.get("cells_done"), man.get("cells_done")
    if then != now:
        raise SchedportError(f"{path}: analyses the store as it was at {then} cells; it now holds {now}, so the "
                             f"page would name cells it does not show; {redo}")


def check_same_corpus(res: dict, corpus_dir, path, option: str = "--corpus") -> None:
    """Refuse (one line) an analysis `res` (read from `path`) of a store run on another corpus than
    the one at `corpus_dir`: what it predicts was measured on other windows. A missing or
    unreadable corpus, or a file that is no JSON object, is left to its reader, which says why."""
    if not isinstance(res, dict):
        return
    try:
        man = json.loads((Path(corpus_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    actual = man.get("corpus_sha256") if isinstance(man, dict) else None
    store = res.get("store") if isinstance(res.get("store"), dict) else {}
    prov = res.get("provenance") if isinstance(res.get("provenance"), dict) else {}
    claimed = store.get("corpus_sha256", prov.get("corpus_sha256"))
    if not isinstance(claimed, str):
        raise SchedportError(f"{path}: names no corpus (store.corpus_sha256), so it cannot be checked against "
                             f"{option} {corpus_dir}; analyse the store again with this version")
    if claimed != actual:
        raise SchedportError(f"{path}: analyses a store of corpus {claimed[:12]}, but {option} {corpus_dir} is "
                             f"corpus {str(actual)[:12]}; give the corpus the store was run on")


def check_not_inside_store(out_dir, results) -> None:
    """Refuse an analysis folder inside a results store other than its own, or inside a corpus:
    there it would pass for that store's analysis (`explain --list` would show it)."""
    if results is None:
        return
    o = Path(out_dir).absolute()
    for d in [o, *o.parents]:
        if (d / "manifest.json").is_file():
            kind = dir_kind(d)
            own = kind == "results" and d == o and d.resolve() == Path(results).resolve()
            if kind in ("results", "corpus") and not own:
                raise SchedportError(f"{out_dir}: is inside {WHAT[kind]} at {d}; refusing to write an analysis "
                                     f"there (choose another --out)")
            return


#: The lock file a command writing a directory holds: the results store's (`run`) and an
#: analysis folder's (`analyze`) are the same file, so neither writes where the other is writing.
LOCK_NAME = ".lock"


class _Held:
    """A folder's lock as this process holds it: the flocked descriptor, how many holders share
    it, the lock file's identity, descriptors of earlier lock files still held, and whether
    its first holder lets later holders of this process share it."""

    def __init__(self, fd: int, ident: tuple[int, int], shared: bool):
        self.fd, self.ident, self.count, self.old, self.shared = fd, ident, 1, [], shared


#: The folder locks this process holds, by the folder's real path.
_HELD: dict[str, _Held] = {}


class DirLock:
    """One hold of a folder's lock (`hold_dir_lock`); `release` gives it back (once)."""

    def __init__(self, key: str):
        self.key, self.held = key, True

    def release(self) -> None:
        """Give this hold back; the lock itself is released with the process's last hold."""
        if not self.held:
            return
        self.held = False
        ent = _HELD.get(self.key)
        if ent is None:
            return
        ent.count -= 1
        if ent.count == 0:
            del _HELD[self.key]
            for fd in (ent.fd, *ent.old):
                try:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                finally:
                    os.close(fd)


def _flock(lock: Path, busy: str, error) -> tuple[int, tuple[int, int]]:
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise error(f"{lock.parent}: {busy}") from None
    st = os.fstat(fd)
    return fd, (st.st_dev, st.st_ino)


def hold_dir_lock(path, busy: str, error=SchedportError, shared: bool = True) -> DirLock:
    """Take the exclusive lock of the existing folder `path` (its `LOCK_NAME`) for this process,
    or one more hold of it where the process holds it already and its first hold was `shared`:
    a command holds its store's lock from start to end (`dir_lock`) while the sweep and the
    analysis inside it take it again. If another process holds it, or this process holds it
    unshared (an open results store): ``error("<path>: <busy>")``. Where the folder was moved aside and
    made anew under the process's hold (``run --force``), the new folder's lock is taken too,
    and the old one kept until the last hold is released."""
    d = Path(path)
    lock = d / LOCK_NAME
    key = os.path.realpath(d)
    ent = _HELD.get(key)
    if ent is not None:
        if not ent.shared:
            raise error(f"{d}: {busy}")
        try:
            st = os.stat(lock)
            ident = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            ident = None
        if ident != ent.ident:
            fd, ident = _flock(lock, busy, error)
            ent.old.append(ent.fd)
            ent.fd, ent.ident = fd, ident
        ent.count += 1
        return DirLock(key)
    fd, ident = _flock(lock, busy, error)
    _HELD[key] = _Held(fd, ident, shared)
    return DirLock(key)


@contextmanager
def dir_lock(path, busy: str):
    """Hold the exclusive lock of the directory `path` (its `LOCK_NAME`, created with the folder
    if needed) for the block; if another process holds it, a one-line `SchedportError`
    ``<path>: <busy>``. A hold this process has already is shared (`hold_dir_lock`). When the
    block fails, the lock file this call created is removed, and so is the folder it created if
    nothing else is left in it: a refused or failed command leaves no empty output, and no lock
    file in a folder of the user's."""
    d = Path(path)
    created = not d.exists()
    d.mkdir(parents=True, exist_ok=True)
    new_lock = not (d / LOCK_NAME).exists()
    hold = hold_dir_lock(d, busy)
    ok = False
    try:
        yield
        ok = True
    finally:
        alone = getattr(_HELD.get(hold.key), "count", 0) == 1      # no outer hold of this process uses it
        if not ok and new_lock and alone and d.is_dir():
            # a refused or failed command leaves no lock file of its own in a folder it did not write
            (d / LOCK_NAME).unlink(missing_ok=True)
            if created and not any(d.iterdir()):
                d.rmdir()
        hold.release()
