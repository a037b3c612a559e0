"""LruStack: stack distances computed online, one step at a time, for the live split controller.

The same numbers as `wisp.plan.miss_curves.stack_distances` / `kv_stack_distances` over a whole stream
(tested against them), but fed as the engine runs. A step lists DISTINCT keys in touch order (later =
more recent after the step); each key's distance is measured on the stack as it was before the step:
1 + the number of distinct keys referenced since its last reference, COLD for a first reference. Under
LRU with C entries a reference hits iff 1 <= distance <= C.

With a `capacity`, only the `capacity` most recent keys are kept: a key deeper than that is forgotten, so
its next distance reads COLD where the whole stack would say some d > capacity; distances up to capacity are
unchanged. A reader that tells distances apart only up to capacity (the controller's histograms count COLD
and d > max_distance in one bucket) sees the same numbers, from a stack that stops growing.

Cost: O(stack size) per step (the stack is a list), fine for an expert layer (<= num_experts keys)
and for the KV blocks of a serving session (bounded by `capacity`); not meant for million-key streams.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from wisp.plan.miss_curves import COLD


class LruStack:
    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._order: list[Hashable] = []  # least recently used first

    def __len__(self) -> int:
        return len(self._order)

    def touch(self, step: Sequence[Hashable]) -> list[int]:
        """Distances of the step's distinct keys (in the step's order), then make them the most recent."""
        n = len(self._order)
        index = {k: i for i, k in enumerate(self._order)}
        distances = [n - index[k] if k in index else COLD for k in step]
        touched = set(step)
        self._order = [k for k in self._order if k not in touched] + list(step)
        if self.capacity is not None and len(self._order) > self.capacity:
            del self._order[: len(self._order) - self.capacity]
        return distances

    def touch_blocks(self, keys: Sequence[Hashable]) -> list[int]:
        """One request's full KV blocks in position order (`kv_stack_distances` semantics: the earlier a
        block, the more recent it counts, as the pool frees tails first); distances in position order."""
        blocks = list(dict.fromkeys(keys))
        return self.touch(blocks[::-1])[::-1]
