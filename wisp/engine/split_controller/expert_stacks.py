"""ExpertStacks: every MoE layer's LRU stack of expert ids, fed engine steps of routing, one or many at a time.

What the live split controller learns expert reuse from. For each step and layer the numbers are exactly those
of `LruStack.touch(order_by_last_token(...))` on the step's routing (tested against it): the layer's distinct
experts of the step in touch order (`wisp.core.experts.recency`: by last token, then id), each with its stack
distance before the step (1 + the distinct experts referenced since, COLD for a first reference), then made
the most recent. The distances come out step after step, layer after layer within a step, in touch order
within a layer.

`touch_steps` takes any number of consecutive steps in one call, in a fixed few dozen array operations
whatever their number and size (no per-step, per-layer or per-expert Python loop), so the live split can
hold a few dozen steps' routing and feed them in bulk before a re-solve: the per-step cost of the numpy
calls' own overhead is paid once per batch. A stack is kept as each expert's stamp, when it was last touched
(-1: never; every stamp of a step is above those of earlier steps, and within a step they grow along the touch
order), so an expert's distance at a step is the number of its layer's experts stamped no earlier as the step
begins: each step's stamps are the running maximum over the steps before it, and the counts are one sort of
every (step, layer) row of stamps and a search. A step's touch order is one sort of its (last token, id) keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wisp.plan.miss_curves import COLD


class ExpertStacks:
    def __init__(self, num_layers: int, num_experts: int):
        self.num_layers, self.num_experts = num_layers, num_experts
        self._stamp = np.full((num_layers, num_experts), -1, dtype=np.int64)
        self._next_stamp = 0  # above every stamp given so far
        self._ids = np.arange(num_experts)
        self._token_of = np.zeros(0, dtype=np.int64)  # each flat [T, L, K] entry's token, for the largest T so far

    def touch(self, rows: np.ndarray) -> np.ndarray:
        """rows [T, L, K]: one step's routed ids in token order (-1: unknown, skipped). Returns the
        distances (int64) of each layer's distinct experts in touch order, layer after layer."""
        return self.touch_steps(rows, [rows.shape[0]])[0]

    def touch_steps(self, rows: np.ndarray, step_tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """rows [T, L, K]: consecutive steps' routed ids, step after step, `step_tokens[s]` rows for step s
        (sum(step_tokens) == T). Returns (the distances of every step in order, as `touch` would give them
        one step at a time; each step's number of distances, int64 [len(step_tokens)])."""
        t, layers, k = rows.shape
        e, steps = self.num_experts, len(step_tokens)
        if sum(step_tokens) != t:
            raise ValueError(f"step_tokens add up to {sum(step_tokens)}, rows hold {t} tokens")
        if self._token_of.size < t * layers * k:  # grown only: one array, sliced for smaller batches
            self._token_of = np.repeat(np.arange(t), layers * k)
        # flat index of (step, layer, id) in a [S, L, E + 1] table whose column 0 takes the unknown (-1) ids
        row_of = np.repeat(np.arange(steps) * layers, step_tokens)[:, None, None] + np.arange(layers)[None, :, None]
        last = np.full(steps * layers * (e + 1), -1, dtype=np.int64)  # each (step, layer, expert)'s last token
        np.maximum.at(last, (rows + (row_of * (e + 1) + 1)).reshape(-1), self._token_of[: t * layers * k])
        # touch order: by (last token, id); an expert not routed (last -1) gets a negative key, sorted first
        keys = np.sort(last.reshape(steps, layers, e + 1)[:, :, 1:] * e + self._ids, axis=2).reshape(-1)
        where = np.flatnonzero(keys >= 0)  # step after step, layer after layer, in touch order
        row, column = np.divmod(where, e)  # row: step * layers + layer
        at = row * e + keys[where] % e  # flat index of (step, layer, expert)
        # stamps[s]: every expert's stamp as step s begins; stamps[s + 1] first holds those step s gives (-1:
        # untouched), then, stamps only growing, the running maximum over the steps
        stamps = np.full((steps + 1, layers, e), -1, dtype=np.int64)
        stamps[0] = self._stamp
        stamps[1:].reshape(-1)[at] = self._next_stamp + e * (row // layers) + column  # grow along the touch order
        np.maximum.accumulate(stamps, axis=0, out=stamps)
        before = stamps[:-1].reshape(-1)[at]
        # an expert's distance: the experts of its row stamped no earlier, itself included; stamps >= 0 are
        # distinct within a row, so that is e minus its stamp's rank in the row
        rank = np.empty((steps, layers, e), dtype=np.int64)
        np.put_along_axis(rank, np.argsort(stamps[:-1], axis=2), self._ids[None, None, :], axis=2)
        self._stamp = stamps[-1].copy()
        self._next_stamp += e * steps
        return np.where(before >= 0, e - rank.reshape(-1)[at], COLD), np.bincount(row // layers, minlength=steps)
