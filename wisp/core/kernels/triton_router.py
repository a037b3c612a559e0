"""The router's softmax -> top-k -> renormalise in one Triton launch, one program per token (CUDA); or GPT-OSS's
top-k of the logits -> softmax over those k (`topk_first`).

Same contract as the torch path in `MoEDecoder.moe`: probabilities in float32, the K largest in
descending order (ties to the lower expert id), optionally divided by their sum, written in the weights'
dtype. One program reads one row, so routing is batch-invariant; it replaces ~6 small launches per layer.
A benchmark's replayed routing (`override`, [T, K] ids, -1 where the router's choice stands) is taken in the
same launch: a token whose K replayed ids are all >= 0 gets them, with the probabilities at those ids as
weights (renormalised alike), as the torch path's gather does, so replayed runs pay a real run's routing cost.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _route(logits_ptr, ids_ptr, w_ptr, over_ptr, s_over, N, K: tl.constexpr, KP: tl.constexpr,
           BLOCK_N: tl.constexpr, NORM: tl.constexpr, OVERRIDE: tl.constexpr, TOPK_FIRST: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, BLOCK_N)
    ok = n < N
    x = tl.load(logits_ptr + row * N + n, mask=ok, other=float("-inf")).to(tl.float32)
    if TOPK_FIRST:  # the K largest logits are picked; the softmax is over them alone (below)
        p = x
    else:
        e = tl.where(ok, tl.exp(x - tl.max(x, axis=0)), 0.0)
        p = e / tl.sum(e, axis=0)
    left = tl.where(ok, p, float("-inf"))
    kk = tl.arange(0, KP)
    picked_w = tl.zeros((KP,), tl.float32)
    picked_i = tl.zeros((KP,), tl.int64)
    for j in tl.static_range(K):
        best = tl.max(left, axis=0)
        idx = tl.min(tl.where(left == best, n, BLOCK_N), axis=0)  # the lowest id among equal maxima
        picked_w = tl.where(kk == j, best, picked_w)
        picked_i = tl.where(kk == j, idx.to(tl.int64), picked_i)
        left = tl.where(n == idx, float("-inf"), left)
    if OVERRIDE:  # the replayed ids where all K are given, the probabilities at them
        over = tl.load(over_ptr + row * s_over + kk, mask=kk < K, other=0)  # [KP]
        given = tl.min(over, axis=0) >= 0
        at_over = tl.sum(tl.where(n[None, :] == over[:, None], p[None, :], 0.0), axis=1)  # [KP]: one term each
        picked_i = tl.where(given, over, picked_i)
        picked_w = tl.where(given, tl.where(kk < K, at_over, 0.0), picked_w)
    if TOPK_FIRST:
        top = tl.where(kk < K, picked_w, float("-inf"))
        e_top = tl.where(kk < K, tl.exp(top - tl.max(top, axis=0)), 0.0)
        picked_w = e_top / tl.sum(e_top, axis=0)
    if NORM:
        picked_w = picked_w / tl.sum(picked_w, axis=0)
    tl.store(ids_ptr + row * K + kk, picked_i, mask=kk < K)
    tl.store(w_ptr + row * K + kk, picked_w.to(w_ptr.dtype.element_ty), mask=kk < K)


def triton_route(logits: torch.Tensor, top_k: int, normalize: bool, weight_dtype: torch.dtype,
                 override: torch.Tensor | None = None, topk_first: bool = False):
    """logits [T, N] -> (topk_weights [T, K] in weight_dtype, topk_ids [T, K] int64); `override`: replayed ids
    [T, K] int64 on the logits' device (rows may share memory: stride 0), -1 where the router's choice stands.
    topk_first: the K largest logits, then a softmax over those K (GPT-OSS's routing), instead of a softmax over
    all N then its K largest."""
    t, n = logits.shape
    logits = logits.contiguous()
    ids = torch.empty((t, top_k), dtype=torch.int64, device=logits.device)
    weights = torch.empty((t, top_k), dtype=weight_dtype, device=logits.device)
    if t:
        over = ids if override is None else override  # (a placeholder pointer when there is none)
        if override is not None and (override.shape != (t, top_k) or override.stride(1) != 1):
            raise ValueError(f"override must be [{t}, {top_k}] with unit column stride, got {tuple(override.shape)}")
        _route[(t,)](logits, ids, weights, over, over.stride(0), n, K=top_k, KP=triton.next_power_of_2(top_k),
                     BLOCK_N=triton.next_power_of_2(n), NORM=normalize and not topk_first,
                     OVERRIDE=override is not None, TOPK_FIRST=topk_first)
    return weights, ids
