"""Quantized expert weights: the formats an expert bank may hold, told apart by the weight's dtype.

- FP8 block-scaled (`wisp.core.fp8_blocks`): weight float8_e4m3fn [out, in], scale float32
  [ceil(out/128), ceil(in/128)];
- MXFP4 (`wisp.core.mxfp4`): weight uint8 [out, in/32, 16] (two e2m1 codes a byte), scale uint8 [out, in/32]
  (e8m0).

An expert bank keeps each weight's scales beside it (`GATE_UP_SCALE`, `DOWN_SCALE`, [N, ...] like the
weights), so whatever pages the bank's tensors (the pager, staging buffers, the device pager, prefetch)
moves them with no extra code; `block_scales` finds them in a bank, `scales_at` takes one slot's, and
`dequantize_weight` turns one expert's weight into plain numbers in the compute dtype, exactly (each
element from its own code and its block's scale), right before the GEMM that reads it.
"""

from __future__ import annotations

from typing import Mapping

import torch

from wisp.core.fp8_blocks import FP8, dequantize_blocks
from wisp.core.mxfp4 import dequantize_mxfp4

GATE_UP_SCALE, DOWN_SCALE = "gate_up_scale", "down_scale"  # beside "gate_up" and "down" in an expert bank


def block_scales(bank: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A bank's (gate_up, down) scales, or None for a bank of plain weights."""
    return (bank[GATE_UP_SCALE], bank[DOWN_SCALE]) if GATE_UP_SCALE in bank else None


def scales_at(scales: tuple[torch.Tensor, torch.Tensor] | None, index) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One slot's (or expert's) scales of a bank's."""
    return None if scales is None else (scales[0][index], scales[1][index])


def dequantize_weight(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One expert's quantized weight [out, ...] and its scale -> [out, in] in `dtype`."""
    if weight.dtype == FP8:
        return dequantize_blocks(weight, scale, dtype)
    if weight.dtype == torch.uint8:
        return dequantize_mxfp4(weight, scale, dtype)
    raise ValueError(f"no quantized expert format stores its weight as {weight.dtype}; supported: "
                     "float8_e4m3fn (FP8 block-scaled), uint8 (MXFP4)")


def dequantize_expert(w_gate_up: torch.Tensor, w_down: torch.Tensor, scales, dtype: torch.dtype):
    """(gate_up, down) as plain weights: as they are without `scales`, else dequantized to `dtype`."""
    if scales is None:
        return w_gate_up, w_down
    return dequantize_weight(w_gate_up, scales[0], dtype), dequantize_weight(w_down, scales[1], dtype)
