"""What a cache has measured of each model: its size, its load from disk, its swap-in from host memory; plain data
(seeded from what earlier workers learned, ``swapless.tasks.worker.learned``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from swapless.manager.cache.entries import DEFAULT_LOAD_COST_S, HOST_COST_FRACTION, Tier

__all__ = ["LoadCosts"]


@dataclass
class LoadCosts:
    """Per model: ``sizes`` (bytes once loaded), ``disk_s`` (seconds of its last load from disk) and ``host_s``
    (seconds of its last swap-in from host memory). Not thread-safe: the cache guards it with its lock."""

    sizes: dict[str, int] = field(default_factory=dict)
    disk_s: dict[str, float] = field(default_factory=dict)
    host_s: dict[str, float] = field(default_factory=dict)

    def cost_s(self, model_id: str, tier: Tier) -> float:
        """Expected seconds to bring ``model_id`` onto the device from ``tier``: 0 from the device; from host
        memory, its last swap-in, else ``HOST_COST_FRACTION`` of its load; from disk, its last load, else a
        default."""
        if tier is Tier.DEVICE:
            return 0.0
        disk = self.disk_s.get(model_id, DEFAULT_LOAD_COST_S)
        if tier is Tier.HOST:
            return self.host_s.get(model_id, disk * HOST_COST_FRACTION)
        return disk

    def seed(
        self, model_id: str, *, load_s: float | None, size_bytes: int | None, host_load_s: float | None
    ) -> None:
        """Take earlier measurements where this cache has none of its own."""
        if load_s is not None:
            self.disk_s.setdefault(model_id, float(load_s))
        if host_load_s is not None:
            self.host_s.setdefault(model_id, float(host_load_s))
        if size_bytes is not None:
            self.sizes.setdefault(model_id, int(size_bytes))

    def learned(self, model_id: str) -> dict[str, float | int]:
        """``load_s``, ``host_load_s`` and ``size_bytes`` of ``model_id``, each when known."""
        found: dict[str, float | int] = {}
        if model_id in self.disk_s:
            found["load_s"] = round(self.disk_s[model_id], 4)
        if model_id in self.host_s:
            found["host_load_s"] = round(self.host_s[model_id], 4)
        if model_id in self.sizes:
            found["size_bytes"] = self.sizes[model_id]
        return found
