"""`schedport explain`: the command line of this stage (typer lives only in schedport.cli)."""

from schedport.analysis.explain import explain_command  # noqa: F401  (moving here)
