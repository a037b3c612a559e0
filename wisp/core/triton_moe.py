"""`fused_moe` on the GPU in Triton, with the reference's signature and contract (`wisp.core.moe`).

Three launches:
1. `_gate_up_act`: one program per (token, k) pair and block of I rows reads the pair's expert through
   `expert_map` (a -1 slot writes zeros: the term is skipped) and computes silu(gate) * up in float32;
2. `_down`: one program per pair and block of D rows computes the pair's output rows in float32;
3. `_combine`: one program per (token, block of D) sums weight_k * y_k over k in routing order in
   float32 and casts to hidden's dtype (the contract of `combine_in_routing_order`, in one launch).

Each program reduces over a fixed sequence of fixed-size blocks, and no program reads another pair's
data, so a token's output depends only on its own row, routing and expert bytes: it is batch-invariant
and slot-invariant by construction (paged == resident bit for bit). Weights may be pinned host tensors
(zero-copy mode): they are read in place over PCIe through UVA (`wisp.core.uva`), with the same
arithmetic, so the bits match a device copy. The kernel is a per-pair GEMV, right for decode (a few
tokens); a prefill re-reads an expert once per token routed to it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wisp.core.uva import device_view


@triton.jit
def _gate_up_act(x_ptr, w_ptr, ids_ptr, map_ptr, h_ptr, stride_ws, K: tl.constexpr, D: tl.constexpr, I: tl.constexpr,
                 BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr):
    pair = tl.program_id(0)
    ib = tl.program_id(1)
    token = pair // K
    slot = tl.load(map_ptr + tl.load(ids_ptr + pair))
    rows = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    row_ok = rows < I
    gate = tl.zeros((BLOCK_I,), dtype=tl.float32)
    up = tl.zeros((BLOCK_I,), dtype=tl.float32)
    if slot >= 0:
        w = w_ptr + slot.to(tl.int64) * stride_ws
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            col_ok = cols < D
            x = tl.load(x_ptr + token.to(tl.int64) * D + cols, mask=col_ok, other=0.0).to(tl.float32)
            mask = row_ok[:, None] & col_ok[None, :]
            wg = tl.load(w + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            wu = tl.load(w + (rows[:, None] + I) * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            gate += tl.sum(wg * x[None, :], axis=1)
            up += tl.sum(wu * x[None, :], axis=1)
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + pair.to(tl.int64) * I + rows, h, mask=row_ok)


@triton.jit
def _combine(y_ptr, w_ptr, out_ptr, K: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = cols < D
    base = token.to(tl.int64) * K
    acc = tl.load(y_ptr + base * D + cols, mask=ok, other=0.0) * tl.load(w_ptr + base).to(tl.float32)
    for j in range(1, K):
        acc = acc + tl.load(y_ptr + (base + j) * D + cols, mask=ok, other=0.0) * tl.load(w_ptr + base + j).to(tl.float32)
    tl.store(out_ptr + token.to(tl.int64) * D + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _down(h_ptr, w_ptr, ids_ptr, map_ptr, y_ptr, stride_ws, D: tl.constexpr, I: tl.constexpr, BLOCK_D: tl.constexpr,
          BLOCK_I: tl.constexpr):
    pair = tl.program_id(0)
    db = tl.program_id(1)
    slot = tl.load(map_ptr + tl.load(ids_ptr + pair))
    rows = db * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < D
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if slot >= 0:
        w = w_ptr + slot.to(tl.int64) * stride_ws
        for i0 in range(0, I, BLOCK_I):
            cols = i0 + tl.arange(0, BLOCK_I)
            col_ok = cols < I
            h = tl.load(h_ptr + pair.to(tl.int64) * I + cols, mask=col_ok, other=0.0)
            wd = tl.load(w + rows[:, None] * I + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            acc += tl.sum(wd.to(tl.float32) * h[None, :], axis=1)
    tl.store(y_ptr + pair.to(tl.int64) * D + rows, acc, mask=row_ok)


def triton_fused_moe(
    hidden: torch.Tensor,  # [T, D]
    w_gate_up: torch.Tensor,  # [S, 2I, D]
    w_down: torch.Tensor,  # [S, D, I]
    topk_ids: torch.Tensor,  # [T, K]
    topk_weights: torch.Tensor,  # [T, K]
    expert_map: torch.Tensor | None = None,  # [N] int32, logical -> slot or -1
) -> torch.Tensor:
    t, k = topk_ids.shape
    d, inter = hidden.shape[1], w_down.shape[2]
    if expert_map is None:
        expert_map = torch.arange(w_gate_up.shape[0], dtype=torch.int32, device=hidden.device)
    if w_gate_up.dtype != hidden.dtype or w_down.dtype != hidden.dtype:
        raise ValueError(f"expert weights ({w_gate_up.dtype}) and hidden ({hidden.dtype}) must share a dtype")
    hidden, w_gate_up, w_down = hidden.contiguous(), w_gate_up.contiguous(), w_down.contiguous()
    ids = topk_ids.reshape(-1).contiguous()  # any integer dtype: the kernels load it as it is
    emap = expert_map.to(torch.int32).contiguous()
    h = torch.empty((t * k, inter), dtype=torch.float32, device=hidden.device)
    y = torch.empty((t * k, d), dtype=torch.float32, device=hidden.device)
    block_i, block_d = 16, 256  # many short programs: a decode step has only t*k pairs
    _gate_up_act[(t * k, triton.cdiv(inter, block_i))](
        hidden, device_view(w_gate_up, hidden.device), ids, emap, h, w_gate_up.stride(0), K=k, D=d, I=inter, BLOCK_I=block_i,
        BLOCK_D=block_d,
    )
    _down[(t * k, triton.cdiv(d, 64))](h, device_view(w_down, hidden.device), ids, emap, y, w_down.stride(0), D=d, I=inter,
                                       BLOCK_D=64, BLOCK_I=128)
    out = torch.empty_like(hidden)
    _combine[(t, triton.cdiv(d, 1024))](y, topk_weights.contiguous(), out, K=k, D=d, BLOCK_D=1024)
    return out
