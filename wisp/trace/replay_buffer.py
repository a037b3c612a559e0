"""ReplayBuffer: what every routing replay shares (benchmarks only): recorded trace rows on the host and the
device buffer the decoder's MoE layers read a step's replayed expert ids from.

A replay maps each token of a step to a trace row (or to none: the router's choice stands) and `load`s the
step: token i's row goes to row i of `buf` [max_rows, L, K] (int64, -1 = the router's choice), in the batch's
token order. `replayed(layer, tokens)` is `buf[:tokens, layer]`: rows of stride L*K, unit column stride, as
the route kernel's `override` reads them (`wisp.core.kernels.triton_router`); `ids(layer, topk_ids)` is the
same choice for the torch routing paths.

Invariants: `buf`'s address never changes, so the override works inside CUDA graphs (the runner re-captures
them when a replay is set); `load` never waits for the device: on CUDA it sends the step's distinct rows
and each token's index among them from pinned memory (torch's caching host allocator keeps a pinned block
until the copy out of it is done) and gathers them into `buf` on the device; a step of more than
`max_rows` tokens is a WispError. The host rows are never written after construction.
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
        if len(index) > self.buf.shape[0]:
            raise WispError(f"a step of {len(index)} tokens exceeds the replay buffer's {self.buf.shape[0]} rows")
        distinct, where = np.unique(index, return_inverse=True)
        rows, where = self._to_device(self.rows_at(distinct)), self._to_device(where.reshape(-1).astype(np.int64))
        torch.index_select(rows, 0, where, out=self.buf[: len(index)])

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if self.buf.device.type != "cuda":
            return t.to(self.buf.device)
        return t.pin_memory().to(self.buf.device, non_blocking=True)

    def replayed(self, layer: int, tokens: int) -> torch.Tensor:
        return self.buf[:tokens, self.layer_index[layer]]  # [T, K]

    def ids(self, layer: int, topk_ids: torch.Tensor) -> torch.Tensor:
        return replayed_or_routed(self.replayed(layer, topk_ids.shape[0]), topk_ids)  # a row with a gap: the router's
