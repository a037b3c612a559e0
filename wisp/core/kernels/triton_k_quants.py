"""k-quant weight tiles for the Triton MoE kernels (`wisp.core.kernels.triton_moe`): a 32-column step of a Q4_K, Q5_K
or Q6_K weight kept packed as codes and heads (`wisp.core.kernels.k_quants`), decoded in registers to the values the
`gguf` package's dequantizer gives (float32, every product exact, as `wisp.core.kernels.gguf_blocks` computes them),
rounded to the compute dtype.

A step's 32 columns lie in one super-block (256 columns), so its block's float16 d (and dmin) are read once a row.
Q4_K / Q5_K: the step is one sub-block j of 32, whose 6-bit scale and min (12 bytes packed as llama.cpp's
get_scale_min_k4) are read once a row too; its codes are 32 consecutive bytes, the low nibbles for even j and the high
ones for odd j (Q5_K: the fifth bit is bit j of 32 more bytes). Q6_K: the step is a quarter t of a 128-column half n;
its low nibbles are 32 consecutive bytes, its high bit pairs another 32, and its two sub-blocks of 16 each have an
int8 scale, gathered per element (two values a row).
"""

from __future__ import annotations

import triton
import triton.language as tl

from wisp.core.kernels.triton_interpreter import rounded

Q4_K, Q5_K, Q6_K = 4, 5, 6  # `triton_moe._weight_tile`'s FMT codes of the k-quants
CODE_BYTES = {Q4_K: 128, Q5_K: 160, Q6_K: 192}  # bytes of codes a super-block of 256 (`k_quants.K_QUANTS`)
HEAD_BYTES = {Q4_K: 16, Q5_K: 16, Q6_K: 18}
STEP = 32  # columns a step


@triton.jit
def _f16(p, ok):
    """The little-endian float16 at byte pointers p (uint8), as float32."""
    lo = tl.load(p, mask=ok, other=0).to(tl.uint16)
    hi = tl.load(p + 1, mask=ok, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _byte(p, ok):
    return tl.load(p, mask=ok, other=0).to(tl.int32)


@triton.jit
def k_quant_tile(w, sc, rows, row_ok, col0, COLS: tl.constexpr, FMT: tl.constexpr, ROUND: tl.constexpr):
    """The tile [rows, 32 columns from col0] (col0 a multiple of 32) of one expert's k-quant weight [R, COLS]: codes
    at w (uint8 [R, COLS / 256, CB]), heads at sc (uint8 [R, COLS / 256, HB]), as float32 values rounded to the
    compute dtype (`rounded`)."""
    code_bytes = 128 + 32 * (FMT - 4)  # CODE_BYTES[FMT]
    head_bytes = 16 + 2 * (FMT // 6)  # HEAD_BYTES[FMT]
    blocks = COLS // 256
    g = col0 // 256
    lane = tl.arange(0, 32)
    codes = w + rows.to(tl.int64)[:, None] * (blocks * code_bytes) + g * code_bytes  # [rows, 1]
    heads = sc + rows.to(tl.int64) * (blocks * head_bytes) + g * head_bytes  # [rows]
    ok = row_ok[:, None] & (lane < 32)[None, :]
    if FMT == 6:
        n = (col0 % 256) // 128
        t = (col0 % 128) // 32
        low = (_byte(codes + 64 * n + 32 * (t % 2) + lane[None, :], ok) >> (4 * (t // 2))) & 15
        high = (_byte(codes + 128 + 32 * n + lane[None, :], ok) >> (2 * t)) & 3
        q = ((low | (high << 4)) - 32).to(tl.float32)
        s = _byte(heads[:, None] + 8 * n + 2 * t + lane[None, :] // 16, ok)
        s = tl.where(s >= 128, s - 256, s)  # the int8 scales' values
        d = _f16(heads + 16, row_ok)
        value = (d[:, None] * s.to(tl.float32)) * q
    else:
        j = (col0 % 256) // 32  # the sub-block
        a = _byte(heads + 4 + j % 4, row_ok)
        b = _byte(heads + 8 + j % 4, row_ok)
        c = _byte(heads + 12 + j % 4, row_ok)
        scale = tl.where(j < 4, a & 63, (c & 15) | ((a >> 6) << 4)).to(tl.float32)
        least = tl.where(j < 4, b & 63, (c >> 4) | ((b >> 6) << 4)).to(tl.float32)
        q = (_byte(codes + (code_bytes - 128) + 32 * (j // 2) + lane[None, :], ok) >> (4 * (j % 2))) & 15
        if FMT == 5:
            q = q | (((_byte(codes + lane[None, :], ok) >> j) & 1) << 4)
        dq = _f16(heads, row_ok) * scale  # [rows]
        dm = _f16(heads + 2, row_ok) * least
        value = dq[:, None] * q.to(tl.float32) - dm[:, None]
    return rounded(value, ROUND)
