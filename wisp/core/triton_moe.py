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

Quantized weights are dequantized in-kernel (`_weight_tile`), reading only their packed bytes and scales:
FP8 block-scaled (`wisp.core.fp8_blocks`): each tile times its 128 x 128 block's float32 scale, rounded to
hidden's dtype (`_rounded`, to nearest even by the bits); MXFP4 (`wisp.core.mxfp4`): codes and power-of-two
scales built from their bits, exact. That is what the torch kernels do before their GEMMs, so under Triton's
interpreter a quantized bank gives the bits of its dequantized twin; compiled, tl.sum's order follows the
load's layout, which follows the weight's dtype, so a GPU matches the twin closely (a quantized bank's own
modes still agree bit for bit). Biases (GPT-OSS) are added in float32 after each reduction, and the clamped
SwiGLU replaces silu(gate) * up when asked (`wisp.core.expert_extras.Activation`).

The same two kernels have a one-expert form (`triton_pairs_of_one_expert`, ONE_EXPERT): programs walk
a list of pairs all routed to one expert whose weights sit at the given pointer (a slot, or a staging
buffer of `wisp.core.expert_major`). Per program the arithmetic is the same, so the bits are too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wisp.core.expert_extras import SILU, Activation, ExpertExtras
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
def _weight_tile(w, sc, rows, cols, mask, COLS: tl.constexpr, FMT: tl.constexpr, FP8_BLOCK: tl.constexpr,
                 ROUND: tl.constexpr):
    """The float32 tile [rows, cols] of one expert's [R, COLS] weight at w (scales at sc), dequantized as the
    torch kernels do: FMT 0 plain; 1 FP8 (float32 product with the 128 x 128 block's scale, rounded to the
    compute dtype); 2 MXFP4 (two e2m1 codes a byte, even column in the low nibble, times 2^(e8m0 - 127):
    exact, built from the bits)."""
    if FMT == 2:
        byte = tl.load(w + rows[:, None] * (COLS // 2) + cols[None, :] // 2, mask=mask, other=0).to(tl.int32)
        code = tl.where((cols % 2 == 0)[None, :], byte & 0xF, byte >> 4)
        mag, e = (code & 7), (code & 7) >> 1
        frac = 1.0 + 0.5 * (mag & 1).to(tl.float32)
        value = tl.where(e == 0, 0.5 * (mag & 1).to(tl.float32), frac * tl.where(e == 3, 4.0, tl.where(e == 2, 2.0, 1.0)))
        value = tl.where((code & 8) != 0, -value, value)
        s = tl.load(sc + rows[:, None] * (COLS // 32) + cols[None, :] // 32, mask=mask, other=127).to(tl.uint32)
        return _rounded(value * (s << 23).to(tl.float32, bitcast=True), ROUND)
    tile = tl.load(w + rows[:, None] * COLS + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if FMT == 1:
        n_cols = (COLS + FP8_BLOCK - 1) // FP8_BLOCK
        scale = tl.load(sc + (rows // FP8_BLOCK)[:, None] * n_cols + (cols // FP8_BLOCK)[None, :], mask=mask, other=0.0)
        tile = _rounded(tile * scale, ROUND)
    return tile


@triton.jit
def _gate_up_act(x_ptr, w_ptr, ids_ptr, map_ptr, pairs_ptr, h_ptr, stride_ws, s_ptr, stride_ss, b_ptr, stride_bs,
                 alpha, limit, K: tl.constexpr, D: tl.constexpr, I: tl.constexpr, BLOCK_I: tl.constexpr,
                 BLOCK_D: tl.constexpr, ONE_EXPERT: tl.constexpr, FMT: tl.constexpr, FP8_BLOCK: tl.constexpr,
                 ROUND: tl.constexpr, HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr):
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
            wg = _weight_tile(w, sc, rows, cols, mask, D, FMT, FP8_BLOCK, ROUND)
            wu = _weight_tile(w, sc, rows + I, cols, mask, D, FMT, FP8_BLOCK, ROUND)
            gate += tl.sum(wg * x[None, :], axis=1)
            up += tl.sum(wu * x[None, :], axis=1)
        if HAS_BIAS:
            b = b_ptr + slot.to(tl.int64) * stride_bs
            gate += tl.load(b + rows, mask=row_ok, other=0.0).to(tl.float32)
            up += tl.load(b + I + rows, mask=row_ok, other=0.0).to(tl.float32)
    if SWIGLU:  # GPT-OSS's clamped SwiGLU (wisp.core.expert_extras.Activation)
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        h = (up + 1.0) * (gate / (1.0 + tl.exp(-alpha * gate)))
    else:
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
def _down(h_ptr, w_ptr, ids_ptr, map_ptr, pairs_ptr, y_ptr, stride_ws, s_ptr, stride_ss, b_ptr, stride_bs,
          D: tl.constexpr, I: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_I: tl.constexpr, ONE_EXPERT: tl.constexpr,
          FMT: tl.constexpr, FP8_BLOCK: tl.constexpr, ROUND: tl.constexpr, HAS_BIAS: tl.constexpr):
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
            wd = _weight_tile(w, sc, rows, cols, mask, I, FMT, FP8_BLOCK, ROUND)
            acc += tl.sum(wd * h[None, :], axis=1)
        if HAS_BIAS:
            acc += tl.load(b_ptr + slot.to(tl.int64) * stride_bs + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + pair.to(tl.int64) * D + rows, acc, mask=row_ok)


BLOCK_I_GATE_UP, BLOCK_D_GATE_UP = 16, 256  # many short programs: a decode step has only t*k pairs
BLOCK_D_DOWN, BLOCK_I_DOWN = 64, 128
ROUND_IDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # `_rounded`'s codes for the compute dtype


def _format(w_gate_up: torch.Tensor, hidden: torch.Tensor, extras: ExpertExtras | None) -> int:
    """`_weight_tile`'s FMT for these weights: 0 plain (hidden's dtype), 1 FP8, 2 MXFP4 (scales in extras)."""
    scales = None if extras is None else extras.scales
    fmt = 0 if scales is None else {FP8: 1, torch.uint8: 2}.get(w_gate_up.dtype, -1)
    want = {0: hidden.dtype, 1: FP8, 2: torch.uint8}.get(fmt)
    if fmt < 0 or w_gate_up.dtype != want:
        raise ValueError(f"expert weights ({w_gate_up.dtype}) must be {hidden.dtype} like hidden, or float8_e4m3fn / "
                         f"uint8 (MXFP4) with their scales{' (none given)' if scales is None else ''}")
    return fmt


def _launch(per_k, hidden, w_gate_up, w_down, ids, emap, pairs, rows: int, top_k: int, one_expert: bool,
            extras: ExpertExtras | None = None, activation: Activation = SILU) -> None:
    """The two per-pair kernels over `rows` programs: per_k [T*K, D] float32 gets each pair's output.
    extras: the bank's (or the one expert's) scales and biases, if any (`wisp.core.expert_extras`)."""
    d, inter = hidden.shape[1], w_gate_up.shape[0 if one_expert else 1] // 2  # [S,] 2I, D (MXFP4: D/32, 16)
    fmt = _format(w_gate_up, hidden, extras)
    if w_down.dtype != w_gate_up.dtype:
        raise ValueError(f"expert weights must share a dtype (gate_up {w_gate_up.dtype}, down {w_down.dtype})")
    if rows == 0:
        return
    dev = hidden.device
    extras = extras or ExpertExtras()
    s_gate_up, s_down = extras.scales or (w_gate_up, w_down)  # unread unless FMT > 0
    has_bias = extras.gate_up_bias is not None
    b_gate_up, b_down = (extras.gate_up_bias, extras.down_bias) if has_bias else (w_gate_up, w_down)  # unread

    def stride0(t: torch.Tensor) -> int:
        return t.stride(0) if not one_expert else 0

    common = dict(ONE_EXPERT=one_expert, FMT=fmt, FP8_BLOCK=DEFAULT_BLOCK[0], ROUND=ROUND_IDS[hidden.dtype],
                  HAS_BIAS=has_bias)
    h = torch.empty((rows, inter), dtype=torch.float32, device=dev)
    _gate_up_act[(rows, triton.cdiv(inter, BLOCK_I_GATE_UP))](
        hidden, device_view(w_gate_up, dev), ids, emap, pairs, h, stride0(w_gate_up), device_view(s_gate_up, dev),
        stride0(s_gate_up), device_view(b_gate_up, dev), stride0(b_gate_up), activation.alpha, activation.limit,
        K=top_k, D=d, I=inter, BLOCK_I=BLOCK_I_GATE_UP, BLOCK_D=BLOCK_D_GATE_UP,
        SWIGLU=activation.kind == "clamped_swiglu", **common,
    )
    _down[(rows, triton.cdiv(d, BLOCK_D_DOWN))](
        h, device_view(w_down, dev), ids, emap, pairs, per_k, stride0(w_down), device_view(s_down, dev),
        stride0(s_down), device_view(b_down, dev), stride0(b_down), D=d, I=inter, BLOCK_D=BLOCK_D_DOWN,
        BLOCK_I=BLOCK_I_DOWN, **common,
    )


def triton_pairs_by_map(per_k, hidden, w_gate_up, w_down, topk_ids, expert_map, extras=None,
                        activation: Activation = SILU) -> None:
    """`wisp.core.moe.pairs_by_map` in Triton: per_k [T*K, D] float32 gets every pair whose expert has a
    slot in expert_map [N] (None: identity); the other pairs are left as they are."""
    t, k = topk_ids.shape
    if expert_map is None:
        expert_map = torch.arange(w_gate_up.shape[0], dtype=torch.int32, device=hidden.device)
    ids = topk_ids.reshape(-1).contiguous()  # any integer dtype: the kernels load it as it is
    emap = expert_map.to(torch.int32).contiguous()
    _launch(per_k, hidden.contiguous(), w_gate_up.contiguous(), w_down.contiguous(), ids, emap, ids, t * k, k, False,
            extras and extras.contiguous(), activation)


def triton_pairs_of_one_expert(per_k, hidden, w_gate_up, w_down, pairs, top_k: int, extras=None,
                               activation: Activation = SILU) -> None:
    """`wisp.core.moe.pairs_of_one_expert` in Triton: w_gate_up [2I, D] and w_down [D, I] are one
    expert's weights (a slot or a staging buffer); pairs [M] the flat pair indices routed to it."""
    pairs = pairs.contiguous()
    _launch(per_k, hidden.contiguous(), w_gate_up.contiguous(), w_down.contiguous(), pairs, pairs, pairs, pairs.numel(),
            top_k, True, extras and extras.contiguous(), activation)


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
    extras: ExpertExtras | None = None,  # scales (FP8 / MXFP4 weights: dequantized in-kernel) and biases
    activation: Activation = SILU,
) -> torch.Tensor:
    t, k = topk_ids.shape
    per_k = torch.zeros((t * k, hidden.shape[1]), dtype=torch.float32, device=hidden.device)  # [T*K, D]
    triton_pairs_by_map(per_k, hidden, w_gate_up, w_down, topk_ids, expert_map, extras, activation)
    return triton_combine(per_k.view(t, k, -1), topk_weights, hidden.dtype)
