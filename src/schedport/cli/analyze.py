"""`schedport analyze`: the command line of this stage (typer lives only in schedport.cli)."""

from schedport.analysis.portability import analyze_command  # noqa: F401  (moving here)
