"""`schedport study`: the command line of this stage (typer lives only in schedport.cli)."""

from schedport.study.sweep import run_command  # noqa: F401  (moving here)
