"""Whether the Triton kernels run under Triton's interpreter (CPU machines: tests/conftest.py sets
TRITON_INTERPRET=1 before any kernel module is imported), read once at import, as @triton.jit reads it,
and the one rule the kernels follow because of it.

Under the interpreter tl.dot misreads 16-bit float operands (Triton 3.9), so the kernels that multiply
16-bit tiles (`wisp.core.kernels.triton_moe`, `wisp.core.kernels.triton_linear`, `wisp.engine.triton_attention`) widen them
to float32 there first: exact products, IEEE sums (`ieee_products`, `dot_rows`). Compiled on a GPU they
multiply the 16-bit tiles on tensor cores; float32 operands are multiplied in IEEE everywhere (never TF32).
The interpreter also truncates a float32 -> bfloat16 cast, where the GPU (and torch) round to nearest even:
`rounded` rounds by the bits there and with the hardware's cast when compiled, the same bits either way.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
NATIVE_CASTS = tl.constexpr(not INTERPRETED)  # compiled: the hardware's float32 -> 16-bit casts round to nearest even


def ieee_products(dtype: torch.dtype) -> bool:
    """Whether a kernel's products of `dtype` operands run as float32 IEEE: float32 ones, or any under the
    interpreter."""
    return dtype == torch.float32 or INTERPRETED


@triton.jit
def dot_rows(a, w, acc, IEEE: tl.constexpr):
    """acc + a [M, K] @ w [N, K]^T, float32 accumulation. IEEE (`ieee_products`): float32 operands, 16-bit ones
    widened first (exact)."""
    if IEEE:
        return tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(a, tl.trans(w), acc)


@triton.jit
def dot_cols(w, a, acc, IEEE: tl.constexpr):
    """acc + w [N, K] @ a [M, K]^T, float32 accumulation: `dot_rows` transposed, the weight tile the product's left
    operand (on Hopper held in registers after its dequantization, where the right one must be in shared memory).
    IEEE as in `dot_rows`."""
    if IEEE:
        return tl.dot(w.to(tl.float32), tl.trans(a.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(w, tl.trans(a), acc)


@triton.jit
def rounded(w, ROUND: tl.constexpr):
    """float32 w rounded to the compute dtype (ROUND: 0 float32, 1 bfloat16, 2 float16) to nearest even as torch
    casts; callers cast the result to the compute dtype (exact). Compiled: one hardware cast, and the result is
    already in the compute dtype. Interpreted: bfloat16 by the bits (its plain cast truncates), kept in float32;
    the same values for every finite w."""
    if ROUND == 1:
        if NATIVE_CASTS:
            w = w.to(tl.bfloat16)
        else:
            bits = w.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            w = bits.to(tl.float32, bitcast=True)
    elif ROUND == 2:
        w = w.to(tl.float16) if NATIVE_CASTS else w.to(tl.float16).to(tl.float32)
    return w


ROUND_IDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # `rounded`'s codes for the compute dtype
