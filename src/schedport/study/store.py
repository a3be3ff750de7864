"""The results store of `schedport run`: an append-only Parquet dataset plus a manifest.

Layout of a results directory ``DIR`` (default ``results/``)::

    DIR/manifest.json          what this store holds (see below); rewritten atomically
    DIR/runs/part-<seq>-<uuid>.parquet
                               one file per flushed batch of finished cells, never modified
    DIR/requests/part-<seq>-<uuid>.parquet
                               per-request tables of the same cells (only with --keep-requests)
    DIR/capacity.json          capacity cache (`schedport.study.regions`), keyed by window + engine hash
    DIR/.lock                  held (flock) by the one sweep writing here

``pandas.read_parquet("DIR/runs")`` reads every finished cell: one row per
(source, window_id, region, scheduler, seed) -- the *key* -- with ``rho``, ``time_scale``,
``capacity_rps``, ``window_sha256``, ``corpus_sha256``, ``engine_hash`` and one column per
run metric (the ``summary.json`` fields of `schedport.engine.core.metrics`, in `summary_keys` order).
Every part has exactly the same Arrow schema: strings for the key names and hashes, int64
for ``seed`` and the counts, float64 for everything else, with an undefined metric (None in
the summary) stored as NaN.

Durability: a part is written to a dot-prefixed temp file (ignored by Parquet readers),
fsynced, renamed into place and the directory fsynced, so a crash or kill leaves either
the whole batch or nothing; at most the cells not yet flushed are lost. Stale temp files
of a killed writer are removed on the next open (the lock guarantees nobody else is
writing). With --keep-requests the requests part of a batch is written before its runs
part, under the same name; a requests part without its runs part (kill between the two
renames) is an orphan and is removed on open, so its cells rerun cleanly.

Identity: the manifest records the corpus hash and the engine config (resolved dict and
hash); every row repeats both hashes. Opening a store for a different corpus or engine
config refuses (`StoreMismatch`) unless ``force``, which moves the whole old directory
aside to ``DIR.old-<UTC timestamp>`` (nothing is deleted) and starts a fresh store.
A directory that is not ours (non-empty without our manifest, a manifest of another
kind or schema, unknown files in ``runs/``), an unreadable or inconsistent part (bad
Parquet, other schema, other hashes, duplicated cells) is reported in one line and never
overwritten.

User schedulers (`schedport.engine.policies.plugins`: a policy from the user's own file, module or an
installed package) are identified by the sha256 of their source file. The manifest's
``policies`` records each one's kind, spec, path, hash and source text (so `explain` reruns the
very code that made the cells), and every runs part holding its cells names that hash in its
Parquet metadata (``schedport.policies``: {name: sha256}). A run with another version of a file
whose cells the store holds refuses, naming both hashes (`ResultsStore.adopt_policies`).

Provenance: the manifest's ``engine_hash`` must be the sha256 of its own ``engine_config``
(canonical JSON, as `EngineConfig.config_hash`); a manifest whose config was edited without
its hash is refused, by `run` and by `analyze` alike (`verified_runs`), so a report never
shows a configuration that was not used. A ``"running"`` entry left by a sweep that was
killed (or whose writes failed) is closed as ``"abandoned"`` when the next sweep opens
the store under its lock.

Manifest fields: ``kind`` ("schedport-results"), ``store_schema``, ``corpus_sha256``,
``corpus_dir``, ``engine_hash``, ``engine_config``, ``package_version``, ``git_commit``,
``columns`` ([name, arrow type] pairs), ``created``, ``status`` (running, finished,
interrupted, failed), ``started``, ``ended``, ``selectors`` (of the latest run),
``policies`` (only when a user scheduler ran), ``cells_done`` and ``runs`` (one entry per
invocation: selectors, executor, workers, cells planned / skipped / run, wall time, status).
"""

from __future__ import annotations

import datetime as _dt
import inspect
import json
import math
import os
import re
import signal
import subprocess
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schedport.errors import SchedportError
from schedport.common.outputs import cause
from schedport.common.atomic import atomic_write, atomic_write_bytes
from schedport.common.guard import hold_dir_lock

