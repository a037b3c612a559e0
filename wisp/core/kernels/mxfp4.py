"""MXFP4 weights: the OCP microscaling FP4 format GPT-OSS stores its experts in (`*_blocks`, `*_scales`).

A row of K values is cut into K / 32 blocks. Each block keeps 32 FP4 (e2m1) codes packed two per byte,
the even element in the low nibble (`blocks` uint8 [..., K/32, 16]), and one shared power-of-two scale as
a biased exponent byte (e8m0: `scales` uint8 [..., K/32], scale = 2^(byte - 127)):

    w[..., 32 g + 2 j]     = E2M1[blocks[..., g, j] & 0xF] * 2^(scales[..., g] - 127)
    w[..., 32 g + 2 j + 1] = E2M1[blocks[..., g, j] >> 4]  * 2^(scales[..., g] - 127)

with E2M1 = 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (bit 3 the sign). `dequantize_mxfp4` computes
exactly that (a table lookup and an exact power-of-two scaling, so the same bits anywhere and for any
slice); it equals transformers' GPT-OSS conversion before that one's final transpose (tested).
`quantize_mxfp4` is the inverse used for test checkpoints and dummy weights: per block the smallest scale
that keeps the block's largest magnitude within 6, then each value to its nearest code.
"""

from __future__ import annotations

import torch

BLOCK = 32  # values per shared scale
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """blocks uint8 [..., G, 16] and scales uint8 [..., G] -> [..., G * 32] in `dtype`."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[-1] != BLOCK // 2 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match: "
                         f"blocks must be [..., G, {BLOCK // 2}] and scales [..., G]")
    table = torch.tensor(E2M1, dtype=torch.float32, device=blocks.device)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2).long()  # [..., G, 32], even first
    values = torch.ldexp(table[codes], scales.to(torch.int32)[..., None] - 127)  # exact: a power of two
    return values.flatten(-2).to(dtype)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., K] (K a multiple of 32) -> (blocks uint8 [..., K/32, 16], scales uint8 [..., K/32])."""
    if w.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 rows must be a multiple of {BLOCK} long, got {w.shape[-1]}")
    grouped = w.float().unflatten(-1, (w.shape[-1] // BLOCK, BLOCK))  # [..., G, 32]
    amax = grouped.abs().amax(dim=-1)  # [..., G]
    exponent = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.full_like(amax, -127.0))
    exponent = exponent.clamp(-127, 127)
    scaled = torch.ldexp(grouped, (-exponent).to(torch.int32)[..., None])  # |scaled| <= 6
    magnitudes = torch.tensor(E2M1[:8], device=w.device)
    code = (scaled.abs()[..., None] - magnitudes).abs().argmin(dim=-1)  # nearest magnitude (ties: the smaller)
    code = code + 8 * (scaled < 0)
    code = code.to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8)
