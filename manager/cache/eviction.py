"""Which loaded models to evict to make room for another: a pure decision over plain data."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swapless.manager.cache.entries import LoadedModel

__all__ = ["Cached", "choose_victims", "pool_candidates"]


@dataclass(frozen=True)
class Cached:
    """One loaded model as the eviction policy sees it, in least-recently-used-first order. ``resident``: it served
    interactive jobs recently, or its spec keeps it loaded (``ModelManager.resident``)."""

    model_id: str
    size_bytes: int
    pinned: bool = False
    remote: bool = False
    resident: bool = False


def choose_victims(
    cached: Sequence[Cached],
    *,
    incoming_bytes: int,
    max_models: int,
    memory_budget_bytes: int | None,
    keep: Mapping[str, int] | None = None,
) -> list[str] | None:
    """Least-recently-used models to evict so that one more model of ``incoming_bytes`` fits.

    Pinned models are never chosen. The others go in LRU order within each step: models with no waiting jobs
    (``keep``: waiting jobs per model), then models with work, then resident models, those with no waiting jobs first.

    Returns:
        the ids to evict (possibly empty), or None when even evicting every unpinned model is not enough.
    """
    waiting = keep or {}
    count = len(cached)
    used = sum(c.size_bytes for c in cached)

    def fits(count: int, used: int) -> bool:
        if count + 1 > max_models:
            return False
        return memory_budget_bytes is None or used + incoming_bytes <= memory_budget_bytes

    if fits(count, used):
        return []
    evictable = [c for c in cached if not c.pinned]
    evictable.sort(key=lambda c: (c.resident, waiting.get(c.model_id, 0) > 0))  # stable: LRU order kept
    victims = []
    for entry in evictable:
        victims.append(entry.model_id)
        count -= 1
        used -= entry.size_bytes
        if fits(count, used):
            return victims
    return None


def pool_candidates(
    pool: Sequence[LoadedModel],
    reserved: Mapping[str, int],
    waiting: Mapping[str, int],
    resident: Callable[[LoadedModel], bool],
    *,
    remote: bool,
    ahead: bool,
) -> list[Cached]:
    """A pool's entries (LRU first), then its loads in progress (``reserved``: bytes per model), as ``Cached``.

    Loads in progress hold their room. For a load ahead (``ahead``), a model in use, with waiting work or resident
    is pinned: it is never evicted for a load that may not be needed.
    """
    if ahead:
        cached = [
            Cached(e.model_id, e.size_bytes, e.pins > 0 or waiting.get(e.model_id, 0) > 0 or resident(e), e.remote)
            for e in pool
        ]
    else:
        cached = [Cached(e.model_id, e.size_bytes, e.pins > 0, e.remote, resident(e)) for e in pool]
    return cached + [Cached(f"\0{m}", size, True, remote) for m, size in reserved.items()]
