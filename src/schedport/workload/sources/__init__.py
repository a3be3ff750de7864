"""Source adapters: each public workload format -> the canonical trace, with what was dropped.

`read(fmt, paths, **selection)` dispatches to one module per format (`FORMATS`):

- ``azure``: Azure LLM inference trace CSV (Patel et al., Splitwise, ISCA 2024).
- ``burstgpt``: BurstGPT CSV, columns by name (Wang et al., BurstGPT, KDD 2025); with
  ``prefix="sessions"`` a prefix identity derived from its sessions, labelled an assumption.
- ``servegen``: a ServeGen client-pool folder; a window is *generated* for one 600 s slot
  (ServeGen, arXiv 2505.09999; Alibaba Bailian).
- ``jsonl``: Mooncake-style JSONL (Qin et al., Mooncake, FAST 2025) or a user's own.
- ``mooncake``: Mooncake JSONL keeping its prefix identity (``hash_ids``, 512-token blocks).
- ``canonical``: the project's own CSV/Parquet.

Every adapter returns an `AdapterResult` (trace, rows dropped per named reason, things
skipped, the files read with their sha256) and raises `schedport.errors.DataError` with a
one-line message naming file, line and column for any malformed input; nothing is returned
when the input is bad, and no value is silently repaired.

Drop reasons (a dropped row is counted once, under the first that applies):
``unparsable_row`` (only with ``bad_rows="drop"``), ``failed_response`` (BurstGPT: 0 response
tokens), ``zero_output_tokens``, ``zero_input_tokens``, ``over_max_len`` (input + output >
``max_len``, only when ``max_len`` is given).

Tabular formats (azure, burstgpt, jsonl, mooncake, canonical) share the selection options
``start_s``, ``duration_s``, ``rows``, ``max_len`` and ``bad_rows``; servegen takes
``slot_start_s``, ``seed``, ``rate_scale``, ``duration_s``, ``clients``, ``length_match``,
``max_len``. Unknown options are a `ConfigError`.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from schedport.errors import ConfigError
from schedport.workload.sources._common import DROP_REASONS, AdapterResult

FORMATS = ("azure", "burstgpt", "servegen", "jsonl", "mooncake", "canonical")

__all__ = ["AdapterResult", "DROP_REASONS", "FORMATS", "clear_cache", "read"]


def read(fmt: str, paths: list[Path] | list[str] | Path | str, **selection) -> AdapterResult:
    """Read public file(s) of format `fmt` into the canonical trace (see the module docstring).

    `paths` is a list of files read in order (or, for servegen, client-pool folders); a
    single path is accepted too. `selection` holds the format's window options.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown source format {fmt!r} (known: {', '.join(FORMATS)})")
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = [Path(p) for p in paths]
    if not paths:
        raise ConfigError(f"{fmt}: no input files given")
    module = import_module(f"schedport.workload.sources.{fmt}")
    return module.read(paths, **selection)


def clear_cache() -> None:
    """Forget every file the adapters parsed in this process (they cache by path, size, mtime)."""
    from schedport.workload.sources import _common, servegen

    _common.clear_cache()
    servegen.clear_cache()
