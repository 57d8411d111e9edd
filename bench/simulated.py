"""A simulated framework for the scale-out benchmark: models whose load and forward pass *sleep* like a GPU's.

Registered as framework ``simulated`` when a worker imports it (``SWAPLESS_PLUGINS=bench.simulated``). A model's
``name`` gives its costs, in seconds: ``load=2.0,batch=0.02,item=0.001,host=0.2`` loads in 2 s (from disk), a forward
pass of n inputs takes 0.02 + 0.001 n s, and a move between the device and host memory (the cache's host tier, either
way) takes 0.2 s (``host`` unset: a tenth of ``load``); ``adapter=0.0005`` is the copy of one variant's adapter into a
slot (``swapless.manager.frameworks.adapters``; ``SWAPLESS_MAX_ADAPTERS`` slots, least recently used out), paid in
the pass that first needs it. Sleeping uses no CPU, as a GPU's work does not, so how the queue scales with the number
of workers can be measured on a 2-core machine. Every input succeeds with one label.

With ``SIMULATED_LOG`` set, every input that reaches a forward pass is appended to that file, one per line (the
overload benchmark reads from it which jobs reached the model). With ``SIMULATED_LOADS`` set, every load appends
``<model id>\t<pid>`` to that file once it is done (the long-tail benchmark counts loads exactly from it).
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from swapless.config.errors import ConfigError
from swapless.manager.frameworks.worker import ModelWorker
from swapless.manager.registry.specs import ModelSpec

__all__ = ["SimulatedWorker", "costs", "simulated_entry"]

#: The bytes a loaded simulated model reports (a small GPU model's).
MEMORY_BYTES = 500 * 1024 * 1024


def costs(name: str) -> dict[str, float]:
    """``{"load": s, "batch": s, "item": s}`` from a model name such as ``load=2.0,batch=0.02,item=0.001``.

    Raises:
        ConfigError: the name is not of that form.
    """
    found = {"load": 1.0, "batch": 0.01, "item": 0.001, "host": -1.0, "adapter": 0.0005}
    for part in filter(None, name.split(",")):
        key, sep, value = part.partition("=")
        try:
            if not sep or key not in found:
                raise ValueError(part)
            found[key] = float(value)
        except ValueError:
            raise ConfigError(f"simulated model {name!r}",
                              "write its costs as load=S,batch=S,item=S,host=S,adapter=S") from None
    if found["host"] < 0:
        found["host"] = found["load"] / 10
    return found


def simulated_entry(
    model_id: str, load_s: float, batch_s: float, item_s: float, host_s: float | None = None
) -> dict[str, Any]:
    """A models-file entry for a simulated model (``host_s``: a move to host memory or back; None: load_s / 10)."""
    host = "" if host_s is None else f",host={host_s:g}"
    return {
        "id": model_id,
        "name": f"load={load_s:g},batch={batch_s:g},item={item_s:g}{host}",
        "type": "text",
        "framework": "simulated",
        "description": "simulated GPU model (sleeps)",
        "max_batch_size": 64,
    }


class SimulatedWorker(ModelWorker, framework="simulated"):
    """Sleeps for its load, for each forward pass and for each move to host memory and back (see the module
    docstring)."""

    host_tier = True
    runs_adapters = True

    def load(self) -> None:
        self._slots: OrderedDict[str, None] = OrderedDict()
        time.sleep(costs(self.spec.name)["load"])
        self.memory_bytes = MEMORY_BYTES
        loads = os.environ.get("SIMULATED_LOADS")
        if loads:
            with open(loads, "a", encoding="utf-8") as file:  # one short append: whole lines across processes
                file.write(f"{self.spec.id}\t{os.getpid()}\n")

    def prepare(self, value: Any) -> Any:
        return self.prepare_text(value)

    def prepare_for(self, variant: ModelSpec | None, value: Any) -> Any:
        text = self.prepare_text(value)
        return text if variant is None else (variant.id, text)

    def _swap_ins(self, chunk: Sequence[Any]) -> int:
        """Variants of ``chunk`` brought into a slot now (least recently used out)."""
        brought = 0
        for variant in dict.fromkeys(item[0] for item in chunk if isinstance(item, tuple)):
            if variant in self._slots:
                self._slots.move_to_end(variant)
                continue
            brought += 1
            self._slots[variant] = None
            if len(self._slots) > self.limits.max_adapters:
                self._slots.popitem(last=False)
        return brought

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        log = os.environ.get("SIMULATED_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as file:
                file.write("".join(f"{value}\n" for value in batch))
        cost = costs(self.spec.name)
        out: list[Any] = []
        for chunk in self.batched(batch):
            time.sleep(cost["batch"] + cost["item"] * len(chunk) + cost["adapter"] * self._swap_ins(chunk))
            out.extend([{"label": "ok", "score": 1.0}] for _ in chunk)
        return out

    def to_host(self) -> None:
        time.sleep(costs(self.spec.name)["host"])

    def to_device(self) -> None:
        time.sleep(costs(self.spec.name)["host"])

    def unload(self) -> None:
        self.memory_bytes = 0
