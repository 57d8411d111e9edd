"""Routes: one id that jobs address, over several models. Pure functions over plain data: no Redis, no torch.

A route is a weighted split over versions (with optional shadows that get a copy), or a branch by input type.
The pick is weighted rendezvous hashing of the job's key (BLAKE2b, stable across processes): each target wins
with probability weight / total, a key keeps its target while the weights hold, and a weight change moves only
the share it changes. See docs/guides/models-and-routes.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from swapless.manager.registry.specs import InputType, RouteSpec

__all__ = ["Resolved", "input_type", "pick", "resolve", "shadows_of", "unit_hash"]

_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp")
#: A route may name a route, which may name another: deeper than this is a cycle (rejected at load anyway).
MAX_DEPTH = 16


def unit_hash(*parts: str) -> float:
    """A stable number in the open interval (0, 1) from ``parts``."""
    digest = hashlib.blake2b("\0".join(parts).encode("utf-8"), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2.0**64


def pick(weights: Mapping[str, float], key: str) -> str:
    """The target of ``key`` among ``weights`` (target -> positive weight): weighted rendezvous hashing."""
    best, best_score = "", -1.0
    for target in sorted(weights):
        score = weights[target] / -math.log(unit_hash(target, key))
        if score > best_score:
            best, best_score = target, score
    if not best:
        raise ValueError("a route needs at least one target with a positive weight")
    return best


def shadows_of(shadow: Mapping[str, float], key: str) -> tuple[str, ...]:
    """The shadow targets that also get a copy of ``key``'s job: each with its own percent chance, stable per key."""
    return tuple(target for target in sorted(shadow) if unit_hash("shadow", target, key) * 100.0 < shadow[target])


def input_type(value: object, *, paths: bool = True) -> InputType | None:
    """What an input is: an image (base64, a data URL, or with ``paths`` an image file's path), text, or None."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    if paths and text.lower().endswith(_IMAGE_SUFFIXES) and "\n" not in text and len(text) < 4096:
        return InputType.IMAGE
    if text.startswith("data:image/"):
        return InputType.IMAGE
    if len(text) >= 16 and " " not in text:
        try:
            head = base64.b64decode(text[:64] + "=" * (-len(text[:64]) % 4), validate=True)
        except (binascii.Error, ValueError):
            head = b""
        if head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
            return InputType.IMAGE
    return InputType.TEXT


@dataclass(frozen=True)
class Resolved:
    """Where a job addressed to an id goes.

    Attributes:
        model_id: the model that serves it (a model id or alias as the route names it; canonical when resolved
            through ``ModelStore.route``).
        shadows: models that also get a copy (results kept apart).
        via: the routes it went through, outermost first (empty: it addressed a model).
    """

    model_id: str
    shadows: tuple[str, ...] = ()
    via: tuple[str, ...] = ()


class NoBranch(ValueError):
    """A ``by_type`` route has no branch for this input; ``accepts`` names the types it has."""

    def __init__(self, route_id: str, found: InputType | None, accepts: tuple[str, ...]) -> None:
        super().__init__(route_id, found, accepts)
        self.route_id = route_id
        self.found = found
        self.accepts = accepts


def resolve(
    routes: Mapping[str, RouteSpec],
    target: str,
    value: object,
    key: str,
    overrides: Mapping[str, Mapping[str, float]] | None = None,
    is_route: Callable[[str], bool] | None = None,
    *,
    paths: bool = True,
) -> Resolved:
    """Follow ``target`` through ``routes`` to one model.

    Args:
        routes: route id -> its entry.
        target: what the job addresses (a model id or alias passes through unchanged).
        value: the job's input (``by_type`` routes look at it).
        key: the job's sticky key, else its id.
        overrides: route id -> weights that replace the entry's (``swapless route``).
        is_route: whether an id is a route (default: a key of ``routes``).
        paths: whether an input may be an image file's path (``input_type``); False for network callers.

    Raises:
        NoBranch: a ``by_type`` route has no branch for this input.
    """
    is_route = is_route or routes.__contains__
    via: list[str] = []
    shadows: list[str] = []
    for _ in range(MAX_DEPTH):
        if not is_route(target):
            return Resolved(target, tuple(shadows), tuple(via))
        spec = routes[target]
        via.append(spec.id)
        if spec.by_type is not None:
            found = input_type(value, paths=paths)
            branch = spec.by_type.get(found) if found is not None else None
            if branch is None:
                raise NoBranch(spec.id, found, tuple(t.value for t in spec.by_type))
            target = branch
            continue
        # run-time weights name only this entry's versions (set from a newer models file, they may name others)
        override = {t: w for t, w in ((overrides or {}).get(spec.id) or {}).items() if t in (spec.route or {})}
        weights = override or spec.route or {}
        if spec.shadow:
            shadows.extend(shadows_of(spec.shadow, key))
        target = pick(weights, f"{spec.id}\0{key}")
    raise ValueError(f"route {via[0]!r} goes {MAX_DEPTH} routes deep: a cycle")
