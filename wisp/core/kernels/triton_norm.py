"""RMSNorm in Triton: one program per row, so a row's result never depends on the batch (CUDA).

Same formula as `wisp.core.kernels.rows.rms_norm` (the HF one): in float32 h = x * rsqrt(mean(x^2) + eps),
cast to x's dtype, times weight. The sum of squares is one fixed-order reduction over the row, so the
kernel is row-invariant by construction and needs no row tiles; its bits differ from the torch path's
(another reduction order), and every GPU path uses it, so they agree among themselves.

`triton_add_rms_norm` adds a residual first, in the same launch: s = x + delta rounded to x's dtype to nearest
even, as torch's `x + delta` rounds (its float32 sum of two 16-bit values, cast once), so it returns the bits of
`x + delta` and of `triton_rms_norm(x + delta)`, and the residual adds of a decoder layer cost no launch of their own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wisp.core.kernels.triton_interpreter import ROUND_IDS, rounded


@triton.jit
def _normed_row(x, w_ptr, out_ptr, row, n, eps, cols, ok, WEIGHT_IN_F32: tl.constexpr, ROUND: tl.constexpr):
    """One row x [BLOCK] (in its dtype) normalised, times the weight, stored at out's row. WEIGHT_IN_F32: the
    weight multiplies the float32 row before the one cast to x's dtype (GPT-OSS)."""
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    if WEIGHT_IN_F32:
        y = rounded(w.to(tl.float32) * h, ROUND)
    else:
        y = w.to(tl.float32) * h.to(x.dtype).to(tl.float32)
    tl.store(out_ptr + row * n + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rms_norm(x_ptr, w_ptr, out_ptr, n, eps, WEIGHT_IN_F32: tl.constexpr, ROUND: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    _normed_row(tl.load(x_ptr + row * n + cols, mask=ok, other=0.0), w_ptr, out_ptr, row, n, eps, cols, ok,
                WEIGHT_IN_F32, ROUND)


@triton.jit
def _add_rms_norm(x_ptr, d_ptr, sum_ptr, w_ptr, out_ptr, n, eps, WEIGHT_IN_F32: tl.constexpr, ROUND: tl.constexpr,
                  BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=ok, other=0.0)
    d = tl.load(d_ptr + row * n + cols, mask=ok, other=0.0)
    s = rounded(x.to(tl.float32) + d.to(tl.float32), ROUND).to(x.dtype)  # [BLOCK]: torch's x + delta
    tl.store(sum_ptr + row * n + cols, s, mask=ok)
    _normed_row(s, w_ptr, out_ptr, row, n, eps, cols, ok, WEIGHT_IN_F32, ROUND)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(-1, x.shape[-1])


def _out_dtype(x: torch.Tensor, weight: torch.Tensor, weight_in_float32: bool) -> torch.dtype:
    return x.dtype if weight_in_float32 else torch.promote_types(x.dtype, weight.dtype)


def triton_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_in_float32: bool = False) -> torch.Tensor:
    """RMSNorm over the last dim of x [..., n] with weight [n]. weight_in_float32: the weight multiplies the float32
    normalised row before its one cast to x's dtype, as `wisp.core.kernels.rows.rms_norm_float32_weight` (GPT-OSS)."""
    n = x.shape[-1]
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=_out_dtype(x, weight, weight_in_float32), device=x.device)
    if x2.shape[0]:
        _rms_norm[(x2.shape[0],)](x2, weight.contiguous(), out, n, eps, WEIGHT_IN_F32=weight_in_float32,
                                  ROUND=ROUND_IDS[x.dtype], BLOCK=triton.next_power_of_2(n))
    return out.view(x.shape)


def triton_add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                        weight_in_float32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, RMSNorm of it with weight [n]) in one launch; x and delta [..., n] of one dtype.
    weight_in_float32: as `triton_rms_norm`'s."""
    if delta.dtype != x.dtype or delta.shape != x.shape:
        raise ValueError(f"delta {tuple(delta.shape)} {delta.dtype} must match x {tuple(x.shape)} {x.dtype}")
    n = x.shape[-1]
    x2, d2 = _rows(x), _rows(delta)
    total = torch.empty_like(x2)
    out = torch.empty(x2.shape, dtype=_out_dtype(x, weight, weight_in_float32), device=x.device)
    if x2.shape[0]:
        _add_rms_norm[(x2.shape[0],)](x2, d2, total, weight.contiguous(), out, n, eps, WEIGHT_IN_F32=weight_in_float32,
                                      ROUND=ROUND_IDS[x.dtype], BLOCK=triton.next_power_of_2(n))
    return total.view(x.shape), out.view(x.shape)
