"""Followups: what is done between a job's result store and its ack (Celery's canvas, webhooks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from celery import states

from swapless.config.errors import SwaplessError
from swapless.tasks.broker.results import ResultStore, StoredResult
from swapless.tasks.worker.canvas import Canvas
from swapless.tasks.worker.webhooks import WebhookIntake

__all__ = ["Followups"]


class Followups:
    """The canvas and the webhooks of finished jobs.

    Args:
        canvas: sends Celery follow-ups (None: a worker that does not).
        webhooks: queues webhook deliveries (None: a worker that does not).
    """

    def __init__(self, canvas: Canvas | None, webhooks: WebhookIntake | None) -> None:
        self.canvas = canvas
        self.webhooks = webhooks

    def stored(
        self,
        store: ResultStore,
        items: Sequence[tuple[Any, Any, SwaplessError | None]],
        models: Mapping[str, str] | None = None,
    ) -> None:
        """After ``items`` (``(request, result, error)``) were stored, before they are acked."""
        if self.webhooks is not None:
            self.webhooks.enqueue(items, models or {})
        if self.canvas is not None:
            self.canvas.fire(store, items)

    def found(self, store: ResultStore, requests: Sequence[Any], results: Sequence[StoredResult]) -> None:
        """Before acking redelivered ``requests`` whose final ``results`` were found stored (their worker may have
        died before it sent their follow-ups)."""
        by_id = {found.job_id: found for found in results}
        items: list[tuple[Any, Any, Any]] = []
        models: dict[str, str] = {}
        for request in requests:
            found = by_id.get(request.id)
            if found is None or not found.ready:
                continue
            failed = found.state != states.SUCCESS
            items.append((request, None if failed else found.value, found.value if failed else None))
            if found.model is not None:
                models[request.id] = found.model
        if items:
            self.stored(store, items, models)
