"""MXFP4 weight tiles for the Triton MoE kernels (`wisp.core.kernels.triton_moe`): e2m1 codes built from their bits,
a step's packed bytes read as one contiguous tile and multiplied as its even columns (low nibbles), then its odd ones,
and `loads` steps' bytes read in one load a row where the bank is read in place from host memory
(docs/decisions/mxfp4-in-place-reads-load-four-steps.md), each step computed as alone: the sums do not depend on
`loads`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from wisp.core.kernels.triton_interpreter import dot_cols, dot_rows, rounded


@triton.jit
def _e2m1(code):
    """A 4-bit e2m1 code's value as float32 (exact), built from its bits: magnitude m = code & 7 is 0.5 * m up to
    1 (m < 2); past it exponent field m >> 1 and mantissa bit m & 1, rebiased (+126) into float32's fields; bit 3
    the sign (code 8: -0.0)."""
    m = code & 7
    bits = tl.where(m < 2, m * 0x3F000000, (m << 22) + (126 << 23)) | ((code & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _mxfp4_bytes(w, sc, rows, row_ok, col0, COLS: tl.constexpr, WIDTH: tl.constexpr):
    """The packed bytes [rows, WIDTH / 2] of one expert's MXFP4 [R, COLS] weight from column col0, one contiguous
    load a row, and each byte's e8m0 scale beside it (`_mxfp4_decoded` decodes them)."""
    half = col0 // 2 + tl.arange(0, WIDTH // 2)
    mask = row_ok[:, None] & (half < COLS // 2)[None, :]
    byte = tl.load(w + rows[:, None] * (COLS // 2) + half[None, :], mask=mask, other=0).to(tl.int32)
    # a scale gathered per byte, not one per 32-column group: docs/decisions/mxfp4-scale-gathered-per-element.md
    s = tl.load(sc + rows[:, None] * (COLS // 32) + (half // 16)[None, :], mask=mask, other=127).to(tl.int32)
    return byte, s


@triton.jit
def _mxfp4_decoded(byte, s, ROUND: tl.constexpr):
    """Bytes and their scales (`_mxfp4_bytes`) -> the even columns' values and the odd ones', rounded."""
    scale = (s.to(tl.uint32) << 23).to(tl.float32, bitcast=True)
    return rounded(_e2m1(byte & 0xF) * scale, ROUND), rounded(_e2m1(byte >> 4) * scale, ROUND)


@triton.jit
def first_last(t):
    """A tile [R, 2H] -> its first H columns and its last H (in registers)."""
    return tl.split(tl.permute(tl.reshape(t, (t.shape[0], 2, t.shape[1] // 2)), (0, 2, 1)))


@triton.jit
def _mxfp4_step(acc, a_ptr, a_off, a_ok, col0, COLS: tl.constexpr, BLOCK_C: tl.constexpr, byte, s,
                ROUND: tl.constexpr, IEEE: tl.constexpr, WFIRST: tl.constexpr):
    """acc + one BLOCK_C-column step from col0: the activation's even and odd columns against the bytes' decoded
    halves (`_dot_halves`), exactly as the step loaded alone computes it."""
    ae, ao = _halves(a_ptr, a_off, a_ok, col0, COLS, BLOCK_C)
    return _dot_halves(acc, ae, ao, *_mxfp4_decoded(byte, s, ROUND), IEEE, WFIRST)


@triton.jit
def _two_steps(acc, a_ptr, a_off, a_ok, col0, COLS: tl.constexpr, BLOCK_C: tl.constexpr, byte, s,
               ROUND: tl.constexpr, IEEE: tl.constexpr, WFIRST: tl.constexpr):
    """acc + the two BLOCK_C-column steps from col0 whose bytes and scales [rows, BLOCK_C] were loaded as one tile,
    in turn (`_mxfp4_step`); the second skipped where it starts past COLS."""
    b0, b1 = first_last(byte)
    s0, s1 = first_last(s)
    acc = _mxfp4_step(acc, a_ptr, a_off, a_ok, col0, COLS, BLOCK_C, b0, s0, ROUND, IEEE, WFIRST)
    if col0 + BLOCK_C < COLS:
        acc = _mxfp4_step(acc, a_ptr, a_off, a_ok, col0 + BLOCK_C, COLS, BLOCK_C, b1, s1, ROUND, IEEE, WFIRST)
    return acc


@triton.jit
def mxfp4_steps(acc, a_ptr, a_off, a_ok, w, sc, rows, w_ok, col0, COLS: tl.constexpr, BLOCK_C: tl.constexpr,
                LOADS: tl.constexpr, ROUND: tl.constexpr, IEEE: tl.constexpr, WFIRST: tl.constexpr = False):
    """acc + LOADS consecutive BLOCK_C-column steps from col0, their bytes read in one load a row (LOADS x BLOCK_C / 2
    contiguous bytes: read in place over PCIe, a request of 32 bytes a row costs about half the link, one of 128 a
    little), each step then computed in turn as alone, so the sums are those of LOADS = 1. A step past COLS adds
    nothing (skipped). LOADS: 1, 2 or 4."""
    byte, s = _mxfp4_bytes(w, sc, rows, w_ok, col0, COLS, LOADS * BLOCK_C)
    if LOADS == 1:
        acc = _mxfp4_step(acc, a_ptr, a_off, a_ok, col0, COLS, BLOCK_C, byte, s, ROUND, IEEE, WFIRST)
    elif LOADS == 2:
        acc = _two_steps(acc, a_ptr, a_off, a_ok, col0, COLS, BLOCK_C, byte, s, ROUND, IEEE, WFIRST)
    else:
        tl.static_assert(LOADS == 4)
        b01, b23 = first_last(byte)
        s01, s23 = first_last(s)
        acc = _two_steps(acc, a_ptr, a_off, a_ok, col0, COLS, BLOCK_C, b01, s01, ROUND, IEEE, WFIRST)
        if col0 + 2 * BLOCK_C < COLS:
            acc = _two_steps(acc, a_ptr, a_off, a_ok, col0 + 2 * BLOCK_C, COLS, BLOCK_C, b23, s23, ROUND, IEEE, WFIRST)
    return acc


@triton.jit
def _halves(a_ptr, row_offsets, row_ok, col0, COLS: tl.constexpr, BLOCK_C: tl.constexpr):
    """An activation tile [rows, BLOCK_C columns from col0] as its even columns and its odd ones, the partners of
    `_mxfp4_decoded`: loaded whole (contiguous, vector loads), then split in registers."""
    cols = col0 + tl.arange(0, BLOCK_C)
    a = tl.load(a_ptr + row_offsets[:, None] + cols[None, :], mask=row_ok[:, None] & (cols < COLS)[None, :], other=0.0)
    return tl.split(tl.reshape(a, (a.shape[0], BLOCK_C // 2, 2)))


@triton.jit
def _dot_halves(acc, a_even, a_odd, w_even, w_odd, IEEE: tl.constexpr, WFIRST: tl.constexpr):
    """acc + the even columns' products, then the odd columns' (`_halves` by `_mxfp4_decoded`); WFIRST: acc is
    [weight rows, activation rows] (`dot_cols`), else [activation rows, weight rows] (`dot_rows`)."""
    if WFIRST:
        acc = dot_cols(w_even.to(a_even.dtype), a_even, acc, IEEE)
        return dot_cols(w_odd.to(a_odd.dtype), a_odd, acc, IEEE)
    acc = dot_rows(a_even, w_even.to(a_even.dtype), acc, IEEE)
    return dot_rows(a_odd, w_odd.to(a_odd.dtype), acc, IEEE)
