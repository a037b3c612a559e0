"""Q8_0 experts kept packed: llama.cpp's 8-bit block format as an expert bank holds it.

A row of K values is cut into K / 32 blocks, each a float16 scale d and 32 int8 codes q, value = d * q (float32,
exact: an 11-bit by 8-bit product). llama.cpp stores a block as 34 bytes (d, then q); the bank keeps the same
bytes apart, by role: codes int8 [..., K] (the row's values in order) and scales float16 [..., K / 32]
(`split_blocks`), so a weight is one byte and a 32nd of two: 8.5 bits, exactly the file's size, on the host, over
the link and in the slots. `dequantize_q8_0` gives the floats of the `gguf` package's dequantizer (tested), cast
to the compute dtype (to nearest even), as the GGUF reader's dequantized twin is.
"""

from __future__ import annotations

import torch

BLOCK = 32  # values per scale
BLOCK_BYTES = 2 + BLOCK  # llama.cpp's block: float16 scale, 32 int8 codes


def split_blocks(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's Q8_0 rows, uint8 [..., G * 34] -> (codes int8 [..., G * 32], scales float16 [..., G])."""
    if packed.dtype != torch.uint8 or packed.shape[-1] % BLOCK_BYTES:
        raise ValueError(f"Q8_0 rows are whole {BLOCK_BYTES}-byte blocks of uint8, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    blocks = packed.reshape(*packed.shape[:-1], -1, BLOCK_BYTES)  # [..., G, 34]
    scales = blocks[..., :2].contiguous().view(torch.float16)[..., 0]  # [..., G]
    codes = blocks[..., 2:].contiguous().view(torch.int8).flatten(-2)  # [..., G * 32]
    return codes, scales


def dequantize_q8_0(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """codes int8 [..., K] and scales float16 [..., K / 32] -> [..., K] in `dtype`."""
    if codes.dtype != torch.int8 or scales.dtype != torch.float16:
        raise ValueError(f"Q8_0 codes and scales must be int8 and float16, got {codes.dtype} and {scales.dtype}")
    if codes.shape[-1] != scales.shape[-1] * BLOCK or codes.shape[:-1] != scales.shape[:-1]:
        raise ValueError(f"Q8_0 codes {tuple(codes.shape)} and scales {tuple(scales.shape)} do not match: codes must be "
                         f"[..., K] and scales [..., K / {BLOCK}]")
    grouped = codes.unflatten(-1, (-1, BLOCK)).float()  # [..., G, 32]
    return (scales.float()[..., None] * grouped).flatten(-2).to(dtype)


def quantize_q8_0(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., K] (K a multiple of 32) -> (codes int8 [..., K], scales float16 [..., K / 32]): d = absmax / 127 (in
    float16), codes the nearest integers of w / d (ties to even; llama.cpp divides by the float32 d and rounds ties
    away from zero, so its codes may differ by one: test data only)."""
    if w.shape[-1] % BLOCK:
        raise ValueError(f"Q8_0 rows must be a multiple of {BLOCK} long, got {w.shape[-1]}")
    grouped = w.float().unflatten(-1, (-1, BLOCK))  # [..., G, 32]
    d = (grouped.abs().amax(dim=-1) / 127).to(torch.float16)  # [..., G]
    inv = torch.where(d > 0, 1.0 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    codes = torch.round(grouped * inv[..., None]).clamp(-127, 127).to(torch.int8)
    return codes.flatten(-2), d
