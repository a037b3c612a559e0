"""`RankShareCaptured`: the rank share's graph-safe part (`wisp.core.experts.rank_share`): the host and device
buffers one MoE layer's share runs through, `send` (the rows and routing to the host at the end of a piece's
graph), `gpu_pairs` (the GPU's pairs, its own graph), `rows_in` and `merge` (the head of the next piece's graph),
and the device scalar n (`set_share`). Nothing here waits on the host.
"""

from __future__ import annotations

import torch

from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.kernels.expert_extras import extras_of


class RankShareCaptured:
    def __init__(self, store, max_batch: int, top_k: int, hidden: torch.Tensor):
        """`store`: an `ExpertStore` whose `rank_share` holds (its masters, kernels, CPU server, counters);
        `hidden`: a row like the experts' input (its width, dtype and device)."""
        self.store, self.top_k = store, top_k
        device, d = hidden.device, hidden.shape[-1]
        pinned = device.type == "cuda"
        n = store.num_experts
        self.cpu_share = torch.zeros((), dtype=torch.int64, device=device)  # n: ranks below it are the CPU's
        self._share = 0  # its value, as last set
        self.expert_map = torch.cat([store.residency.in_place_map, torch.full((1,), -1, dtype=torch.int32, device=device)])  # [N+1]
        self.placeholder = n  # the CPU's pairs' id on the GPU: no slot
        self.ranks = torch.arange(top_k, device=device)  # [K]
        self.hidden_host = torch.zeros((max_batch, d), dtype=hidden.dtype, pin_memory=pinned)
        self.ids_host = torch.zeros((max_batch, top_k), dtype=torch.int64, pin_memory=pinned)
        self.rows_host = torch.zeros((max_batch, top_k, d), dtype=torch.float32, pin_memory=pinned)
        self.rows = torch.zeros((max_batch, top_k, d), dtype=torch.float32, device=device)  # the CPU's, on the device
        self.hot = store.hot  # a `HotExperts` or None: those experts' pairs are the GPU's, from its bank
        # with hot experts the CPU gets the routing with their ids -1 (its kernels skip them); the raw ids still
        # come for the counts, and `live[r]` is the share of recent pairs of rank r that were not hot (the
        # prediction's: the most-routed experts are mostly the first ranks, the CPU's)
        self.cpu_ids_host = (torch.zeros((max_batch, top_k), dtype=torch.int64, pin_memory=pinned)
                             if self.hot is not None else self.ids_host)

    def send(self, hidden: torch.Tensor, topk_ids: torch.Tensor) -> None:
        """The experts' input rows [B, D] and the routing [B, K] to the host buffers (no wait)."""
        b = hidden.shape[0]
        self.hidden_host[:b].copy_(hidden, non_blocking=True)
        self.ids_host[:b].copy_(topk_ids, non_blocking=True)
        if self.hot is not None:
            self.cpu_ids_host[:b].copy_(torch.where(self._hot_pairs(topk_ids), -1, topk_ids), non_blocking=True)

    def _hot_pairs(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """[B, K] bool: the pairs whose expert is hot (held in the device bank)."""
        return self.hot.slot_map[topk_ids] >= 0

    def gpu_pairs(self, hidden: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """The GPU's pairs: the hot experts' from the bank, the others of rank >= n read in place: [B*K, D]
        float32, the CPU's pairs left zero."""
        b, k = topk_ids.shape
        ids = torch.where(self.ranks < self.cpu_share, self.placeholder, topk_ids)  # [B, K]
        per_k = torch.zeros((b * k, hidden.shape[1]), dtype=torch.float32, device=hidden.device)  # [B*K, D]
        if self.hot is not None:
            bank = self.hot.bank
            self.store.kernels.pairs_by_map(per_k, hidden, bank[GATE_UP], bank[DOWN], topk_ids, self.hot.slot_map,
                                            extras=extras_of(bank))
            ids = torch.where(self._hot_pairs(topk_ids), self.placeholder, ids)
        host = self.store.host
        self.store.kernels.pairs_by_map(per_k, hidden, host[GATE_UP], host[DOWN], ids, self.expert_map,
                                        extras=extras_of(host))
        return per_k

    def merge(self, per_k: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              dtype: torch.dtype) -> torch.Tensor:
        """The CPU's rows in their pairs' places, then the sum over k in routing order: [B, D]."""
        b, k = topk_weights.shape
        on_cpu = (self.ranks < self.cpu_share).view(1, k, 1)
        if self.hot is not None:
            on_cpu = on_cpu & ~self._hot_pairs(topk_ids).unsqueeze(-1)  # [B, K, 1]
        per = torch.where(on_cpu, self.rows[:b], per_k.view(b, k, -1))  # [B, K, D]
        return self.store.kernels.combine(per, topk_weights, dtype)

    def rows_in(self, b: int) -> None:
        """The host rows to the device buffer `merge` reads (graph-safe: a copy from pinned memory, stream
        ordered). Rows of ranks the CPU did not compute are copied too; `merge` does not take them."""
        self.rows[:b].copy_(self.rows_host[:b], non_blocking=True)

    def set_share(self, n: int) -> None:
        """Ranks below n go to the CPU from the next step on (one fill launch when it changes)."""
        if not 0 <= n <= self.top_k:
            raise ValueError(f"cpu share must be within 0..{self.top_k}, got {n}")
        if n != self._share:
            self.cpu_share.fill_(n)
            self._share = n
