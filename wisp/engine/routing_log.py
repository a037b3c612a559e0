"""RoutingLog: every step's routed experts kept on the device, graph-safe, read on the host in one copy
every now and then (what the live split controller learns expert reuse from while decode keeps its CUDA
graphs).

Each logged MoE layer of a step writes its [T, K] routed ids into row (rows written + t) mod capacity of a
device ring buffer [capacity, L, K] (one launch a layer: the rows' places are computed once, at the first logged
layer); the last logged layer also stamps the rows with the step's number and advances both counters. `layers`
may be a subset of the MoE layers (a sample is enough to estimate working sets); the others are not logged. Every write is a device op with no host sync, so a captured decode graph records
them and each replay logs its step. `drain()` reads what was written since the last drain (one sync) and
returns it split into steps, oldest first; rows overwritten before a drain are lost and counted in `lost`.
`reset()` forgets everything (after a graph capture, whose warm-up steps are not traffic).

Invariant: within a step, rows keep the batch's token order (so `wisp.core.experts.recency` can order the step's
experts by their last token, as the pager does).
"""

from __future__ import annotations

import numpy as np
import torch


class RoutingLog:
    def __init__(self, moe_layer_ids: list[int], top_k: int, device: torch.device, capacity: int):
        """moe_layer_ids: the layers logged, in order; capacity: rows (tokens) kept, at least the largest step's
        tokens (the caller drains before it fills)."""
        self.index = {li: i for i, li in enumerate(moe_layer_ids)}
        self.first_layer, self.last_layer = moe_layer_ids[0], moe_layer_ids[-1]
        self.capacity = capacity
        self.ids = torch.full((capacity, len(moe_layer_ids), top_k), -1, dtype=torch.int64, device=device)
        self._where = torch.zeros(capacity, dtype=torch.int64, device=device)  # this step's rows' places
        self.step_of = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.rows = torch.zeros((), dtype=torch.int64, device=device)  # rows written
        self.steps = torch.zeros((), dtype=torch.int64, device=device)  # steps logged
        self._arange = torch.arange(capacity, device=device)
        self.read = 0  # rows already drained
        self.lost = 0

    def begin_step(self, batch) -> None:
        """A step begins (the runner tells every routing log; this one stamps steps by its own count)."""

    def record(self, layer: int, topk_ids: torch.Tensor) -> None:
        """One MoE layer's routed ids [T, K] of the current step (no host sync)."""
        index = self.index.get(layer)
        if index is None:
            return
        t = topk_ids.shape[0]
        where = self._where[:t]
        if layer == self.first_layer:
            torch.remainder(self.rows + self._arange[:t], self.capacity, out=where)  # [T]
        self.ids[:, index].index_copy_(0, where, topk_ids.to(torch.int64))
        if layer == self.last_layer:
            self.step_of.index_copy_(0, where, self.steps.expand(t).contiguous())
            self.rows.add_(t)
            self.steps.add_(1)

    def drain(self) -> list[np.ndarray]:
        """The steps logged since the last drain, each [T, L, K] (host), oldest first."""
        return [rows for _, rows in self.drain_numbered()]

    def drain_numbered(self) -> list[tuple[int, np.ndarray]]:
        """`drain`, each step with its number (steps logged before it since the last `reset`)."""
        written = int(self.rows)  # the one sync
        start = max(self.read, written - self.capacity)
        lost, self.read = start - self.read, written
        self.lost += lost
        if written == start:
            return []
        where = torch.arange(start, written, device=self.ids.device) % self.capacity
        ids, steps = self.ids[where].cpu().numpy().astype(np.int64), self.step_of[where].cpu().numpy()
        if lost:  # the oldest step may have lost its first rows to the wrap: drop what is left of it
            keep = steps != steps[0]
            ids, steps = ids[keep], steps[keep]
        if not len(ids):
            return []
        cuts = np.flatnonzero(np.diff(steps)) + 1
        return [(int(steps[at]), rows) for at, rows in zip(np.concatenate([[0], cuts]), np.split(ids, cuts))]

    def reset(self) -> None:
        self.rows.zero_()
        self.steps.zero_()
        self.read = 0
