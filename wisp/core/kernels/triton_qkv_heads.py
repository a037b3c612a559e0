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

Given `cache` (`CacheSlots`: a layer's paged cache [blocks, kv_heads, block_size, hd] and each token's block and
offset), the k and v heads are also stored there, so a decode step writes its keys and values in this launch rather
than copying them in one more (the same bytes `wisp.engine.triton_attention.write_kv` stores).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

NORMS = {"none": 0, "per_head": 1, "full": 2}


@dataclass(frozen=True)
class CacheSlots:
    """Where each token's k and v heads go in one layer's paged cache: k_cache and v_cache [NB, Hkv, bs, hd]
    (unit stride along hd), token t at (blocks[t], head, offsets[t]); blocks and offsets [T] integers."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    blocks: torch.Tensor
    offsets: torch.Tensor


@triton.jit
def _norm_rope(src, w_norm, cos, sin, dst, head, eps, WIDTH: tl.constexpr, BLOCK_W: tl.constexpr,
               HALF: tl.constexpr, NORM: tl.constexpr, dst2, TWICE: tl.constexpr):
    """One head of a q or k row at `src` (its WIDTH columns), normed as NORM says and rotated, stored at `dst` (and
    at `dst2` if TWICE)."""
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
    y1, y2 = (x1 * c1 - x2 * s1).to(dst.dtype.element_ty), (x2 * c2 + x1 * s2).to(dst.dtype.element_ty)
    tl.store(dst + d, y1)
    tl.store(dst + HALF + d, y2)
    if TWICE:
        tl.store(dst2 + d, y1)
        tl.store(dst2 + HALF + d, y2)


@triton.jit
def _qkv_heads(qkv_ptr, q_norm, k_norm, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, s_t, eps, k_cache, v_cache,
               blocks_ptr, offs_ptr, s_cb, s_ch, s_cp, H: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr,
               BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, CACHE: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)  # q heads, then k heads, then v heads
    hd: tl.constexpr = 2 * HALF
    row = qkv_ptr + token * s_t
    cos, sin = cos_ptr + token * hd, sin_ptr + token * hd
    at = 0  # the token's (block, offset) in the cache, as an element offset
    if CACHE:
        at = tl.load(blocks_ptr + token).to(tl.int64) * s_cb + tl.load(offs_ptr + token).to(tl.int64) * s_cp
    if j < H:
        _norm_rope(row, q_norm, cos, sin, q_ptr + (token * H + j) * hd, j, eps, H * hd, BLOCK_Q, HALF, NORM, q_ptr,
                   False)
    elif j < H + HKV:
        head = j - H
        _norm_rope(row + H * hd, k_norm, cos, sin, k_ptr + (token * HKV + head) * hd, head, eps, HKV * hd, BLOCK_K,
                   HALF, NORM, k_cache + at + head * s_ch, CACHE)
    else:
        d = tl.arange(0, hd)
        head = j - H - HKV
        v = tl.load(row + (H + HKV + head) * hd + d)
        tl.store(v_ptr + (token * HKV + head) * hd + d, v)
        if CACHE:
            tl.store(v_cache + at + head * s_ch + d, v)


def triton_qkv_heads(qkv: torch.Tensor, heads: int, kv_heads: int, cos: torch.Tensor, sin: torch.Tensor,
                     norm: str = "none", q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                     eps: float = 1e-6, cache: CacheSlots | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [T, (heads + 2 kv_heads) * hd] (rows may be strided), cos / sin [T, 1, hd] -> q [T, heads, hd],
    k and v [T, kv_heads, hd], contiguous. norm: "none", "per_head" (q_norm / k_norm [hd]) or "full"
    (q_norm [heads * hd], k_norm [kv_heads * hd]); the norm weights must share qkv's dtype. `cache`: k and v are
    stored there too."""
    t = qkv.shape[0]
    hd = qkv.shape[1] // (heads + 2 * kv_heads)
    if qkv.stride(1) != 1 or hd * (heads + 2 * kv_heads) != qkv.shape[1] or hd & (hd - 1) or cos.shape[-1] != hd:
        raise ValueError(f"triton_qkv_heads: qkv {tuple(qkv.shape)} for {heads} + 2 x {kv_heads} heads needs unit "
                         f"column stride, a power-of-two head width and a rotation over it (cos {tuple(cos.shape)})")
    q = torch.empty((t, heads, hd), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((t, kv_heads, hd), dtype=qkv.dtype, device=qkv.device)
    v = torch.empty((t, kv_heads, hd), dtype=qkv.dtype, device=qkv.device)
    if cache is not None:
        kc = cache.k_cache
        if (kc.shape[1], kc.shape[3]) != (kv_heads, hd) or kc.stride() != cache.v_cache.stride() or kc.stride(3) != 1:
            raise ValueError(f"triton_qkv_heads: a cache {tuple(kc.shape)} cannot take {kv_heads} heads of {hd}")
        where = (kc, cache.v_cache, cache.blocks, cache.offsets, kc.stride(0), kc.stride(1), kc.stride(2))
    else:
        where = (q, q, q, q, 0, 0, 0)  # (unread)
    if t:
        _qkv_heads[(t, heads + 2 * kv_heads)](
            qkv, qkv if q_norm is None else q_norm, qkv if k_norm is None else k_norm, cos.contiguous(),
            sin.contiguous(), q, k, v, qkv.stride(0), eps, *where, H=heads, HKV=kv_heads, HALF=hd // 2,
            BLOCK_Q=triton.next_power_of_2(heads * hd), BLOCK_K=triton.next_power_of_2(kv_heads * hd), NORM=NORMS[norm],
            CACHE=cache is not None)
    return q, k, v
