"""Sizes with units, and the defaults other modules name."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "DEFAULT_MODELS_FILE", "DEFAULT_REDIS_URL", "parse_bytes", "size_or"]

DEFAULT_MODELS_FILE = Path(__file__).parent.parent / "models.json"
#: Largest forward pass, in inputs, unless a model entry or SWAPLESS_MAX_BATCH_SIZE says otherwise.
DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def parse_bytes(value: str | float) -> int:
    """Bytes of a size such as ``4GiB``, ``512MB``, ``1.5 GiB`` or ``1048576``.

    Raises:
        ValueError: not a number and a known unit.
    """
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return int(value)
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"cannot read {value!r} as a size: write a number and a unit, like 4GiB, 512MiB or 2000000000"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def size_or(value: object, unset: int | None) -> int | None:
    """A size field's value: ``unset`` for None or an empty string."""
    if value is None or value == "":
        return unset
    if isinstance(value, (str, int, float)):
        return parse_bytes(value)
    raise ValueError(f"cannot read {value!r} as a size")
