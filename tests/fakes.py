"""A fake framework for fast tests of the cache, scheduler and runner through the real config path.

``name`` carries the fake's behaviour: ``"size=<bytes>"`` sets the memory it reports after load. Inputs are
strings; ``predict`` returns ``{"echo": text, "model": id}``; the text ``"boom"`` raises inside a forward
pass (a poison input), ``"oom"`` raises an out-of-memory error when batched with others. It has a host tier: a
move to host memory and back is counted (``to_host`` / ``to_device``), and ``predict`` refuses to run while the model
is in host memory.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from swapless.manager.frameworks.worker import ModelWorker

if TYPE_CHECKING:
    from swapless.manager import ModelManager


class OutOfMemoryError(RuntimeError):
    """Named like torch's, which is what the runner recognises."""


class FakeWorker(ModelWorker, framework="fake"):
    loads: ClassVar[Counter[str]] = Counter()
    unloads: ClassVar[Counter[str]] = Counter()
    batches: ClassVar[list[tuple[str, int]]] = []
    fail_load: ClassVar[set[str]] = set()
    #: a load of a model listed here waits until its event is set (tests of loads running in the background)
    load_gates: ClassVar[dict[str, Any]] = {}
    #: loads of a model listed here raise torch's out-of-memory error this many times first
    oom_loads: ClassVar[Counter[str]] = Counter()
    host_tier = True
    to_host_moves: ClassVar[Counter[str]] = Counter()
    to_device_moves: ClassVar[Counter[str]] = Counter()
    #: moves of a model listed here raise an out-of-memory error this many times first (to host, to the device)
    oom_to_host: ClassVar[Counter[str]] = Counter()
    oom_to_device: ClassVar[Counter[str]] = Counter()
    #: moves to host of a model listed here fail with another error
    fail_to_host: ClassVar[set[str]] = set()

    def load(self) -> None:
        gate = FakeWorker.load_gates.get(self.spec.id)
        if gate is not None:
            assert gate.wait(30), f"the test never opened the gate of {self.spec.id}"
        if self.spec.id in FakeWorker.fail_load:
            raise RuntimeError("weights file is corrupt")
        if FakeWorker.oom_loads[self.spec.id] > 0:
            FakeWorker.oom_loads[self.spec.id] -= 1
            import torch

            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        FakeWorker.loads[self.spec.id] += 1
        size = self.spec.name.removeprefix("size=")
        self.memory_bytes = int(size) if size.isdigit() else 100
        self.loaded = True
        self.on_host = False

    def to_host(self) -> None:
        assert getattr(self, "loaded", False) and not self.on_host, "to_host of a model not on the device"
        if FakeWorker.oom_to_host[self.spec.id] > 0:
            FakeWorker.oom_to_host[self.spec.id] -= 1
            raise MemoryError("cannot allocate pinned host memory")
        if self.spec.id in FakeWorker.fail_to_host:
            raise RuntimeError("host copy failed")
        FakeWorker.to_host_moves[self.spec.id] += 1
        self.on_host = True

    def to_device(self) -> None:
        assert getattr(self, "loaded", False) and self.on_host, "to_device of a model not in host memory"
        if FakeWorker.oom_to_device[self.spec.id] > 0:
            FakeWorker.oom_to_device[self.spec.id] -= 1
            import torch

            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        FakeWorker.to_device_moves[self.spec.id] += 1
        self.on_host = False

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        assert getattr(self, "loaded", False), "predict before load"
        assert not self.on_host, "predict while the model is in host memory"
        FakeWorker.batches.append((self.spec.id, len(batch)))
        if "boom" in batch:
            raise RuntimeError("forward pass exploded")
        if "oom" in batch and len(batch) > 1:
            raise OutOfMemoryError("CUDA out of memory")
        return [{"echo": text, "model": self.spec.id} for text in batch]

    def unload(self) -> None:
        FakeWorker.unloads[self.spec.id] += 1
        self.loaded = False
        self.memory_bytes = 0

    @classmethod
    def reset(cls) -> None:
        cls.loads.clear()
        cls.unloads.clear()
        cls.batches.clear()
        cls.fail_load.clear()
        cls.load_gates.clear()
        cls.oom_loads.clear()
        cls.to_host_moves.clear()
        cls.to_device_moves.clear()
        cls.oom_to_host.clear()
        cls.oom_to_device.clear()
        cls.fail_to_host.clear()


def write_fake_models(directory: Path, sizes: dict[str, int], kept: Collection[str] = ()) -> Path:
    """A models.json with one fake text model per entry of ``sizes`` (id -> bytes); those in ``kept`` are kept
    loaded (``keep_loaded``)."""
    entries = [
        {"id": model_id, "name": f"size={size}", "type": "text", "framework": "fake", "description": "fake",
         **({"keep_loaded": True} if model_id in kept else {})}
        for model_id, size in sizes.items()
    ]
    path = directory / "models.json"
    path.write_text(json.dumps({"models": entries}))
    return path


def make_manager(tmp_path: Path, sizes: dict[str, int], kept: Collection[str] = (), **kwargs: object) -> ModelManager:
    """A ModelManager over fake models of these sizes, ``kept`` kept loaded (``kwargs``: its limits)."""
    from swapless.manager import ModelEngine, ModelManager, ModelStore

    engine = ModelEngine()
    store = ModelStore.from_file(write_fake_models(tmp_path, sizes, kept), engine.frameworks)
    return ModelManager(store, engine, **kwargs)  # type: ignore[arg-type]


def use(manager: ModelManager, model_id: str) -> None:
    """Run one fake input through ``model_id`` (loading it if need be)."""
    with manager.use(model_id) as worker:
        assert worker.predict(["x"]) == [{"echo": "x", "model": model_id}]
