"""How values and sizes are named in messages."""

from __future__ import annotations

from typing import Any

__all__ = ["format_bytes", "kind"]

_KINDS: dict[type, str] = {
    dict: "an object",
    list: "a list",
    tuple: "a list",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    bytes: "bytes",
}


def kind(value: Any) -> str:
    """What a JSON value is, for a message: ``null``, ``a string``, ``an object``, ..."""
    if value is None:
        return "null"
    return _KINDS.get(type(value), type(value).__name__)


def format_bytes(n: int | None) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 KiB``, ``3.2 GiB``; ``-`` for None."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover - the loop always returns
