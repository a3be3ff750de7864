"""Numbers on the report's page, each tagged with its path in ``portability.json`` and its format
(``data-key``, ``data-fmt``), so a test can check every tagged number against the file and the
page can never say something the file does not."""

from __future__ import annotations

from typing import Any

from schedport.common.formatting import fmt, pct
from schedport.report.style import escape_html as esc

__all__ = ["FORMATTERS", "Nums", "resolve_key", "plain"]


FORMATTERS = {"num": fmt, "pct": pct, "int": lambda v: "n/a" if v is None else str(int(v)),
               "count": lambda v: "n/a" if v is None else f"{int(v):,}", "str": str}


def resolve_key(res: dict, key: str) -> Any:
    """The value at dotted path `key` (list indices as integers) of the portability dict."""
    cur: Any = res
    for part in key.split("."):
        cur = cur[int(part)] if isinstance(cur, list) else cur[part]
    return cur


class Nums:
    """Emits headline numbers tagged with their JSON path and format."""

    def __init__(self, res: dict):
        self.res = res

    def __call__(self, key: str, kind: str = "num") -> str:
        v = resolve_key(self.res, key)
        text = FORMATTERS[kind](v)
        mark = ""
        if key.endswith(".adjusted") and isinstance(v, (int, float)) and v > 1:
            # a ratio over a noisy ceiling can pass 1: shown as it is, marked, never as "better than perfect"
            mark = ("<sup class='flag' title='above 1: the split-half reliability it is divided by is itself "
                    "noisy here; read as at the ceiling (1)'>&gt;1</sup>")
        return f'<span class="num" data-key="{esc(key)}" data-fmt="{kind}">{esc(text)}</span>{mark}'

    def ci(self, key: str, kind: str = "num") -> str:
        """value [low, high] for a dict at `key` with value/ci_low/ci_high."""
        return (f"{self(key + '.value', kind)} <span class='ci'>[{self(key + '.ci_low', kind)}, "
                f"{self(key + '.ci_high', kind)}]</span>")


def plain(res: dict, key: str, kind: str = "num") -> str:
    """The value at `key` formatted as on the page, untagged (for Markdown and plain text)."""
    return FORMATTERS[kind](resolve_key(res, key))
