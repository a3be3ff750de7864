"""The frozen corpus: windows cut from public traces by a spec, with a manifest of hashes.

A corpus directory holds ``windows/<window_id>.parquet`` (canonical traces, written by
`schedport.workload.trace.save_trace`) and ``manifest.json``: per window its source, selection,
seed, origin file and sha256, statistics, drops and the sha256 of its canonical content;
for the whole corpus ``corpus_sha256`` (over the sorted ``(window_id, sha256)`` pairs and
the spec as built) and ``manifest_sha256`` (a seal over every other manifest field, so a
hand edit anywhere is caught). ``build.json`` beside them records when and where it was
built (kept out of the manifest so two builds are byte-identical).

The corpus is defined by a spec (TOML; the study's is packaged as
``schedport/workload/data/corpus-spec.toml``, documented in docs/corpus.md): sources, each with an
adapter (`schedport.workload.sources` formats, plus ``burstgpt-modeled``), files relative to the data
directory, a window rule and count, and seeds. The packaged
``schedport/workload/data/corpus-expected.json`` holds the window hashes of the study as frozen, so a
build on another machine says whether its data reproduced the same windows.

Window rules (``windows = {rule = ..., ...}``):

- ``tile``: ``count`` equal, contiguous windows from the file's first request to 1 ms after
  its last (no gap, no overlap; every request in exactly one window). The study's Azure
  hours use it: they span 3,502 s and 3,436 s, so 20 windows are ~3 minutes each.
- ``contiguous``: ``count`` windows of ``duration_s`` from ``start_s`` (default 0), one
  every ``step_s`` (default ``duration_s``); time is the file's own clock.
- ``stratified``: ``count`` windows spread over ``days`` (an integer, or ``"auto"`` = the
  whole days the file spans) and the time of day. Window k starts on day
  ``floor((k + 0.5) * days / count)`` at hour ``3 * ((3k) mod 8) + (k div 8) mod 3``: the
  eight 3-hour blocks of the day are visited in the order 0, 3, 6, 1, 4, 7, 2, 5 (every
  block once per 8 windows, consecutive windows 9 h apart) and the hour inside the block
  rotates each round, so 40 windows cover every hour of the day and every block five times.
  The window is then the first ``rows`` requests from that start (tabular files and
  ``burstgpt-modeled``) or the 600 s ServeGen slot starting there (``servegen``).
- ``explicit``: ``starts_s = [...]`` with ``duration_s`` or ``rows`` (or ServeGen slots).

ServeGen slots take ``target_requests`` (scale every active client's rate by one factor so
the slot's expected request count is the target: factor = target / (sum of the active
clients' rates x slot length), clients without length data left out) or a fixed
``rate_scale``; each slot is generated with seed ``derive_seed(seed, slot)``.

This module builds (`build_corpus`), verifies (`verify_corpus`) and freezes (`write_expected`) a
corpus; the stored corpus and its hashes are `schedport.workload.corpus_manifest`, the spec
`schedport.workload.corpus_spec`, the window rules `schedport.workload.corpus_windows` and the
frozen hashes `schedport.workload.corpus_expected` (their public names are re-exported here). The
command line is `schedport.cli.corpus`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import numpy as np

from schedport.__about__ import __version__
from schedport.common.guard import check_only_own, claim_dir
from schedport.common.outputs import cause, process_alive
from schedport.errors import ConfigError, DataError, SchedportError
from schedport.workload.corpus_expected import (  # noqa: F401  (re-exported)
    compare_expected, expected_from_manifest, load_expected,
)
from schedport.workload.corpus_manifest import (  # noqa: F401  (re-exported: the corpus's public API)
    DEFAULT_OUT, EXPECTED_KIND, MANIFEST_KIND, MANIFEST_SCHEMA, MODELED_ADAPTER, SPEC_SCHEMA, STAT_KEYS, Corpus,
    Window, corpus_hash, derive_seed, file_sha256, load_corpus, manifest_seal, source_label, window_stats,
)
from schedport.workload.corpus_spec import ADAPTERS, RULES, TABULAR, default_spec_path, load_spec  # noqa: F401
from schedport.workload.corpus_spec import SourceSpec, resolve_sources
from schedport.workload.prefix import merged_prefix_record
from schedport.workload.corpus_windows import (  # noqa: F401
    STRATA, STRATUM_STEP, TILE_EPS_S, cut_window, manifest_entry, stratified_start, tile_windows, window_plans,
)


def build_corpus(spec: str | os.PathLike[str] | None = None,
                 data_dir: str | os.PathLike[str] | None = None,
                 out: str | os.PathLike[str] = DEFAULT_OUT, *, download: bool = True,
                 progress: Callable[[str], None] | None = None) -> Corpus:
    """Build the corpus of `spec` (None: the packaged study) from the public data into `out`.

    Files are found via `schedport.workload.datadir` (``data_dir``, $SCHEDPORT_DATA, the shared
    mirror, the user cache; a missing registered file is downloaded when `download` and the
    machine is online, else a one-line `DataError` says what to get and where to put it).
    The build is atomic: windows and manifest are written to a temporary directory beside
    `out` and renamed into place, replacing an earlier corpus there; a failure leaves `out`
    as it was. An existing `out` that is not a corpus (no manifest.json) and not empty, a corpus
    folder holding anything besides the corpus's own files, and a folder inside a corpus or a
    results store are refused. The returned `Corpus` carries `reproduction`: the comparison with the shipped
    expected hashes (also written to ``build.json``). `progress` receives one-line messages.
    """
    from schedport.workload.datadir import resolve_data_dir
    from schedport.workload.trace import Trace, save_trace

    log = progress or (lambda msg: None)
    t0 = time.perf_counter()
    root = resolve_data_dir(None if data_dir is None else str(data_dir))
    raw, spec_dir = load_spec(spec)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory")
    # only an earlier corpus is ever replaced: a results store, a folder with a manifest of
    # another kind, or any other non-empty folder is refused (guard.claim_dir)
    try:
        if claim_dir(out, {"corpus"}, allow_other=False, inputs=[root, spec]) == "corpus":
            check_only_own(out)   # a rebuild replaces the folder whole: nothing else may be lost with it
    except SchedportError as e:
        raise ConfigError(str(e)) from None
    _remove_stale_builds(out)
    study_variants = raw.pop("variants", None)   # how to run the study, not what the corpus is: not hashed
    srcs, built_spec = resolve_sources(raw, root, spec_dir, download, log)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{out}: cannot create its directory {out.parent} ({cause(e)})") from None
    tmp = out.parent / f".{out.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        (tmp / "windows").mkdir(parents=True)
        entries: list[dict] = []
        for src in srcs:
            ts = time.perf_counter()
            n0 = len(entries)
            for part in src.parts:
                for plan in window_plans(src, part):
                    try:
                        res, sel, extra = cut_window(src, part, plan)
                    except SchedportError as e:
                        raise type(e)(f"window {plan.window_id}: {e}") from None
                    tr = res.trace
                    if len(tr) == 0:
                        raise DataError(f"window {plan.window_id}: no requests in this window "
                                        f"({_sel_text(sel)}); choose other windows in the spec")
                    if "rows" in sel and len(tr) - tr.warmup < sel["rows"]:
                        raise DataError(f"window {plan.window_id}: only {len(tr) - tr.warmup} requests after "
                                        f"start_s={sel['start_s']:g} ({sel['rows']} asked); the "
                                        "file ends first")
                    # the checks `load_trace` applies when `run` reads the window back (token
                    # counts <= 2^31 - 1, arrivals in range): refused now, not after the build
                    tr = Trace.from_arrays(tr.arrival_s, tr.input_tokens, tr.output_tokens, tr.client_id,
                                           name=plan.window_id, source=f"window {plan.window_id}",
                                           hash_ids=tr.hash_id_lists(), hash_block_size=tr.hash_block_size,
                                           warmup=tr.warmup)
                    path = tmp / "windows" / f"{plan.window_id}.parquet"
                    try:
                        save_trace(tr, path)
                    except SchedportError as e:
                        if isinstance(e.__cause__, OSError):  # the disk, not the data: name the output
                            raise DataError(f"{out}: cannot write the corpus ({cause(e.__cause__)}); "
                                            f"nothing was changed there") from None
                        raise
                    entries.append(manifest_entry(src, part, plan, res, sel, extra, tr,
                                          file_sha256(path)))
            label = "" if src.adapter != MODELED_ADAPTER else f" [{source_label(src.adapter)}]"
            log(f"{src.name}{label}: {len(entries) - n0} windows "
                f"({time.perf_counter() - ts:.1f} s)")
        ids = [e["window_id"] for e in entries]
        dup = next((i for i in ids if ids.count(i) > 1), None)
        if dup:
            raise ConfigError(f"window id {dup!r} produced twice; give the sources distinct names")
        manifest = _manifest(built_spec, entries, srcs, study_variants, root)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, allow_nan=False) + "\n",
                                           encoding="utf-8")
        repro = compare_expected(manifest)
        build = {"built_unix_s": round(time.time(), 3), "build_seconds": round(time.perf_counter() - t0, 3),
                 "data_dir": str(root), "spec": str(spec) if spec is not None else "(packaged default)",
                 "code_version": __version__, "python": sys.version.split()[0],
                 "numpy": np.__version__, "reproduction": repro}
        (tmp / "build.json").write_text(json.dumps(build, indent=1) + "\n", encoding="utf-8")
        _swap_in(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise DataError(f"{out}: cannot write the corpus ({cause(e)}); nothing was changed there") from None
        raise
    corpus = load_corpus(out)
    corpus.reproduction = repro
    return corpus


def _remove_stale_builds(out: Path) -> None:
    """Remove the temporary folders of builds of `out` whose process is gone (a build killed
    with -9 cannot clean up after itself); a live build's folder is left alone."""
    parent = out.parent
    if not parent.is_dir():
        return
    pat = re.compile(rf"\.{re.escape(out.name)}\.(building|old)-(\d+)-[0-9a-f]{{8}}")
    for p in parent.iterdir():
        m = pat.fullmatch(p.name)
        if m and p.is_dir() and int(m.group(2)) != os.getpid() and not process_alive(int(m.group(2))):
            shutil.rmtree(p, ignore_errors=True)


