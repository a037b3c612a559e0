"""Quantized expert weights: the formats an expert bank may hold, told apart by the weight's and its scale's dtype and
shape (`weight_format`).

- FP8 block-scaled (`wisp.core.kernels.fp8_blocks`): weight float8_e4m3fn [out, in], scale float32
  [ceil(out/128), ceil(in/128)];
- MXFP4 (`wisp.core.kernels.mxfp4`): weight uint8 [out, in/32, 16] (two e2m1 codes a byte), scale uint8 [out, in/32]
  (e8m0);
- Q8_0 (`wisp.core.kernels.q8_0`, llama.cpp's GGUF files): weight int8 [out, in], scale float16 [out, in/32];
- Q4_K, Q5_K, Q6_K (`wisp.core.kernels.k_quants`, GGUF files): weight uint8 codes [out, in/256, C], scale uint8
  heads [out, in/256, H] (C and H name the format).

An expert bank keeps each weight's scales beside it (`wisp.core.kernels.expert_extras`: "gate_up_scale",
"down_scale", [N, ...] like the weights), so whatever pages the bank's tensors moves them with no extra code;
`dequantize_weight` turns one expert's weight into plain numbers in the compute dtype, exactly (each element
from its own code and its block's scale), right before the GEMM that reads it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from wisp.core.kernels.fp8_blocks import FP8, dequantize_blocks
from wisp.core.kernels.k_quants import dequantize_k_quant, format_of_codes
from wisp.core.kernels.mxfp4 import dequantize_mxfp4
from wisp.core.kernels.q8_0 import dequantize_q8_0

def weight_format(weight: torch.Tensor, scale: torch.Tensor | None) -> str:
    """One weight's format (an expert's, or a bank's with its leading [N]): "plain" without a scale, else "fp8",
    "mxfp4" or one of GGUF_BLOCK_FORMATS. Raises ValueError for a pairing no format stores."""
    if scale is None:
        return "plain"
    if weight.dtype == FP8 and scale.dtype == torch.float32:
        return "fp8"
    if weight.dtype == torch.int8 and scale.dtype == torch.float16:
        return "q8_0"
    if weight.dtype == torch.uint8 and scale.dtype == torch.uint8:
        if scale.dim() == weight.dim() - 1:
            return "mxfp4"
        k = format_of_codes(weight, scale)
        if k is not None:
            return k.name.lower()
    raise ValueError(f"no quantized expert format stores a weight {weight.dtype} {tuple(weight.shape)} with a scale "
                     f"{scale.dtype} {tuple(scale.shape)}; supported: float8_e4m3fn with float32 (FP8 block-scaled), "
                     "uint8 [.., in/32, 16] with uint8 [.., in/32] (MXFP4), int8 with float16 (Q8_0), uint8 codes with "
                     "uint8 heads [.., in/256, width] (Q4_K, Q5_K, Q6_K)")


def dequantize_weight(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One expert's quantized weight [out, ...] and its scale -> [out, in] in `dtype`."""
    fmt = weight_format(weight, scale)
    if fmt == "fp8":
        return dequantize_blocks(weight, scale, dtype)
    if fmt == "mxfp4":
        return dequantize_mxfp4(weight, scale, dtype)
    if fmt == "q8_0":
        return dequantize_q8_0(weight, scale, dtype)
    if fmt == "plain":
        raise ValueError("a quantized weight needs its scale")
    return dequantize_k_quant(weight, scale, dtype)


GGUF_BLOCK_FORMATS = ("q8_0", "q4_k", "q5_k", "q6_k")  # `weight_format`s of a GGUF file's block formats


def dequantize_expert(w_gate_up: torch.Tensor, w_down: torch.Tensor, extras, dtype: torch.dtype):
    """(gate_up, down) as plain weights: as they are without scales, else dequantized to `dtype`. extras: an
    `ExpertExtras` (or None)."""
    scales = None if extras is None else extras.scales
    if scales is None:
        return w_gate_up, w_down
    return dequantize_weight(w_gate_up, scales[0], dtype), dequantize_weight(w_down, scales[1], dtype)


class BlockWeight(NamedTuple):
    """A dense projection kept in its GGUF file's block format (Q8_0 or a k-quant: `weight_format` tells which):
    weight and scale as an expert bank holds them, for one [out, in] matrix. Read in-kernel by
    `wisp.core.kernels.triton_linear`; `rows.linear` dequantizes it first (`dequantized`: the `gguf` package's
    floats, cast to the compute dtype)."""

    weight: torch.Tensor
    scale: torch.Tensor

    @property
    def format(self) -> str:
        return weight_format(self.weight, self.scale)

    @property
    def shape(self) -> torch.Size:
        columns = self.weight.shape[1] * 256 if self.weight.dim() == 3 else self.weight.shape[1]  # k-quant: blocks
        return torch.Size((self.weight.shape[0], columns))

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_weight(self.weight, self.scale, dtype)

    def to(self, device) -> "BlockWeight":
        return BlockWeight(self.weight.to(device), self.scale.to(device))
