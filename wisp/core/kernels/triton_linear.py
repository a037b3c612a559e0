"""`triton_linear`: the dense projections (attention, router, dense MLPs, LM head) as one row-invariant
Triton GEMM launch, on the GPU.

`wisp.core.kernels.rows.linear` keeps a row's bits independent of its batch by cutting every input into 16-row
tiles and calling the GEMM library once per tile: one launch per 16 tokens and weight, which left a long
prefill launch-bound (docs/decisions/dense-projections-as-one-triton-launch.md). Here one launch covers every
row, and the invariance holds by construction instead:
- program (block of N, block of M) computes a [BLOCK_M, BLOCK_N] output tile as a sum of `tl.dot`s over
  K in blocks of BLOCK_K, always in the same order, accumulated in float32 (no split-K);
- the tile shape depends on (N, K) and the dtype only (`tile_for`), never on M, and M is not specialised
  on, so a one-token decode step and a 2048-token prefill run the same instructions on a row;
- a row of a tensor-core product is computed by the same instructions whatever the other rows of its
  tile hold (rows past M are masked to zeros and never stored).
So `linear(x)[rows] == linear(x[rows])` bit for bit for any consecutive rows (tested), as `rows.linear`
promises; the bits differ from cuBLAS's (another order of the sum). 16-bit operands multiply on tensor
cores; float32 ones in IEEE (never TF32), as torch's default matmul. The bias is added in float32 to the
sum before the one rounding to the output dtype. Under Triton's interpreter (the CPU tests) 16-bit
operands are widened to float32 first, since its tl.dot misreads them (`wisp.core.kernels.triton_interpreter`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from wisp.core.kernels.triton_interpreter import dot_rows, ieee_products


class Tile(NamedTuple):
    """A launch's geometry, fixed per weight shape: the output tile, the K step, and Triton's knobs."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int


def tile_for(n: int, k: int, dtype: torch.dtype) -> Tile:
    """The tile for a weight [n, k] of `dtype`: a function of the weight alone (never of the rows), since
    the tile is part of every row's arithmetic (the pipeline depth, `stages`, is not: it fits the shared
    memory of consumer GPUs, about 100 KB a block). 64 rows feed the Hopper tensor cores' smallest product;
    narrow N blocks keep a one-row decode step spread over the GPU's multiprocessors
    (`wisp bench sweep linear` times the alternatives)."""
    if dtype == torch.float32:
        return Tile(64, 32, 32, 4, 2)
    block_n = 64 if n >= 8192 else 32
    return Tile(64, block_n, 128, 4, 3)  # 3 stages of (64 + block_n) x 128 x 2 bytes: <= 96 KB of shared memory


@triton.jit(do_not_specialize=["M"])
def _linear(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, s_xm, s_wn, s_om,
            HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            IEEE: tl.constexpr):
    """out[m, n] = sum_k x[m, k] w[n, k] (+ b[n]) for one [BLOCK_M, BLOCK_N] tile, K in order."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    x_rows = x_ptr + rm[:, None] * s_xm
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        a = tl.load(x_rows + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # [BM, BK]
        w = tl.load(w_rows + (k0 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)  # [BN, BK]
        acc = dot_rows(a, w, acc, IEEE)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rm[:, None] * s_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def triton_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  tile: Tile | None = None) -> torch.Tensor:
    """x [T, in] @ weight[out, in]^T (+ bias) -> [T, out] in x's dtype, row-invariant (one launch).
    `tile` overrides `tile_for` (benchmarks: the same rows then get other bits)."""
    if x.dtype != weight.dtype:
        raise TypeError(f"triton_linear: x is {x.dtype}, weight {weight.dtype}")
    n, k = weight.shape
    if x.dim() != 2 or x.shape[1] != k or (bias is not None and bias.shape != (n,)):
        bias_shape = None if bias is None else tuple(bias.shape)
        raise ValueError(f"triton_linear: x {tuple(x.shape)}, weight {(n, k)}, bias {bias_shape}: "
                         f"expected x [T, {k}] and bias [{n}]")
    t = x.shape[0]
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    tile = tile or tile_for(n, k, weight.dtype)
    grid = (triton.cdiv(n, tile.block_n), triton.cdiv(t, tile.block_m))
    _linear[grid](x, weight, x if bias is None else bias, out, t, n, k, x.stride(0), weight.stride(0), out.stride(0),
                  HAS_BIAS=bias is not None, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
                  IEEE=ieee_products(x.dtype), num_warps=tile.warps, num_stages=tile.stages)
    return out
