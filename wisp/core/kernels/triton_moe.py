"""`fused_moe` on the GPU in Triton, with the reference's signature and contract (`wisp.core.kernels.moe`).

Pairs are grouped by slot into tiles of BLOCK_M rows that share one expert's weights, so each weight tile
read feeds a tensor-core product for every token routed to that expert (a prefill chunk reads an expert
once per tile, not once per token). Five launches:
1-2. the pairs sorted by slot into whole tiles on the device (`wisp.core.kernels.triton_moe_sort`: one launch for a
   decode step);
3. `_gate_up_act`: program (tile, block of I rows) computes silu(gate) * up of its pairs, accumulated in
   float32 (`tl.dot`), rounded to hidden's dtype, into h;
4. `_down`: program (tile, block of D rows) computes its pairs' output rows in float32;
5. `_combine`: one program per (token, block of D) sums weight_k * y_k over k in routing order in
   float32 and casts to hidden's dtype (the contract of `combine_in_routing_order`, in one launch).

Every call uses the same tile shape and the same fixed sequence of reduction blocks (no split-K, no
autotuning), and a row of a tensor-core product is computed by the same instructions whatever the other
rows of its tile hold or where in the tile it sits. So a token's output depends only on its own row,
routing and expert bytes: batch-invariant and slot-invariant by construction (paged == resident bit for
bit; a prefill chunk's tokens get the bits they get alone), and decode and prefill run the same kernels.
Weights may be pinned host tensors (zero-copy mode): they are read in place over PCIe through UVA
(`wisp.core.kernels.uva`), with the same arithmetic, so the bits match a device copy.

Quantized weights are dequantized in-kernel (`triton_weight_tiles.weight_tile`), reading only their packed bytes and scales:
FP8 block-scaled (`wisp.core.kernels.fp8_blocks`) and Q8_0 (`wisp.core.kernels.q8_0`: int8 codes, a float16 scale
per 32 columns): each element times its block's scale in float32, rounded to
hidden's dtype (`wisp.core.kernels.triton_interpreter.rounded`, to nearest even); MXFP4 (`wisp.core.kernels.mxfp4`): codes and power-of-two
scales built from their bits, exact. Those are the values the torch kernels multiply after dequantizing,
and they enter the product in hidden's dtype like plain weights. An MXFP4 step reads its packed bytes as one
contiguous tile and multiplies its even columns (low nibbles) and then its odd ones (`wisp.core.kernels.triton_mxfp4`;
`Blocks.loads` steps' bytes read in one load, for the link's sake where the bank is read in place,
each step then computed as alone): the same products, summed in that order, so its outputs are close to, not equal to, those of the
dequantized weights (still the same for every batch, slot and mode). Biases (GPT-OSS) are added in float32
after each reduction, and the clamped SwiGLU replaces silu(gate) * up when asked
(`wisp.core.kernels.expert_extras.Activation`). Under Triton's interpreter (the CPU tests) 16-bit operands are
widened to float32 before each product (exact), since its tl.dot misreads 16-bit floats.

The same two kernels serve one expert (`triton_pairs_of_one_expert`): a list of pairs all routed to the
expert whose weights sit at the given pointer (a slot, or a staging buffer of `wisp.core.experts.expert_major`)
is one slot's tiles. Per row the arithmetic is the same, so the bits are too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import triton
import triton.language as tl

from wisp.core.kernels.expert_extras import SILU, Activation, ExpertExtras
from wisp.core.kernels.fp8_blocks import DEFAULT_BLOCK
from wisp.core.kernels.moe import fused_from_pairs
from wisp.core.kernels.quantized_weights import weight_format
from wisp.core.kernels.step_count import StepCount
from wisp.core.kernels.triton_interpreter import ROUND_IDS, dot_cols, dot_rows, ieee_products, rounded
from wisp.core.kernels.triton_k_quants import k_quant_super_block
from wisp.core.kernels.triton_weight_tiles import FORMAT_IDS, weight_tile
from wisp.core.kernels.triton_mxfp4 import mxfp4_steps
from wisp.core.kernels.triton_moe_sort import BLOCK_M, slot_tiles, sorted_by_slot
from wisp.core.kernels.uva import device_view


@triton.jit
def _tile_pairs(sorted_ptr, counts_ptr, S, SP: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's tile (axis 0): its slot (S or more: past the last tile), its rows' places in the sorted
    list and pair indices, and which rows are live."""
    tile = tl.program_id(0)
    s, count, tiles = slot_tiles(counts_ptr, S, SP, BLOCK_M)
    slot = tl.sum((tl.cumsum(tiles, 0) <= tile).to(tl.int32), 0)
    first = tl.sum(tl.where(s < slot, tiles, 0), 0)
    live = tl.sum(tl.where(s == slot, count, 0), 0) - (tile - first) * BLOCK_M
    places = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = tl.arange(0, BLOCK_M) < live
    pair = tl.load(sorted_ptr + places, mask=row_ok, other=0)
    return slot, places.to(tl.int64), pair.to(tl.int64), row_ok


