"""Numbers as people read them: one style for the analysis's text summaries and the report."""

from __future__ import annotations

import math
from typing import Any


def fmt(v: Any, digits: int = 3) -> str:
    """A number for display: fixed digits, "n/a" for None/NaN."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    return f"{v:.{digits}f}"


def pct(v: Any, digits: int = 1) -> str:
    """A share as a percentage, "n/a" for None/NaN."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return f"{100 * v:.{digits}f}%"


def whole_pct(v: Any) -> str:
    """A share as a whole percentage ("42%"), "n/a" for None, never "-0%" (a share that rounds to
    zero reads 0% whatever its sign): the style of `schedport explain`'s shares."""
    if v is None:
        return "n/a"
    t = f"{100 * v:.0f}"
    return ("0" if t == "-0" else t) + "%"


def signed_pct(v: Any, digits: int = 1) -> str:
    """A signed share as a percentage ("+9.1%"), "n/a" for None, NaN or a non-number: the style
    of a relative error, whose sign says which side is larger."""
    try:
        f = math.nan if v is None else float(v)
    except (TypeError, ValueError):
        f = math.nan
    if not math.isfinite(f):
        return "n/a"
    return f"{100 * f:+.{digits}f}%"


def as_float(v: Any) -> float:
    """`v` as a float, NaN for None / missing / non-numeric (a value read from a summary or a JSON file)."""
    if v is None:
        return math.nan
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f
