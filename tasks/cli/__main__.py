"""``python -m tasks.cli``: the ``swapless`` command."""

from tasks.cli.main import main

main()
