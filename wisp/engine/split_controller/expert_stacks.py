"""ExpertStacks: every MoE layer's LRU stack of expert ids, fed one engine step of routing at a time.

What the live split controller learns expert reuse from. For each layer the numbers are exactly those of
`LruStack.touch(order_by_last_token(...))` on the step's routing (tested against it): the layer's distinct
experts of the step in touch order (`wisp.core.experts.recency`: by last token, then id), each with its stack
distance before the step (1 + the distinct experts referenced since, COLD for a first reference), then
made the most recent. The distances come out layer after layer, in touch order within a layer.

All layers are updated at once with numpy, in a fixed few dozen array operations a step whatever its
size (no per-layer or per-expert Python loop): a stack is kept as each expert's stamp, when it was last
touched (-1: never; every stamp of a step is above those of earlier steps, and within a step they grow
along the touch order), so an expert's distance is the number of its layer's experts stamped no earlier:
one sort of every layer's stamps and a search. A step's touch order is one sort of its (last token, id) keys.
"""

from __future__ import annotations

import numpy as np

from wisp.plan.miss_curves import COLD


class ExpertStacks:
    def __init__(self, num_layers: int, num_experts: int):
        self.num_experts = num_experts
        self._stamp = np.full((num_layers, num_experts), -1, dtype=np.int64)
        self._next_stamp = 0  # above every stamp given so far
        # flat index of (layer, id) in a [L, E + 1] table whose column 0 takes the unknown (-1) ids
        self._flat_offset = ((num_experts + 1) * np.arange(num_layers) + 1)[None, :, None]
        self._layer = np.arange(num_layers, dtype=np.int64)[:, None]
        self._layer_end = (np.arange(num_layers, dtype=np.int64) + 1) * num_experts  # flat end of each layer
        self._ids = np.arange(num_experts)
        self._token_of = np.zeros(0, dtype=np.int64)  # each flat [T, L, K] entry's token, for the largest T so far

    def touch(self, rows: np.ndarray) -> np.ndarray:
        """rows [T, L, K]: one step's routed ids in token order (-1: unknown, skipped). Returns the
        distances (int64) of each layer's distinct experts in touch order, layer after layer."""
        t, layers, k = rows.shape
        e = self.num_experts
        if self._token_of.size < t * layers * k:  # grown only: one array, sliced for smaller steps
            self._token_of = np.repeat(np.arange(t), layers * k)
        last = np.full(layers * (e + 1), -1, dtype=np.int64)  # each (layer, expert)'s last token in the step
        np.maximum.at(last, (rows + self._flat_offset).reshape(-1), self._token_of[: t * layers * k])
        # touch order: by (last token, id); an expert not routed (last -1) gets a negative key, sorted first
        keys = np.sort(last.reshape(layers, e + 1)[:, 1:] * e + self._ids, axis=1)
        layer, column = np.nonzero(keys >= 0)  # each layer's touch order, layer after layer
        expert = keys[layer, column] % e
        before = self._stamp[layer, expert]
        # every layer's stamps sorted, each layer shifted above the previous one: one sorted array
        shift = (self._next_stamp + 1) * self._layer + 1
        stamps = (np.sort(self._stamp, axis=1) + shift).reshape(-1)
        no_earlier = self._layer_end[layer] - np.searchsorted(stamps, before + shift[layer, 0])
        distances = np.where(before >= 0, no_earlier, COLD)
        self._stamp[layer, expert] = self._next_stamp + column  # columns grow along the touch order
        self._next_stamp += e
        return distances
