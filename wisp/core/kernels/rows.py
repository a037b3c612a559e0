"""Row-invariant primitives: a row's result never depends on the other rows it is computed with.

A GEMM library picks its algorithm (and so its reduction order) from the problem shape: one row is a
GEMV, sixteen rows a GEMM, and a large M may split K. A token's output would then depend on how many
other tokens share its batch, its expert or its prefill group. Every per-row operation whose result
could depend on M therefore runs on fixed tiles of `ROW_TILE` rows (the last tile zero-padded), so the
library always sees the same shape and each row is reduced the same way wherever it sits.

A second effect: some CPU float32 GEMM kernels reduce a row differently by its position in the tile
when the inner dimension is not a multiple of 4. `tile_linear` zero-pads such an inner dimension to a
multiple of 8 (exact: the added products are zeros); real models' widths never need it.

A third: CPU elementwise kernels (silu, sigmoid, exp, cos, rsqrt, ...) run a vector body over the
flattened tensor and a scalar tail over the last `numel % step` elements (step = 2 x the SIMD width:
16 floats on AVX2, 32 on AVX-512), and split big tensors between threads at boundaries that follow
`numel`. The body and the tail compute a transcendental function differently, so whether a row's
elements fall in the tail depends on how many rows share the call and on the machine's vector width.
`pointwise` therefore feeds such ops only contiguous calls of a multiple of `POINTWISE_STEP` elements
(a whole number of vector steps on any x86 or Arm SIMD width) and at most `POINTWISE_BLOCK` elements
(below ATen's parallel grain), so every element runs through the same vector code, single-threaded,
whatever shares its call. Exact ops (+, -, *, /, casts, max) need none of this: IEEE rounds them the
same in every lane.

Invariant (tested): for any x and any split of its rows into consecutive chunks,
`op(x) == cat([op(chunk) for chunk])` with torch.equal, on every CPU, for every op here and for
`pointwise` of each transcendental the models use.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

ROW_TILE = 16
POINTWISE_STEP = 64  # elements: a multiple of every CPU SIMD loop step (2 x 512-bit of bf16 = 64)
POINTWISE_BLOCK = 2048  # elements per call: <= ATen's smallest parallel grain for unary math (2048)


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """x with zero rows appended up to a whole number of ROW_TILE tiles (at least one)."""
    t = x.shape[0]
    pad = (-t) % ROW_TILE if t else ROW_TILE
    return F.pad(x, (0, 0) * (x.dim() - 1) + (0, pad)) if pad else x  # one kernel


def map_row_tiles(x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Apply `fn` to consecutive [ROW_TILE, ...] tiles of x (zero-padded) and return the first T rows."""
    t = x.shape[0]
    x = pad_rows(x)
    pad = x.shape[0] - t
    outs = [fn(x[i : i + ROW_TILE]) for i in range(0, t + pad, ROW_TILE)]
    return torch.cat(outs)[:t] if len(outs) > 1 else outs[0][:t]


def tile_linear(tile: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear on one tile, with an odd inner dimension zero-padded to a multiple of 8."""
    pad = (-weight.shape[-1]) % 8
    if pad:
        tile, weight = F.pad(tile, (0, pad)), F.pad(weight, (0, pad))
    return F.linear(tile, weight, bias)


def linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in] @ weight[out, in]^T (+ bias) -> [T, out], row-invariant. weight: a tensor, or a packed one with
    `dequantized(dtype)` (`wisp.core.kernels.fp8_blocks.Fp8BlockWeight`), dequantized to x's dtype first."""
    if not isinstance(weight, torch.Tensor):
        weight = weight.dequantized(x.dtype)
    return map_row_tiles(x, lambda tile: tile_linear(tile, weight, bias))


def pointwise(fn: Callable[..., torch.Tensor], *xs: torch.Tensor) -> torch.Tensor:
    """fn(*xs) for an elementwise fn of same-shaped tensors, each element computed by the same code
    whatever else is in the tensor (see the module docstring). On the CPU the inputs are flattened,
    zero-padded to a multiple of POINTWISE_STEP and fed to fn in calls of at most POINTWISE_BLOCK
    elements; elsewhere (CUDA kernels apply one function per element) fn runs once on the whole."""
    x0 = xs[0]
    if x0.device.type != "cpu":
        return fn(*xs)
    n = x0.numel()
    pad = (-n) % POINTWISE_STEP if n else POINTWISE_STEP
    flat = [F.pad(x.reshape(-1), (0, pad)) for x in xs]
    outs = [fn(*(f[i : i + POINTWISE_BLOCK] for f in flat)) for i in range(0, n + pad, POINTWISE_BLOCK)]
    out = torch.cat(outs) if len(outs) > 1 else outs[0]
    return out[:n].view(x0.shape)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, elementwise and row-invariant (the gated MLP's activation)."""
    return pointwise(lambda g, u: F.silu(g) * u, gate, up)


def _normalized(tile: torch.Tensor, eps: float) -> torch.Tensor:
    """A tile's rows over their RMS, in float32."""
    h = tile.float()
    return h * pointwise(torch.rsqrt, h.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in float32, cast back, times weight (the HF formula); row-invariant."""
    return map_row_tiles(x, lambda tile: weight * _normalized(tile, eps).to(tile.dtype))


def rms_norm_float32_weight(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm` with the weight applied to the float32 activations before the cast back (GPT-OSS's RMSNorm,
    whose weight stays float32); row-invariant."""

    return map_row_tiles(x, lambda tile: (weight.float() * _normalized(tile, eps)).to(tile.dtype))
