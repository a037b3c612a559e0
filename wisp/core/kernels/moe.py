"""The fused-MoE function: the PyTorch reference (CPU and CUDA) and the oracle for faster kernels.

`fused_moe(hidden, w_gate_up, w_down, topk_ids, topk_weights, expert_map)` computes, for every token t,

    out[t] = sum over k = 0..K-1, in routing order, of topk_weights[t, k] * expert(topk_ids[t, k])(hidden[t])
    expert(e)(x) = w_down[s] @ act(gate, up) (+ down bias),  [gate; up] = w_gate_up[s] @ x (+ gate_up bias),
    s = expert_map[e], act = silu(gate) * up unless another `Activation` is given (GPT-OSS)

Weights are indexed by *slot*: `expert_map` [N] maps a logical expert id to the slot holding its bytes
(-1: not present, and that term is skipped). Invariants:
- the result does not depend on which slot holds which expert, nor on the other tokens in the call
  (expert GEMMs run on fixed row tiles, see `wisp.core.kernels.rows`), so paged, resident and offloaded
  layouts give torch.equal outputs for the same routing;
- the sum over k is taken in float32 in routing order, then cast to hidden's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wisp.core.kernels.expert_extras import SILU, Activation, ExpertExtras, extras_at
from wisp.core.kernels.quantized_weights import dequantize_expert
from wisp.core.kernels.rows import map_row_tiles, tile_linear


def expert_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, extras: ExpertExtras | None = None,
               activation: Activation = SILU) -> torch.Tensor:
    """One expert on rows x [M, D]: w_gate_up [2I, D], w_down [D, I] -> [M, D] (row-invariant). `extras`
    (`wisp.core.kernels.expert_extras`): quantized weights' scales (FP8, MXFP4 or Q8_0, dequantized to x's dtype
    first) and biases, each added to its GEMM's output in x's dtype."""
    w_gate_up, w_down = dequantize_expert(w_gate_up, w_down, extras, x.dtype)
    b_gate_up, b_down = (None, None) if extras is None else (extras.gate_up_bias, extras.down_bias)

    def tile_fn(tile: torch.Tensor) -> torch.Tensor:
        gate, up = tile_linear(tile, w_gate_up, b_gate_up).chunk(2, dim=-1)  # [R, I] each
        return tile_linear(activation(gate, up), w_down, b_down)  # [R, D]

    return map_row_tiles(x, tile_fn)


def fused_moe(
    hidden: torch.Tensor,  # [T, D]
    w_gate_up: torch.Tensor,  # [S, 2I, D]
    w_down: torch.Tensor,  # [S, D, I]
    topk_ids: torch.Tensor,  # [T, K] logical expert ids
    topk_weights: torch.Tensor,  # [T, K]
    expert_map: torch.Tensor | None = None,  # [N] int, logical -> slot or -1; None = identity
    extras: ExpertExtras | None = None,  # the bank's scales and biases ([S, ...]); None: plain weights
    activation: Activation = SILU,
    count=None,  # a `wisp.core.kernels.step_count.StepCount` (CUDA or Triton's interpreter): the step is added to it
) -> torch.Tensor:
    if count is not None:
        from wisp.core.kernels.triton_step_count import count_step

        count_step(count, topk_ids)
    return fused_from_pairs(pairs_by_map, combine_in_routing_order, hidden, w_gate_up, w_down, topk_ids, topk_weights,
                            expert_map, extras, activation)


def fused_from_pairs(pairs_fn, combine_fn, hidden, w_gate_up, w_down, topk_ids, topk_weights, expert_map, extras,
                     activation) -> torch.Tensor:
    """A whole MoE step as a backend computes it: every (token, k) pair into [T*K, D] float32 (`pairs_fn`, a
    `pairs_by_map`), then the sum over k in routing order (`combine_fn`): [T, D] in hidden's dtype."""
    t, k = topk_ids.shape
    per_k = torch.zeros((t * k, hidden.shape[1]), dtype=torch.float32, device=hidden.device)  # [T*K, D]
    pairs_fn(per_k, hidden, w_gate_up, w_down, topk_ids, expert_map, extras, activation)
    return combine_fn(per_k.view(t, k, -1), topk_weights, hidden.dtype)


def pairs_by_map(
    per_k: torch.Tensor,  # [T*K, D] float32, written for the pairs whose expert has a slot
    hidden: torch.Tensor,  # [T, D]
    w_gate_up: torch.Tensor,  # [S, 2I, D]
    w_down: torch.Tensor,  # [S, D, I]
    topk_ids: torch.Tensor,  # [T, K]
    expert_map: torch.Tensor | None,  # [N] logical -> slot or -1 (pair left as it is); None = identity
    extras: ExpertExtras | None = None,  # [S, ...] (see fused_moe)
    activation: Activation = SILU,
) -> None:
    """Each routed (token, k) pair's expert output, from the slot `expert_map` gives its expert."""
    k = topk_ids.shape[1]
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)  # (t, k) pairs grouped by expert, token order inside
    experts, counts = torch.unique(flat_ids, return_counts=True)
    slots = expert_map[experts].to(experts.dtype) if expert_map is not None else experts
    plan = torch.stack([experts, counts, slots]).tolist()  # the one host read of the call
    start = 0
    for expert, count, slot in zip(*plan):
        pairs = order[start : start + count]
        start += count
        if slot >= 0:
            pairs_of_one_expert(per_k, hidden, w_gate_up[slot], w_down[slot], pairs, k, extras_at(extras, slot),
                                activation)


def pairs_of_one_expert(
    per_k: torch.Tensor,  # [T*K, D] float32
    hidden: torch.Tensor,  # [T, D]
    w_gate_up: torch.Tensor,  # [2I, D]: one expert's weights (a slot, or a staging buffer)
    w_down: torch.Tensor,  # [D, I]
    pairs: torch.Tensor,  # [M] flat pair indices t * K + k routed to that expert
    top_k: int,
    extras: ExpertExtras | None = None,  # that expert's scales and biases, if any
    activation: Activation = SILU,
) -> None:
    """per_k[pairs] = the expert's output for each pair's token (the same bits as `fused_moe`'s)."""
    per_k[pairs] = expert_mlp(hidden[pairs // top_k], w_gate_up, w_down, extras, activation).float()


def combine_in_routing_order(per_k: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """sum_k weights[:, k] * per_k[:, k] in float32, k = 0..K-1 in order, cast to dtype: [T, K, D] -> [T, D].
    Elementwise in a fixed order, so each token's sum never depends on the batch (the Triton `_combine`
    kernel follows the same order; tests use this as its oracle)."""
    weights = topk_weights.float()
    out = per_k[:, 0] * weights[:, :1]
    for j in range(1, per_k.shape[1]):
        out = out + per_k[:, j] * weights[:, j : j + 1]
    return out.to(dtype)


def reference_moe(
    hidden: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """Token-by-token float64 oracle (no slots, no tiles): for tests of fused_moe and faster kernels."""
    out = torch.zeros(hidden.shape, dtype=torch.float64, device=hidden.device)
    for t in range(hidden.shape[0]):
        x = hidden[t].double()
        for e, w in zip(topk_ids[t].tolist(), topk_weights[t].double()):
            gate, up = (w_gate_up[e].double() @ x).chunk(2)
            out[t] += w * (w_down[e].double() @ (F.silu(gate) * up))
    return out
