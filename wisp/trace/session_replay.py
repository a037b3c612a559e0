"""SessionRoutingReplay: recorded routing for every token of every request, each session reading the
trace from its own offset (benchmarks only, clearly labelled).

A trace holds T tokens x L MoE layers x K routed experts (`RoutingTrace`). A request registered with
`assign(request_id, offset)` routes the token at position p (prompt or output) as trace row
(offset + p) mod T, in every layer, prefill and decode alike. Turns of one agent session share an offset,
so a prompt that extends the previous turn's routes its shared prefix exactly as before (as the same
tokens would in a real model), and concurrent sessions with different offsets never share a stream. A
request never assigned, or a trace row with a missing (-1) entry, keeps the router's choice for that token.

Before each step the runner calls `advance(batch)`: the step's rows, in the batch's token order, go to the
fixed-address device buffer of `ReplayBuffer` (`max_tokens` rows), so the override works inside CUDA graphs;
`last_rows` keeps the same rows on the host for whoever wants to know the step's routing without reading the
device (the live split controller). (`RoutingReplay` is the other policy: each request its own trace
sequence, from its first output token.)

Replayed routing measures what a real model's expert reuse does to the pager with random weights; the
tokens it produces mean nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from wisp.trace.format import RoutingTrace
from wisp.trace.replay_buffer import ReplayBuffer


class SessionRoutingReplay(ReplayBuffer):
    def __init__(self, trace: RoutingTrace, moe_layer_ids: list[int], num_experts: int, top_k: int,
                 device: torch.device, max_tokens: int):
        super().__init__([np.asarray(trace.ids)], moe_layer_ids, num_experts, top_k, device, max_tokens)
        self.offsets: dict[str, int] = {}
        self.last_rows: np.ndarray | None = None  # [T, L, K] of the step that began last

    def assign(self, request_id: str, offset: int) -> None:
        """Route `request_id`'s token at position p by trace row (offset + p) mod T."""
        self.offsets[request_id] = offset

    def forget(self, request_id: str) -> None:
        self.offsets.pop(request_id, None)

    def advance(self, batch) -> None:
        """A step begins: its tokens' rows (each sequence's next `n` positions) into the device buffer."""
        index = self.token_rows(batch, self._rows_of)
        self.load(index)
        self.last_rows = self.rows_at(index)

    def _rows_of(self, seq, positions: np.ndarray) -> np.ndarray:
        offset = self.offsets.get(seq.request_id)
        return np.full(len(positions), -1) if offset is None else (offset + positions) % len(self)
