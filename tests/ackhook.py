"""A test plugin that SIGKILLs the worker after a job's result is stored and before its message is acked.

Loaded beside the crashy framework (``SWAPLESS_PLUGINS=tests.crashy,tests.ackhook``), it wraps the scheduler's bulk
ack (``AckQueue.ack``, called only once results are stored): when a request about to be acked carries the input
``die-before-ack`` and the file named by ``ACKHOOK_MARKER`` does not exist yet, it creates that file and kills the
process, so the stored result's message is still unacked when the worker dies. Once only: the worker that takes
the redelivered message acks it normally.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from typing import Any

from swapless.tasks.broker.acks import AckQueue

MARKER_ENV = "ACKHOOK_MARKER"
TRIGGER = "die-before-ack"

_ack = AckQueue.ack


def _ack_or_die(self: AckQueue, requests: Iterable[Any]) -> None:
    requests = list(requests)
    marker = os.environ.get(MARKER_ENV)
    hit = any(isinstance(r.args, (list, tuple)) and len(r.args) == 2 and r.args[1] == TRIGGER for r in requests)
    if hit and marker and not os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as file:
            file.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    _ack(self, requests)


AckQueue.ack = _ack_or_die  # type: ignore[method-assign]