def _sel_text(sel: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sel.items())


def _manifest(spec: dict, entries: list[dict], srcs: list[SourceSpec], variants: str | None = None,
              data_dir: Path | None = None) -> dict:
    sources = {}
    for s in srcs:
        n = sum(1 for e in entries if e["source"] == s.name)
        sources[s.name] = {"adapter": s.adapter, "n_windows": n, "cite": s.cite,
                           "modeled": s.adapter == MODELED_ADAPTER,
                           "label": source_label(s.adapter),
                           **({"fallback_for": s.spec["fallback_for"]} if "fallback_for" in s.spec else {})}
        prefix = merged_prefix_record([e["prefix"] for e in entries if e["source"] == s.name and "prefix" in e])
        if prefix is not None:
            sources[s.name]["prefix"] = prefix
        if s.adapter == MODELED_ADAPTER:
            from schedport.workload.modelcheck import fidelity_record
            from schedport.workload.sources.burstgpt_model import api_share, params_sha256, with_options

            params = with_options(None, s.parts[0].options)  # the spec's options (api_share, ...) applied
            sources[s.name]["model_params"] = params
            sources[s.name]["model_params_sha256"] = params_sha256(params)
            sources[s.name]["api_share"] = round(api_share(params), 6)
            # the modeled Conversation stream held against the real BurstGPT rows of the mirror
            sources[s.name]["fidelity"] = fidelity_record(data_dir, params)
    man = {"schema": MANIFEST_SCHEMA, "kind": MANIFEST_KIND, "name": spec["name"],
           "corpus_sha256": corpus_hash([(e["window_id"], e["sha256"]) for e in entries], spec),
           "code_version": __version__, "n_windows": len(entries), "sources": sources,
           "spec": spec, "windows": entries}
    if variants is not None:       # the spec's engine variants for `schedport run` (sealed, outside the hash)
        man["study"] = {"variants": variants}
    man["manifest_sha256"] = manifest_seal(man)
    return man


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename the freshly built `tmp` to `out`, moving an earlier corpus aside first."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# =========================================================================== verify


