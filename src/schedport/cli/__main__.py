"""``python -m schedport.cli``: the same as the ``schedport`` command."""

from schedport.cli import main

main()
