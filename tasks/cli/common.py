"""What the ``swapless`` commands share: the error line, the ``--models`` option, settings from flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from config.settings import Settings, load_settings

__all__ = ["ModelsOption", "console", "err_console", "fail", "print_error", "settings_with"]

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

ModelsOption = Annotated[
    Path | None, typer.Option("--models", help="models file (default: SWAPLESS_MODELS_FILE, else config/models.json)")
]


def print_error(err: BaseException | str) -> None:
    """One line on stderr: ``error: <message>``. The message is printed as it is (brackets included)."""
    err_console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False)


def fail(err: BaseException | str, code: int = 2) -> NoReturn:
    """Print ``err`` as one error line and exit with ``code``."""
    print_error(err)
    raise typer.Exit(code)


def settings_with(**flags: Any) -> Settings:
    """The environment's settings with a command's flags on top (by setting name; None: not given); the command
    hands them to everything it runs.

    Raises:
        ConfigError: a variable or a flag is invalid (``main`` prints it as one line).
    """
    return load_settings(**flags)
