"""`schedport corpus`: the command line of this stage (typer lives only in schedport.cli)."""

from schedport.workload.corpus import corpus_app  # noqa: F401  (moving here)
