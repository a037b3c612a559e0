"""llama.cpp's k-quant experts kept packed: Q4_K, Q5_K and Q6_K as an expert bank holds them.

A row of K values (K a multiple of 256) is K / 256 super-blocks. The file stores each as one block of bytes
(`wisp.core.kernels.gguf_blocks`, the reference these are held to); the bank keeps the same bytes apart, by role, as
Q8_0's are (`wisp.core.kernels.q8_0`):
- codes uint8 [..., K / 256, C]: the values' bits (Q4_K: 128 bytes of nibbles; Q5_K: 32 bytes of fifth bits, then
  those 128; Q6_K: 128 bytes of low nibbles, then 64 of high 2-bit pairs);
- heads uint8 [..., K / 256, H]: what scales them (Q4_K and Q5_K: float16 d and dmin, then 12 bytes of 6-bit scales
  and mins for the 8 sub-blocks of 32; Q6_K: 16 int8 scales for sub-blocks of 16, then float16 d).
So a weight costs exactly the file's bits (4.5, 5.5, 6.5625) on the host, over the link and in the slots, and the
format is told by the codes' width C alone (`format_of_codes`). `dequantize_k_quant` gives the `gguf` package's
floats (the products are exact in float32: an 11-bit float16 times a scale of at most 8 bits times a code of at most
6), cast to the compute dtype (to nearest even), as the GGUF reader's dequantized twin holds them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from wisp.core.kernels.gguf_blocks import dequantize

SUPER_BLOCK = 256  # values a block


class KQuant(NamedTuple):
    """Where a block's codes and heads lie in the file's bytes of one block."""

    name: str  # llama.cpp's type name
    block_bytes: int
    codes: tuple[int, int]  # [start, end) of the codes
    heads: tuple[int, int]  # [start, end) of the heads

    @property
    def code_bytes(self) -> int:
        return self.codes[1] - self.codes[0]

    @property
    def head_bytes(self) -> int:
        return self.heads[1] - self.heads[0]


K_QUANTS = {k.name: k for k in (KQuant("Q4_K", 144, (16, 144), (0, 16)), KQuant("Q5_K", 176, (16, 176), (0, 16)),
                                KQuant("Q6_K", 210, (0, 192), (192, 210)))}
_BY_CODE_BYTES = {k.code_bytes: k for k in K_QUANTS.values()}


def format_of_codes(codes: torch.Tensor, heads: torch.Tensor) -> KQuant | None:
    """The k-quant whose bank tensors these are (uint8 codes [..., G, C] and heads [..., G, H] of one of the formats'
    widths), or None."""
    k = _BY_CODE_BYTES.get(codes.shape[-1]) if codes.dim() >= 2 else None
    ok = (k is not None and codes.dtype == torch.uint8 and heads.dtype == torch.uint8 and heads.shape[-1] == k.head_bytes
          and heads.shape[:-1] == codes.shape[:-1])
    return k if ok else None


def split_blocks(packed: torch.Tensor, qtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A k-quant's rows as the file stores them, uint8 [..., G * block bytes] -> (codes [..., G, C], heads
    [..., G, H])."""
    k = K_QUANTS[qtype]
    if packed.dtype != torch.uint8 or packed.shape[-1] % k.block_bytes:
        raise ValueError(f"{qtype} rows are whole {k.block_bytes}-byte blocks of uint8, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    blocks = packed.reshape(*packed.shape[:-1], -1, k.block_bytes)  # [..., G, bytes]
    return blocks[..., slice(*k.codes)].contiguous(), blocks[..., slice(*k.heads)].contiguous()


def join_blocks(codes: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """`split_blocks`' inverse: the file's bytes of these rows, uint8 [..., G * block bytes]."""
    k = format_of_codes(codes, heads)
    if k is None:
        raise ValueError(f"not a k-quant's codes and heads: {codes.dtype} {tuple(codes.shape)} and {heads.dtype} "
                         f"{tuple(heads.shape)} (codes' last dim: {', '.join(f'{c} {q.name}' for c, q in _BY_CODE_BYTES.items())})")
    blocks = torch.empty((*codes.shape[:-1], k.block_bytes), dtype=torch.uint8, device=codes.device)
    blocks[..., slice(*k.codes)] = codes
    blocks[..., slice(*k.heads)] = heads
    return blocks.flatten(-2)


def dequantize_k_quant(codes: torch.Tensor, heads: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """codes [..., G, C] and heads [..., G, H] of one k-quant -> [..., G * 256] in `dtype`."""
    k = format_of_codes(codes, heads)
    return dequantize(join_blocks(codes, heads), k.name).to(dtype)


def bank_shapes(rows: int, depth: int, qtype: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(codes', heads') shapes of a [rows, depth] weight in `qtype` (depth a multiple of 256)."""
    k = K_QUANTS[qtype]
    if depth % SUPER_BLOCK:
        raise ValueError(f"{qtype} rows must be a multiple of {SUPER_BLOCK} long, got {depth}")
    return (rows, depth // SUPER_BLOCK, k.code_bytes), (rows, depth // SUPER_BLOCK, k.head_bytes)
