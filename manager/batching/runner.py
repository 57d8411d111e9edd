"""Running jobs through the cache: the backlog grouped by model, and one group's execution (no Celery here).

A bad input fails its job alone. When a forward pass raises, the group is split in halves and each half retried,
down to single jobs; errors of the whole model (a failed load, a server unavailable) fail the group at once.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from swapless.config.errors import (
    BackendUnavailable,
    InputError,
    ModelLoadError,
    PredictionFailed,
    SwaplessError,
    UnknownModel,
)
from swapless.manager.batching.order import Waiting, choose_next
from swapless.manager.cache.lru import ModelManager
from swapless.manager.frameworks.worker import ModelWorker

__all__ = ["Backlog", "Outcome", "WorkItem", "run_group"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkItem:
    """One job as the worker runs it (the producer's handle is ``swapless.Job``).

    ``received_s``: when it was queued (monotonic clock); ``urgent``: interactive; ``expires_at``: the epoch time by
    which it must start, if any; ``trace``: its producer's W3C ``traceparent``, for the queue side's spans.
    """

    id: str
    model_id: str
    input: Any
    received_s: float = field(default_factory=time.monotonic)
    urgent: bool = False
    expires_at: float | None = None
    trace: str | None = None
    #: The variant (an adapter of ``model_id``, ``swapless.manager.frameworks.adapters``) the job addressed, if any.
    variant: str | None = None

    @property
    def served_model(self) -> str:
        """The model that answers the job, as its caller knows it: its variant, else its model."""
        return self.variant or self.model_id


@dataclass(frozen=True)
class Outcome:
    """A job's final state: a result, or an error."""

    job: WorkItem
    result: Any = None
    error: SwaplessError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Backlog:
    """Jobs waiting in this worker, grouped by model, each group in arrival order.

    Args:
        max_wait_s: a job older than this is served next even if its model is cold.
        clock: monotonic clock (injectable for tests).
    """

    def __init__(self, max_wait_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_wait_s = max_wait_s
        self.clock = clock
        self._groups: OrderedDict[str, deque[WorkItem]] = OrderedDict()
        #: Jobs of each model waiting outside this backlog, not fetched yet (in Redis; set by the worker): counted
        #: in each model's work when the next model is chosen, so a model whose jobs come a fetch at a time is
        #: chosen, and kept, for all of its work.
        self.queued: Callable[[], Mapping[str, int]] = dict
        self._deadlines = 0  # jobs added with a deadline (an upper bound of those waiting): none, no scan
        self._urgent = 0  # interactive jobs waiting (the scheduler asks at every wake: no scan)
        self._starved_turn = False  # the last group taken was a starved cold model's (``choose_next``)

    def add(self, jobs: Iterable[WorkItem]) -> None:
        for job in jobs:
            self._groups.setdefault(job.model_id, deque()).append(job)
            if job.expires_at is not None:
                self._deadlines += 1
            self._urgent += job.urgent

    @property
    def urgent(self) -> int:
        """Interactive jobs waiting, over all models."""
        return self._urgent

    def _taken(self, jobs: Iterable[WorkItem]) -> list[WorkItem]:
        """``jobs``, which leave the backlog, as a list (the count of interactive jobs follows)."""
        taken = list(jobs)
        self._urgent -= sum(job.urgent for job in taken)
        return taken

    def __len__(self) -> int:
        return sum(len(group) for group in self._groups.values())

    def counts(self) -> dict[str, int]:
        """Waiting jobs per model."""
        return {model_id: len(group) for model_id, group in self._groups.items()}

    def waiting(self, load_cost_s: Callable[[str], float]) -> list[Waiting]:
        now = self.clock()
        queued = self.queued()
        return [
            Waiting(
                model_id=model_id,
                jobs=len(group) + queued.get(model_id, 0),
                oldest_wait_s=now - min(job.received_s for job in group),
                urgent=sum(1 for job in group if job.urgent),
                load_cost_s=load_cost_s(model_id),
            )
            for model_id, group in self._groups.items()
            if group
        ]

    def peek_next(self, loaded: Sequence[str], load_cost_s: Callable[[str], float], exclude: str) -> str | None:
        """The model ``next_group`` would pick once ``exclude``'s jobs are done (what to load ahead), or None."""
        waiting = [w for w in self.waiting(load_cost_s) if w.model_id != exclude]
        return choose_next(waiting, loaded, self.max_wait_s)

    def coming(self, loaded: Sequence[str], load_cost_s: Callable[[str], float]) -> frozenset[str]:
        """The loaded models worth waiting a moment for: none of their jobs is here but some are on their way
        (``queued``), and the next group would need a load that would evict one of them.
        """
        held, queued = self.counts(), self.queued()
        coming = frozenset(m for m in loaded if not held.get(m) and queued.get(m))
        if not coming:
            return coming
        upcoming = choose_next(self.waiting(load_cost_s), loaded, self.max_wait_s)
        return coming if upcoming is not None and upcoming not in loaded else frozenset()

    def jobs_of(self, model_id: str) -> list[WorkItem]:
        """The jobs of ``model_id`` waiting now, in arrival order (a copy)."""
        return list(self._groups.get(model_id, ()))

    def take_model(self, model_id: str, keep: Callable[[WorkItem], bool] = lambda job: False) -> list[WorkItem]:
        """Take every waiting job of ``model_id`` out of the backlog but those ``keep`` says to keep."""
        group = self._groups.pop(model_id, None)
        if not group:
            return []
        kept = deque(job for job in group if keep(job))
        if kept:
            self._groups[model_id] = kept
        return self._taken(job for job in group if not keep(job))

    def take_expired(self, now: float) -> list[WorkItem]:
        """Take every job whose deadline (``expires_at``, epoch seconds) is before ``now`` out of the backlog."""
        expired: list[WorkItem] = []
        if not self._deadlines:
            return expired
        self._deadlines = 0
        for model_id, group in list(self._groups.items()):
            kept: deque[WorkItem] = deque()
            for job in group:
                if job.expires_at is None:
                    kept.append(job)
                elif job.expires_at < now:
                    expired.append(job)
                else:
                    kept.append(job)
                    self._deadlines += 1
            if len(kept) == len(group):
                continue
            if kept:
                self._groups[model_id] = kept
            else:
                del self._groups[model_id]
        return self._taken(expired)

    def next_group(self, loaded: Sequence[str], load_cost_s: Callable[[str], float], limit: int,
                   loading: Sequence[str] = ()) -> list[WorkItem]:
        """Take the next jobs to run: up to ``limit`` jobs of the model ``choose_next`` picks (urgent ones first;
        ``loading``: the models being loaded ahead now).

        Returns:
            the jobs, all for one model; empty when nothing waits.
        """
        model_id, ordered = self._next(loaded, load_cost_s, loading)
        if model_id is None:
            return []
        oldest = self.clock() - min(job.received_s for job in ordered)
        self._starved_turn = model_id not in loaded and oldest > self.max_wait_s
        taken, rest = ordered[:limit], ordered[limit:]
        if rest:
            self._groups[model_id] = deque(sorted(rest, key=lambda job: job.received_s))
        else:
            del self._groups[model_id]
        return self._taken(taken)

    def peek_group(self, loaded: Sequence[str], load_cost_s: Callable[[str], float], limit: int) -> list[WorkItem]:
        """The jobs ``next_group`` would take now, left in the backlog."""
        return self._next(loaded, load_cost_s)[1][:limit]

    def _next(self, loaded: Sequence[str], load_cost_s: Callable[[str], float],
              loading: Sequence[str] = ()) -> tuple[str | None, list[WorkItem]]:
        waiting = self.waiting(load_cost_s)
        model_id = choose_next(waiting, loaded, self.max_wait_s, starved_first=not self._starved_turn,
                               loading=loading)
        if model_id is None:
            return None, []
        return model_id, sorted(self._groups[model_id], key=lambda job: (not job.urgent, job.received_s))


def _wrap(model_id: str, err: BaseException) -> SwaplessError:
    if isinstance(err, SwaplessError):
        return err
    if type(err).__name__ == "OutOfMemoryError" or isinstance(err, MemoryError):
        return PredictionFailed(model_id, "out of memory even for this input alone")
    return PredictionFailed(model_id, f"{type(err).__name__}: {err}")


def _predict(worker: ModelWorker, items: list[tuple[WorkItem, Any]]) -> list[Outcome]:
    try:
        results = worker.predict([prepared for _, prepared in items])
        if len(results) != len(items):
            raise PredictionFailed(worker.spec.id, f"worker returned {len(results)} outputs for {len(items)} inputs")
    except (BackendUnavailable, ModelLoadError) as err:
        return [Outcome(job, error=err) for job, _ in items]
    except Exception as err:  # noqa: BLE001 - isolate the failing input(s) by splitting
        if len(items) == 1:
            logger.warning("job %s failed on model %s: %s", items[0][0].id, worker.spec.id, err)
            return [Outcome(items[0][0], error=_wrap(worker.spec.id, err))]
        middle = len(items) // 2
        logger.warning("batch of %d on %s failed (%s); retrying in halves", len(items), worker.spec.id, err)
        return _predict(worker, items[:middle]) + _predict(worker, items[middle:])
    return [Outcome(job, result=result) for (job, _), result in zip(items, results, strict=True)]


def run_group(
    manager: ModelManager,
    model_id: str,
    jobs: Sequence[WorkItem],
    waiting: dict[str, int] | None = None,
    on_loaded: Callable[[], None] | None = None,
    before_last_pass: Callable[[], None] | None = None,
) -> list[Outcome]:
    """Run jobs that all address ``model_id``; never raises for a job's sake.

    ``on_loaded`` is called once the model is loaded (the scheduler starts the next load ahead there);
    ``before_last_pass`` as the last forward pass begins (it sends the next group's reads there).

    Returns:
        one Outcome per job, in the order of ``jobs``.
    """
    outcomes: dict[str, Outcome] = {}
    try:
        with manager.use(model_id, waiting, interactive=sum(1 for job in jobs if job.urgent)) as worker:
            if on_loaded is not None:
                on_loaded()
            ready: list[tuple[WorkItem, Any]] = []
            for job in jobs:
                try:
                    variant = manager.store.get(job.variant) if job.variant is not None else None
                    ready.append((job, worker.prepare_for(variant, job.input)))
                except InputError as err:
                    outcomes[job.id] = Outcome(job, error=err)
                except Exception as err:  # noqa: BLE001 - a decoder bug must fail only this job
                    outcomes[job.id] = Outcome(job, error=InputError(model_id, f"{type(err).__name__}: {err}"))
            if ready:
                worker.before_last_pass = before_last_pass
                try:
                    for outcome in _predict(worker, ready):
                        outcomes[outcome.job.id] = outcome
                finally:
                    worker.before_last_pass = None
    except (UnknownModel, ModelLoadError, BackendUnavailable) as err:
        return [Outcome(job, error=err) for job in jobs]
    except SwaplessError as err:
        return [outcomes.get(job.id) or Outcome(job, error=err) for job in jobs]
    return [outcomes[job.id] for job in jobs]
