"""WorkingSets: each running request's expert working set per MoE layer, and the joint set of a decode set.

A request's working set at a layer is the set of experts its last `window` decode tokens routed to there, kept
as a boolean mask [L, N], so the joint working set of a candidate decode set is the OR of its members' masks and
its size per layer a sum.

Only decode tokens count: a prefill chunk routes a whole prompt and says little about the experts decode will use.

Invariants: a request's ring holds its decode rows in the order they ran, at most `window` of them; `mask` is a
function of that ring alone; a request never observed is unknown (`known` False), and `forget`
makes it unknown again.
"""

from __future__ import annotations

import numpy as np


class WorkingSets:
    def __init__(self, num_layers: int, num_experts: int, top_k: int, window: int = 8):
        if window < 2:
            raise ValueError(f"a working-set window needs at least 2 steps, got {window}")
        self.num_layers, self.num_experts, self.top_k, self.window = num_layers, num_experts, top_k, window
        self._rings: dict[str, np.ndarray] = {}  # request -> [rows, L, K] int16, oldest first, at most `window`
        self._masks: dict[str, np.ndarray] = {}  # cached `mask` per request, dropped when its ring changes

    def observe(self, request_id: str, rows: np.ndarray) -> None:
        """`rows` [T, L, K]: request_id's next T decode tokens' routed ids, in order (-1 entries are ignored)."""
        rows = np.asarray(rows, dtype=np.int16)
        if rows.ndim != 3 or rows.shape[1:] != (self.num_layers, self.top_k):
            raise ValueError(f"rows must be [T, {self.num_layers}, {self.top_k}], got {rows.shape}")
        ring = self._rings.get(request_id)
        ring = rows if ring is None else np.concatenate([ring, rows])
        self._rings[request_id] = ring[-self.window:]
        self._masks.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        for table in (self._rings, self._masks):
            table.pop(request_id, None)

    def known(self, request_id: str) -> bool:
        return request_id in self._rings

    def steps(self, request_id: str) -> int:
        """Decode tokens in its window (0: unknown)."""
        ring = self._rings.get(request_id)
        return 0 if ring is None else ring.shape[0]

    def mask(self, request_id: str) -> np.ndarray | None:
        """[L, N] bool: the experts request_id's window routed to, per layer (None: unknown)."""
        if request_id not in self._rings:
            return None
        if request_id not in self._masks:
            self._masks[request_id] = self._onehot(self._rings[request_id]).any(axis=0)
        return self._masks[request_id]

    def joint_size(self, request_ids) -> np.ndarray:
        """[L] int: experts the known requests among request_ids route to jointly, per layer."""
        masks = [m for r in request_ids if (m := self.mask(r)) is not None]
        if not masks:
            return np.zeros(self.num_layers, dtype=np.int64)
        return np.logical_or.reduce(masks).sum(axis=1)

    def _onehot(self, ring: np.ndarray) -> np.ndarray:
        """ring [T, L, K] -> [T, L, N] bool (-1 entries dropped)."""
        t = ring.shape[0]
        hot = np.zeros((t, self.num_layers, self.num_experts + 1), dtype=bool)  # the last column takes the -1s
        step, layer = np.indices(ring.shape[:2])
        hot[step[..., None], layer[..., None], ring.astype(np.int64)] = True
        return hot[..., : self.num_experts]
