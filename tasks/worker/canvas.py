"""Celery's canvas for Swapless's jobs: ``link``, ``link_error``, chains and chords, done as Celery does them.

``fire`` runs between a result's store and its ack; follow-ups are sent at least once (docs/guides/scripts.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery, group, signature, states
from celery.app.task import Context
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from swapless.config.errors import SwaplessError
from swapless.tasks.broker.kombu_private import request_payload
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.protocol import CHUNK_TASK, PREDICT_TASK

__all__ = ["CANVAS_FIELDS", "Canvas", "embed_of"]

logger = logging.getLogger(__name__)

#: The fields of a protocol-2 message's embed (``[args, kwargs, embed]``) that ask for follow-ups.
CANVAS_FIELDS = ("callbacks", "errbacks", "chain", "chord")
_OWN_TASKS = frozenset((PREDICT_TASK, CHUNK_TASK))
_ROUTING_OPTIONS = ("queue", "routing_key", "exchange")


def embed_of(request: Any) -> dict[str, Any] | None:
    """The embed of a request's message when it asks for follow-ups, else None.

    Args:
        request: the intake's ``LeanRequest`` (its ``embed``) or Celery's ``Request`` (its ``_payload``).
    """
    embed = getattr(request, "embed", None)
    if embed is None:
        payload = request_payload(request)
        if isinstance(payload, (list, tuple)) and len(payload) == 3:
            embed = payload[2]
    if isinstance(embed, dict) and any(embed.get(field) for field in CANVAS_FIELDS):
        return embed
    return None


class Canvas:
    """Sends the follow-ups of finished jobs.

    Args:
        app: the worker's Celery app (its producer pool sends the follow-ups, its result backend holds the chord
            counters).
        default_queue: the queue of follow-up tasks other than Swapless's that name none.
    """

    def __init__(self, app: Celery, default_queue: str) -> None:
        self.app = app
        self.default_queue = default_queue

    def fire(self, store: ResultStore, items: Sequence[tuple[Any, Any, BaseException | None]]) -> int:
        """Send the follow-ups of each ``(request, result, error)``; returns how many jobs had some.

        Raises:
            RedisError, OperationalError: the jobs stay unacked and their follow-ups are sent again on retry.
        """
        fired = 0
        for request, result, error in items:
            embed = embed_of(request)
            if embed is None:
                continue
            fired += 1
            try:
                if error is None:
                    self._succeeded(request, embed, result)
                else:
                    self._failed(store, request, embed, error)
            except (RedisError, OperationalError):
                raise
            except Exception:  # a malformed signature fails its own follow-ups, never the batch
                logger.exception("could not send the follow-ups of job %s", request.id)
        return fired

    # -- success -------------------------------------------------------------------------------------------------

    def _succeeded(self, request: Any, embed: Mapping[str, Any], retval: Any) -> None:
        options = self._options(request)
        callbacks = [self._routed(signature(cb, app=self.app)) for cb in embed.get("callbacks") or ()]
        if len(callbacks) == 1:
            callbacks[0].apply_async((retval,), **options)
        elif callbacks:
            groups = [cb for cb in callbacks if isinstance(cb, group)]
            for g in groups:
                g.apply_async((retval,), **options)
            plain = [cb for cb in callbacks if not isinstance(cb, group)]
            if plain:
                group(plain, app=self.app).apply_async((retval,), **options)
        chain = embed.get("chain")
        if chain:
            step = self._routed(signature(chain[-1], app=self.app))
            step.apply_async((retval,), chain=chain[:-1], **options)
        if embed.get("chord"):
            self.app.backend.on_chord_part_return(self._context(request, embed), states.SUCCESS, retval)

    # -- failure -------------------------------------------------------------------------------------------------

    def _failed(self, store: ResultStore, request: Any, embed: Mapping[str, Any], error: BaseException) -> None:
        if embed.get("chord"):
            self.app.backend.on_chord_part_return(self._context(request, embed), states.FAILURE, error)
        steps = []
        for step in embed.get("chain") or ():  # as Celery's mark_as_failure: the chain's later steps fail too
            ctx = Context(step)
            ctx.update(ctx.options)
            ctx.id = ctx.options.get("task_id")
            ctx.group = ctx.options.get("group_id")
            if ctx.id is not None:
                steps.append(ctx.id)
            if "chord" in ctx.options:
                self.app.backend.on_chord_part_return(ctx, states.FAILURE, error)
        if steps:
            failure = error if isinstance(error, SwaplessError) else None
            if failure is not None:
                store.store([(step_id, None, failure) for step_id in steps])
        errbacks = [self._routed(signature(eb, app=self.app)) for eb in embed.get("errbacks") or ()]
        if errbacks:
            root_id = self._headers(request).get("root_id") or request.id
            group(errbacks, app=self.app).apply_async((request.id,), parent_id=request.id, root_id=root_id)

    # -- helpers -------------------------------------------------------------------------------------------------

    @staticmethod
    def _headers(request: Any) -> dict[str, Any]:
        return getattr(request, "request_dict", None) or {}

    def _options(self, request: Any) -> dict[str, Any]:
        headers = self._headers(request)
        options: dict[str, Any] = {"parent_id": request.id, "root_id": headers.get("root_id") or request.id}
        priority = (getattr(request, "delivery_info", None) or {}).get("priority")
        if priority is not None:
            options["priority"] = priority
        return options

    def _routed(self, sig: Any) -> Any:
        """``sig`` with the default queue when it names no route and is not one of Swapless's tasks (a group's
        members each get it)."""
        if isinstance(sig, group):
            sig.tasks = [self._routed(signature(member, app=self.app)) for member in sig.tasks]
            return sig
        task = sig.get("task")
        if task not in _OWN_TASKS and not any(sig.options.get(option) for option in _ROUTING_OPTIONS):
            sig.set(queue=self.default_queue)
        return sig

    def _context(self, request: Any, embed: Mapping[str, Any]) -> Context:
        """What ``on_chord_part_return`` reads of a chord member: its id, group, index and the chord's body (routed
        like any follow-up)."""
        headers = self._headers(request)
        body = self._routed(signature(embed["chord"], app=self.app))
        return Context(id=request.id, group=headers.get("group"), group_index=headers.get("group_index"),
                       chord=body, root_id=headers.get("root_id"), parent_id=headers.get("parent_id"),
                       delivery_info=getattr(request, "delivery_info", None) or {})