STORE_KIND = "schedport-results"
STORE_SCHEMA = 1
KEY_COLUMNS = ("source", "window_id", "region", "scheduler", "seed")
#: Columns between the key and the metrics, in order.
CELL_COLUMNS = ("rho", "time_scale", "capacity_rps", "window_sha256", "corpus_sha256", "engine_hash")
#: Metrics that are always integers (everything else is float64, NaN when undefined).
INT_METRICS = frozenset({"n_requests", "n_completed", "n_rejected", "n_unfinished",
                         "completed_within_horizon", "preemptions", "iterations", "recomputed_tokens",
                         "swapped_bytes", "host_swap_full_events", "stall_recomputes",
                         "prefix_cached_tokens", "prefix_prompt_tokens"})
REQUEST_KEY_COLUMNS = KEY_COLUMNS
_REQUEST_TYPES = {
    "request_id": pa.int64(), "client_id": pa.string(), "arrival_s": pa.float64(),
    "input_tokens": pa.int64(), "output_tokens": pa.int64(), "status": pa.string(),
    "first_token_s": pa.float64(), "finish_s": pa.float64(), "ttft_s": pa.float64(),
    "tpot_s": pa.float64(), "e2e_s": pa.float64(), "preemptions": pa.int64(), "reject_reason": pa.string(),
}
# Page CRCs (pyarrow >= 14) so that damage inside a part, not only in its footer, is detected.
_WRITE_CHECKED = ({"write_page_checksum": True}
                  if "write_page_checksum" in inspect.signature(pq.write_table).parameters else {})
_READ_CHECKED = ({"page_checksum_verification": True}
                 if "page_checksum_verification" in inspect.signature(pq.read_table).parameters else {})
#: The Parquet metadata key under which a runs part records its user schedulers' versions.
POLICIES_META = b"schedport.policies"
_PART_RE = re.compile(r"part-(\d{6,})-([0-9a-f]{32})\.parquet")
_TMP_RE = re.compile(r"\.part-\d{6,}-[0-9a-f]{32}\.parquet\.[0-9a-z_]+\.tmp")
_TOP_TMP_RE = re.compile(r"\.(manifest|capacity)\.json\..+\.tmp")


class StoreError(SchedportError):
    """A results directory that is corrupt, foreign or locked: reported, never overwritten."""


class StoreMismatch(StoreError):
    """A results store made for another corpus, engine config or store schema."""


def _changed_part(old: dict, src) -> str:
    """What changed between a recorded user policy and this run's: its file, or which helper modules
    of its folder (the version covers both, `engine.plugins.PolicySource`)."""
    new = src.record()
    if old.get("file_sha256", old.get("sha256")) != new.get("file_sha256", new.get("sha256")):
        return "its file changed"
    was = {h.get("module"): h.get("sha256") for h in old.get("helpers") or []}
    now = {h["module"]: h["sha256"] for h in new.get("helpers") or []}
    changed = sorted(m for m in set(was) | set(now) if was.get(m) != now.get(m))
    return ("its file is unchanged; helper module(s) " + ", ".join(changed) + " changed") if changed else \
        "its version changed"


def part_policies(schema: pa.Schema, where) -> dict[str, str]:
    """{user scheduler: sha256 of its source} that a runs part records in its Parquet metadata."""
    raw = (schema.metadata or {}).get(POLICIES_META)
    if raw is None:
        return {}
    try:
        got = json.loads(raw)
    except ValueError:
        got = None
    if not isinstance(got, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in got.items()):
        raise StoreError(f"{where}: its record of user schedulers ({POLICIES_META.decode()}) is damaged")
    return got


def run_schema(metric_columns: Sequence[str]) -> pa.Schema:
    """The Arrow schema of every runs part, for these metric columns (in order)."""
    fields = [pa.field(c, pa.string()) for c in KEY_COLUMNS[:4]] + [pa.field("seed", pa.int64())]
    fields += [pa.field(c, pa.float64()) for c in CELL_COLUMNS[:3]]
    fields += [pa.field(c, pa.string()) for c in CELL_COLUMNS[3:]]
    for m in metric_columns:
        if m in KEY_COLUMNS or m in CELL_COLUMNS:
            raise ValueError(f"metric column {m!r} collides with a store column")
        fields.append(pa.field(m, pa.int64() if m in INT_METRICS else pa.float64()))
    return pa.schema(fields)


