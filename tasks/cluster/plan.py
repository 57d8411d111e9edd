"""Placement across workers, as pure functions over plain data: ``plan`` composes four phases (place the cold
models, copy the hot ones, drop idle copies, hand over a share). docs/concepts/several-workers.md gives the rules.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Board", "Demand", "Moves", "PlanWorker", "Take", "copy_hot", "drop_idle_copies", "hand_over", "place_cold", "plan",
]


@dataclass(frozen=True)
class PlanWorker:
    """One live worker as placement sees it.

    Attributes:
        slots: models its cache holds at once.
        idle_s: per model, seconds since it last ran a group of it (absent: never).
        host: models in its host tier (a swap-in away).
        resident: loaded models that served interactive jobs lately.
    """

    worker_id: str
    slots: int
    loaded: frozenset[str] = frozenset()
    idle_s: Mapping[str, float] = field(default_factory=dict)
    host: frozenset[str] = frozenset()
    resident: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Demand:
    """One model's work as placement sees it.

    Attributes:
        queued: messages waiting in its own lists.
        held: jobs fetched by workers, not finished.
        job_s, load_s, host_load_s: estimated seconds per job, per load, per swap-in (None: ``load_s``).
        holders: the workers holding a live claim, by id.
        measured: ``job_s`` was measured on this model: only measured work earns a copy.
    """

    model_id: str
    queued: int = 0
    held: int = 0
    job_s: float = 0.01
    holders: tuple[str, ...] = ()
    load_s: float = 1.0
    host_load_s: float | None = None
    measured: bool = True

    def load_on(self, worker: PlanWorker) -> float:
        """Seconds to bring it onto ``worker``'s device: 0 when loaded, a swap-in from its host tier, else a load."""
        if self.model_id in worker.loaded:
            return 0.0
        if self.model_id in worker.host and self.host_load_s is not None:
            return self.host_load_s
        return self.load_s

    @property
    def waiting(self) -> int:
        """Queued and held."""
        return self.queued + self.held

    def backlog_s(self, copies: int) -> float:
        """Seconds of waiting work per copy."""
        return self.waiting * self.job_s / max(copies, 1)


@dataclass(frozen=True)
class Moves:
    """What one worker should do now: claim (model, most holders, victim to release or None), release, drop."""

    claim: tuple[tuple[str, int, str | None], ...] = ()
    release: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.claim or self.release or self.drop)


@dataclass(frozen=True)
class Take:
    """One claim a phase gives: ``model_id`` to ``worker_id``, releasing ``victim``, at most ``most_holders``."""

    model_id: str
    worker_id: str
    victim: str | None
    most_holders: int


