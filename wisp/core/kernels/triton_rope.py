"""Rotary position embedding in Triton: one program per (token, head), q and k in one launch each (CUDA).

out = x * cos + rotate_half(x) * sin (the HF formula, half-split rotation), computed in float32 and
rounded once to x's dtype. Each row depends only on itself and its position: batch-invariant. The
bits differ from the torch path (which rounds after every op); every GPU path uses this kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope(x_ptr, cos_ptr, sin_ptr, out_ptr, H, HALF: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # token * H + head
    token = row // H
    d = tl.arange(0, HALF)
    x = x_ptr + row * 2 * HALF
    x1 = tl.load(x + d).to(tl.float32)
    x2 = tl.load(x + HALF + d).to(tl.float32)
    c = cos_ptr + token * 2 * HALF
    s = sin_ptr + token * 2 * HALF
    c1, c2 = tl.load(c + d).to(tl.float32), tl.load(c + HALF + d).to(tl.float32)
    s1, s2 = tl.load(s + d).to(tl.float32), tl.load(s + HALF + d).to(tl.float32)
    o = out_ptr + row * 2 * HALF
    tl.store(o + d, (x1 * c1 - x2 * s1).to(out_ptr.dtype.element_ty))
    tl.store(o + HALF + d, (x2 * c2 + x1 * s2).to(out_ptr.dtype.element_ty))


def triton_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, hd]; cos, sin [T, 1, hd] (hd a power of two) -> [T, H, hd]."""
    t, h, hd = x.shape
    x = x.contiguous()
    out = torch.empty_like(x)
    if t:
        _rope[(t * h,)](x, cos.contiguous(), sin.contiguous(), out, h, HALF=hd // 2)
    return out