def requests_schema() -> pa.Schema:
    """The Arrow schema of every requests part: the cell key, then the per-request table."""
    fields = [pa.field(c, pa.string()) for c in KEY_COLUMNS[:4]] + [pa.field("seed", pa.int64())]
    fields += [pa.field(c, t) for c, t in _REQUEST_TYPES.items()]
    return pa.schema(fields)


def _schema_desc(schema: pa.Schema) -> list[list[str]]:
    return [[f.name, str(f.type)] for f in schema]


def now_iso() -> str:
    """The current UTC time as an ISO-8601 string (seconds resolution)."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def git_commit() -> str | None:
    """The git commit of the schedport source tree (with "-dirty" if modified), or None."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
        return rev.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class ResultsStore:
    """An open, validated, locked results store. Create it with `open_store`.

    `done` holds the keys of every finished cell, `region_rho` the rho each stored region
    name was run at. `add` buffers finished cells, `flush` writes them as one part;
    `begin_run` / `end_run` record an invocation in the manifest.
    """

    def __init__(self, root: Path, manifest: dict, schema: pa.Schema, lock_fd):
        self.root = root
        self.runs_dir = root / "runs"
        self.requests_dir = root / "requests"
        self.manifest = manifest
        self.schema = schema
        self._lock_fd = lock_fd
        self.done: set[tuple] = set()
        self.region_rho: dict[str, float] = {}
        self.part_policies: dict[str, str] = {}   # user scheduler -> sha256 its parts record
        self._rows: list[dict] = []
        self._requests: list[pa.Table] = []
        self._next_seq = 0
        self.parts_written = 0

    # ------------------------------------------------------------------ reading

    def _scan(self) -> None:
        """Validate every part on disk and collect the finished keys."""
        parts: dict[str, Path] = {}
        for d in (self.runs_dir, self.requests_dir):
            if not d.exists():
                continue
            if not d.is_dir():
                raise StoreError(f"{d}: expected a directory of Parquet parts; this is not a schedport "
                                 f"results store")
            for p in sorted(d.iterdir()):
                if _TMP_RE.fullmatch(p.name):
                    p.unlink()  # a killed writer's unfinished batch; we hold the lock
                    continue
                m = _PART_RE.fullmatch(p.name)
                if not m or not p.is_file():
                    raise StoreError(f"{p}: unknown file in the results store (only part-<seq>-<uuid>.parquet "
                                     f"files belong there); move it away or use another --out")
                self._next_seq = max(self._next_seq, int(m.group(1)) + 1)
                if d == self.runs_dir:
                    parts[p.name] = p
        if self.requests_dir.exists():
            for p in sorted(self.requests_dir.iterdir()):
                if p.name not in parts:
                    p.unlink()  # orphan of a kill between the requests and runs renames
        want_corpus = self.manifest["corpus_sha256"]
        want_engine = self.manifest["engine_hash"]
        for name in sorted(parts):
            p = parts[name]
            try:  # decode every page (checksummed), not just the footer: catches damage anywhere
                t = pq.read_table(p, **_READ_CHECKED)
            except Exception as e:  # pyarrow raises several types for a damaged file
                raise StoreError(f"{p}: corrupt results part ({_one_line(e)}); move it away to rerun its "
                                 f"cells, or use --force to start a fresh store") from None
            if not t.schema.remove_metadata().equals(self.schema):
                raise StoreError(f"{p}: results part has another schema than this store's manifest "
                                 f"declares; it was not written by this store (move it away, or use --force)")
            for name, sha in part_policies(t.schema, p).items():
                if self.part_policies.setdefault(name, sha) != sha:
                    raise StoreError(f"{p}: holds cells of scheduler {name!r} made by sha256 {sha[:12]}, other "
                                     f"parts by {self.part_policies[name][:12]}: two versions of one policy file "
                                     f"are mixed in this store (move the part away)")
            t = t.select(list(KEY_COLUMNS) + ["rho", "corpus_sha256", "engine_hash"])
            cols = t.to_pydict()
            if any(v != want_corpus for v in set(cols["corpus_sha256"])) or \
                    any(v != want_engine for v in set(cols["engine_hash"])):
                raise StoreMismatch(f"{p}: holds rows of another corpus or engine config than the manifest; "
                                    f"the store is inconsistent (move the part away, or use --force)")
            for i in range(t.num_rows):
                key = tuple(cols[c][i] for c in KEY_COLUMNS)
                if key in self.done:
                    raise StoreError(f"{p}: cell {'/'.join(map(str, key))} is stored twice; the store is "
                                     f"inconsistent (was it written by two sweeps at once?)")
                self.done.add(key)
                region, rho = cols["region"][i], cols["rho"][i]
                if self.region_rho.setdefault(region, rho) != rho:
                    raise StoreError(f"{p}: region {region!r} appears with two rho values "
                                     f"({self.region_rho[region]} and {rho}); the store is inconsistent")

    # ------------------------------------------------------------------ writing

    def add(self, rows: list[dict], requests: list | None = None) -> None:
        """Buffer finished cells (row dicts from the sweep; optional per-request DataFrames)."""
        self._rows.extend(rows)
        if requests:
            for row, df in zip(rows, requests):
                self._requests.append(self._requests_table(row, df))

    @property
    def pending(self) -> int:
        """Cells buffered but not yet written."""
        return len(self._rows)

    def adopt_policies(self, policies: dict) -> None:
        """Record this run's user schedulers ({name: `PolicySource`}) in the manifest, text included;
        refuse (`StoreMismatch`, one line with both hashes) one whose stored cells another version of
        its file made: a changed file is a new scheduler, never mixed with the old one's results."""
        recorded = self.manifest.get("policies") or {}
        for name, src in policies.items():
            old = recorded.get(name) or {}
            old_sha = self.part_policies.get(name) or old.get("sha256")
            has_cells = any(k[3] == name for k in self.done)
            if has_cells and old_sha != src.sha256:
                made_by = f"{old.get('path', 'a policy file')} with sha256 {str(old_sha)[:12]}" if old_sha \
                    else "a policy file this store did not record"
                what = _changed_part(old, src)
                raise StoreMismatch(f"{self.root}: its cells of scheduler {name!r} were made by {made_by}; this "
                                    f"run's {src.path} hashes to {src.sha256[:12]} ({what}): a changed policy is a "
                                    f"new scheduler version, not mixed with the old results (use a new --out, or "
                                    f"give the changed policy another name)")
            if not has_cells or not old:
                recorded[name] = src.record()
        if policies:
            self.manifest["policies"] = recorded
            self.write_manifest()

    def _run_table(self, rows: list[dict]) -> pa.Table:
        cols: dict[str, list] = {}
        extra = {"corpus_sha256": self.manifest["corpus_sha256"], "engine_hash": self.manifest["engine_hash"]}
        for f in self.schema:
            name = f.name
            if name in extra:
                cols[name] = [extra[name]] * len(rows)
                continue
            try:
                vals = [r[name] for r in rows]
            except KeyError:
                raise RuntimeError(f"schedport bug: a sweep row lacks column {name!r}") from None
            if pa.types.is_floating(f.type):
                vals = [math.nan if v is None else float(v) for v in vals]
            elif pa.types.is_integer(f.type):
                if any(v is None for v in vals):
                    raise RuntimeError(f"schedport bug: integer column {name!r} got an undefined value")
                vals = [int(v) for v in vals]
            cols[name] = vals
        table = pa.Table.from_pydict(cols, schema=self.schema)
        recorded = self.manifest.get("policies") or {}
        used = {n: recorded[n]["sha256"] for n in sorted({r["scheduler"] for r in rows}) if n in recorded}
        if used:   # each part names the version of every user scheduler whose cells it holds
            table = table.replace_schema_metadata({POLICIES_META: json.dumps(used, sort_keys=True)})
        return table

    def _requests_table(self, row: dict, df) -> pa.Table:
        n = len(df)
        cols = {c: [row[c]] * n for c in KEY_COLUMNS}
        for c in _REQUEST_TYPES:
            if c == "reject_reason":  # optional in a caller's table; text or missing (None/NaN)
                vals = df[c].tolist() if c in df.columns else [None] * n
                cols[c] = [v if isinstance(v, str) else None for v in vals]
            else:
                cols[c] = df[c].tolist()
        return pa.Table.from_pydict(cols, schema=requests_schema())

    def flush(self) -> int:
        """Write the buffered cells as one new part (atomically); return how many were written.

        Ctrl-C / SIGTERM are held off while the part is written and the buffer cleared, so
        an interrupt can neither lose the batch nor make the final flush write it twice.
        """
        if not self._rows:
            return 0
        with _signals_deferred():
            rows, reqs = self._rows, self._requests
            table = self._run_table(rows)
            name = f"part-{self._next_seq:06d}-{uuid.uuid4().hex}.parquet"
            self._next_seq += 1
            if reqs:
                self.requests_dir.mkdir(exist_ok=True)
                _write_part(self.requests_dir / name, pa.concat_tables(reqs))
            _write_part(self.runs_dir / name, table)
            self._rows, self._requests = [], []
            for r in rows:
                self.done.add(tuple(r[c] for c in KEY_COLUMNS))
            self.parts_written += 1
        return len(rows)

    # ------------------------------------------------------------------ manifest

    def write_manifest(self) -> None:
        """Rewrite manifest.json atomically from `self.manifest`."""
        self.manifest["cells_done"] = len(self.done)
        data = json.dumps(self.manifest, indent=2, allow_nan=False) + "\n"
        try:
            atomic_write_bytes(self.root / "manifest.json", data.encode("utf-8"))
        except OSError as e:
            raise StoreError(f"{self.root / 'manifest.json'}: cannot write the results manifest "
                             f"({cause(e)})") from None

    def begin_run(self, info: dict) -> None:
        """Record the start of a sweep invocation (status running) in the manifest.

        An earlier entry still ``"running"`` belongs to a sweep that died without recording
        its end (SIGKILL, a failed write): we hold the lock, so it is not running; it is
        closed as ``"abandoned"``.
        """
        t = now_iso()
        for old in self.manifest.setdefault("runs", []):
            if old.get("status") == "running":
                old.update(status="abandoned", abandoned_noticed=t,
                           note="the sweep ended without recording its end (killed, or a write failed)")
        run = {"started": t, "ended": None, "status": "running", **info}
        self.manifest["runs"].append(run)
        self.manifest.update(status="running", started=t, ended=None, selectors=info.get("selectors"),
                             package_version=_version(), git_commit=git_commit())
        self.write_manifest()

    def end_run(self, status: str, **info) -> None:
        """Record the end of the current invocation (finished, interrupted or failed)."""
        t = now_iso()
        run = self.manifest["runs"][-1]
        run.update(ended=t, status=status, **info)
        self.manifest.update(status=status, ended=t)
        self.write_manifest()

    def close(self) -> None:
        """Release the directory lock (buffered cells are NOT flushed: call `flush` first)."""
        self._lock_fd.release()


