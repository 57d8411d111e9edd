"""``python -m swapless``: the ``swapless`` command."""

from swapless.tasks.cli.main import main

main()
