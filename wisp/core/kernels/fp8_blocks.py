"""FP8 block-scaled weights: the Hugging Face "fp8" layout (Qwen3-*-FP8, DeepSeek-V3, MiniMax-M2).

A weight W [out, in] is kept as `weight` float8_e4m3fn [out, in] and `weight_scale_inv` float32
[ceil(out / Bo), ceil(in / Bi)], where (Bo, Bi) is config.json's `quantization_config.weight_block_size`
(128 x 128 in every checkpoint named above):

    W[i, j] = float32(weight[i, j]) * weight_scale_inv[i // Bo, j // Bi]

(the name is the checkpoint's: it is the factor that undoes the quantization, not its inverse).

`dequantize_blocks` computes exactly that, elementwise in float32, then casts once to the compute dtype:
each output element depends only on its own byte and its block's scale, so the result is the same bits on
every machine and for any slicing of the weight (an expert, a slot, a host master). How an expert bank
carries these weights and scales: `wisp.core.kernels.quantized_weights` (only (128, 128) blocks for now:
`DEFAULT_BLOCK`). `quantize_blocks` is the
inverse used to write test checkpoints and dummy weights: per block, scale = absmax / 448 (e4m3's largest
finite value), so every block uses the format's full range and nothing overflows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
DEFAULT_BLOCK = (128, 128)


def scale_key(weight_key: str) -> str:
    """The checkpoint name of a weight's scales: `...proj.weight` -> `...proj.weight_scale_inv`."""
    return weight_key.removesuffix(".weight") + ".weight_scale_inv"


def scale_shape(shape: tuple[int, ...], block: tuple[int, int] = DEFAULT_BLOCK) -> tuple[int, ...]:
    """The weight_scale_inv shape of a weight of `shape` [..., out, in] (leading dims: experts)."""
    *lead, out, inp = shape
    return (*lead, -(-out // block[0]), -(-inp // block[1]))


def _expand(scale: torch.Tensor, shape: tuple[int, ...], block: tuple[int, int]) -> torch.Tensor:
    """The per-element scale [..., out, in] of per-block scales [..., ceil(out/Bo), ceil(in/Bi)]."""
    out, inp = shape[-2:]
    return scale.repeat_interleave(block[0], dim=-2)[..., :out, :].repeat_interleave(block[1], dim=-1)[..., :inp]


def dequantize_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
                      block: tuple[int, int] = DEFAULT_BLOCK) -> torch.Tensor:
    """weight float8_e4m3fn [..., out, in] and scale_inv float32 [..., ceil(out/Bo), ceil(in/Bi)] -> [..., out, in]
    in `dtype`."""
    if weight.dtype != FP8:
        raise ValueError(f"FP8 block weights must be float8_e4m3fn, got {weight.dtype}")
    if tuple(scale_inv.shape) != scale_shape(tuple(weight.shape), block):
        raise ValueError(f"weight_scale_inv has shape {tuple(scale_inv.shape)}; a weight of shape "
                         f"{tuple(weight.shape)} in {block[0]}x{block[1]} blocks needs {scale_shape(tuple(weight.shape), block)}")
    return (weight.float() * _expand(scale_inv.float(), tuple(weight.shape), block)).to(dtype)


def quantize_blocks(w: torch.Tensor, block: tuple[int, int] = DEFAULT_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., out, in] -> (weight float8_e4m3fn, weight_scale_inv float32): per block, scale = absmax / 448
    (1 for an all-zero block)."""
    w = w.float()
    out, inp = w.shape[-2:]
    rows, cols = -(-out // block[0]), -(-inp // block[1])
    padded = torch.zeros((*w.shape[:-2], rows * block[0], cols * block[1]), dtype=torch.float32, device=w.device)
    padded[..., :out, :inp] = w
    blocks = padded.unflatten(-1, (cols, block[1])).unflatten(-3, (rows, block[0]))  # [..., R, Bo, C, Bi]
    absmax = blocks.abs().amax(dim=(-3, -1))  # [..., R, C]
    scale = torch.where(absmax > 0, absmax / FP8_MAX, torch.ones_like(absmax))
    weight = (w / _expand(scale, tuple(w.shape), block)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return weight, scale


class Fp8BlockWeight(NamedTuple):
    """A dense projection kept in its checkpoint's FP8 block-scaled form (read in-kernel by
    `wisp.core.kernels.triton_linear`; `rows.linear` dequantizes it first): weight float8_e4m3fn [out, in], scale
    float32 [ceil(out/128), ceil(in/128)]. Its values are `dequantized(dtype)`'s, bit for bit."""

    weight: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_blocks(self.weight, self.scale, dtype)
