"""schedport: do LLM-serving scheduler rankings carry over across workloads, loads and metrics?"""

from __future__ import annotations

from schedport.__about__ import __version__  # noqa: E402

from schedport.errors import ConfigError, SchedportError, TraceError  # noqa: E402

__all__ = ["__version__", "SchedportError", "TraceError", "ConfigError", "simulate"]


def __getattr__(name: str):
    # The simulation API imports numpy/pandas; keep `import schedport` cheap.
    if name == "simulate":
        from schedport.engine.runner import simulate

        return simulate
    raise AttributeError(name)