def _tie(model_id: str, worker_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{model_id}\0{worker_id}".encode(), digest_size=8).digest(), "big")


class Board:
    """The claims as the plan goes; each phase works on its own copy."""

    def __init__(self, workers: Sequence[PlanWorker], demand: Mapping[str, Demand]) -> None:
        self.workers = {w.worker_id: w for w in workers}
        self.demand = demand
        self.claims: dict[str, list[str]] = {w.worker_id: [] for w in workers}
        for d in demand.values():
            for holder in d.holders:
                if holder in self.claims:
                    self.claims[holder].append(d.model_id)

    def copy(self) -> Board:
        """The same board with claims of its own."""
        board = copy.copy(self)
        board.claims = {worker_id: list(models) for worker_id, models in self.claims.items()}
        return board

    def free(self, worker_id: str) -> int:
        return self.workers[worker_id].slots - len(self.claims[worker_id])

    def cost_s(self, worker_id: str, model_id: str) -> float:
        """Seconds of work ``model_id`` gives ``worker_id``: its waiting jobs' share, and its load if not loaded."""
        d = self.demand.get(model_id)
        if d is None or d.waiting == 0:
            return 0.0
        return d.backlog_s(max(len(d.holders), 1)) + d.load_on(self.workers[worker_id])

    def busy_s(self, worker_id: str) -> float:
        return sum(self.cost_s(worker_id, model_id) for model_id in self.claims[worker_id])

    def victim(self, worker_id: str) -> tuple[str, float] | None:
        """The claimed model this worker would give up, and its idle seconds (phase 1's victim)."""
        worker = self.workers[worker_id]
        idle = [
            (model_id, worker.idle_s.get(model_id, math.inf))
            for model_id in self.claims[worker_id]
            if model_id not in self.demand or self.demand[model_id].waiting == 0
        ]
        idle = [(m, s) for m, s in idle
                if m not in worker.loaded or (m not in worker.resident
                                              and (m not in self.demand or s >= self.demand[m].load_s))]
        return max(idle, key=lambda item: (item[1], item[0])) if idle else None

    def move(self, take: Take) -> None:
        self.claims[take.worker_id].append(take.model_id)
        if take.victim is not None:
            self.claims[take.worker_id].remove(take.victim)


def _choose(
    board: Board, model_id: str, exclude: Sequence[str], any_worker: bool
) -> tuple[str, str | None, float] | None:
    """``(worker, victim or None, seconds until done with it)``: the worker done soonest with ``model_id``; with
    ``any_worker`` off, only one with a free slot or a victim."""
    d = board.demand.get(model_id)
    options = []
    for worker_id in board.workers:
        if worker_id in exclude:
            continue
        load_s = d.load_on(board.workers[worker_id]) if d is not None else 1.0
        busy, victim, idle = board.busy_s(worker_id), None, math.inf  # a free slot evicts nothing: it wins ties
        if board.free(worker_id) <= 0:
            found = board.victim(worker_id)
            if found is not None:
                victim, idle = found
                busy -= board.cost_s(worker_id, victim)
            elif not any_worker:
                continue
            else:
                busy += d.load_s if d is not None else 1.0  # no room: something it holds will have to come back
        options.append((busy + load_s, -idle, len(board.claims[worker_id]), _tie(model_id, worker_id), worker_id,
                        victim))
    if not options:
        return None
    best = min(options)
    return best[4], best[5], best[0]


def place_cold(board: Board, demand: Sequence[Demand]) -> tuple[Board, list[Take]]:
    """Each model with waiting work and no holder, the longest first, to the worker done soonest with it."""
    board = board.copy()
    takes = []
    # the longest first (its work and its load): the shorter ones then even out the workers' totals
    cold = sorted((d for d in demand if d.waiting > 0 and not d.holders),
                  key=lambda d: (-(d.backlog_s(1) + d.load_s), d.model_id))
    for d in cold:
        chosen = _choose(board, d.model_id, (), any_worker=True)
        if chosen is not None:
            takes.append(Take(d.model_id, chosen[0], chosen[1], 1))
            board.move(takes[-1])
    return board, takes


def _earns_copy(board: Board, d: Demand, copy_backlog_s: float, copies_cap: int) -> float | None:
    """Seconds until ``d``'s least busy holder is done, when ``d`` earns a copy; else None."""
    if len(d.holders) >= copies_cap or not d.measured or d.backlog_s(len(d.holders)) <= copy_backlog_s:
        return None
    holders_s = [board.busy_s(h) for h in d.holders if h in board.claims]
    if not holders_s:
        return None
    finish_s = min(holders_s)
    average_s = sum(board.busy_s(w) for w in board.workers) / len(board.workers)
    if finish_s - average_s <= d.load_s:
        return None  # the holders are not the long pole: a copy's load would cost more than it saves
    return finish_s


def copy_hot(
    board: Board, demand: Sequence[Demand], copy_backlog_s: float, copies_cap: int
) -> tuple[Board, list[Take]]:
    """One more copy of each hot model, on the worker ready for it soonest, if before its holders are done."""
    board = board.copy()
    takes = []
    hot = sorted((d for d in demand if d.holders), key=lambda d: (-d.backlog_s(len(d.holders)), d.model_id))
    for d in hot:
        finish_s = _earns_copy(board, d, copy_backlog_s, copies_cap)
        if finish_s is None:
            continue
        chosen = _choose(board, d.model_id, d.holders, any_worker=True)
        if chosen is not None and chosen[2] < finish_s:
            takes.append(Take(d.model_id, chosen[0], chosen[1], len(d.holders) + 1))
            board.move(takes[-1])
    return board, takes


def drop_idle_copies(me: PlanWorker, demand: Sequence[Demand], copy_idle_s: float) -> list[str]:
    """``me``'s extra copies with no work for ``copy_idle_s`` (the holder first by id keeps the last copy)."""
    return [
        d.model_id for d in demand
        if me.worker_id in d.holders and len(d.holders) > 1 and d.holders[0] != me.worker_id
        and d.waiting == 0 and me.idle_s.get(d.model_id, math.inf) > copy_idle_s
    ]


def hand_over(board: Board, me: str, kept: set[str], by_model: Mapping[str, Demand]) -> list[str]:
    """The claim ``me`` hands over to a worker with room, if any (``kept``: its victims and drops stay)."""
    alone = len(board.workers) == 1
    if not (board.free(me) < 0 or alone):
        return []
    me_view = board.workers[me]
    unloaded = [
        m for m in board.claims[me]
        if m not in me_view.loaded and m not in kept and m in by_model
        and by_model[m].holders == (me,) and (board.free(me) < 0 or _evicted_idle(me_view, by_model[m]))
    ]
    free_elsewhere = any(board.free(w) > 0 for w in board.workers if w != me)
    for m in sorted(unloaded, key=lambda m: (-by_model[m].waiting, m))[:1]:
        if not by_model[m].waiting:
            # nothing to hand over: the claim only keeps a free slot idle, or, alone, it is claimed at its next job
            return [m] if free_elsewhere or alone else []
        mine_first = board.busy_s(me) - board.cost_s(me, m)  # what comes before it here
        there = _choose(board, m, (me,), any_worker=False)
        if there is not None and there[2] < mine_first:
            return [m]
    return []


def plan(
    me: str,
    workers: Sequence[PlanWorker],
    demand: Sequence[Demand],
    *,
    copy_backlog_s: float = 2.0,
    max_copies: int | None = None,
    copy_idle_s: float = 10.0,
) -> Moves:
    """The moves of worker ``me``.

    Args:
        workers: every live worker, ``me`` included.
        demand: every model with waiting work or a holder.
        copy_backlog_s: waiting seconds per copy above which a model gets one more copy.
        max_copies: most holders of one model (None: as many as there are workers).
        copy_idle_s: an extra copy with no work for this long is dropped.

    Returns:
        what ``me`` should claim, release and drop.
    """
    me_view = next((w for w in workers if w.worker_id == me), None)
    if me_view is None:
        return Moves()
    by_model = {d.model_id: d for d in demand}
    board, cold = place_cold(Board(workers, by_model), demand)
    board, copies = copy_hot(board, demand, copy_backlog_s, min(max_copies or len(workers), len(workers)))
    claim = tuple((t.model_id, t.most_holders, t.victim) for t in [*cold, *copies] if t.worker_id == me)
    drop = drop_idle_copies(me_view, demand, copy_idle_s)
    kept = {victim for _, _, victim in claim if victim is not None} | set(drop)
    return Moves(claim, tuple(hand_over(board, me, kept, by_model)), tuple(drop))


def _evicted_idle(view: PlanWorker, d: Demand) -> bool:
    """Whether ``d``'s model ran on ``view``'s worker and has been idle longer than its load, with no work."""
    idle = view.idle_s.get(d.model_id)
    return idle is not None and idle > d.load_s and not (d.waiting or d.held)