class _signals_deferred:
    """Block SIGINT and SIGTERM in this thread for the duration (delivered on exit)."""

    _SIGS = {signal.SIGINT, signal.SIGTERM}

    def __enter__(self):
        self.old = None
        if hasattr(signal, "pthread_sigmask") and threading.current_thread() is threading.main_thread():
            self.old = signal.pthread_sigmask(signal.SIG_BLOCK, self._SIGS)
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.old)
        return False


def _write_part(path: Path, table: pa.Table) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd", **_WRITE_CHECKED)

    try:
        atomic_write(path, write)
    except OSError as e:
        raise StoreError(f"{path}: cannot write this results part ({cause(e)}); the cells of this "
                         f"batch were not stored, rerun to compute them again") from None


def _version() -> str:
    from schedport.__about__ import __version__

    return __version__


def engine_config_hash(engine_config: dict) -> str:
    """sha256 hex of an engine config dict's canonical JSON (the rule of `EngineConfig.config_hash`)."""
    import hashlib

    canon = json.dumps(engine_config, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def _read_manifest(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StoreError(f"{path}: unreadable results manifest ({_one_line(e)}); not overwriting it "
                         f"(use another --out, or --force to move this directory aside)") from None
    if not isinstance(data, dict) or data.get("kind") != STORE_KIND:
        raise StoreError(f"{path}: not a schedport results manifest; not overwriting it "
                         f"(use another --out, or --force to move this directory aside)")
    check_manifest(data, path)
    return data


def check_manifest(data: dict, path) -> None:
    """Check a schedport results manifest's fields and provenance; a one-line `StoreError` if not.

    Required fields present and of the right type, the store schema this version writes,
    and ``engine_hash`` equal to the hash recomputed from the stored ``engine_config``.
    """
    if data.get("store_schema") != STORE_SCHEMA:
        raise StoreMismatch(f"{path}: results store schema {data.get('store_schema')!r}, this schedport "
                            f"writes schema {STORE_SCHEMA}; use another --out or --force")
    for k in ("corpus_sha256", "engine_hash", "columns"):
        if k not in data:
            raise StoreError(f"{path}: results manifest lacks {k!r}; the store is damaged "
                             f"(use another --out, or --force to move it aside)")
    types = {"corpus_sha256": str, "engine_hash": str, "columns": list, "engine_config": dict, "runs": list}
    for k, t in types.items():
        if k in data and not isinstance(data[k], t):
            raise StoreError(f"{path}: results manifest field {k!r} is a {type(data[k]).__name__}, not a "
                             f"{'JSON ' + ('object' if t is dict else 'array' if t is list else 'string')}; "
                             f"the store is damaged (use another --out, or --force to move it aside)")
    if any(not isinstance(r, dict) for r in data.get("runs", [])):
        raise StoreError(f"{path}: results manifest field 'runs' holds an entry that is not an object; "
                         f"the store is damaged (use another --out, or --force to move it aside)")
    pol = data.get("policies", {})
    if not isinstance(pol, dict) or not all(isinstance(v, dict) and isinstance(v.get("sha256"), str)
                                            for v in pol.values()):
        raise StoreError(f"{path}: results manifest field 'policies' is not an object of policy records; "
                         f"the store is damaged (use another --out, or --force to move it aside)")
    if "engine_config" not in data:
        raise StoreError(f"{path}: results manifest lacks 'engine_config'; the store is damaged "
                         f"(use another --out, or --force to move it aside)")
    try:
        actual = engine_config_hash(data["engine_config"])
    except (TypeError, ValueError) as e:
        raise StoreError(f"{path}: results manifest 'engine_config' cannot be hashed ({_one_line(e)})") from None
    if actual != data["engine_hash"]:
        raise StoreError(f"{path}: 'engine_config' hashes to {actual[:12]}, but the manifest records engine_hash "
                         f"{str(data['engine_hash'])[:12]}: the config was edited after the run, so it is not "
                         f"the one the results were made with (restore it, or rerun into a new --out)")


def move_aside(root: Path) -> Path:
    """Rename `root` to a fresh sibling ``<root>.old-<UTC timestamp>`` and return that path."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = root.with_name(f"{root.name}.old-{stamp}")
    i = 1
    while dest.exists():
        dest = root.with_name(f"{root.name}.old-{stamp}-{i}")
        i += 1
    try:
        os.rename(root, dest)
    except OSError as e:
        raise StoreError(f"{root}: cannot move the old results aside to {dest} "
                         f"({e.strerror or e}); move or delete it yourself") from None
    return dest


def _holds_no_cells(root: Path) -> bool:
    """True when the store at `root` has no results part at all (and no analysis of one)."""
    runs = root / "runs"
    if (root / "portability.json").exists():
        return False
    try:
        return not any(_PART_RE.fullmatch(p.name) for p in runs.iterdir())
    except FileNotFoundError:
        return True
    except OSError:
        return False


def open_store(root: str | os.PathLike[str], *, corpus_sha256: str, engine_config: dict, engine_hash: str,
               metric_columns: Sequence[str], corpus_dir: str | None = None, force: bool = False,
               ) -> tuple[ResultsStore, Path | None]:
    """Open the results store at `root` for this corpus and engine, creating it if needed.

    Validates everything already there (manifest identity, every part's schema, hashes and
    keys) and takes an exclusive lock so two sweeps never write the same store. Returns
    the store and, when ``force`` moved an existing directory aside, where it went.
    Raises `StoreMismatch` for another corpus / engine / schema and `StoreError` for a
    foreign, corrupt or locked directory (``force`` moves the old directory aside
    instead, except when it is locked by a running sweep).
    """
    root = Path(root)
    schema = run_schema(metric_columns)
    moved: Path | None = None
    if root.exists() and not root.is_dir():
        raise StoreError(f"{root}: exists and is not a directory; choose another --out")

    def identity_problem() -> StoreError | None:
        mpath = root / "manifest.json"
        if not root.exists():
            return None
        if not mpath.exists():
            # A sweep killed before its first manifest write leaves only an empty runs/ and .lock.
            entries = [p.name for p in root.iterdir()
                       if not (p.name == ".lock" or (p.name == "runs" and p.is_dir() and not any(p.iterdir())))]
            if entries:
                return StoreError(f"{root}: not empty and has no manifest.json, so it is not a schedport "
                                  f"results store ({len(entries)} entries, e.g. {sorted(entries)[0]!r}); "
                                  f"use another --out, or --force to move it aside")
            return None
        try:
            m = _read_manifest(mpath)
        except StoreError as e:
            return e
        if m["corpus_sha256"] != corpus_sha256:
            return StoreMismatch(f"{root}: holds results for corpus {m['corpus_sha256'][:12]}, this run uses "
                                 f"corpus {corpus_sha256[:12]}; refusing to mix them (use a new --out, or "
                                 f"--force to move the old results aside)")
        if m["engine_hash"] != engine_hash:
            return StoreMismatch(f"{root}: holds results for engine config {m['engine_hash'][:12]}, this run "
                                 f"uses {engine_hash[:12]}; refusing to mix them (use a new --out, or "
                                 f"--force to move the old results aside)")
        if m["columns"] != _schema_desc(schema):
            return StoreMismatch(f"{root}: its metric columns differ from this schedport version's (other "
                                 f"SLO profiles or version); use a new --out, or --force to move it aside")
        return None

    problem = identity_problem()
    if isinstance(problem, StoreMismatch) and not force and _holds_no_cells(root):
        # a run that failed before its first cell (a bad engine config, say) left only its
        # manifest: nothing a user could lose, so the corrected rerun starts the store afresh
        _check_unlocked(root)
        (root / "manifest.json").unlink()
        problem = None
    if problem is not None:
        if not force:
            raise problem
        _check_unlocked(root)
        moved = move_aside(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / "runs").mkdir(exist_ok=True)
    except OSError as e:
        raise StoreError(f"{root}: cannot create the results directory ({e.strerror or e})") from None
    lock_fd = _lock(root)
    store = None
    try:
        mpath = root / "manifest.json"
        if mpath.exists():
            manifest = _read_manifest(mpath)
        else:
            manifest = {
                "kind": STORE_KIND, "store_schema": STORE_SCHEMA,
                "corpus_sha256": corpus_sha256, "corpus_dir": corpus_dir,
                "engine_hash": engine_hash, "engine_config": engine_config,
                "package_version": _version(), "git_commit": git_commit(),
                "columns": _schema_desc(schema), "created": now_iso(),
                "status": "new", "started": None, "ended": None, "selectors": None,
                "cells_done": 0, "runs": [],
            }
        for p in root.iterdir():
            if _TOP_TMP_RE.fullmatch(p.name):
                p.unlink()  # a killed writer's unfinished manifest/cache rewrite; we hold the lock
        store = ResultsStore(root, manifest, schema, lock_fd)
        store._scan()
        if not mpath.exists():
            store.write_manifest()
        return store, moved
    except StoreError:
        if store is not None:
            store.close()
        else:
            lock_fd.release()
        if not force:
            raise
    except BaseException:
        if store is not None:
            store.close()
        else:
            lock_fd.release()
        raise
    # --force on a corrupt store: move it aside and start a fresh one.
    moved = move_aside(root)
    store, _ = open_store(root, corpus_sha256=corpus_sha256, engine_config=engine_config,
                          engine_hash=engine_hash, metric_columns=metric_columns,
                          corpus_dir=corpus_dir, force=False)
    return store, moved


def _lock(root: Path):
    """Hold the store's lock (`schedport.common.guard.hold_dir_lock`: joining the hold of the
    command that runs this sweep, so `run` keeps it from start to end, but never shared with
    another open store); a `StoreError` if another writer has it."""
    return hold_dir_lock(root, "another schedport run is writing this results store right now; wait for it to "
                               "finish or use another --out", StoreError, shared=False)


def _check_unlocked(root: Path) -> None:
    if (root / ".lock").exists():
        _lock(root).release()


def verified_runs(root: str | os.PathLike[str], manifest: dict):
    """Every runs part under `root`/runs, verified as `open_store` verifies it, as a DataFrame.

    For a store written by `schedport run` (manifest kind ``schedport-results``): the
    manifest's fields and engine hash (`check_manifest`), only ``part-<seq>-<uuid>.parquet``
    files (a killed writer's dot-prefixed temporary files are ignored), every page decoded
    with its checksum, every part's schema equal to the manifest's ``columns``, and every
    row's corpus and engine hash equal to the manifest's. Tables of another origin (made
    by hand, say) are only read page by page with checksums. A part's record of its user schedulers'
    versions must be the manifest's. Any failure is a one-line
    `StoreError` naming the part; nothing damaged is ever returned.
    """
    import pandas as pd

    root = Path(root)
    runs = root / "runs"
    ours = isinstance(manifest, dict) and manifest.get("kind") == STORE_KIND
    if ours:
        check_manifest(manifest, root / "manifest.json")
    try:
        entries = sorted(runs.iterdir())
    except OSError as e:
        raise StoreError(f"{runs}: cannot list the results parts ({e.strerror or e})") from None
    parts = []
    for p in entries:
        if p.name.startswith((".", "_")):
            continue  # temporary files of a writer, and Parquet's own metadata side files
        if ours and not (_PART_RE.fullmatch(p.name) and p.is_file()):
            raise StoreError(f"{p}: unknown file in the results store (only part-<seq>-<uuid>.parquet files "
                             f"belong there); move it away")
        parts.append(p)
    tables = []
    for p in parts:
        try:
            t = pq.read_table(p, **_READ_CHECKED)
        except Exception as e:  # pyarrow raises several types for a damaged file
            raise StoreError(f"{p}: corrupt results part ({_one_line(e)}); move it away and rerun "
                             f"`schedport run` to recompute its cells") from None
        if ours:
            if _schema_desc(t.schema.remove_metadata()) != manifest["columns"]:
                raise StoreError(f"{p}: results part has another schema than this store's manifest declares; "
                                 f"it was not written by this store")
            recorded = manifest.get("policies") or {}
            for name, sha in part_policies(t.schema, p).items():
                if (recorded.get(name) or {}).get("sha256") != sha:
                    raise StoreError(f"{p}: holds cells of user scheduler {name!r} made by sha256 {sha[:12]}, which "
                                     f"the manifest does not record; the store is inconsistent")
            for col in ("corpus_sha256", "engine_hash"):
                if set(t.column(col).to_pylist()) - {manifest[col]}:
                    raise StoreError(f"{p}: holds rows of another {col.split('_')[0]} than the manifest "
                                     f"records; the store is inconsistent")
        tables.append(t)
    if not tables:
        raise StoreError(f"{runs}: no results parts; the results store holds no runs")
    try:
        table = pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise StoreError(f"{runs}: the parts do not share one schema ({_one_line(e)})") from None
    return table.to_pandas() if table.num_rows else pd.DataFrame(columns=table.schema.names)


def read_results(root: str | os.PathLike[str]):
    """All finished cells of the store at `root` as a pandas DataFrame (one row per cell)."""
    import pandas as pd

    runs = Path(root) / "runs"
    if not runs.is_dir() or not any(_PART_RE.fullmatch(p.name) for p in runs.iterdir()):
        raise StoreError(f"{root}: no results yet (no part files under {runs})")
    return pd.read_parquet(runs)
