"""Whether the Triton kernels run under Triton's interpreter (CPU machines: tests/conftest.py sets
TRITON_INTERPRET=1 before any kernel module is imported), read once at import, as @triton.jit reads it,
and the one rule the kernels follow because of it.

Under the interpreter tl.dot misreads 16-bit float operands (Triton 3.9), so the kernels that multiply
16-bit tiles (`wisp.core.kernels.triton_moe`, `wisp.core.kernels.triton_linear`, `wisp.engine.triton_attention`) widen them
to float32 there first: exact products, IEEE sums (`ieee_products`, `dot_rows`). Compiled on a GPU they
multiply the 16-bit tiles on tensor cores; float32 operands are multiplied in IEEE everywhere (never TF32).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


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
