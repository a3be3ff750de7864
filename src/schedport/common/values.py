"""Value rules shared by every layer: what counts as an integer or a real number in a config or
an input file, and the JSON-safe form of a result (the rule every JSON file schedport writes
follows: numpy values as Python ones, NaN and infinities as null)."""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

import numpy as np


def is_int(v: Any) -> bool:
    """An integer that is not a bool (numpy integers count; numpy bools are not Integral)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_real(v: Any) -> bool:
    """A real number that is not a bool (NaN and infinities included: callers that need a finite
    value say so)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def json_scalar(v: Any):
    """A numeric or string value as a JSON-safe Python scalar (NaN / inf -> None); refuses anything
    else with a `TypeError`, for callers whose values must be scalars (an engine's counters)."""
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, str):
        return v
    raise TypeError(f"counter value {v!r} is not a JSON scalar")


def json_safe(v: Any) -> Any:
    """JSON-safe copy of `v`: containers walked (keys as strings, arrays as lists), scalars by
    `json_scalar`, a path as its string, a timestamp in ISO form, anything else as its `str`."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, np.ndarray):
        return json_safe(v.tolist())
    if v is None or isinstance(v, (bool, np.bool_, int, np.integer, float, np.floating, str)):
        return json_scalar(v)
    if isinstance(v, Path):
        return str(v)
    if type(v).__name__ == "Timestamp" and type(v).__module__.startswith("pandas"):
        return v.isoformat()      # a pandas Timestamp, known without importing pandas (the vLLM
                                  # conformance driver imports the engine config where pandas is absent)
    return str(v)
