"""k-quant weight tiles for the Triton MoE kernels (`wisp.core.kernels.triton_moe`): a 32-column step of a Q4_K, Q5_K
or Q6_K weight kept packed as codes and heads (`wisp.core.kernels.k_quants`), decoded in registers to the values the
`gguf` package's dequantizer gives (float32, every product exact, as `wisp.core.kernels.gguf_blocks` computes them),
rounded to the compute dtype (`k_quant_tile`); or, for a bank read in place over PCIe, a whole super-block's 8 steps
from one wide load of its codes a row, each step computed as alone (`k_quant_super_block`: the same sums).

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

from wisp.core.kernels.triton_interpreter import dot_cols, dot_rows, rounded
from wisp.core.kernels.triton_mxfp4 import first_last

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
def _places(w, sc, rows, col0, COLS: tl.constexpr, FMT: tl.constexpr):
    """Where the super-block holding column col0 lies for each row: its codes [rows, 1] and its heads [rows]. FMT:
    `triton_weight_tiles.FORMAT_IDS`' 4, 5, 6 for Q4_K, Q5_K, Q6_K (their widths: `k_quants.K_QUANTS`)."""
    code_bytes = 128 + 32 * (FMT - 4)  # 128, 160, 192
    head_bytes = 16 + 2 * (FMT // 6)  # 16, 16, 18
    g = col0 // 256
    codes = w + rows.to(tl.int64)[:, None] * (COLS // 256 * code_bytes) + g * code_bytes
    return codes, sc + rows.to(tl.int64) * (COLS // 256 * head_bytes) + g * head_bytes


@triton.jit
def _q45_values(byte, high5, heads, row_ok, j, FMT: tl.constexpr):
    """Q4_K / Q5_K sub-block j's values [rows, 32] (float32): its codes are the 32 bytes `byte`'s low nibbles (j even)
    or high ones, Q5_K's fifth bit bit j of `high5`'s bytes; times d * scale, less dmin * min (llama.cpp's
    get_scale_min_k4 unpacks the 6-bit scale and min from the 12 bytes after d and dmin)."""
    q = (byte >> (4 * (j % 2))) & 15
    if FMT == 5:
        q = q | (((high5 >> j) & 1) << 4)
    a = _byte(heads + 4 + j % 4, row_ok)
    b = _byte(heads + 8 + j % 4, row_ok)
    c = _byte(heads + 12 + j % 4, row_ok)
    scale = _f16(heads, row_ok) * tl.where(j < 4, a & 63, (c & 15) | ((a >> 6) << 4)).to(tl.float32)
    least = _f16(heads + 2, row_ok) * tl.where(j < 4, b & 63, (c >> 4) | ((b >> 6) << 4)).to(tl.float32)
    return scale[:, None] * q.to(tl.float32) - least[:, None]


@triton.jit
def _q6_values(low, high, heads, row_ok, n, t):
    """Q6_K half n's quarter t's values [rows, 32] (float32): low nibbles from `low`'s bytes (t >= 2: the high
    nibbles), high bit pairs from `high`'s (bits 2t), each value d times its sub-block of 16's int8 scale, times q - 32."""
    lane = tl.arange(0, 32)
    q = ((((low >> (4 * (t // 2))) & 15) | (((high >> (2 * t)) & 3) << 4)) - 32).to(tl.float32)
    s = _byte(heads[:, None] + 8 * n + 2 * t + lane[None, :] // 16, row_ok[:, None] & (lane < 32)[None, :])
    s = tl.where(s >= 128, s - 256, s).to(tl.float32)  # the int8 scales' values
    return (_f16(heads + 16, row_ok)[:, None] * s) * q


@triton.jit
def k_quant_tile(w, sc, rows, row_ok, col0, COLS: tl.constexpr, FMT: tl.constexpr, ROUND: tl.constexpr):
    """The tile [rows, 32 columns from col0] (col0 a multiple of 32) of one expert's k-quant weight [R, COLS]: codes
    at w (uint8 [R, COLS / 256, CB]), heads at sc (uint8 [R, COLS / 256, HB]), as float32 values rounded to the
    compute dtype (`rounded`)."""
    codes, heads = _places(w, sc, rows, col0, COLS, FMT)
    lane = tl.arange(0, 32)
    ok = row_ok[:, None] & (lane < 32)[None, :]
    if FMT == 6:
        n = (col0 % 256) // 128
        t = (col0 % 128) // 32
        low = _byte(codes + 64 * n + 32 * (t % 2) + lane[None, :], ok)
        value = _q6_values(low, _byte(codes + 128 + 32 * n + lane[None, :], ok), heads, row_ok, n, t)
    else:
        j = (col0 % 256) // 32  # the sub-block
        byte = _byte(codes + 32 * (FMT - 4) + 32 * (j // 2) + lane[None, :], ok)
        high5 = byte  # (unread but for Q5_K)
        if FMT == 5:
            high5 = _byte(codes + lane[None, :], ok)
        value = _q45_values(byte, high5, heads, row_ok, j, FMT)
    return rounded(value, ROUND)


@triton.jit
def _step(acc, a_ptr, a_off, a_ok, col, COLS: tl.constexpr, value, ROUND: tl.constexpr, IEEE: tl.constexpr,
          WFIRST: tl.constexpr):
    """acc + one 32-column step from column col: the activation's [a rows, 32] against the weight values [rows, 32]
    (float32, rounded here to the compute dtype), `dot_cols` (WFIRST) or `dot_rows` as the kernel's launch has it."""
    cols = col + tl.arange(0, 32)
    a = tl.load(a_ptr + a_off[:, None] + cols[None, :], mask=a_ok[:, None] & (cols < COLS)[None, :], other=0.0)
    w = rounded(value, ROUND).to(a.dtype)  # exact
    return dot_cols(w, a, acc, IEEE) if WFIRST else dot_rows(a, w, acc, IEEE)


@triton.jit
def _chunk(acc, a_ptr, a_off, a_ok, col0, COLS: tl.constexpr, byte, high5, heads, row_ok, c: tl.constexpr,
           FMT: tl.constexpr, ROUND: tl.constexpr, IEEE: tl.constexpr, WFIRST: tl.constexpr):
    """Q4_K / Q5_K: the two sub-blocks 2c and 2c + 1 whose codes are the 32 bytes `byte` [rows, 32]."""
    acc = _step(acc, a_ptr, a_off, a_ok, col0 + 64 * c, COLS, _q45_values(byte, high5, heads, row_ok, 2 * c, FMT),
                ROUND, IEEE, WFIRST)
    return _step(acc, a_ptr, a_off, a_ok, col0 + 64 * c + 32, COLS,
                 _q45_values(byte, high5, heads, row_ok, 2 * c + 1, FMT), ROUND, IEEE, WFIRST)


@triton.jit
def _half(acc, a_ptr, a_off, a_ok, col0, COLS: tl.constexpr, low, high, heads, row_ok, n: tl.constexpr,
          ROUND: tl.constexpr, IEEE: tl.constexpr, WFIRST: tl.constexpr):
    """Q6_K: half n's four quarters, its 64 low bytes `low` [rows, 64] and 32 high ones `high` [rows, 32]."""
    low0, low1 = first_last(low)  # quarters 0 and 2 read the first 32 bytes, 1 and 3 the last
    col = col0 + 128 * n
    acc = _step(acc, a_ptr, a_off, a_ok, col, COLS, _q6_values(low0, high, heads, row_ok, n, 0), ROUND, IEEE, WFIRST)
    acc = _step(acc, a_ptr, a_off, a_ok, col + 32, COLS, _q6_values(low1, high, heads, row_ok, n, 1), ROUND, IEEE,
                WFIRST)
    acc = _step(acc, a_ptr, a_off, a_ok, col + 64, COLS, _q6_values(low0, high, heads, row_ok, n, 2), ROUND, IEEE,
                WFIRST)
    return _step(acc, a_ptr, a_off, a_ok, col + 96, COLS, _q6_values(low1, high, heads, row_ok, n, 3), ROUND, IEEE,
                 WFIRST)


@triton.jit
def k_quant_super_block(acc, a_ptr, a_off, a_ok, w, sc, rows, row_ok, col0, COLS: tl.constexpr, FMT: tl.constexpr,
                        ROUND: tl.constexpr, IEEE: tl.constexpr, WFIRST: tl.constexpr):
    """acc + the 8 32-column steps of the super-block from col0 (a multiple of 256): the activation a [a rows, COLS]
    (a_ptr + a_off[r] its row r, a_ok the live ones) against the weight's rows; its codes read in one load a row
    (Q4_K: 128 bytes; Q5_K: 32, then 128; Q6_K: 128, then 64), each step then computed as `k_quant_tile`'s step alone
    computes it, in the same order: the sums are those of one step a load. For a bank read in place over PCIe, where a
    32-byte request a row costs about half the link (docs/decisions/mxfp4-in-place-reads-load-four-steps.md)."""
    codes, heads = _places(w, sc, rows, col0, COLS, FMT)
    wide, half = tl.arange(0, 128), tl.arange(0, 64)
    if FMT == 6:
        low = _byte(codes + wide[None, :], row_ok[:, None] & (wide < 128)[None, :])  # [rows, 128]: each half's 64
        high = _byte(codes + 128 + half[None, :], row_ok[:, None] & (half < 64)[None, :])
        high0, high1 = first_last(high)
        low_n0, low_n1 = first_last(low)
        acc = _half(acc, a_ptr, a_off, a_ok, col0, COLS, low_n0, high0, heads, row_ok, 0, ROUND, IEEE, WFIRST)
        acc = _half(acc, a_ptr, a_off, a_ok, col0, COLS, low_n1, high1, heads, row_ok, 1, ROUND, IEEE, WFIRST)
    else:
        byte = _byte(codes + 32 * (FMT - 4) + wide[None, :], row_ok[:, None] & (wide < 128)[None, :])  # [rows, 128]
        b01, b23 = first_last(byte)
        b0, b1 = first_last(b01)
        b2, b3 = first_last(b23)
        high5 = b0  # (unread but for Q5_K)
        if FMT == 5:  # one 32-byte load of fifth bits serves every sub-block
            lane = tl.arange(0, 32)
            high5 = _byte(codes + lane[None, :], row_ok[:, None] & (lane < 32)[None, :])
        acc = _chunk(acc, a_ptr, a_off, a_ok, col0, COLS, b0, high5, heads, row_ok, 0, FMT, ROUND, IEEE, WFIRST)
        acc = _chunk(acc, a_ptr, a_off, a_ok, col0, COLS, b1, high5, heads, row_ok, 1, FMT, ROUND, IEEE, WFIRST)
        acc = _chunk(acc, a_ptr, a_off, a_ok, col0, COLS, b2, high5, heads, row_ok, 2, FMT, ROUND, IEEE, WFIRST)
        acc = _chunk(acc, a_ptr, a_off, a_ok, col0, COLS, b3, high5, heads, row_ok, 3, FMT, ROUND, IEEE, WFIRST)
    return acc
