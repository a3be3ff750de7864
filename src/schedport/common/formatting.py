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
