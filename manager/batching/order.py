"""Which model's jobs run next: a pure decision over plain data (no Redis, no torch, no clock of its own)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Waiting", "choose_next"]


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


def choose_next(
    waiting: Sequence[Waiting], loaded: Sequence[str], max_wait_s: float, *, starved_first: bool = True,
    loading: Sequence[str] = (),
) -> str | None:
    """The model whose jobs should run next (None when nothing waits). In order of precedence:

    1. models with interactive jobs before models with none;
    2. a model whose oldest job has waited over ``max_wait_s``, a loaded one first, then the oldest (``starved_first``
       False skips this rule once, so a resident model's jobs wait for one load at most);
    3. loaded models, most waiting jobs first;
    4. cold models: interactive, by jobs times the oldest's wait; bulk, by waiting jobs per second of load cost.

    When the pick would be a cold model, a model in ``loading`` (being loaded ahead) goes first: its load is paid.
    See docs/concepts/scheduling.md.
    """
    candidates = [w for w in waiting if w.jobs > 0]
    if not candidates:
        return None
    loaded_set = set(loaded)
    pool = [w for w in candidates if w.urgent > 0] or candidates
    pick = _pick(pool, loaded_set, max_wait_s, starved_first)
    if pick in loaded_set or not loading:
        return pick
    ahead = [w for w in pool if w.model_id in set(loading)]
    return max(ahead, key=lambda w: (w.jobs * w.oldest_wait_s, w.oldest_wait_s)).model_id if ahead else pick


def _pick(pool: Sequence[Waiting], loaded_set: set[str], max_wait_s: float, starved_first: bool) -> str:
    """Rules 2 to 4 of ``choose_next`` over ``pool`` (not empty)."""
    starved = [w for w in pool if w.oldest_wait_s > max_wait_s] if starved_first else []
    if starved:
        return max(starved, key=lambda w: (w.model_id in loaded_set, w.oldest_wait_s)).model_id
    warm = [w for w in pool if w.model_id in loaded_set]
    if warm:
        return max(warm, key=lambda w: (w.jobs, w.oldest_wait_s)).model_id
    if pool[0].urgent > 0:
        return max(pool, key=lambda w: (w.jobs * w.oldest_wait_s, w.oldest_wait_s)).model_id
    return max(pool, key=lambda w: (w.jobs / max(w.load_cost_s, 1e-3), w.oldest_wait_s)).model_id