def verify_corpus(dir: str | os.PathLike[str] = DEFAULT_OUT) -> list[str]:
    """Recompute every hash of the corpus at `dir`; return the problems found (empty = intact).

    Checks: the manifest's seal (any edit), its corpus_sha256 (recomputed from the window
    list and spec), and per window that its file exists, has the recorded file sha256,
    loads as a canonical trace whose content sha256 and statistics match the manifest; files
    in ``windows/`` the manifest does not list are problems too.
    """
    from schedport.workload.trace import load_trace

    root = Path(dir)
    try:
        corpus = load_corpus(root)
    except SchedportError as e:
        return [str(e)]
    man = corpus.manifest
    problems: list[str] = []
    seal = man.get("manifest_sha256")
    if not isinstance(seal, str):
        problems.append("manifest.json: no manifest_sha256 seal")
    elif seal != manifest_seal(man):
        problems.append("manifest.json: manifest_sha256 does not match its content (the manifest "
                        "was edited after the build)")
    spec = man.get("spec")
    if not isinstance(spec, dict):
        problems.append("manifest.json: no spec")
    else:
        again = corpus_hash([(w.window_id, w.sha256) for w in corpus.windows], spec)
        if again != corpus.corpus_sha256:
            problems.append(f"manifest.json: corpus_sha256 {corpus.corpus_sha256[:16]}... does not "
                            f"match the windows and spec it lists (recomputed {again[:16]}...)")
    for w in corpus.windows:
        rel = f"windows/{w.window_id}.parquet"
        if not w.path.is_file():
            problems.append(f"{rel}: missing (window {w.window_id} of {w.source})")
            continue
        fsha = file_sha256(w.path)
        if w.meta.get("file_sha256") != fsha:
            problems.append(f"{rel}: file sha256 {fsha[:16]}... differs from the manifest's "
                            f"{str(w.meta.get('file_sha256'))[:16]}... (the file changed)")
        try:
            tr = load_trace(w.path)
        except SchedportError as e:
            problems.append(f"{rel}: unreadable ({e})")
            continue
        csha = tr.content_sha256()
        if csha != w.sha256:
            problems.append(f"{rel}: content sha256 {csha[:16]}... differs from the manifest's "
                            f"{w.sha256[:16]}...")
            continue
        dur = w.meta.get("duration_s")
        if isinstance(dur, (int, float)) and not isinstance(dur, bool):
            warm = w.meta.get("warmup_s", 0.0)
            st = window_stats(tr, float(dur), float(warm) if isinstance(warm, (int, float)) else 0.0)
            bad = [k for k in STAT_KEYS if w.meta.get(k) != st[k]]
            if bad:
                problems.append(f"manifest.json: window {w.window_id}: recorded {', '.join(bad)} "
                                "do not match its trace")
        else:
            problems.append(f"manifest.json: window {w.window_id}: no duration_s")
    listed = {f"{w.window_id}.parquet" for w in corpus.windows}
    wdir = root / "windows"
    if wdir.is_dir():
        for p in sorted(wdir.iterdir()):
            if p.name not in listed and not p.name.startswith("."):
                problems.append(f"windows/{p.name}: not listed in the manifest")
    return problems


