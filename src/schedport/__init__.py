"""schedport: do LLM-serving scheduler rankings carry over across workloads, loads and metrics?"""

from __future__ import annotations

__version__ = "0.1.0"

from schedport.errors import ConfigError, SchedportError, TraceError  # noqa: E402

__all__ = ["__version__", "SchedportError", "TraceError", "ConfigError", "simulate"]


def __getattr__(name: str):
    # The simulation API imports numpy/pandas; keep `import schedport` cheap.
    if name == "simulate":
        from schedport.api import simulate

        return simulate
    raise AttributeError(name)
