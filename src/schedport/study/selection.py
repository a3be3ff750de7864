"""What a sweep runs: the corpus it reads and the cells selected from it.

`select` resolves the command line's selectors (``--schedulers``, ``--sources``, ``--regions``,
``--windows``, ``--seeds``, ``--quick``) against the corpus and the scheduler registry into a
`Selection`: ``schedulers x windows x regions x seeds``. `write_demo_corpus` writes a small
synthetic corpus for tests, benchmarks and first contact.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from schedport.engine.core.metrics import summary_keys
from schedport.engine.policies.plugins import PolicySource, resolve_schedulers, source_of
from schedport.engine.policies.schedulers import REGISTRY
from schedport.errors import SchedportError
from schedport.common.atomic import atomic_write_bytes
from schedport.study.regions import REGIONS, parse_regions
from schedport.workload import corpus as corpus_lib
from schedport.workload.corpus import Window
from schedport.workload.examples import make_example_trace
from schedport.workload.trace import Trace, save_trace

#: Extra counters `schedport.engine.runner.simulate` adds to every summary (after the SLO metrics).
SUMMARY_COUNTERS = ("recomputed_tokens", "swapped_bytes", "load_scale", "predictor_tau",
                    "host_swap_full_events", "stall_recomputes")
#: ... and those it adds with `[engine] enable_prefix_caching` (docs/engine.md §1.3).
PREFIX_COUNTERS = ("prefix_hit_rate", "prefix_cached_tokens", "prefix_prompt_tokens")
#: The ``--quick`` subset (documented in the module docstring and the CLI help).
QUICK = {"schedulers": ("vllm-fcfs", "sarathi", "sjf", "vtc", "slo-admission"), "windows": 4,
         "regions": ("moderate", "near-saturation", "overload")}


def load_corpus(root: str | os.PathLike[str]):
    """The corpus at `root` (`schedport.workload.corpus.load_corpus`; a one-line error if there is none)."""
    return corpus_lib.load_corpus(root)


def write_demo_corpus(out: str | os.PathLike[str], *, sources: tuple[str, ...] = ("demo-a", "demo-b"),
                      windows_per_source: int = 2, requests_per_window: int = 60, seed: int = 0) -> Path:
    """Write a small synthetic corpus (same layout and manifest as the real one) to `out`.

    Windows are consecutive slices of `schedport.workload.examples.make_example_trace` (one
    generated trace per source, seeded by `seed` + source index), re-based to start at 0.
    For tests, the sweep benchmark and first contact without the public data; its sources
    are synthetic and named as such, never mistaken for real traces.
    """
    out = Path(out)
    (out / "windows").mkdir(parents=True, exist_ok=True)
    entries = []
    n = requests_per_window
    for si, src in enumerate(sources):
        full = make_example_trace(n * windows_per_source, seed + si)
        for k in range(windows_per_source):
            part = full[k * n:(k + 1) * n]
            arr = np.round(part.arrival_s - part.arrival_s[0], 6)
            wid = f"{src}-{k:02d}"
            t = Trace.from_arrays(arr, part.input_tokens, part.output_tokens, part.client_id, name=wid)
            save_trace(t, out / "windows" / f"{wid}.parquet")
            entries.append({"window_id": wid, "source": src, "n_requests": len(t),
                            "duration_s": float(t.span_s), "sha256": t.content_sha256()})
    digest = hashlib.sha256("".join(e["window_id"] + ":" + e["sha256"] + "\n" for e in entries).encode())
    manifest = {"schema": 1, "corpus_sha256": digest.hexdigest(), "code_version": "demo", "windows": entries}
    atomic_write_bytes(out / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    return out


@dataclass(frozen=True)
class Selection:
    """What to run: scheduler names, windows (in corpus order), regions {name: rho}, seeds, and
    the source of each user scheduler among the names (`schedport.engine.policies.plugins`)."""

    schedulers: tuple[str, ...]
    windows: tuple[Window, ...]
    regions: dict[str, float]
    seeds: tuple[int, ...]
    policies: dict[str, PolicySource] = field(default_factory=dict)

    @property
    def n_cells(self) -> int:
        """Number of cells (runs) in the selection."""
        return len(self.schedulers) * len(self.windows) * len(self.regions) * len(self.seeds)

    def cells(self):
        """Every cell key (source, window_id, region, scheduler, seed), window-major."""
        for w in self.windows:
            for s in self.schedulers:
                for r in self.regions:
                    for seed in self.seeds:
                        yield (w.source, w.window_id, r, s, seed)


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    return items or None


def select(corpus, *, schedulers: str | list[str] | None = None, sources: str | list[str] | None = None,
           regions: str | None = None, windows: int | None = None, seeds: int = 1,
           quick: bool = False) -> Selection:
    """Resolve command-line selectors against the corpus and the scheduler registry.

    Names are validated (unknown scheduler, source or region -> one-line error listing the
    known ones); a scheduler may be a user's (``PATH.py:NAME``, ``module:NAME``, an installed
    entry point), loaded here and selected under its declared name. `quick` fills in `QUICK` for
    every selector not given explicitly.
    """
    for opt, val in (("--schedulers", schedulers), ("--sources", sources), ("--regions", regions)):
        if isinstance(val, str) and _split(val) is None:
            raise SchedportError(f"{opt}: no name given ({val!r}); leave the option out to select all")
    sch = _split(schedulers) if isinstance(schedulers, str) or schedulers is None else list(schedulers)
    src = _split(sources) if isinstance(sources, str) or sources is None else list(sources)
    if quick:
        sch = sch or list(QUICK["schedulers"])
        windows = windows if windows is not None else QUICK["windows"]
        if regions is None:
            regions = ",".join(QUICK["regions"])
    sch = sch or list(REGISTRY)
    if len(set(sch)) != len(sch):
        raise SchedportError("--schedulers: a scheduler is named twice")
    resolved = resolve_schedulers(sch)
    sch = [p.name for p in resolved]
    policies = {p.name: source_of(p) for p in resolved if source_of(p) is not None}
    reg = parse_regions(regions) if regions is not None else dict(REGIONS)
    if windows is not None and windows < 1:
        raise SchedportError(f"--windows must be at least 1, got {windows}")
    if seeds < 1:
        raise SchedportError(f"--seeds must be at least 1, got {seeds}")
    known = list(dict.fromkeys(w.source for w in corpus.windows))
    if src:
        for s in src:
            if s not in known:
                raise SchedportError(f"--sources: unknown source {s!r} in this corpus (known: {', '.join(known)})")
    pool = [w for w in corpus.windows if not src or w.source in src]
    chosen = pool if windows is None else spread_windows(pool, windows)
    return Selection(tuple(sch), tuple(chosen), reg, tuple(range(seeds)), policies)


def spread_windows(windows: list[Window], n: int) -> list[Window]:
    """The first `n` windows of each source, taken in turn from its parts (Azure's ``conv`` and
    ``code`` traces, the manifest's ``label``), in corpus order. Why: a source's parts can differ
    in kind (Azure's conversation windows have an index of dispersion of 11, its code windows 1.1),
    so a subset of one part would stand for the source in a way the full study does not."""
    parts: dict[str, dict] = {}
    for w in windows:
        parts.setdefault(w.source, {}).setdefault(w.meta.get("label"), []).append(w)
    keep = set()
    for by_label in parts.values():
        queues = [list(ws) for ws in by_label.values()]
        taken = 0
        while taken < n and any(queues):
            for q in queues:
                if q and taken < n:
                    keep.add(q.pop(0).window_id)
                    taken += 1
    return [w for w in windows if w.window_id in keep]


def metric_columns(cfg) -> list[str]:
    """The metric columns of every stored row for engine config `cfg` (summary key order); a
    prefix-caching engine's rows also hold its hit rate."""
    counters = SUMMARY_COUNTERS + (PREFIX_COUNTERS if cfg.enable_prefix_caching else ())
    return summary_keys(list(cfg.slo_profiles), counters)
