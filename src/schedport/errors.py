"""User-facing errors: one line that names what is wrong and where.

Every error a user can cause (bad file, bad config, unknown name) is raised as a
`SchedportError`; the CLI prints its message on one line and exits non-zero.
Anything else escaping is a bug in schedport, not in the user's input.
"""

from __future__ import annotations

import json
import os
from typing import Any


class SchedportError(Exception):
    """An error caused by the user's input, with a one-line message."""

    exit_code = 2


class TraceError(SchedportError):
    """A trace file or table that cannot be used as given."""


class ConfigError(SchedportError):
    """An engine or scheduler configuration that is unknown or impossible."""


class DataError(SchedportError):
    """A public data file that is missing, corrupt, or not in its documented format."""


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON document in `path`; an unreadable file or invalid JSON is a one-line
    `SchedportError` naming the file and the cause (the parser's message, on one line)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SchedportError(f"{path}: cannot be read ({e.strerror or e})") from None
    except ValueError as e:                 # not UTF-8
        raise SchedportError(f"{path}: not valid JSON ({' '.join(str(e).split())})") from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise SchedportError(f"{path}: not valid JSON ({' '.join(str(e).split())})") from None
