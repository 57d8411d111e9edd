"""Placement across workers: which worker holds which model, as a pure function over plain data.

Several workers on one Redis act as one model cache: each model's jobs are fetched only by the workers that hold
a claim on it (``swapless.tasks.worker.placement`` reads the cluster and carries out the moves; the claims are atomic in
Redis, so two workers that reach different conclusions from slightly different views still cannot both take a
cold model). Every worker runs the same ``plan`` over the same reading and carries out only its own moves; ties
are broken by a hash of (model, worker), so that the workers agree without talking to each other.

The rules, in order:

1. **Cold models** (waiting work, no holder), the most seconds of work (with the load) first, each to one worker:
   the one that would be done soonest with it, counting in seconds the work it holds already (waiting jobs times their
   cost, plus the load of each claimed model it has not loaded) and this model's load. A worker with a free slot, or an
   eviction victim (a claimed model with no waiting work that, if loaded there, is idle at least as long as its load
   and not resident: it served no interactive jobs lately; it releases it), takes it as it is; one with neither
   pays a reload on top (it will swap models in its own cache, as one worker alone does). Ties go to a free slot,
   then to the victim idle longest, then to fewer claims.
2. **Hot models** get one more copy per plan when their waiting work per copy, on a measured cost per job (not one
   guessed from other models: a model's first group measures it within a pass), passes ``copy_backlog_s`` and
   their holders are the long pole: even the least busy holder would finish more than one load of the model after
   the cluster's average worker. The copy goes to the worker that would be ready for it soonest (rule 1's choice,
   a reload counted where it has no room), and only if it would be ready before the holders are done. A copy
   fetches from the model's shared lists, so the work splits by who is free, not in equal shares.
3. **Idle copies** are dropped: a worker holding a copy of a model that has had no work for ``copy_idle_s``, with
   another copy elsewhere, releases it; the holder first by id keeps the last copy, so the model stays warm until
   its slot is needed.
4. **Joining and idle workers** take a share: a worker holding more models than it has slots hands over one it alone
   holds and has not loaded nor begun loading, one per plan: one with waiting work when another worker with a free slot
   or an idle victim would be done with it sooner than it would get to it (the model turns cold and rule 1 places it
   there; its waiting jobs go back to its lists), one with none whenever another worker has a free slot (the claim would
   only make this worker swap it in later while that slot stays empty) or none is live but it (it claims the model again
   at its next job). A worker alone releases such a claim with a slot to spare too, once the model has been idle there
   longer than its load with no jobs waiting or held: evicted, not on its way in (its slots hold other models; it loads
   this one again at its next job either way).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Demand", "Moves", "WorkerView", "plan"]


@dataclass(frozen=True)
class WorkerView:
    """One live worker as placement sees it.

    Attributes:
        worker_id: its id (``hostname:pid``).
        slots: models its cache holds at once (``max_models``).
        loaded: models loaded in its cache now.
        idle_s: per model, seconds since it last ran a group of it (absent: never).
        host: models in its host tier now: a swap-in away (``Demand.host_load_s``), not a load.
        resident: loaded models that served interactive jobs lately (``SWAPLESS_KEEP_INTERACTIVE_S``): its cache
            keeps them, and so does placement.
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
        model_id: the model.
        queued: jobs waiting in Redis (in the model's lists).
        held: jobs fetched by workers and not yet finished.
        job_s: estimated seconds of work per job.
        load_s: estimated seconds to load it from disk.
        host_load_s: estimated seconds to swap it in on a worker that holds it in its host tier (None: ``load_s``).
        holders: the workers that hold a live claim on it, by id (every reader sees the same order).
        measured: whether ``job_s`` was measured on this model (run by a worker, or timed by a warm start) rather
            than guessed from other models: only measured work earns a copy.
    """

    model_id: str
    queued: int = 0
    held: int = 0
    job_s: float = 0.01
    holders: tuple[str, ...] = ()
    load_s: float = 1.0
    host_load_s: float | None = None
    measured: bool = True

    def load_on(self, worker: WorkerView) -> float:
        """Seconds to bring it onto ``worker``'s device: 0 when loaded there, a swap-in from its host tier, else a
        load from disk."""
        if self.model_id in worker.loaded:
            return 0.0
        if self.model_id in worker.host and self.host_load_s is not None:
            return self.host_load_s
        return self.load_s

    @property
    def waiting(self) -> int:
        return self.queued + self.held

    def backlog_s(self, copies: int) -> float:
        """Seconds of waiting work per copy."""
        return self.waiting * self.job_s / max(copies, 1)


@dataclass(frozen=True)
class Moves:
    """What one worker should do now: claim these models (each with the most holders the claim may make, and the
    victim to release once the claim is made, if any), release these claims (the model goes to another worker), and
    drop these extra copies (unless the copy turns out to be the last one: Redis checks that atomically)."""

    claim: tuple[tuple[str, int, str | None], ...] = ()
    release: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.claim or self.release or self.drop)


def _tie(model_id: str, worker_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{model_id}\0{worker_id}".encode(), digest_size=8).digest(), "big")


class _Board:
    """The claims as the plan goes (the plan moves models between workers on it)."""

    def __init__(self, workers: Sequence[WorkerView], demand: Mapping[str, Demand]) -> None:
        self.workers = {w.worker_id: w for w in workers}
        self.demand = demand
        self.claims: dict[str, list[str]] = {w.worker_id: [] for w in workers}
        for d in demand.values():
            for holder in d.holders:
                if holder in self.claims:
                    self.claims[holder].append(d.model_id)

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
        """The claimed model this worker would give up: no waiting work, idle longest, and, when it is loaded here,
        idle at least as long as its load takes and not resident. One loaded and in use between sparse jobs
        (interactive traffic's) is no victim: it would come back elsewhere at a load's price, its caller waiting; and
        a worker alone that gave it up would claim it again at its next job, giving up another, at every job: in the
        meantime the model has no holder, and a worker that joins takes it, cold."""
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

    def move(self, model_id: str, to: str, release: str | None) -> None:
        self.claims[to].append(model_id)
        if release is not None:
            self.claims[to].remove(release)


def _choose(
    board: _Board, model_id: str, exclude: Sequence[str], any_worker: bool
) -> tuple[str, str | None, float] | None:
    """``(worker, victim it releases or None, seconds until it would be done with the model)`` to take
    ``model_id``, by rules 1 and 2 (see the module): the worker done soonest with it. With ``any_worker`` off, only
    a worker with a free slot or a victim may take it."""
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


def plan(
    me: str,
    workers: Sequence[WorkerView],
    demand: Sequence[Demand],
    *,
    copy_backlog_s: float = 2.0,
    max_copies: int | None = None,
    copy_idle_s: float = 10.0,
) -> Moves:
    """The moves of worker ``me`` (see the module docstring for the rules).

    Args:
        me: the worker planning.
        workers: every live worker, ``me`` included.
        demand: every model with waiting work or a holder.
        copy_backlog_s: seconds of waiting work per copy above which a model gets one more copy.
        max_copies: most holders of one model (None: as many as there are workers).
        copy_idle_s: an extra copy of a model with no work for this long is dropped.

    Returns:
        the claims ``me`` should make (with the most holders each claim may make, enforced atomically in Redis)
        and the claims it should release.
    """
    if not any(w.worker_id == me for w in workers):
        return Moves()
    by_model = {d.model_id: d for d in demand}
    board = _Board(workers, by_model)
    copies_cap = min(max_copies or len(workers), len(workers))
    claim: list[tuple[str, int, str | None]] = []
    release: list[str] = []
    drop: list[str] = []

    def take(model_id: str, worker_id: str, victim: str | None, most_holders: int) -> None:
        board.move(model_id, worker_id, victim)
        if worker_id == me:
            claim.append((model_id, most_holders, victim))

    # the longest first (its work and its load): the shorter ones then even out the workers' totals
    cold = sorted((d for d in demand if d.waiting > 0 and not d.holders),
                  key=lambda d: (-(d.backlog_s(1) + d.load_s), d.model_id))
    for d in cold:
        chosen = _choose(board, d.model_id, (), any_worker=True)
        if chosen is not None:
            take(d.model_id, chosen[0], chosen[1], 1)

    hot = sorted((d for d in demand if d.holders), key=lambda d: (-d.backlog_s(len(d.holders)), d.model_id))
    for d in hot:
        if len(d.holders) >= copies_cap or not d.measured or d.backlog_s(len(d.holders)) <= copy_backlog_s:
            continue
        holders_s = [board.busy_s(h) for h in d.holders if h in board.claims]
        if not holders_s:
            continue
        finish_s = min(holders_s)
        average_s = sum(board.busy_s(w) for w in board.workers) / len(board.workers)
        if finish_s - average_s <= d.load_s:
            continue  # the holders are not the long pole: a copy's load would cost more than it saves
        chosen = _choose(board, d.model_id, d.holders, any_worker=True)
        if chosen is not None and chosen[2] < finish_s:
            take(d.model_id, chosen[0], chosen[1], len(d.holders) + 1)

    mine = [d for d in demand if me in d.holders]
    idle_s = next(w.idle_s for w in workers if w.worker_id == me)
    for d in mine:
        extra = len(d.holders) > 1 and d.holders[0] != me  # the holder first by id keeps the last copy
        if extra and d.waiting == 0 and idle_s.get(d.model_id, math.inf) > copy_idle_s:
            drop.append(d.model_id)

    alone = len(board.workers) == 1
    if board.free(me) < 0 or alone:
        me_view = board.workers[me]
        taken = {victim for _, _, victim in claim}
        unloaded = [
            m for m in board.claims[me]
            if m not in me_view.loaded and m not in taken and m not in drop and m in by_model
            and by_model[m].holders == (me,) and (board.free(me) < 0 or _evicted_idle(me_view, by_model[m]))
        ]
        free_elsewhere = any(board.free(w) > 0 for w in board.workers if w != me)
        for m in sorted(unloaded, key=lambda m: (-by_model[m].waiting, m))[:1]:
            if not by_model[m].waiting:
                if free_elsewhere or alone:  # nothing to hand over: the claim only keeps a free slot idle, or, alone,
                    release.append(m)  # it is claimed again at its next job
                continue
            mine_first = board.busy_s(me) - board.cost_s(me, m)  # what comes before it here
            there = _choose(board, m, (me,), any_worker=False)
            if there is not None and there[2] < mine_first:
                release.append(m)

    return Moves(tuple(claim), tuple(release), tuple(drop))


def _evicted_idle(view: WorkerView, d: Demand) -> bool:
    """Whether ``d``'s model ran on ``view``'s worker and has been idle there longer than its load, with no jobs
    waiting or held: evicted a while ago, not on its way in (a model being loaded for jobs in hand is not loaded
    yet either, but it ran just now or never)."""
    idle = view.idle_s.get(d.model_id)
    return idle is not None and idle > d.load_s and not (d.waiting or d.held)