@triton.jit
def _gate_up_act(x_ptr, w_ptr, sorted_ptr, counts_ptr, h_ptr, stride_ws, s_ptr, stride_ss, b_ptr, stride_bs,
                 alpha, limit, S, K: tl.constexpr, D: tl.constexpr, I: tl.constexpr, SP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr, FMT: tl.constexpr,
                 FP8_BLOCK: tl.constexpr, ROUND: tl.constexpr, HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr,
                 IEEE: tl.constexpr, LOADS: tl.constexpr, WFIRST: tl.constexpr):
    """Program (tile, block of I rows): h[place] = act(gate, up) of the tile's pairs, rounded to hidden's dtype.
    WFIRST (`Blocks.weights_first`): the block's gate rows and up rows are one weight tile [2 BLOCK_I, BLOCK_D], the
    product's left operand (`dot_cols`), its result [2 BLOCK_I, BLOCK_M] split into gate and up at the end."""
    slot, places, pair, row_ok = _tile_pairs(sorted_ptr, counts_ptr, S, SP, BLOCK_M)
    if slot < S:
        token = pair // K
        rows = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
        i_ok = rows < I
        w = w_ptr + slot.to(tl.int64) * stride_ws
        sc = s_ptr + slot.to(tl.int64) * stride_ss
        tl.static_assert(FMT == 2 or LOADS == 1 or (FMT >= 4 and LOADS == 8))  # wide loads: MXFP4's, a k-quant's
        if WFIRST:
            r = tl.arange(0, 2 * BLOCK_I)
            both = tl.program_id(1) * BLOCK_I + r % BLOCK_I + (r // BLOCK_I) * I  # [2 BLOCK_I]: gate rows, up rows
            both_ok = tl.program_id(1) * BLOCK_I + r % BLOCK_I < I
            acc = tl.zeros((2 * BLOCK_I, BLOCK_M), dtype=tl.float32)
            for d0 in range(0, D, BLOCK_D * LOADS):
                if FMT == 2:
                    acc = mxfp4_steps(acc, x_ptr, token * D, row_ok, w, sc, both, both_ok, d0, D, BLOCK_D, LOADS, ROUND,
                                      IEEE, True)
                elif FMT >= 4 and LOADS > 1:
                    acc = k_quant_super_block(acc, x_ptr, token * D, row_ok, w, sc, both, both_ok, d0, D, FMT, ROUND,
                                              IEEE, True)
                else:
                    cols = d0 + tl.arange(0, BLOCK_D)
                    x = tl.load(x_ptr + token[:, None] * D + cols[None, :],
                                mask=row_ok[:, None] & (cols < D)[None, :], other=0.0)
                    wt = weight_tile(w, sc, both, both_ok, d0, D, BLOCK_D, FMT, FP8_BLOCK, ROUND).to(x.dtype)
                    acc = dot_cols(wt, x, acc, IEEE)
            gate, up = tl.split(tl.permute(tl.reshape(acc, (2, BLOCK_I, BLOCK_M)), (1, 2, 0)))  # [BLOCK_I, BLOCK_M]
            gate = tl.trans(gate)
            up = tl.trans(up)
        else:
            gate = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
            up = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
            for d0 in range(0, D, BLOCK_D * LOADS):
                if FMT == 2:  # MXFP4: each step's even columns' products, then its odd ones', LOADS steps a load
                    gate = mxfp4_steps(gate, x_ptr, token * D, row_ok, w, sc, rows, i_ok, d0, D, BLOCK_D, LOADS, ROUND,
                                       IEEE)
                    up = mxfp4_steps(up, x_ptr, token * D, row_ok, w, sc, rows + I, i_ok, d0, D, BLOCK_D, LOADS, ROUND,
                                     IEEE)
                elif FMT >= 4 and LOADS > 1:  # a k-quant read in place: a super-block's codes a load
                    gate = k_quant_super_block(gate, x_ptr, token * D, row_ok, w, sc, rows, i_ok, d0, D, FMT, ROUND,
                                               IEEE, False)
                    up = k_quant_super_block(up, x_ptr, token * D, row_ok, w, sc, rows + I, i_ok, d0, D, FMT, ROUND,
                                             IEEE, False)
                else:
                    cols = d0 + tl.arange(0, BLOCK_D)
                    x = tl.load(x_ptr + token[:, None] * D + cols[None, :],
                                mask=row_ok[:, None] & (cols < D)[None, :], other=0.0)
                    wg = weight_tile(w, sc, rows, i_ok, d0, D, BLOCK_D, FMT, FP8_BLOCK, ROUND).to(x.dtype)  # exact
                    wu = weight_tile(w, sc, rows + I, i_ok, d0, D, BLOCK_D, FMT, FP8_BLOCK, ROUND).to(x.dtype)
                    gate = dot_rows(x, wg, gate, IEEE)
                    up = dot_rows(x, wu, up, IEEE)
        if HAS_BIAS:
            b = b_ptr + slot.to(tl.int64) * stride_bs
            gate += tl.load(b + rows, mask=i_ok, other=0.0).to(tl.float32)[None, :]
            up += tl.load(b + I + rows, mask=i_ok, other=0.0).to(tl.float32)[None, :]
        if SWIGLU:  # GPT-OSS's clamped SwiGLU (wisp.core.kernels.expert_extras.Activation)
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
            h = (up + 1.0) * (gate / (1.0 + tl.exp(-alpha * gate)))
        else:
            h = gate / (1.0 + tl.exp(-gate)) * up
        h = rounded(h, ROUND).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + places[:, None] * I + rows[None, :], h, mask=row_ok[:, None] & i_ok[None, :])


