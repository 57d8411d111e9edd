"""How a group's jobs run, given how often each was in flight when its worker died: a pure decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from swapless.manager import Job

__all__ = ["AttemptPlan", "plan_attempts"]


@dataclass(frozen=True)
class AttemptPlan:
    """A group's jobs by how they run: ``poison`` not at all, ``together`` in one batch, ``alone`` one by one,
    ``fresh`` (never started before) as the group's ordinary slices."""

    poison: list[Job]
    together: list[Job]
    alone: list[Job]
    fresh: list[Job]


def plan_attempts(jobs: Sequence[Job], attempts: Mapping[str, int], max_attempts: int) -> AttemptPlan:
    """Split ``jobs`` by their attempts started before (job id -> count; absent: never started)."""
    poison = [job for job in jobs if attempts.get(job.id, 0) >= max_attempts]
    again = [job for job in jobs if 0 < attempts.get(job.id, 0) < max_attempts]
    together = [job for job in again if attempts[job.id] == 1 and max_attempts > 2]
    alone = [job for job in again if job not in together]
    fresh = [job for job in jobs if job.id not in attempts]
    return AttemptPlan(poison, together, alone, fresh)
