"""The ``swapless`` command line (typer); ``python -m swapless`` runs it as the ``swapless`` script does."""
