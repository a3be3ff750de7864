"""The report's look, shared by its sections: the style sheet, the colour-blind-safe palettes, and
the two helpers every section uses to write HTML (`escape_html`, `img_tag`)."""

from __future__ import annotations

import html
from typing import Any, Optional

__all__ = ["CSS", "OKABE_ITO", "MARKERS", "LINESTYLES", "escape_html", "img_tag"]

#: Okabe-Ito: eight colours told apart with every common colour-vision deficiency (categories).
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")
#: Markers paired with the colours, so a category never rests on its colour alone.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "d")
#: Line styles, for categories beyond the eight colours.
LINESTYLES = ("-", "--", "-.", ":")


def escape_html(s: Any) -> str:
    """`s` as text safe inside HTML, attribute values included (quotes escaped)."""
    return html.escape(str(s), quote=True)


def img_tag(uri: Optional[str], alt: str, cls: str = "fig") -> str:
    """An ``<img>`` of an embedded figure (a ``data:`` URI), or "" when there is no figure (None)."""
    if uri is None:
        return ""
    return f'<img class="{cls}" alt="{escape_html(alt)}" src="{uri}">'


#: The page's style sheet (inline: the report fetches nothing).
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1a1a1a;background:#fff;line-height:1.4}
main{max-width:1200px;margin:0 auto;padding:16px 24px}
h1{font-size:1.5em;margin:0.2em 0}h2{border-bottom:1px solid #ccc;padding-bottom:2px;margin-top:1.6em}
.sub{color:#555;font-size:0.9em}
#headline>*{margin-bottom:12px}
ul.answer{padding-left:1.2em;margin:10px 0;font-size:1.02em}ul.answer li{margin:6px 0}
.figrow{display:flex;gap:12px;flex-wrap:wrap;align-items:flex-start}
img.half{max-width:calc(50% - 6px);min-width:420px;height:auto;flex:1 1 420px;object-fit:contain}
details.fold{border-top:1px solid #e0e0e0;padding:4px 0}details.fold>summary{font-size:1.05em;padding:4px 0}
details.fold[open]>summary{margin-bottom:6px}
.scroll{overflow-x:auto}
.card{border:1px solid #d0d0d0;border-radius:6px;padding:10px 14px;background:#fafafa}
.card h3{margin:0 0 6px 0;font-size:1.05em}
.big{font-size:1.6em;font-weight:600}
.num{font-variant-numeric:tabular-nums}.ci{color:#555;font-size:0.9em}
.surv{white-space:nowrap}.surv.robust{color:#0072B2}.surv.fragile{color:#D55E00}.surv.partial{color:#555}
table{border-collapse:collapse;font-size:0.85em;margin:6px 0}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:right}th{background:#f0f0f0}
td.l,th.l{text-align:left}
img.fig{max-width:100%;height:auto;display:block;margin:8px 0}
img.small{max-width:100%;height:auto}
.note{background:#fff8e1;border-left:4px solid #E69F00;padding:6px 10px;margin:8px 0;font-size:0.9em}
tr.flag td{background:#fdecea}
.warn{background:#fdecea;border-left:4px solid #D55E00;padding:6px 10px;margin:8px 0}
.modeled{background:#e8f1fb;border-left:4px solid #0072B2;padding:4px 8px}
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:0.8em}
details{margin:6px 0}summary{cursor:pointer;font-weight:600}
.v-holds{background:#e3f4ea}.v-not{background:#fbe5e1}.v-part{background:#fff4d6}.v-nc{background:#eeeeee}
.subset{font-size:0.6em;color:#D55E00;font-weight:600}
tr.ceiling td{color:#444;background:#f4f4f4}
"""
