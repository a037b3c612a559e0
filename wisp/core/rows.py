"""Row-invariant primitives: a row's result never depends on the other rows it is computed with.

A GEMM library picks its algorithm (and so its reduction order) from the problem shape: one row is a
GEMV, sixteen rows a GEMM, and a large M may split K. A token's output would then depend on how many
other tokens share its batch, its expert or its prefill group. Every per-row operation whose result
could depend on M therefore runs on fixed tiles of `ROW_TILE` rows (the last tile zero-padded), so the
library always sees the same shape and each row is reduced the same way wherever it sits.

A second effect: some CPU float32 GEMM kernels reduce a row differently by its position in the tile
when the inner dimension is not a multiple of 4. `tile_linear` zero-pads such an inner dimension to a
multiple of 8 (exact: the added products are zeros); real models' widths never need it.

Invariant (tested): for any x and any split of its rows into consecutive chunks,
`op(x) == cat([op(chunk) for chunk])` with torch.equal.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

ROW_TILE = 16


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


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, in] @ weight[out, in]^T (+ bias) -> [T, out], row-invariant."""
    return map_row_tiles(x, lambda tile: tile_linear(tile, weight, bias))


def linear_many(x: torch.Tensor, weights, biases=None) -> list[torch.Tensor]:
    """[linear(x, w, b) for each weight], padding x once (the same tiles, so the same bits)."""
    t, xp = x.shape[0], pad_rows(x)
    biases = biases or [None] * len(weights)
    return [linear(xp, w, b)[:t] for w, b in zip(weights, biases)]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in float32, cast back, times weight (the HF formula); row-invariant."""

    def norm(tile: torch.Tensor) -> torch.Tensor:
        h = tile.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(tile.dtype)

    return map_row_tiles(x, norm)
