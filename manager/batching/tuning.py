"""Choosing each model's batch size by measurement, online: ``BatchTuner`` hill-climbs over powers of two, timing
full forward passes of real work, and keeps a smoothed cost per input for each size. It lives as long as the
worker process, across unloads and reloads of its model.
"""

from __future__ import annotations

__all__ = ["BatchTuner"]


class BatchTuner:
    """Online batch-size choice for one model.

    Args:
        max_size: the largest batch allowed.
        start: the first size tried (clamped to ``max_size``).
        smoothing: weight of a slower measurement in the moving average of seconds per input.
        revisit_every: after this many passes at the best size, measure a neighbour again.
    """

    def __init__(self, max_size: int, start: int = 8, smoothing: float = 0.3, revisit_every: int = 50) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self.max_size = max_size
        sizes = []
        size = 1
        while size < max_size:
            sizes.append(size)
            size *= 2
        sizes.append(max_size)
        self.sizes = sizes
        self.start = min(sizes, key=lambda s: abs(s - start))
        self.smoothing = smoothing
        self.revisit_every = revisit_every
        self.cost_s: dict[int, float] = {}
        self._measured_at: dict[int, int] = {}  # size -> number of the pass that last measured it
        self._passes = 0
        self._since_explore = 0

    def best(self) -> int:
        """The size with the lowest measured cost per input (the start size before any measurement)."""
        if not self.cost_s:
            return self.start
        return min(self.cost_s, key=self.cost_s.__getitem__)

    def next_size(self) -> int:
        """The batch size to use for the next forward pass."""
        if self.start not in self.cost_s:
            return self.start
        best = self.best()
        index = self.sizes.index(best)
        neighbours = [self.sizes[i] for i in (index + 1, index - 1) if 0 <= i < len(self.sizes)]
        for size in neighbours:
            if size not in self.cost_s:
                return size
        if self._since_explore >= self.revisit_every and neighbours:
            # the neighbour measured longest ago: each gets its turn, whatever a noisy pass once said of it
            self._since_explore = 0
            return min(neighbours, key=lambda size: self._measured_at.get(size, -1))
        self._since_explore += 1
        return best

    def record(self, size: int, items: int, seconds: float) -> None:
        """Record a forward pass of ``items`` inputs at batch ``size``. Partial batches are not counted."""
        if items != size or size not in self.sizes or items <= 0:
            return
        per_item = seconds / items
        self._passes += 1
        self._measured_at[size] = self._passes
        old = self.cost_s.get(size)
        if old is None:
            self.cost_s[size] = per_item
        else:
            # Down at once, up slowly: on a shared machine a pass is only ever slowed by others, so a fast pass is
            # what the size can do, while a slow one may be noise (the moving average still follows lasting change).
            self.cost_s[size] = min(per_item, (1 - self.smoothing) * old + self.smoothing * per_item)

    def chunks(self, total: int) -> list[int]:
        """Cut ``total`` inputs into batch sizes, asking ``next_size`` before each (without measuring)."""
        sizes = []
        remaining = total
        while remaining > 0:
            size = min(self.next_size(), remaining)
            sizes.append(size)
            remaining -= size
        return sizes
