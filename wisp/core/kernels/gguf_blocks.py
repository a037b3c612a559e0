"""llama.cpp's block formats dequantized in torch, on any device: the reference the GGUF expert kernels are held to
(issue 44: experts kept packed), giving the bits of the `gguf` package's numpy dequantizer (tested).

A tensor's rows are stored as blocks: Q8_0 (34 bytes for 32 values: a float16 scale, 32 int8), Q4_K (144 bytes for
256: float16 d and dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes of 4-bit codes), Q5_K
(176 bytes: Q4_K's with 32 bytes of fifth bits) and Q6_K (210 bytes: 128 bytes of low 4 bits, 64 of high 2 bits, 16
int8 scales for sub-blocks of 16, a float16 d). Every product is taken in float32 in the order the reference takes it
((d * scale) * q - dmin * min), so the values are the same floats.
"""

from __future__ import annotations

import torch

from wisp.core.kernels import q8_0

# values, bytes a block
BLOCKS = {"Q8_0": (q8_0.BLOCK, q8_0.BLOCK_BYTES), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}


def block_bytes(qtype: str, rows: int, depth: int) -> int:
    """Bytes of a [rows, depth] weight in `qtype` (depth a whole number of its blocks), as the file stores it."""
    values, nbytes = BLOCKS[qtype]
    if depth % values:
        raise ValueError(f"{qtype} rows are whole blocks of {values} values, got {depth}")
    return rows * depth // values * nbytes


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Two bytes [..., 2] (little-endian float16) -> float32 [..., 1]."""
    return b.contiguous().view(torch.float16).float()


def _scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes [n, 12] -> the 8 sub-blocks' 6-bit scales and mins [n, 8] (int32)."""
    s = scales.to(torch.int32).view(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


def _shifts(b: torch.Tensor, *bits: int) -> torch.Tensor:
    """The shift amounts `bits` as an int32 tensor on b's device (a CPU tensor beside CUDA codes is an error)."""
    return torch.tensor(bits, dtype=torch.int32, device=b.device)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return q8_0.dequantize_q8_0(*q8_0.split_blocks(b), torch.float32)  # what the packed experts compute with


def _k_scales(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d * scale, dmin * min) [n, 8, 1] of Q4_K / Q5_K blocks b [n, bytes]."""
    sc, mn = _scale_min(b[:, 4:16])
    return (_f16(b[:, 0:2]) * sc.float()).unsqueeze(-1), (_f16(b[:, 2:4]) * mn.float()).unsqueeze(-1)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    d, dm = _k_scales(b)
    qs = b[:, 16:].to(torch.int32).view(-1, 4, 1, 32)  # 4 chunks of 32 bytes: low nibbles, then high, a sub-block each
    q = ((qs >> _shifts(b, 0, 4).view(1, 1, 2, 1)) & 0x0F).view(-1, 8, 32).float()
    return (d * q - dm).view(-1, 256)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    d, dm = _k_scales(b)
    qh = b[:, 16:48].to(torch.int32).view(-1, 1, 32)  # bit s of byte l: sub-block s's value l's fifth bit
    qs = b[:, 48:].to(torch.int32).view(-1, 4, 1, 32)
    low = ((qs >> _shifts(b, 0, 4).view(1, 1, 2, 1)) & 0x0F).view(-1, 8, 32)
    high = (qh >> torch.arange(8, device=b.device).view(1, 8, 1)) & 0x01
    return (d * (low | (high << 4)).float() - dm).view(-1, 256)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    ql, qh, scales = b[:, :128].to(torch.int32), b[:, 128:192].to(torch.int32), b[:, 192:208]
    d = (_f16(b[:, 208:210]) * scales.contiguous().view(torch.int8).float()).view(-1, 16, 1)
    low = ((ql.view(-1, 2, 1, 64) >> _shifts(b, 0, 4).view(1, 1, 2, 1)) & 0x0F).reshape(-1, 8, 32)
    high = ((qh.view(-1, 2, 1, 32) >> _shifts(b, 0, 2, 4, 6).view(1, 1, 4, 1)) & 0x03).reshape(-1, 8, 32)
    q = ((low | (high << 4)) - 32).view(-1, 16, 16).float()
    return (d * q).view(-1, 256)


_DEQUANTIZE = {"Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def dequantize(packed: torch.Tensor, qtype: str) -> torch.Tensor:
    """packed uint8 [..., row bytes] (whole blocks of `qtype`) -> float32 [..., row values], on packed's device."""
    if qtype not in BLOCKS:
        raise ValueError(f"unsupported block format {qtype!r}; supported: {', '.join(BLOCKS)}")
    values, nbytes = BLOCKS[qtype]
    if packed.dtype != torch.uint8 or packed.shape[-1] % nbytes:
        raise ValueError(f"{qtype} rows are whole {nbytes}-byte blocks of uint8, got {packed.dtype} {tuple(packed.shape)}")
    blocks = packed.reshape(-1, nbytes)
    out = _DEQUANTIZE[qtype](blocks)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] // nbytes * values)
