"""Routes: one id that jobs address, over several models. Pure functions over plain data: no Redis, no torch.

A route entry of ``models.json`` is one of

- a **split** over versions, ``{"id": "sentiment", "route": {"sentiment-v1": 90, "sentiment-v2": 10}}``: a job goes
  to one target with probability weight / total weight. Optional ``"shadow": {"sentiment-v3": 5}`` also runs a copy
  of 5 % of the jobs on ``sentiment-v3``, whose result is kept apart and compared with the served one;
- a **branch by input type**, ``{"id": "classify", "by_type": {"text": "sentiment", "image": "vision"}}``: the
  target is the branch of the input's type (``input_type``); a branch may name a route.

The pick is **weighted rendezvous hashing** of the job's key (its sticky key, else its id): each target scores
``weight / -ln(u)`` with ``u`` a stable hash of (target, key) in (0, 1), and the highest score wins. Every target
wins with probability weight / total, the same key always picks the same target while the weights hold (the
hash is BLAKE2b: stable across processes, hosts and restarts, unlike Python's ``hash``), and when one target's
weight grows, only keys moving *to* it change target (and when it shrinks, only keys leaving it): the moved share
and nothing else.
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
    """What an input is: an image (a base64 string or data URL of an encoded image, or, with ``paths``, a path to an
    image file), text (any other non-empty string), or None (not a string). Inputs from the network are typed with
    ``paths=False``: no remote caller may have a worker open a file, so ``secret.png`` is text there."""
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
