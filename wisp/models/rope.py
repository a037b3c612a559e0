"""Rotary position embeddings: the inverse frequencies a checkpoint's scaling (`wisp.config.RopeScaling`) gives.

`inv_freq(scaling, dim)` gives the [dim / 2] float32 inverse frequencies; cos and sin are then multiplied by
the scaling's `attention_factor`. Supported (`ROPE_TYPES`; the formulas of transformers' `modeling_rope_utils`):
- default: inv_freq_i = theta^(-2i / dim);
- linear: the default divided by `factor`;
- yarn (GPT-OSS, DeepSeek): per frequency a blend of the default (extrapolation) and the default / factor
  (interpolation), the blend ramping linearly between the correction dims of beta_fast and beta_slow
  rotations over the original context (floored / ceiled unless `truncate` is false).
Reading the scaling from config.json, and refusing any other kind, is `wisp.models.hf_config`'s job.
"""

from __future__ import annotations

import math

import torch

from wisp.config import RopeScaling

ROPE_TYPES = ("default", "linear", "yarn")


def inv_freq(scaling: RopeScaling, dim: int) -> torch.Tensor:
    """[dim / 2] float32 inverse frequencies of a rotation over `dim` channels."""
    base = 1.0 / (scaling.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if scaling.kind == "default":
        return base
    if scaling.kind == "linear":
        return base / scaling.factor
    pos_freqs = scaling.theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (scaling.factor * pos_freqs)
    low, high = _correction_range(scaling, dim)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # the share of extrapolation
    return interpolation * (1 - keep) + extrapolation * keep


def _correction_range(scaling: RopeScaling, dim: int) -> tuple[float, float]:
    def correction_dim(rotations: float) -> float:
        return ((dim * math.log(scaling.original_max_position_embeddings / (rotations * 2 * math.pi)))
                / (2 * math.log(scaling.theta)))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)
