"""Pure scheduling and eviction policy over plain data: no Redis, no torch, no clock of its own.

Two decisions live here:

- ``choose_next``: which model's jobs run next, given what waits and what is loaded;
- ``choose_victims``: which loaded models to evict to make room for another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Cached", "Waiting", "choose_next", "choose_victims"]


@dataclass(frozen=True)
class Waiting:
    """What waits for one model.

    Attributes:
        model_id: the model.
        jobs: how many jobs wait for it.
        oldest_wait_s: how long its oldest job has waited.
        urgent: how many of them are interactive (priority) jobs.
        load_cost_s: expected seconds to load it (0 when loaded; an estimate from past loads otherwise).
    """

    model_id: str
    jobs: int
    oldest_wait_s: float = 0.0
    urgent: int = 0
    load_cost_s: float = 1.0


@dataclass(frozen=True)
class Cached:
    """One loaded model as the eviction policy sees it, in least-recently-used-first order."""

    model_id: str
    size_bytes: int
    pinned: bool = False
    remote: bool = False


def choose_next(waiting: Sequence[Waiting], loaded: Sequence[str], max_wait_s: float) -> str | None:
    """The model whose jobs should run next.

    Order of precedence:
      1. a model whose oldest job has waited longer than ``max_wait_s`` (no starvation), oldest first;
      2. models with interactive jobs, loaded ones first;
      3. loaded models (no load needed), the one with most waiting jobs first;
      4. cold models, by most waiting jobs per second of load cost.

    Returns:
        the model id, or None when nothing waits.
    """
    candidates = [w for w in waiting if w.jobs > 0]
    if not candidates:
        return None
    starved = [w for w in candidates if w.oldest_wait_s > max_wait_s]
    if starved:
        return max(starved, key=lambda w: w.oldest_wait_s).model_id
    loaded_set = set(loaded)
    urgent = [w for w in candidates if w.urgent > 0]
    pool = urgent or candidates
    warm = [w for w in pool if w.model_id in loaded_set]
    if warm:
        return max(warm, key=lambda w: (w.jobs, w.oldest_wait_s)).model_id
    return max(pool, key=lambda w: (w.jobs / max(w.load_cost_s, 1e-3), w.oldest_wait_s)).model_id


def choose_victims(
    cached: Sequence[Cached],
    *,
    incoming_bytes: int,
    max_models: int,
    memory_budget_bytes: int | None,
    keep: Mapping[str, int] | None = None,
) -> list[str] | None:
    """Least-recently-used models to evict so that one more model of ``incoming_bytes`` fits.

    Pinned models (a batch in flight) are never chosen. Among the others, models with no waiting jobs
    (``keep`` maps model id to waiting jobs) go before models that still have work, each in LRU order.

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
    evictable.sort(key=lambda c: 1 if waiting.get(c.model_id, 0) > 0 else 0)  # stable: LRU order kept
    victims = []
    for entry in evictable:
        victims.append(entry.model_id)
        count -= 1
        used -= entry.size_bytes
        if fits(count, used):
            return victims
    return None
