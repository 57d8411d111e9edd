"""What the ``swapless`` commands share: the error line, the ``--models`` option, settings from flags."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from swapless.config.settings import Settings, load_settings, unknown_variables

__all__ = ["ModelsOption", "columns", "console", "err_console", "fail", "print_error", "routes_table", "settings_with"]

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


def columns(headers: Sequence[str], rows: Iterable[Sequence[str]], width: int | None = None) -> str:
    """Rows as aligned columns under an upper-case header, like ``kubectl get``.

    ``width``: the terminal's width, the last column cut to fit; None: nothing cut. Empty columns are left out.
    """
    table = [tuple(headers), *(tuple(str(cell) for cell in row) for row in rows)]
    shown = [i for i in range(len(headers)) if any(row[i] for row in table[1:])] or list(range(len(headers)))
    table = [tuple(row[i].upper() if n == 0 else row[i] for i in shown) for n, row in enumerate(table)]
    widths = [max(len(row[i]) for row in table) for i in range(len(shown) - 1)]
    lead = sum(widths) + 2 * len(widths)
    lines = []
    for row in table:
        line = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + ("  " if widths else "")
        last = row[-1]
        if width is not None and lead + len(last) > width:
            room = max(width - lead, 16)
            last = last[: room - 1] + "…" if len(last) > room else last
        lines.append((line + last).rstrip())
    return "\n".join(lines) + "\n"


def settings_with(**flags: Any) -> Settings:
    """The environment's settings with a command's flags on top (None: not given).

    Raises:
        ConfigError: a variable or a flag is invalid.
    """
    settings = load_settings(**flags)
    unknown = unknown_variables()
    if unknown:
        err_console.print(f"[yellow]warning:[/] ignoring {escape(', '.join(unknown))}: no such setting (the "
                          "settings are listed in config/settings/)", highlight=False)
    return settings


def routes_table(store: Any, settings: Settings) -> Table:
    """Each route with its split now and its shadows' agreement; without Redis, the file's weights."""
    overrides: dict[str, dict[str, float]] = {}
    agreement: dict[tuple[str, str, str], tuple[int, int]] = {}
    if settings.redis.redis_url is not None:
        from swapless.tasks.broker.connection import redis_client
        from swapless.tasks.broker.sentinel import SentinelOptions
        from swapless.tasks.keyspace import Keyspace
        from swapless.tasks.routing import RouteOverrides, read_shadow

        try:
            client = redis_client(settings.redis.broker_url, connect_timeout_s=settings.redis.connect_timeout_s,
                                  sentinel=SentinelOptions.of(settings))
            overrides = RouteOverrides(client, Keyspace.of(settings)).get()
            agreement = read_shadow(client, Keyspace.of(settings))
        except Exception as err:  # noqa: BLE001 - the file's routes are still worth showing
            print_error(f"cannot read the run-time route weights ({err}); showing the models file's")
    table = Table(title=f"{len(store.routes)} routes")
    for column in ("id", "kind", "split now", "shadow", "shadow agreement"):
        table.add_column(column, overflow="fold")
    for route in store.routes.values():
        if route.by_type is not None:
            branches = ", ".join(f"{t.value} -> {target}" for t, target in route.by_type.items())
            table.add_row(route.id, "by type", branches, "-", "-")
            continue
        weights = overrides.get(route.id) or route.route or {}
        total = sum(weights.values())
        split = ", ".join(f"{target} {100 * w / total:.1f} %" for target, w in weights.items())
        if route.id in overrides:
            split += " (run-time)"
        shadow = ", ".join(f"{target} {share:g} %" for target, share in (route.shadow or {}).items()) or "-"
        agreed = [f"{served} vs {shadow_model}: {a}/{n} ({100 * a / n:.1f} %)"
                  for (r, served, shadow_model), (a, n) in sorted(agreement.items()) if r == route.id and n]
        table.add_row(route.id, "split", split, shadow, "; ".join(agreed) or "-")
    return table
