"""Where the public data files live, and how to get one that is missing.

The project never commits the public traces. It finds them in a data directory, chosen by
`resolve_data_dir` in this order: ``--data-dir``, the ``SCHEDPORT_DATA`` environment
variable, ``../shared/datasets`` beside the project root (the local mirror every developer
machine and CI have), then the user cache (``$XDG_CACHE_HOME/schedport/datasets``, by default
``~/.cache/schedport/datasets``).

`data_files()` registers every public file the corpus uses: its path under the data directory,
its public URL and its sha256 (read from the package's ``data/sha256.json``). `locate` returns
a file if present; when it is missing and the machine is online it downloads it from its
public home into the user cache, checks the sha256 and moves it into place atomically;
otherwise it fails with one line naming the file, where to get it and where to put it.

Sources (cite them where their data is used):
- Azure LLM inference trace 2023 (CC-BY 4.0), github.com/Azure/AzurePublicDataset; Patel et
  al., "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024.
- ServeGen ``data/language/m-large`` (Apache-2.0), github.com/alibaba/ServeGen; "ServeGen:
  Workload Characterization and Generation of Large Language Model Serving in Production",
  arXiv 2505.09999 (Alibaba Bailian). The mirror stores these gzip-compressed; the public
  home serves them uncompressed, so both sha256 are recorded.
- BurstGPT (CC-BY 4.0), github.com/HPMLL/BurstGPT release assets; Wang et al., "BurstGPT: A
  Real-World Workload Dataset to Optimize LLM Serving Systems", KDD 2025. Not mirrored
  here, so its sha256 is unknown to this registry (see `DataFile.sha256`).
- Mooncake FAST'25 conversation trace (Apache-2.0), github.com/kvcache-ai/Mooncake
  ``FAST25-release/traces``; Qin et al., "Mooncake: Trading More Storage for Less Computation —
  A KVCache-centric Architecture for Serving LLM Chatbot", FAST 2025. Read by the ``mooncake``
  adapter with its prefix identity (``hash_ids``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath

from schedport.common.atomic import atomic_write
from schedport.errors import ConfigError, DataError, SchedportError

ENV_VAR = "SCHEDPORT_DATA"
DOWNLOAD_TIMEOUT_S = 60


@dataclass(frozen=True)
class DataFile:
    """One public file the project reads.

    relpath:          path under the data directory, as the mirror stores it.
    url:              its public home (what a download fetches).
    sha256:           of the file at `relpath` (None when no mirror has it: BurstGPT).
    original_relpath: the name the public home serves when the mirror stores a gzip copy
                      (ServeGen); a download is saved under this name.
    original_sha256:  sha256 of what `url` serves, when it differs from `sha256`.
    source:           which public dataset it belongs to.
    """

    relpath: str
    url: str
    sha256: str | None
    original_relpath: str | None = None
    original_sha256: str | None = None
    source: str = ""

    @property
    def download_relpath(self) -> str:
        """Where a downloaded copy is stored (the public home's own form of the file)."""
        return self.original_relpath or self.relpath

    @property
    def download_sha256(self) -> str | None:
        """The sha256 a download from `url` must have."""
        return self.original_sha256 or self.sha256

    @property
    def name(self) -> str:
        """The file's base name."""
        return PurePosixPath(self.relpath).name


AZURE_DIR = "azure-llm-inference-2023"
AZURE_URL = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
SERVEGEN_DIR = "servegen-language-m-large"
SERVEGEN_URL = "https://raw.githubusercontent.com/alibaba/ServeGen/main/data/language/m-large/"
BURSTGPT_DIR = "burstgpt"
BURSTGPT_URL = "https://github.com/HPMLL/BurstGPT/releases/download/v1.1/"
MOONCAKE_DIR = "mooncake-fast25"
MOONCAKE_URL = ("https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
                "3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/")

#: The files' sha256 live in ``data/sha256.json`` in the package, read on first use: for Azure, the
#: file as published; for ServeGen m-large, the mirror's ``.gz`` copy and the file as published, from
#: the mirror's SHA256SUMS and SHA256SUMS.original. Dataset files of ServeGen clients 15, 21, 41, 44,
#: 66, 72, 73, 82, 89, 100, 112, 120, 142, 148 and 156 are not mirrored (too large) and so are not
#: registered; the servegen adapter skips those clients and says so. BurstGPT has no mirror and no sums.
SUMS_RESOURCE = "data/sha256.json"
_BURSTGPT_FILES = ("BurstGPT_1.csv", "BurstGPT_without_fails_1.csv")


@functools.cache
def data_files() -> dict[str, DataFile]:
    """Every registered public file by its path under the data directory (``relpath``), with its
    public URL and sha256 (read once from the package's ``data/sha256.json``)."""
    sums = json.loads((resources.files("schedport.workload") / SUMS_RESOURCE).read_text(encoding="utf-8"))
    files: dict[str, DataFile] = {}
    for name, sha in sums["azure"].items():
        rel = f"{AZURE_DIR}/{name}"
        files[rel] = DataFile(rel, AZURE_URL + name, sha, source="azure")
    for name, s in sums["servegen"].items():
        rel = f"{SERVEGEN_DIR}/{name}.gz"
        files[rel] = DataFile(rel, SERVEGEN_URL + name, s["gz"], f"{SERVEGEN_DIR}/{name}",
                              s["published"], source="servegen")
    for name in _BURSTGPT_FILES:
        rel = f"{BURSTGPT_DIR}/{name}"
        files[rel] = DataFile(rel, BURSTGPT_URL + name, None, source="burstgpt")
    for name, sha in sums.get("mooncake", {}).items():
        rel = f"{MOONCAKE_DIR}/{name}"
        files[rel] = DataFile(rel, MOONCAKE_URL + name, sha, source="mooncake")
    return files


def cache_dir() -> Path:
    """The user cache for downloaded data: ``$XDG_CACHE_HOME/schedport/datasets`` (default ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "schedport" / "datasets"


def _mirror_candidates() -> list[Path]:
    """``<project root>/../shared/datasets`` for the project holding the CWD and the package."""
    out: list[Path] = []
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for anc in (start, *start.parents):
            if (anc / "pyproject.toml").is_file():
                out.append(anc.parent / "shared" / "datasets")
                break
    out.append(Path.cwd().parent / "shared" / "datasets")
    seen: list[Path] = []
    for p in out:
        if p not in seen:
            seen.append(p)
    return seen


def resolve_data_dir(cli_value: str | None = None) -> Path:
    """The data directory to use: ``--data-dir``, else $SCHEDPORT_DATA, else the mirror, else the cache.

    An explicit choice (flag or variable) is used as given, even if it does not exist yet
    (a download then creates it; a missing file's message names it). The shared mirror
    ``../shared/datasets`` is looked for above the current directory's project root and
    the installed package's source tree; the user cache is the fallback.
    """
    for given, what in ((cli_value, "--data-dir"), (os.environ.get(ENV_VAR), f"${ENV_VAR}")):
        if given:
            p = Path(given).expanduser()
            if p.exists() and not p.is_dir():
                raise SchedportError(f"{p}: is a file; {what} takes the folder that holds the public data files")
            return p
    for cand in _mirror_candidates():
        if cand.is_dir():
            return cand.resolve()
    return cache_dir()


def lookup(name: str) -> DataFile:
    """Registry entry by relative path, mirrored or published file name (e.g. ``chunk-3-trace.csv``)."""
    key = str(name).replace(os.sep, "/")
    files = data_files()
    if key in files:
        return files[key]
    for f in files.values():
        if key in (f.original_relpath, f.name) or (
                f.original_relpath and key == PurePosixPath(f.original_relpath).name):
            return f
    raise ConfigError(f"unknown data file {name!r} (not in schedport.workload.datadir.data_files())")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_sha256(path: Path, expected: str | None) -> str:
    """Check a file against its expected sha256; return the actual one.

    Raises a one-line `DataError` on a mismatch (``expected=None`` only computes). Kept
    separate from `locate` so the corpus builder decides when to pay for hashing.
    """
    actual = sha256_file(path)
    if expected is not None and actual != expected.lower():
        raise DataError(f"{Path(path).name}: sha256 {actual} does not match the expected "
                        f"{expected} (a different or corrupted copy; remove {path} and fetch it "
                        "again)")
    return actual


def _fetch(url: str, dest: Path) -> None:
    """Download `url` to `dest` (urllib; any failure raises OSError/URLError)."""
    req = urllib.request.Request(url, headers={"User-Agent": "schedport"})
    with urllib.request.urlopen(req, timeout=DOWNLOAD_TIMEOUT_S) as resp, open(dest, "wb") as out:
        shutil.copyfileobj(resp, out, 1 << 20)


def locate(name: str, data_dir: Path | str | None = None, download: bool = True) -> Path:
    """The local path of registered public file `name`, downloading it if it is missing.

    Looked for in `data_dir` (default: `resolve_data_dir()`) and then in the user cache,
    in the mirror's form (e.g. ``.gz``) or the published one. If absent and `download`:
    fetched from its public URL into the user cache, checked against its sha256 (when the
    registry knows it) and moved into place atomically. Offline, or when the download
    fails: a one-line `DataError` naming the missing file, its public URL and the
    directory to put it in. Verifying files already present is `verify_sha256`'s job.
    """
    entry = lookup(name)
    root = Path(data_dir) if data_dir is not None else resolve_data_dir()
    cache = cache_dir()
    rels = [entry.relpath] + ([entry.original_relpath] if entry.original_relpath else [])
    for base in (root, cache):
        for rel in rels:
            p = base / rel
            if p.is_file():
                return p
    where = (root / entry.relpath).parent
    if not download:
        raise DataError(_missing_message(entry, root, where, "downloads disabled"))
    dest = cache / entry.download_relpath

    def fetch_verified(tmp: Path) -> None:
        try:
            _fetch(entry.url, tmp)
        except Exception as exc:  # noqa: BLE001 - any network failure means "offline" here
            reason = " ".join(str(getattr(exc, "reason", exc) or type(exc).__name__).split())
            raise DataError(_missing_message(entry, root, where, f"download failed: {reason}")) from None
        expected = entry.download_sha256
        if expected is not None:
            actual = sha256_file(tmp)
            if actual != expected:
                raise DataError(f"{entry.name}: downloaded from {entry.url} but its sha256 {actual} "
                                f"is not the expected {expected}; not used (put a verified copy "
                                f"in {where})")

    try:
        atomic_write(dest, fetch_verified, durable=False)
    except OSError as exc:
        raise DataError(_missing_message(entry, root, where, f"cannot write to the cache "
                                         f"{cache}: {exc.strerror or exc}")) from None
    return dest


def _missing_message(entry: DataFile, root: Path, where: Path, reason: str) -> str:
    where_root = f"{root} (no such folder)" if not root.exists() else str(root)
    return (f"missing data file {entry.relpath}: not in {where_root} or {cache_dir()} and {reason}; "
            f"get it from {entry.url} and put it in {where}/ (or pass --data-dir / set "
            f"{ENV_VAR})")
