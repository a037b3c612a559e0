"""The heads of one fused q/k/v projection made ready for attention in one launch (CUDA): q and k normed (per head,
over the whole projection, or not at all) and rotated, v copied out, each into its own contiguous [T, heads, hd].

It does what `triton_rms_norm` then `triton_rope` (and a copy for v) do to the projection's three column ranges,
with the same operations in the same order (their bits under the interpreter; compiled, the threads of a reduction
may be laid out otherwise than in those kernels, so the sums of squares agree to rounding):
- a norm's sum of squares is the same one-dimensional fixed-order reduction over the normed width (a head, or the
  whole q or k row) as `_rms_norm`'s, then each element is x * rsqrt(mean + eps), cast to x's dtype, times the
  weight in float32, cast again;
- the rotation is `_rope`'s: the half-split formula in float32 on the normed (rounded) values, rounded once.
Program (token, head) with heads numbered q's, then k's, then v's: each depends on its own token's row only, so the
launch is batch-invariant. Requires the rotation to span the head (rope_dim == head_dim, a power of two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NORMS = {"none": 0, "per_head": 1, "full": 2}


@triton.jit
def _norm_rope(src, w_norm, cos, sin, dst, head, eps, WIDTH: tl.constexpr, BLOCK_W: tl.constexpr,
               HALF: tl.constexpr, NORM: tl.constexpr):
    """One head of a q or k row at `src` (its WIDTH columns), normed as NORM says and rotated, stored at `dst`."""
    d = tl.arange(0, HALF)
    head_src = src + head * 2 * HALF
    x1 = tl.load(head_src + d)
    x2 = tl.load(head_src + HALF + d)
    if NORM != 0:
        if NORM == 1:  # per head: the head's own 2 * HALF values
            row, n, w1, w2 = head_src, 2 * HALF, w_norm + d, w_norm + HALF + d
            cols = tl.arange(0, 2 * HALF)
            ok = cols < 2 * HALF
        else:  # over the whole row of WIDTH values
            row, n, w1, w2 = src, WIDTH, w_norm + head * 2 * HALF + d, w_norm + head * 2 * HALF + HALF + d
            cols = tl.arange(0, BLOCK_W)
            ok = cols < WIDTH
        h = tl.load(row + cols, mask=ok, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(h * h, axis=0) / n + eps)
        x1 = (tl.load(w1).to(tl.float32) * (x1.to(tl.float32) * r).to(x1.dtype).to(tl.float32)).to(x1.dtype)
        x2 = (tl.load(w2).to(tl.float32) * (x2.to(tl.float32) * r).to(x2.dtype).to(tl.float32)).to(x2.dtype)
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    c1, c2 = tl.load(cos + d).to(tl.float32), tl.load(cos + HALF + d).to(tl.float32)
    s1, s2 = tl.load(sin + d).to(tl.float32), tl.load(sin + HALF + d).to(tl.float32)
    tl.store(dst + d, (x1 * c1 - x2 * s1).to(dst.dtype.element_ty))
    tl.store(dst + HALF + d, (x2 * c2 + x1 * s2).to(dst.dtype.element_ty))


@triton.jit
def _qkv_heads(qkv_ptr, q_norm, k_norm, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, s_t, eps, H: tl.constexpr,
               HKV: tl.constexpr, HALF: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
               NORM: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)  # q heads, then k heads, then v heads
    hd: tl.constexpr = 2 * HALF
    row = qkv_ptr + token * s_t
    cos, sin = cos_ptr + token * hd, sin_ptr + token * hd
    if j < H:
        _norm_rope(row, q_norm, cos, sin, q_ptr + (token * H + j) * hd, j, eps, H * hd, BLOCK_Q, HALF, NORM)
    elif j < H + HKV:
        _norm_rope(row + H * hd, k_norm, cos, sin, k_ptr + (token * HKV + j - H) * hd, j - H, eps, HKV * hd, BLOCK_K,
                   HALF, NORM)
    else:
        d = tl.arange(0, hd)
        head = j - H - HKV
        tl.store(v_ptr + (token * HKV + head) * hd + d, tl.load(row + (H + HKV + head) * hd + d))


def triton_qkv_heads(qkv: torch.Tensor, heads: int, kv_heads: int, cos: torch.Tensor, sin: torch.Tensor,
                     norm: str = "none", q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                     eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [T, (heads + 2 kv_heads) * hd] (rows may be strided), cos / sin [T, 1, hd] -> q [T, heads, hd],
    k and v [T, kv_heads, hd], contiguous. norm: "none", "per_head" (q_norm / k_norm [hd]) or "full"
    (q_norm [heads * hd], k_norm [kv_heads * hd]); the norm weights must share qkv's dtype."""
    t = qkv.shape[0]
    hd = qkv.shape[1] // (heads + 2 * kv_heads)
    if qkv.stride(1) != 1 or hd * (heads + 2 * kv_heads) != qkv.shape[1] or hd & (hd - 1) or cos.shape[-1] != hd:
        raise ValueError(f"triton_qkv_heads: qkv {tuple(qkv.shape)} for {heads} + 2 x {kv_heads} heads needs unit "
                         f"column stride, a power-of-two head width and a rotation over it (cos {tuple(cos.shape)})")
    q = torch.empty((t, heads, hd), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((t, kv_heads, hd), dtype=qkv.dtype, device=qkv.device)
    v = torch.empty((t, kv_heads, hd), dtype=qkv.dtype, device=qkv.device)
    if t:
        _qkv_heads[(t, heads + 2 * kv_heads)](
            qkv, qkv if q_norm is None else q_norm, qkv if k_norm is None else k_norm, cos.contiguous(),
            sin.contiguous(), q, k, v, qkv.stride(0), eps, H=heads, HKV=kv_heads, HALF=hd // 2,
            BLOCK_Q=triton.next_power_of_2(heads * hd), BLOCK_K=triton.next_power_of_2(kv_heads * hd), NORM=NORMS[norm])
    return q, k, v
