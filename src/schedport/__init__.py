"""schedport: do LLM-serving scheduler rankings carry over across workloads, loads and metrics?"""

from __future__ import annotations

from schedport.__about__ import __version__  # noqa: E402

from schedport.errors import ConfigError, SchedportError, TraceError  # noqa: E402

#: The Python API (`schedport.api`), reached as `schedport.NAME` and loaded on first use. Its
#: `report` is `schedport.api.report`: `schedport.report` is the report's subpackage.
_API = ("run", "analyze", "explain", "simulate", "validate", "calibrate", "check_policy", "convert_trace",
       "trace_stats", "conformance")

__all__ = ["__version__", "SchedportError", "TraceError", "ConfigError", *_API]


def __getattr__(name: str):
    # The API imports numpy/pandas (and, when called, the analysis and the engine): `import
    # schedport` stays cheap, and `schedport.run` loads `schedport.api` on first use. Imported by
    # name, so that the layers below the API, which import this package for its version and
    # errors, do not depend on the API through it (the import contract in pyproject.toml).
    if name in _API:
        import importlib

        return getattr(importlib.import_module("schedport.api"), name)
    raise AttributeError(name)
