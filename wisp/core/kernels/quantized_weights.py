"""Quantized expert weights: the formats an expert bank may hold, told apart by the weight's dtype.

- FP8 block-scaled (`wisp.core.kernels.fp8_blocks`): weight float8_e4m3fn [out, in], scale float32
  [ceil(out/128), ceil(in/128)];
- MXFP4 (`wisp.core.kernels.mxfp4`): weight uint8 [out, in/32, 16] (two e2m1 codes a byte), scale uint8 [out, in/32]
  (e8m0);
- Q8_0 (`wisp.core.kernels.q8_0`, llama.cpp's GGUF files): weight int8 [out, in], scale float16 [out, in/32].

An expert bank keeps each weight's scales beside it (`wisp.core.kernels.expert_extras`: "gate_up_scale",
"down_scale", [N, ...] like the weights), so whatever pages the bank's tensors moves them with no extra code;
`dequantize_weight` turns one expert's weight into plain numbers in the compute dtype, exactly (each element
from its own code and its block's scale), right before the GEMM that reads it.
"""

from __future__ import annotations

import torch

from wisp.core.kernels.fp8_blocks import FP8, dequantize_blocks
from wisp.core.kernels.mxfp4 import dequantize_mxfp4
from wisp.core.kernels.q8_0 import dequantize_q8_0


def dequantize_weight(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One expert's quantized weight [out, ...] and its scale -> [out, in] in `dtype`."""
    if weight.dtype == FP8:
        return dequantize_blocks(weight, scale, dtype)
    if weight.dtype == torch.uint8:
        return dequantize_mxfp4(weight, scale, dtype)
    if weight.dtype == torch.int8:
        return dequantize_q8_0(weight, scale, dtype)
    raise ValueError(f"no quantized expert format stores its weight as {weight.dtype}; supported: "
                     "float8_e4m3fn (FP8 block-scaled), uint8 (MXFP4), int8 (Q8_0)")


def dequantize_expert(w_gate_up: torch.Tensor, w_down: torch.Tensor, extras, dtype: torch.dtype):
    """(gate_up, down) as plain weights: as they are without scales, else dequantized to `dtype`. extras: an
    `ExpertExtras` (or None)."""
    scales = None if extras is None else extras.scales
    if scales is None:
        return w_gate_up, w_down
    return dequantize_weight(w_gate_up, scales[0], dtype), dequantize_weight(w_down, scales[1], dtype)
