"""RMSNorm in Triton: one program per row, so a row's result never depends on the batch (CUDA).

Same formula as `wisp.core.kernels.rows.rms_norm` (the HF one): in float32 h = x * rsqrt(mean(x^2) + eps),
cast to x's dtype, times weight. The sum of squares is one fixed-order reduction over the row, so the
kernel is row-invariant by construction and needs no row tiles; its bits differ from the torch path's
(another reduction order), and every GPU path uses it, so they agree among themselves.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm(x_ptr, w_ptr, out_ptr, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=ok, other=0.0)
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    y = w.to(tl.float32) * h.to(x.dtype).to(tl.float32)
    tl.store(out_ptr + row * n + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def triton_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x [..., n] with weight [n]."""
    n = x.shape[-1]
    x2 = x.contiguous().view(-1, n)
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if x2.shape[0]:
        _rms_norm[(x2.shape[0],)](x2, weight.contiguous(), out, n, eps, BLOCK=triton.next_power_of_2(n))
    return out.view(x.shape)
