"""``python -m swapless.tasks.cli``: the ``swapless`` command (``python -m swapless`` is the same)."""

from swapless.tasks.cli.main import main

main()
