"""ReplayBuffer: what every routing replay shares (benchmarks only): recorded trace rows on the host and the
device buffer the decoder's MoE layers read a step's replayed expert ids from.

A replay maps each token of a step to a trace row (or to none: the router's choice stands) and `load`s the
step: token i's row goes to row i of `buf` [max_rows, L, K] (int64, -1 = the router's choice), in the batch's
token order. `replayed(layer, tokens)` is `buf[:tokens, layer]`: rows of stride L*K, unit column stride, as
the route kernel's `override` reads them (`wisp.core.kernels.triton_router`); `ids(layer, topk_ids)` is the
same choice for the torch routing paths.

Invariants: `buf`'s address never changes, so the override works inside CUDA graphs (the runner re-captures
them when a replay is set); the trace's rows, and a row of -1 after them, are on the device (int16) from the
first `load`; `load` sends only each token's row index, through one pinned buffer rewritten once the previous
step's copy out of it is done (no wait on the device's compute), and gathers the rows into `buf` on the
device: one small copy and one gather a step. A step of more than `max_rows` tokens is a WispError. The host
rows are never written after construction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from wisp.errors import WispError


def check_trace_fits(ids: np.ndarray, moe_layer_ids: list[int], num_experts: int, top_k: int) -> None:
    """WispError unless a [T, L, K] trace matches the model's MoE layers, top_k and expert count."""
    if ids.ndim != 3 or ids.shape[1] != len(moe_layer_ids) or ids.shape[2] != top_k:
        layers, k = (ids.shape[1], ids.shape[2]) if ids.ndim == 3 else ("?", "?")
        raise WispError(f"routing trace has {layers} layers x top-{k}; the model has {len(moe_layer_ids)} MoE layers "
                        f"x top-{top_k}")
    if ids.size and ids.max() >= num_experts:
        raise WispError(f"routing trace names expert {int(ids.max())}; the model has {num_experts}")


def replayed_or_routed(rows: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """[T, K]: a token's replayed row where all its K ids are given (>= 0), else the router's `topk_ids`."""
    return torch.where((rows >= 0).all(dim=1, keepdim=True), rows, topk_ids)


class ReplayBuffer:
    def __init__(self, sequences: Sequence[np.ndarray], moe_layer_ids: list[int], num_experts: int, top_k: int,
                 device: torch.device, max_rows: int):
        """`sequences`: the trace's sequences, ids [T_s, L, K] each, kept one after another in `rows`;
        `starts[s]` is sequence s's first row there."""
        if not len(sequences) or not all(len(ids) for ids in sequences):
            raise WispError("a routing replay needs a trace of at least one token per sequence")
        self.rows = np.concatenate(sequences).astype(np.int64)  # [T, L, K]
        check_trace_fits(self.rows, moe_layer_ids, num_experts, top_k)
        self.lengths = np.array([len(ids) for ids in sequences])
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
        self.buf = torch.full((max_rows, len(moe_layer_ids), top_k), -1, dtype=torch.int64, device=device)
        self.layer_index = {li: i for i, li in enumerate(moe_layer_ids)}
        self._device_rows: torch.Tensor | None = None  # [T + 1, L, K], made by the first `load`
        self._staging: torch.Tensor | None = None  # pinned [max_rows] row indices (CUDA)
        self._staged = None  # the event of the last copy out of `_staging`

    def __len__(self) -> int:
        return self.rows.shape[0]

    def rows_at(self, index: np.ndarray) -> np.ndarray:
        """[n, L, K] host rows of `index` (rows of `rows`; -1: a row of -1, the router's choice)."""
        picked = self.rows[np.maximum(index, 0)]
        picked[index < 0] = -1
        return picked

    def token_rows(self, batch, rows_of) -> np.ndarray:
        """Each token of `batch` (its sequences' next `num_tokens`, in order) as a row of `rows` (or -1):
        `rows_of(seq, positions)` gives them for one sequence's tokens at those positions."""
        parts = [rows_of(seq, np.arange(seq.num_computed, seq.num_computed + n))
                 for seq, n in zip(batch.seqs, batch.num_tokens)]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def load(self, index: np.ndarray) -> None:
        """A step's rows into `buf`: token i routes as `rows_at(index)[i]`."""
        n = len(index)
        if n > self.buf.shape[0]:
            raise WispError(f"a step of {n} tokens exceeds the replay buffer's {self.buf.shape[0]} rows")
        if self._device_rows is None:  # the rows, then the row of -1 that index -1 reads (int16: expert ids < 2**15)
            gap = np.full((1, *self.rows.shape[1:]), -1, dtype=np.int64)
            self._device_rows = torch.from_numpy(np.concatenate([self.rows, gap]).astype(np.int16)).to(self.buf.device)
            if self.buf.device.type == "cuda":
                self._staging = torch.empty(self.buf.shape[0], dtype=torch.int64, pin_memory=True)
                self._staged = torch.cuda.Event()
        rows = torch.from_numpy(np.where(np.asarray(index) < 0, len(self.rows), index).astype(np.int64))
        if self._staging is not None:
            self._staged.synchronize()  # the previous step's copy has left the staging buffer
            self._staging[:n].copy_(rows)
            rows = self._staging[:n].to(self.buf.device, non_blocking=True)
            self._staged.record()
        self.buf[:n].copy_(torch.index_select(self._device_rows, 0, rows))  # widened to int64 in the copy

    def prefetch(self, seqs) -> None:
        """While a step computes: the next step's rows, where a replay knows them ahead (`RoutingReplay.prefetch`);
        here nothing: each step loads its own in `advance`."""

    def replayed(self, layer: int, tokens: int) -> torch.Tensor:
        return self.buf[:tokens, self.layer_index[layer]]  # [T, K]

    def ids(self, layer: int, topk_ids: torch.Tensor) -> torch.Tensor:
        return replayed_or_routed(self.replayed(layer, topk_ids.shape[0]), topk_ids)  # a row with a gap: the router's
