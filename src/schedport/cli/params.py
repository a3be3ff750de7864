"""Option parsers shared by the command modules (kept free of imports of those modules, so
each of them can import from here)."""

from __future__ import annotations

from pathlib import Path

import typer

from schedport.common.outputs import parse_out_path
from schedport.errors import SchedportError


def out_path_parser(value) -> Path:
    """Typer parser of an output path option: `schedport.common.outputs.parse_out_path`, its
    refusal of an empty name reported as a usage error (`typer.BadParameter`, same message)."""
    try:
        return parse_out_path(value)
    except SchedportError as e:
        raise typer.BadParameter(str(e)) from None
