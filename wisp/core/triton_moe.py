"""`fused_moe` on the GPU in Triton, with the reference's signature and contract (`wisp.core.moe`).

Three launches:
1. `_gate_up_act`: one program per (token, k) pair and block of I rows reads the pair's expert through
   `expert_map` and computes silu(gate) * up in float32;
2. `_down`: one program per pair and block of D rows computes the pair's output rows in float32 (a pair
   whose expert has no slot, -1, is left as it is: `fused_moe` starts from zeros, so the term is skipped);
3. `_combine`: one program per (token, block of D) sums weight_k * y_k over k in routing order in
   float32 and casts to hidden's dtype (the contract of `combine_in_routing_order`, in one launch).

Each program reduces over a fixed sequence of fixed-size blocks, and no program reads another pair's
data, so a token's output depends only on its own row, routing and expert bytes: it is batch-invariant
and slot-invariant by construction (paged == resident bit for bit). Weights may be pinned host tensors
(zero-copy mode): they are read in place over PCIe through UVA (`wisp.core.uva`), with the same
arithmetic, so the bits match a device copy. The kernel is a per-pair GEMV, right for decode (a few
tokens); a prefill re-reads an expert once per token routed to it (from L2 when the pairs of one
expert run together).

FP8 block-scaled weights (`wisp.core.fp8_blocks`; `scales` given, FP8_BLOCK > 0) are dequantized in-kernel:
each weight tile is multiplied by its 128 x 128 block's float32 scale and rounded to hidden's dtype
(`_rounded`, to nearest even by the bits), exactly what the torch kernels do before their GEMMs, so an FP8
bank gives the bits of the bank of its dequantized weights, and only FP8 bytes (plus scales) are read.

The same two kernels have a one-expert form (`triton_pairs_of_one_expert`, ONE_EXPERT): programs walk
a list of pairs all routed to one expert whose weights sit at the given pointer (a slot, or a staging
buffer of `wisp.core.expert_major`). Per program the arithmetic is the same, so the bits are too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wisp.core.fp8_blocks import DEFAULT_BLOCK, FP8
from wisp.core.uva import device_view


@triton.jit
def _pair_and_slot(ids_ptr, map_ptr, pairs_ptr, ONE_EXPERT: tl.constexpr):
    """This program's (token, k) pair and its expert's slot. ONE_EXPERT: programs walk a list of pairs
    all routed to the single expert at the weight pointer (slot 0); else program i is pair i."""
    row = tl.program_id(0)
    if ONE_EXPERT:
        pair = tl.load(pairs_ptr + row)
        slot = row * 0
    else:
        pair = row
        slot = tl.load(map_ptr + tl.load(ids_ptr + pair))
    return row, pair, slot


@triton.jit
def _rounded(w, ROUND: tl.constexpr):
    """float32 w rounded to the compute dtype (ROUND: 0 float32, 1 bfloat16, 2 float16), back in float32.
    bfloat16 by its bits, to nearest even, as torch casts (Triton's interpreter truncates a plain cast)."""
    if ROUND == 1:
        bits = w.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        w = bits.to(tl.float32, bitcast=True)
    elif ROUND == 2:
        w = w.to(tl.float16).to(tl.float32)
    return w


@triton.jit
def _gate_up_act(x_ptr, w_ptr, ids_ptr, map_ptr, pairs_ptr, h_ptr, stride_ws, s_ptr, stride_ss, K: tl.constexpr,
                 D: tl.constexpr, I: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr,
                 ONE_EXPERT: tl.constexpr, FP8_BLOCK: tl.constexpr, ROUND: tl.constexpr):
    row, pair, slot = _pair_and_slot(ids_ptr, map_ptr, pairs_ptr, ONE_EXPERT)
    ib = tl.program_id(1)
    token = pair // K
    rows = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    row_ok = rows < I
    gate = tl.zeros((BLOCK_I,), dtype=tl.float32)
    up = tl.zeros((BLOCK_I,), dtype=tl.float32)
    if slot >= 0:
        w = w_ptr + slot.to(tl.int64) * stride_ws
        sc = s_ptr + slot.to(tl.int64) * stride_ss
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            col_ok = cols < D
            x = tl.load(x_ptr + token.to(tl.int64) * D + cols, mask=col_ok, other=0.0).to(tl.float32)
            mask = row_ok[:, None] & col_ok[None, :]
            wg = tl.load(w + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            wu = tl.load(w + (rows[:, None] + I) * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            if FP8_BLOCK > 0:  # dequantized as the torch kernels do: float32 product, rounded to x's dtype
                n_cols = (D + FP8_BLOCK - 1) // FP8_BLOCK
                at = (cols // FP8_BLOCK)[None, :]
                sg = tl.load(sc + (rows // FP8_BLOCK)[:, None] * n_cols + at, mask=mask, other=0.0)
                su = tl.load(sc + ((rows + I) // FP8_BLOCK)[:, None] * n_cols + at, mask=mask, other=0.0)
                wg = _rounded(wg * sg, ROUND)
                wu = _rounded(wu * su, ROUND)
            gate += tl.sum(wg * x[None, :], axis=1)
            up += tl.sum(wu * x[None, :], axis=1)
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + row.to(tl.int64) * I + rows, h, mask=row_ok)


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
def _down(h_ptr, w_ptr, ids_ptr, map_ptr, pairs_ptr, y_ptr, stride_ws, s_ptr, stride_ss, D: tl.constexpr,
          I: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_I: tl.constexpr, ONE_EXPERT: tl.constexpr,
          FP8_BLOCK: tl.constexpr, ROUND: tl.constexpr):
    row, pair, slot = _pair_and_slot(ids_ptr, map_ptr, pairs_ptr, ONE_EXPERT)
    db = tl.program_id(1)
    rows = db * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < D
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if slot >= 0:  # a pair without a slot is left as it is
        w = w_ptr + slot.to(tl.int64) * stride_ws
        sc = s_ptr + slot.to(tl.int64) * stride_ss
        for i0 in range(0, I, BLOCK_I):
            cols = i0 + tl.arange(0, BLOCK_I)
            col_ok = cols < I
            h = tl.load(h_ptr + row.to(tl.int64) * I + cols, mask=col_ok, other=0.0)
            mask = row_ok[:, None] & col_ok[None, :]
            wd = tl.load(w + rows[:, None] * I + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            if FP8_BLOCK > 0:  # dequantized as the torch kernels do (see _gate_up_act)
                n_cols = (I + FP8_BLOCK - 1) // FP8_BLOCK
                sd = tl.load(sc + (rows // FP8_BLOCK)[:, None] * n_cols + (cols // FP8_BLOCK)[None, :], mask=mask, other=0.0)
                wd = _rounded(wd * sd, ROUND)
            acc += tl.sum(wd * h[None, :], axis=1)
        tl.store(y_ptr + pair.to(tl.int64) * D + rows, acc, mask=row_ok)


BLOCK_I_GATE_UP, BLOCK_D_GATE_UP = 16, 256  # many short programs: a decode step has only t*k pairs
BLOCK_D_DOWN, BLOCK_I_DOWN = 64, 128
ROUND_IDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # `_rounded`'s codes for the compute dtype


def _check_dtypes(hidden: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, scales) -> None:
    want = FP8 if scales is not None else hidden.dtype
    if scales is not None and w_gate_up.dtype == torch.uint8:
        raise ValueError("MXFP4 experts run on the torch MoE backend (--moe-backend torch) for now: the Triton "
                         "kernels dequantize FP8 only")
    if w_gate_up.dtype != want or w_down.dtype != want:
        raise ValueError(f"expert weights ({w_gate_up.dtype}) must be {want} (hidden is {hidden.dtype}"
                         f"{', with FP8 block scales' if scales is not None else ''})")


def _launch(per_k, hidden, w_gate_up, w_down, ids, emap, pairs, rows: int, top_k: int, one_expert: bool,
            scales=None) -> None:
    """The two per-pair kernels over `rows` programs: per_k [T*K, D] float32 gets each pair's output.
    scales: (gate_up's, down's) FP8 block scales of float8 weights ([S, ...], or one expert's), else None."""
    d, inter = hidden.shape[1], w_down.shape[-1]
    if rows == 0:
        return
    dev = hidden.device
    block = DEFAULT_BLOCK[0] if scales is not None else 0
    round_to = ROUND_IDS[hidden.dtype]
    s_gate_up, s_down = scales if scales is not None else (w_gate_up, w_down)  # unread without FP8_BLOCK

    def stride0(t: torch.Tensor) -> int:
        return t.stride(0) if not one_expert else 0

    h = torch.empty((rows, inter), dtype=torch.float32, device=dev)
    _gate_up_act[(rows, triton.cdiv(inter, BLOCK_I_GATE_UP))](
        hidden, device_view(w_gate_up, dev), ids, emap, pairs, h, stride0(w_gate_up), device_view(s_gate_up, dev),
        stride0(s_gate_up), K=top_k, D=d, I=inter, BLOCK_I=BLOCK_I_GATE_UP, BLOCK_D=BLOCK_D_GATE_UP,
        ONE_EXPERT=one_expert, FP8_BLOCK=block, ROUND=round_to,
    )
    _down[(rows, triton.cdiv(d, BLOCK_D_DOWN))](
        h, device_view(w_down, dev), ids, emap, pairs, per_k, stride0(w_down), device_view(s_down, dev),
        stride0(s_down), D=d, I=inter, BLOCK_D=BLOCK_D_DOWN, BLOCK_I=BLOCK_I_DOWN, ONE_EXPERT=one_expert,
        FP8_BLOCK=block, ROUND=round_to,
    )


def triton_pairs_by_map(per_k, hidden, w_gate_up, w_down, topk_ids, expert_map, scales=None) -> None:
    """`wisp.core.moe.pairs_by_map` in Triton: per_k [T*K, D] float32 gets every pair whose expert has a
    slot in expert_map [N] (None: identity); the other pairs are left as they are."""
    t, k = topk_ids.shape
    _check_dtypes(hidden, w_gate_up, w_down, scales)
    if expert_map is None:
        expert_map = torch.arange(w_gate_up.shape[0], dtype=torch.int32, device=hidden.device)
    ids = topk_ids.reshape(-1).contiguous()  # any integer dtype: the kernels load it as it is
    emap = expert_map.to(torch.int32).contiguous()
    _launch(per_k, hidden.contiguous(), w_gate_up.contiguous(), w_down.contiguous(), ids, emap, ids, t * k, k, False,
            _contiguous(scales))


def triton_pairs_of_one_expert(per_k, hidden, w_gate_up, w_down, pairs, top_k: int, scales=None) -> None:
    """`wisp.core.moe.pairs_of_one_expert` in Triton: w_gate_up [2I, D] and w_down [D, I] are one
    expert's weights (a slot or a staging buffer); pairs [M] the flat pair indices routed to it."""
    _check_dtypes(hidden, w_gate_up, w_down, scales)
    pairs = pairs.contiguous()
    _launch(per_k, hidden.contiguous(), w_gate_up.contiguous(), w_down.contiguous(), pairs, pairs, pairs, pairs.numel(),
            top_k, True, _contiguous(scales))


def _contiguous(scales):
    return None if scales is None else tuple(t.contiguous() for t in scales)


def triton_combine(per_k: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`wisp.core.moe.combine_in_routing_order` in one launch: per_k [T, K, D] float32 -> [T, D] dtype."""
    t, k, d = per_k.shape
    out = torch.empty((t, d), dtype=dtype, device=per_k.device)
    _combine[(t, triton.cdiv(d, 1024))](per_k, topk_weights.contiguous(), out, K=k, D=d, BLOCK_D=1024)
    return out


def triton_fused_moe(
    hidden: torch.Tensor,  # [T, D]
    w_gate_up: torch.Tensor,  # [S, 2I, D]
    w_down: torch.Tensor,  # [S, D, I]
    topk_ids: torch.Tensor,  # [T, K]
    topk_weights: torch.Tensor,  # [T, K]
    expert_map: torch.Tensor | None = None,  # [N] int32, logical -> slot or -1
    scales=None,  # FP8 block scales ([S, ...] of gate_up, of down) of float8 weights: dequantized in-kernel
) -> torch.Tensor:
    t, k = topk_ids.shape
    per_k = torch.zeros((t * k, hidden.shape[1]), dtype=torch.float32, device=hidden.device)  # [T*K, D]
    triton_pairs_by_map(per_k, hidden, w_gate_up, w_down, topk_ids, expert_map, scales)
    return triton_combine(per_k.view(t, k, -1), topk_weights, hidden.dtype)