def write_expected(corpus_dir: str | os.PathLike[str], dest: str | os.PathLike[str],
                   merge: bool = True) -> Path:
    """Freeze a built study corpus: write its expected-hashes document to `dest`.

    Used when the corpus definition changes (see docs/corpus.md). The real BurstGPT is
    recorded as absent unless the corpus was built from it; with `merge`, sources and
    corpus variants already in `dest` that this corpus does not have are kept (so a machine
    with BurstGPT_1.csv can add the real variant's hashes to the modeled ones).
    """
    corpus = load_corpus(corpus_dir)
    problems = verify_corpus(corpus_dir)
    if problems:
        raise DataError(f"{corpus_dir}: does not verify ({problems[0]}); rebuild before freezing")
    absent = {}
    if "burstgpt" not in corpus.sources:
        absent["burstgpt"] = ("the real BurstGPT_1.csv could not be obtained where this corpus "
                              "was frozen (Git LFS / release asset), so its window hashes are "
                              "unknown")
    dest = Path(dest)
    doc = expected_from_manifest(corpus.manifest, absent)
    if merge and dest.is_file():
        try:
            old = json.loads(dest.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            old = {}
        for key in ("sources", "corpora"):
            merged = dict(old.get(key, {})) if isinstance(old, dict) else {}
            for k, v in doc[key].items():
                if v.get("absent_reason") and merged.get(k, {}).get("absent_reason") is None \
                        and k in merged:
                    continue  # keep hashes frozen on a machine that had the file
                merged[k] = v
            doc[key] = merged
    dest.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return dest
