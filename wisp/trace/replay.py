"""RoutingReplay: recorded expert choices in place of the router's (benchmarks only, clearly labelled).

A trace of T tokens x L MoE layers x K (`RoutingTrace`) is replayed one token per engine step. Set it
with `engine.runner.set_routing_replay(replay)`: before each step the runner calls `advance(batch)`, which
writes the next token's ids into a device buffer [L, K], and the decoder's MoE layers use them (`ids`)
in place of top-k; the mixing weights are the router's
probabilities at those experts. While inactive the buffer holds -1 and the router's choice stands, so
a prefill runs on real routing; a trace row with a missing (-1) entry also leaves the router's choice.
The buffer's address never changes: the override works inside CUDA graphs (the runner re-captures them
when the replay is set, so set it while the engine holds no request).

Replayed routing measures what a real model's expert reuse does to the pager with random weights; the
tokens it produces mean nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from wisp.trace.format import RoutingTrace
from wisp.trace.session_replay import check_trace_fits, replayed_or_routed


class RoutingReplay:
    def __init__(self, trace: RoutingTrace, moe_layer_ids: list[int], num_experts: int, top_k: int, device: torch.device):
        ids = np.asarray(trace.ids)  # [T, L, K]
        check_trace_fits(ids, moe_layer_ids, num_experts, top_k)
        self.rows = torch.from_numpy(ids.astype(np.int64))  # pinned on CUDA: each step's row copied without a wait
        if device.type == "cuda":
            self.rows = self.rows.pin_memory()
        self.buf = torch.full((len(moe_layer_ids), top_k), -1, dtype=torch.int64, device=device)
        self.layer_index = {li: i for i, li in enumerate(moe_layer_ids)}
        self.position = 0
        self.active = False

    def __len__(self) -> int:
        return self.rows.shape[0]

    def advance(self, batch=None) -> None:
        """A step begins (whatever its batch): load the next trace token (wrapping around) while active, else -1 (router's ids)."""
        if self.active:
            self.buf.copy_(self.rows[self.position % len(self)], non_blocking=True)  # the pinned trace stays
            self.position += 1
        else:
            self.buf.fill_(-1)

    def replayed(self, layer: int, tokens: int) -> torch.Tensor:
        return self.buf[self.layer_index[layer]].expand(tokens, -1)  # [T, K]: every token the step's row

    def ids(self, layer: int, topk_ids: torch.Tensor) -> torch.Tensor:
        return replayed_or_routed(self.replayed(layer, topk_ids.shape[0]), topk_ids)
