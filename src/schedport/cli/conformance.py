"""`schedport conformance`: the command line of this stage (typer lives only in schedport.cli)."""

from schedport.realengine.conformance import conformance_command  # noqa: F401  (moving here)
