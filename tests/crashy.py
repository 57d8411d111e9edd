"""A test plugin framework, ``crashy``, whose inputs and model names inject faults into a real worker process.

Workers load it with ``SWAPLESS_PLUGINS=tests.crashy``; a models file lists crashy models as
``{"id": ..., "name": <behaviour>, "type": "text", "framework": "crashy"}``. The model's ``name`` picks what the
whole model does:

- ``echo`` (or any other name): per input, ``"crash"`` SIGKILLs the worker process (a segfault, the OOM killer)
  and ``"crash:<s>"`` does so after ``s`` seconds of computing; ``"sleep:<s>[:tag]"`` holds the batch in flight for
  ``s`` seconds (once per batch, the longest asked for); ``"gate:<name>"`` holds it until the file ``<name>``
  exists in the directory named by ``CRASHY_GATES`` (a test opens the gate when it is ready: no guessed
  duration); every input is echoed back as ``{"echo": input, "model": id, "pid": pid}``;
- ``labels``: like ``echo``, but each output is a classifier's, ``[{"label": input, "score": 1.0}]``: two
  ``labels`` models agree on every top label;
- ``broken``: ``predict`` raises for every batch (a bug in a custom framework);
- ``oom``: ``predict`` raises an error named like ``torch.OutOfMemoryError`` for batches of more than one input;
- ``unstorable``: ``predict`` returns outputs JSON cannot encode (a custom framework returning a ``set``).

Before acting on a batch, ``predict`` appends one line per input, ``<batch id>\\t<pid>\\t<model id>\\t<input>``, to
the file named by ``CRASHY_LOG`` (when set): tests count executions from it, across worker processes and deaths,
and see which inputs ran together.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swapless.manager.frameworks.worker import ModelWorker

__all__ = [
    "GATES_ENV", "LOG_ENV", "CrashWorker", "OutOfMemoryError", "batches", "crashy_entry", "executions", "passes",
]

#: The environment variable naming the execution log.
LOG_ENV = "CRASHY_LOG"
#: The environment variable naming the directory of gate files (``"gate:<name>"`` inputs).
GATES_ENV = "CRASHY_GATES"
#: A gate never opened lets its batch go after this long (a failing test must not wedge a shared worker).
GATE_LIMIT_S = 120.0
#: What a loaded crashy model reports as its memory (bytes): small enough for any test budget.
MEMORY_BYTES = 1000
_BATCHES = itertools.count()


class OutOfMemoryError(RuntimeError):
    """Named like torch's, which is what the runner recognises as out of memory."""


class CrashWorker(ModelWorker, framework="crashy"):
    """A model whose inputs and name inject faults (see the module docstring)."""

    def load(self) -> None:
        self.memory_bytes = MEMORY_BYTES

    def unload(self) -> None:
        self.memory_bytes = 0

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        _record(self.spec.id, batch)
        behaviour = self.spec.name
        if behaviour == "broken":
            raise RuntimeError(f"crashy model is broken ({len(batch)} inputs)")
        if behaviour == "oom" and len(batch) > 1:
            raise OutOfMemoryError(f"CUDA out of memory for a batch of {len(batch)}")
        crash_after_s = [float(text.partition(":")[2] or 0) for text in batch if text.partition(":")[0] == "crash"]
        if crash_after_s:
            time.sleep(min(crash_after_s))
            os.kill(os.getpid(), signal.SIGKILL)
        pause_s = max((float(text.split(":")[1]) for text in batch if text.startswith("sleep:")), default=0.0)
        if pause_s:
            time.sleep(pause_s)
        for text in batch:
            if text.startswith("gate:"):
                _wait_gate(text.split(":")[1])
        if behaviour == "unstorable":
            return [{"echo": {text}} for text in batch]
        if behaviour == "labels":
            return [[{"label": str(text), "score": 1.0}] for text in batch]
        return [{"echo": text, "model": self.spec.id, "pid": os.getpid()} for text in batch]


def _record(model_id: str, batch: Sequence[Any]) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    batch_id = f"{os.getpid()}-{next(_BATCHES)}"
    lines = "".join(f"{batch_id}\t{os.getpid()}\t{model_id}\t{text}\n" for text in batch)
    # One O_APPEND write per batch: lines of concurrent workers never interleave, and the kernel keeps them
    # even if this process is SIGKILLed the next instant.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, lines.encode())
    finally:
        os.close(fd)


def _wait_gate(name: str) -> None:
    gate = Path(os.environ.get(GATES_ENV, ".")) / name
    deadline = time.monotonic() + GATE_LIMIT_S
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _rows(path: Path) -> list[tuple[str, int, str, str]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        batch_id, pid, model_id, text = line.split("\t", 3)
        rows.append((batch_id, int(pid), model_id, text))
    return rows


def executions(path: Path) -> list[tuple[int, str, str]]:
    """The ``(pid, model id, input)`` lines of an execution log, in order (empty if nothing ran yet)."""
    return [(pid, model_id, text) for _, pid, model_id, text in _rows(path)]


def passes(path: Path) -> list[tuple[int, list[str]]]:
    """``(pid, inputs)`` of each forward pass, in the order they started."""
    grouped: dict[str, tuple[int, list[str]]] = {}
    for batch_id, pid, _, text in _rows(path):
        grouped.setdefault(batch_id, (pid, []))[1].append(text)
    return list(grouped.values())


def batches(path: Path) -> list[list[str]]:
    """The inputs of each forward pass, in order: which inputs ran together."""
    return [inputs for _, inputs in passes(path)]


def crashy_entry(model_id: str, behaviour: str = "echo") -> dict[str, Any]:
    """A models-file entry for a crashy model."""
    return {"id": model_id, "name": behaviour, "type": "text", "framework": "crashy", "description": "fault injection"}
