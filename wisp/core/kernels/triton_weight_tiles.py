"""A weight's tile dequantized in-kernel, the one the Triton MoE kernels (`wisp.core.kernels.triton_moe`) and the dense
projections (`wisp.core.kernels.triton_linear`, for a GGUF file's block formats) read: [rows, BLOCK_C columns] of a
[R, COLS] weight, plain or FP8 block-scaled, Q8_0 or a k-quant (`wisp.core.kernels.triton_k_quants`), as the values the
torch path dequantizes to, rounded to the compute dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from wisp.core.kernels.triton_interpreter import rounded
from wisp.core.kernels.triton_k_quants import k_quant_tile

FORMAT_IDS = {"plain": 0, "fp8": 1, "mxfp4": 2, "q8_0": 3, "q4_k": 4, "q5_k": 5, "q6_k": 6}  # `weight_format` -> FMT

@triton.jit
def weight_tile(w, sc, rows, row_ok, col0, COLS: tl.constexpr, BLOCK_C: tl.constexpr, FMT: tl.constexpr,
                 FP8_BLOCK: tl.constexpr, ROUND: tl.constexpr):
    """The tile [rows, BLOCK_C columns from col0] of one expert's [R, COLS] weight at w (scales at sc; callers cast
    it to the compute dtype, exact),
    dequantized as the torch kernels do: FMT 0 plain; 1 FP8 (float32 product with the 128 x 128 block's scale,
    rounded to the compute dtype); 3 Q8_0 (int8 code times its 32-column block's float16 scale, rounded); 4-6 the
    k-quants (`wisp.core.kernels.triton_k_quants`); MXFP4 is `mxfp4_steps`. col0 is a multiple of BLOCK_C, which
    divides the FP8 block, so
    the tile's columns share one FP8 scale block: its scales are read once a row
    (docs/decisions/fp8-block-scale-read-once-a-row.md), and every element gets the same scale and product."""
    if FMT >= 4:
        tl.static_assert(BLOCK_C == 32)  # a k-quant step: one sub-block of 32 (Q6_K: two of 16)
        tile = k_quant_tile(w, sc, rows, row_ok, col0, COLS, FMT, ROUND)
    else:
        cols = col0 + tl.arange(0, BLOCK_C)
        mask = row_ok[:, None] & (cols < COLS)[None, :]
        tile = tl.load(w + rows[:, None] * COLS + cols[None, :], mask=mask, other=0.0)  # plain: as stored
        if FMT == 3:  # Q8_0: code times its 32-column block's float16 scale (exact in float32); a step's columns
            tl.static_assert(32 % BLOCK_C == 0)  # share one block, so its scales are read once a row
            s = tl.load(sc + rows * (COLS // 32) + col0 // 32, mask=row_ok, other=0.0)  # [rows]
            tile = rounded(tile.to(tl.float32) * s.to(tl.float32)[:, None], ROUND)
        if FMT == 1:
            tl.static_assert(FP8_BLOCK % BLOCK_C == 0)
            n_cols = (COLS + FP8_BLOCK - 1) // FP8_BLOCK
            scale = tl.load(sc + (rows // FP8_BLOCK) * n_cols + col0 // FP8_BLOCK, mask=row_ok, other=0.0)  # [rows]
            tile = rounded(tile.to(tl.float32) * scale[:, None], ROUND)
    return tile