@triton.jit
def _down(h_ptr, w_ptr, sorted_ptr, counts_ptr, y_ptr, stride_ws, s_ptr, stride_ss, b_ptr, stride_bs, S,
          D: tl.constexpr, I: tl.constexpr, SP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
          BLOCK_I: tl.constexpr, FMT: tl.constexpr, FP8_BLOCK: tl.constexpr, ROUND: tl.constexpr,
          HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, LOADS: tl.constexpr, WFIRST: tl.constexpr):
    """Program (tile, block of D rows): y[pair] = w_down @ h[place] for the tile's pairs, in float32. WFIRST: the
    weight tile is the product's left operand (`dot_cols`), the sum [BLOCK_D, BLOCK_M] transposed at the end."""
    slot, places, pair, row_ok = _tile_pairs(sorted_ptr, counts_ptr, S, SP, BLOCK_M)
    if slot < S:
        rows = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        d_ok = rows < D
        w = w_ptr + slot.to(tl.int64) * stride_ws
        sc = s_ptr + slot.to(tl.int64) * stride_ss
        if WFIRST:
            acc = tl.zeros((BLOCK_D, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        tl.static_assert(FMT == 2 or LOADS == 1 or (FMT >= 4 and LOADS == 8))  # wide loads: MXFP4's, a k-quant's
        for i0 in range(0, I, BLOCK_I * LOADS):
            if FMT == 2:  # MXFP4: each step's even columns' products, then its odd ones', LOADS steps a load
                acc = mxfp4_steps(acc, h_ptr, places * I, row_ok, w, sc, rows, d_ok, i0, I, BLOCK_I, LOADS, ROUND, IEEE,
                                  WFIRST)
            elif FMT >= 4 and LOADS > 1:  # a k-quant read in place: a super-block's codes a load
                acc = k_quant_super_block(acc, h_ptr, places * I, row_ok, w, sc, rows, d_ok, i0, I, FMT, ROUND, IEEE,
                                          WFIRST)
            else:
                cols = i0 + tl.arange(0, BLOCK_I)
                h = tl.load(h_ptr + places[:, None] * I + cols[None, :], mask=row_ok[:, None] & (cols < I)[None, :],
                            other=0.0)
                wd = weight_tile(w, sc, rows, d_ok, i0, I, BLOCK_I, FMT, FP8_BLOCK, ROUND).to(h.dtype)
                acc = dot_cols(wd, h, acc, IEEE) if WFIRST else dot_rows(h, wd, acc, IEEE)
        if WFIRST:
            acc = tl.trans(acc)
        if HAS_BIAS:
            acc += tl.load(b_ptr + slot.to(tl.int64) * stride_bs + rows, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + pair[:, None] * D + rows[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


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



@dataclass(frozen=True)
class Blocks:
    """One of the two kernels' launch: `rows` of the weight a program computes (its output columns), `cols` of the
    reduction a loop step reads, warps a program, and the software pipeline's stages. Fixed per weight format,
    whatever the batch, so no row's instructions depend on it; chosen from `wisp bench sweep moe-attention`
    (docs/decisions/moe-blocks-per-weight-format.md)."""

    rows: int
    cols: int
    warps: int = 4
    stages: int = 3
    # MXFP4 read in place from host memory: column steps whose bytes one load a row reads (1, 2, 4), each step then
    # computed as alone, so the bits are those of 1 (tests; on the H200 too). Over PCIe a 32-byte request a row
    # wastes half the link (gpt-oss's experts in place: 23 GB/s at 1, 37 at 4); on the device the split in registers
    # costs more than it saves (160 -> 399 us at one token): a bank on the device reads one step a load.
    loads: int = 1
    # the weight tile the tensor-core product's left operand (`dot_cols`: dequantized in registers and multiplied
    # from there, where the right operand must first go through shared memory); gate/up then reads its gate and up
    # rows as one tile of 2 x rows
    weights_first: bool = False


TILES = {  # weight format (`_format`: 0 plain, 1 FP8, 2 MXFP4, 3 Q8_0, 4-6 Q4_K, Q5_K, Q6_K) -> (gate/up blocks, down blocks)
    0: (Blocks(32, 128), Blocks(64, 128)),
    1: (Blocks(32, 128), Blocks(64, 128)),
    2: (Blocks(32, 64, loads=4), Blocks(64, 64, loads=4)),  # MXFP4 (loads: in place from host memory only)
    3: (Blocks(64, 32), Blocks(64, 32)),  # Q8_0: a step is one scale block
    # Q4_K, Q5_K, Q6_K: a step is a sub-block of 32; read in place, the 8 steps of a super-block from one load of its
    # codes a row (`triton_k_quants.k_quant_super_block`: the same sums). From two sweeps on the H200 (one token, 8
    # experts; docs/decisions/moe-blocks-per-weight-format.md): gate/up weights first, Q4_K's 32 rows a program, Q6_K's
    # down 128 rows. Q4_K 112 -> 81 us on the device, 757 -> 487 read in place; Q6_K 188 -> 98 us, and at 2048 tokens
    # 4.4 -> 1.6 ms. Q5_K follows Q4_K.
    4: (Blocks(32, 32, loads=8, weights_first=True), Blocks(64, 32, loads=8)),
    5: (Blocks(32, 32, loads=8, weights_first=True), Blocks(64, 32, loads=8)),
    6: (Blocks(64, 32, loads=8, weights_first=True), Blocks(128, 32, loads=8)),
}
WIDE = (2, 4, 5, 6)  # formats whose banks read in place load `Blocks.loads` steps at once: MXFP4, the k-quants


def _format(weight: torch.Tensor, scale: torch.Tensor | None, hidden: torch.Tensor) -> int:
    """`weight_tile`'s FMT for one role's weights (`wisp.core.kernels.quantized_weights.weight_format`); plain
    weights must be in hidden's dtype."""
    fmt = FORMAT_IDS[weight_format(weight, scale)]
    if fmt == 0 and weight.dtype != hidden.dtype:
        raise ValueError(f"expert weights ({weight.dtype}) must be {hidden.dtype} like hidden, or quantized with their "
                         "scales (none given)")
    return fmt


def _launch(per_k, hidden, w_gate_up, w_down, counts, order, max_tiles: int, top_k: int, one_expert: bool,
            extras: ExpertExtras | None = None, activation: Activation = SILU) -> None:
    """The two tiled kernels over `max_tiles` tiles of pairs (`order`, slot by slot as `counts` says):
    per_k [T*K, D] float32 gets each listed pair's output. extras: the bank's (or the one expert's) scales
    and biases, if any (`wisp.core.kernels.expert_extras`)."""
    d, inter = hidden.shape[1], w_gate_up.shape[0 if one_expert else 1] // 2  # [S,] 2I, D (packed: [S,] 2I, ...)
    extras = extras or ExpertExtras()
    fmt_gate_up, fmt_down = (_format(w, s, hidden) for w, s in zip((w_gate_up, w_down), extras.scales or (None, None)))
    if max_tiles == 0:
        return
    dev = hidden.device
    s_gate_up, s_down = extras.scales or (w_gate_up, w_down)  # unread unless FMT > 0
    has_bias = extras.gate_up_bias is not None
    b_gate_up, b_down = (extras.gate_up_bias, extras.down_bias) if has_bias else (w_gate_up, w_down)  # unread
    slots = counts.numel()

    def stride0(t: torch.Tensor) -> int:
        return t.stride(0) if not one_expert else 0

    common = dict(SP=triton.next_power_of_2(slots), BLOCK_M=BLOCK_M, FP8_BLOCK=DEFAULT_BLOCK[0],
                  ROUND=ROUND_IDS[hidden.dtype], HAS_BIAS=has_bias, IEEE=ieee_products(hidden.dtype))
    gate_up, down = TILES[fmt_gate_up][0], TILES[fmt_down][1]
    in_place = w_gate_up.device.type == "cpu"  # read in place from pinned host memory: MXFP4 and k-quants load wide

    def loads(blocks: Blocks, fmt: int) -> int:
        return blocks.loads if in_place and fmt in WIDE else 1

    h = torch.empty((max_tiles * BLOCK_M, inter), dtype=hidden.dtype, device=dev)  # [place, I]
    _gate_up_act[(max_tiles, triton.cdiv(inter, gate_up.rows))](
        hidden, device_view(w_gate_up, dev), order, counts, h, stride0(w_gate_up), device_view(s_gate_up, dev),
        stride0(s_gate_up), device_view(b_gate_up, dev), stride0(b_gate_up), activation.alpha, activation.limit, slots,
        K=top_k, D=d, I=inter, BLOCK_I=gate_up.rows, BLOCK_D=gate_up.cols, LOADS=loads(gate_up, fmt_gate_up),
        FMT=fmt_gate_up, SWIGLU=activation.kind == "clamped_swiglu", WFIRST=gate_up.weights_first,
        num_warps=gate_up.warps, num_stages=gate_up.stages, **common,
    )
    _down[(max_tiles, triton.cdiv(d, down.rows))](
        h, device_view(w_down, dev), order, counts, per_k, stride0(w_down), device_view(s_down, dev),
        stride0(s_down), device_view(b_down, dev), stride0(b_down), slots, D=d, I=inter, BLOCK_D=down.rows,
        BLOCK_I=down.cols, LOADS=loads(down, fmt_down), FMT=fmt_down, WFIRST=down.weights_first,
        num_warps=down.warps, num_stages=down.stages, **common,
    )


def triton_pairs_by_map(per_k, hidden, w_gate_up, w_down, topk_ids, expert_map, extras=None,
                        activation: Activation = SILU, count: StepCount | None = None) -> None:
    """`wisp.core.kernels.moe.pairs_by_map` in Triton: per_k [T*K, D] float32 gets every pair whose expert has a
    slot in expert_map [N] (None: identity); the other pairs are left as they are. `count`: the step is added to
    it (in the decode sort's launch where there is one)."""
    t, k = topk_ids.shape
    if expert_map is None:
        expert_map = torch.arange(w_gate_up.shape[0], dtype=torch.int32, device=hidden.device)
    ids = topk_ids.reshape(-1).contiguous()  # any integer dtype: the kernels load it as it is
    emap = expert_map.to(torch.int32).contiguous()
    counts, order, max_tiles = sorted_by_slot(ids, emap, w_gate_up.shape[0], count)
    _launch(per_k, hidden.contiguous(), w_gate_up.contiguous(), w_down.contiguous(), counts, order, max_tiles, k, False,
            extras and extras.contiguous(), activation)


def triton_pairs_of_one_expert(per_k, hidden, w_gate_up, w_down, pairs, top_k: int, extras=None,
                               activation: Activation = SILU) -> None:
    """`wisp.core.kernels.moe.pairs_of_one_expert` in Triton: w_gate_up [2I, D] and w_down [D, I] are one
    expert's weights (a slot or a staging buffer); pairs [M] the flat pair indices routed to it."""
    m = pairs.numel()
    counts = torch.full((1,), m, dtype=torch.int32, device=hidden.device)  # one slot: the tiles are the list's
    _launch(per_k, hidden.contiguous(), w_gate_up.contiguous(), w_down.contiguous(), counts,
            pairs.to(torch.int32).contiguous(), triton.cdiv(m, BLOCK_M), top_k, True, extras and extras.contiguous(),
            activation)


def triton_combine(per_k: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`wisp.core.kernels.moe.combine_in_routing_order` in one launch: per_k [T, K, D] float32 -> [T, D] dtype."""
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
    count: StepCount | None = None,  # the store's device counts, which the step is added to
) -> torch.Tensor:
    return fused_from_pairs(partial(triton_pairs_by_map, count=count), triton_combine, hidden, w_gate_up, w_down,
                            topk_ids, topk_weights, expert_map, extras, activation)
