"""User-facing errors: one line that names what is wrong and where.

Every error a user can cause (bad file, bad config, unknown name) is raised as a
`SchedportError`; the CLI prints its message on one line and exits non-zero.
Anything else escaping is a bug in schedport, not in the user's input.
"""

from __future__ import annotations


class SchedportError(Exception):
    """An error caused by the user's input, with a one-line message."""

    exit_code = 2


class TraceError(SchedportError):
    """A trace file or table that cannot be used as given."""


class ConfigError(SchedportError):
    """An engine or scheduler configuration that is unknown or impossible."""


class DataError(SchedportError):
    """A public data file that is missing, corrupt, or not in its documented format."""
