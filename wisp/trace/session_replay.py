"""SessionRoutingReplay: recorded routing for every token of every request, each session reading the
trace from its own offset (benchmarks only, clearly labelled).

A trace holds T tokens x L MoE layers x K routed experts (`RoutingTrace`). A request registered with
`assign(request_id, offset)` routes the token at position p (prompt or output) as trace row
(offset + p) mod T, in every layer, prefill and decode alike. Turns of one agent session share an offset,
so a prompt that extends the previous turn's routes its shared prefix exactly as before (as the same
tokens would in a real model), and concurrent sessions with different offsets never share a stream. A
request never assigned, or a trace row with a missing (-1) entry, keeps the router's choice for that token.

Before each step the runner calls `advance(batch)`: the step's rows, in the batch's token order, go to a
device buffer of `max_tokens` rows whose address never changes, so the override works inside CUDA
graphs; `last_rows` keeps the same rows on the host for whoever wants to know the step's routing without
reading the device (the live split controller).

Replayed routing measures what a real model's expert reuse does to the pager with random weights; the
tokens it produces mean nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from wisp.errors import WispError
from wisp.trace.format import RoutingTrace


def check_trace_fits(ids: np.ndarray, moe_layer_ids: list[int], num_experts: int, top_k: int) -> None:
    """WispError unless a [T, L, K] trace matches the model's MoE layers, top_k and expert count."""
    if ids.ndim != 3 or ids.shape[1] != len(moe_layer_ids) or ids.shape[2] != top_k:
        layers, k = (ids.shape[1], ids.shape[2]) if ids.ndim == 3 else ("?", "?")
        raise WispError(f"routing trace has {layers} layers x top-{k}; the model has {len(moe_layer_ids)} MoE layers "
                        f"x top-{top_k}")
    if ids.max() >= num_experts:
        raise WispError(f"routing trace names expert {int(ids.max())}; the model has {num_experts}")


class SessionRoutingReplay:
    def __init__(self, trace: RoutingTrace, moe_layer_ids: list[int], num_experts: int, top_k: int,
                 device: torch.device, max_tokens: int):
        rows = np.asarray(trace.ids).astype(np.int64)  # [T, L, K]
        check_trace_fits(rows, moe_layer_ids, num_experts, top_k)
        self.rows = rows
        self.buf = torch.full((max_tokens, len(moe_layer_ids), top_k), -1, dtype=torch.int64, device=device)
        self.layer_index = {li: i for i, li in enumerate(moe_layer_ids)}
        self.offsets: dict[str, int] = {}
        self.last_rows: np.ndarray | None = None  # [T, L, K] of the step that began last

    def __len__(self) -> int:
        return self.rows.shape[0]

    def assign(self, request_id: str, offset: int) -> None:
        """Route `request_id`'s token at position p by trace row (offset + p) mod T."""
        self.offsets[request_id] = offset

    def forget(self, request_id: str) -> None:
        self.offsets.pop(request_id, None)

    def advance(self, batch) -> None:
        """A step begins: its tokens' rows (each sequence's next `n` positions) into the device buffer."""
        parts = []
        for seq, n in zip(batch.seqs, batch.num_tokens):
            offset = self.offsets.get(seq.request_id)
            if offset is None:
                parts.append(np.full((n, *self.rows.shape[1:]), -1, dtype=np.int64))
            else:
                positions = np.arange(seq.num_computed, seq.num_computed + n)
                parts.append(self.rows[(offset + positions) % len(self)])
        rows = np.concatenate(parts) if parts else self.rows[:0]
        if len(rows) > self.buf.shape[0]:
            raise WispError(f"a step of {len(rows)} tokens exceeds the replay buffer's {self.buf.shape[0]} rows")
        self.buf[: len(rows)].copy_(torch.from_numpy(rows))
        self.last_rows = rows

    def replayed(self, layer: int, tokens: int) -> torch.Tensor:
        return self.buf[:tokens, self.layer_index[layer]]  # [T, K]

    def ids(self, layer: int, topk_ids: torch.Tensor) -> torch.Tensor:
        return replayed_or_routed(self.replayed(layer, topk_ids.shape[0]), topk_ids)  # a row with a gap: the router's


def replayed_or_routed(rows: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """[T, K]: a token's replayed row where all its K ids are given (>= 0), else the router's `topk_ids`."""
    return torch.where((rows >= 0).all(dim=1, keepdim=True), rows, topk_ids)
