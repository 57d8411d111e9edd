"""What workers learn about each model, kept in Redis per device kind so a new worker starts tuned.

Per model: seconds per input at each batch size, load and swap-in times, size in bytes. Read at start-up
(``seed``), written once per heartbeat (``save``); it expires ``LEARNED_TTL_S`` after its last use.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import redis

from swapless.manager import ModelEngine, ModelManager
from swapless.tasks.keyspace import Keyspace

__all__ = ["LEARNED_TTL_S", "LearnedStore", "device_label"]

logger = logging.getLogger(__name__)

#: Seconds what was learned is kept after the last worker started or wrote to it: 30 days.
LEARNED_TTL_S = 30 * 24 * 3600


#: Device files a GPU driver makes (NVIDIA's, WSL's, AMD ROCm's, which torch also reaches as ``cuda``): without
#: any of them torch finds no CUDA device either.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")


def device_label(device: str) -> str:
    """The kind of device a worker computes on (without importing torch where it can)."""
    if device == "auto" and not any(os.path.exists(path) for path in GPU_DEVICE_FILES):
        return "cpu"
    if device != "auto" and not device.startswith("cuda"):
        return device.split(":", 1)[0]
    from swapless.manager.frameworks.torch_utils import resolve_device

    resolved = resolve_device(device)
    if resolved.type == "cuda":
        import torch

        return f"cuda:{torch.cuda.get_device_name(resolved)}"
    return resolved.type


class LearnedStore:
    """One worker's view of what all workers learned on its kind of device.

    Args:
        client: the Redis to read and write.
        keyspace: the deployment's keys.
        device: the device kind (``device_label``).
    """

    def __init__(self, client: redis.Redis, keyspace: Keyspace, device: str) -> None:
        self.client = client
        self.key = keyspace.learned(device)
        self.kinds = keyspace.learned_devices
        self.device = device
        self._saved: dict[str, str] = {}

    def read(self) -> dict[str, dict[str, Any]]:
        """Every model's record (unreadable ones are skipped)."""
        found = {}
        stored: dict[bytes, bytes] = self.client.hgetall(self.key)  # type: ignore[assignment]  # a sync client's reply
        for field, raw in stored.items():
            try:
                found[field.decode() if isinstance(field, bytes) else str(field)] = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                logger.warning("ignoring an unreadable record of %r in %s", field, self.key)
        return found

    def seed(self, manager: ModelManager, engine: ModelEngine) -> dict[str, dict[str, Any]]:
        """Seed this worker's tuners, load costs and sizes from what was learned; returns the records."""
        records = self.read()
        if records:
            self.client.expire(self.key, LEARNED_TTL_S)
        known = set(manager.store.ids())
        for model_id, record in records.items():
            if model_id not in known:
                continue
            costs = {int(size): float(s) for size, s in (record.get("batch_costs_s") or {}).items()}
            if costs:
                engine.seed_tuner(manager.store.get(model_id), costs)
            manager.seed(model_id, load_s=record.get("load_s"), size_bytes=record.get("size_bytes"),
                         host_load_s=record.get("host_load_s"))
        self._saved = {m: json.dumps(r, sort_keys=True) for m, r in records.items()}
        if records:
            logger.info("learned from earlier workers: %s", ", ".join(sorted(set(records) & known)))
        return records

    def save(self, manager: ModelManager, engine: ModelEngine) -> int:
        """Write the records that changed since the last save (one round trip); returns how many."""
        changed = {}
        for model_id in manager.store.ids():
            record: dict[str, Any] = dict(manager.learned(model_id))
            tuner = engine.tuner(model_id)
            if tuner is not None and tuner.cost_s:
                record["batch_costs_s"] = {str(size): s for size, s in tuner.cost_s.items()}
            if not record:
                continue
            text = json.dumps(record, sort_keys=True)
            if self._saved.get(model_id) != text:
                changed[model_id] = text
        if changed:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.hset(self.key, mapping=changed)  # type: ignore[arg-type]  # str -> str is fine
                pipe.expire(self.key, LEARNED_TTL_S)
                pipe.sadd(self.kinds, self.device)
                pipe.execute()
            self._saved.update(changed)
        return len(changed)
