"""A test plugin that SIGKILLs the worker after a job's result is stored and before its webhook is queued.

Loaded with ``SWAPLESS_PLUGINS=tests.webhookhook``, it wraps ``WebhookIntake.enqueue`` (called between the store and
the ack): when a job about to be queued carries the input ``die-before-webhook`` and the file named by
``WEBHOOKHOOK_MARKER`` does not exist yet, it creates that file and kills the process. Once only: the worker that
takes the redelivered message finds the result stored and queues the webhook itself.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from swapless.tasks.worker.webhooks import WebhookIntake

MARKER_ENV = "WEBHOOKHOOK_MARKER"
TRIGGER = "die-before-webhook"

_enqueue = WebhookIntake.enqueue


def _enqueue_or_die(self: WebhookIntake, items: Sequence[tuple[Any, Any, Any]], models: Mapping[str, str]) -> int:
    marker = os.environ.get(MARKER_ENV)
    hit = any(isinstance(r.args, (list, tuple)) and len(r.args) == 2 and r.args[1] == TRIGGER for r, _, _ in items)
    if hit and marker and not os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as file:
            file.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return _enqueue(self, items, models)


WebhookIntake.enqueue = _enqueue_or_die  # type: ignore[method-assign]
