"""Rotary position embeddings: which scaling a checkpoint asks for and the inverse frequencies it gives.

`RopeScaling.from_hf` reads config.json's `rope_parameters` (or the older `rope_scaling`, or a bare
`rope_theta`); `inv_freq(dim)` gives the [dim / 2] float32 inverse frequencies and `attention_factor` the
factor cos and sin are multiplied by. Supported (the formulas of transformers' `modeling_rope_utils`):
- default: inv_freq_i = theta^(-2i / dim);
- linear: the default divided by `factor`;
- yarn (GPT-OSS, DeepSeek): per frequency a blend of the default (extrapolation) and the default / factor
  (interpolation), the blend ramping linearly between the correction dims of beta_fast and beta_slow
  rotations over the original context (floored / ceiled unless `truncate` is false); cos and sin scaled by
  `attention_factor` (given, or 0.1 ln(factor) + 1, or with mscale and mscale_all_dim the ratio of those).
Anything else is one WispError naming what is supported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from wisp.errors import WispError

ROPE_TYPES = ("default", "linear", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    original_max_position_embeddings: int = 4096
    truncate: bool = True
    attention_factor: float = 1.0
    mscale_all_dim: float = 0.0  # yarn's softmax-scale correction (DeepSeek's MLA reads it: `wisp.models.mla`)

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "RopeScaling":
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise WispError(f"unsupported rope_type {kind!r}; supported: {', '.join(ROPE_TYPES)}")
        theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
        if kind == "default":
            return cls(theta=theta)
        if kind == "linear":
            return cls("linear", theta, float(rope.get("factor") or 1.0), mscale_all_dim=float(rope.get("mscale_all_dim") or 0.0))
        original = int(rope.get("original_max_position_embeddings") or raw.get("original_max_position_embeddings")
                       or raw["max_position_embeddings"])
        factor = rope.get("factor") or int(raw["max_position_embeddings"]) / original
        attention = rope.get("attention_factor")
        mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
        if attention is None:
            attention = (_mscale(factor, mscale) / _mscale(factor, mscale_all)) if mscale and mscale_all else _mscale(factor)
        return cls("yarn", theta, float(factor), float(rope.get("beta_fast") or 32), float(rope.get("beta_slow") or 1),
                   original, bool(rope.get("truncate", True)), float(attention), float(mscale_all or 0.0))

    def inv_freq(self, dim: int) -> torch.Tensor:
        """[dim / 2] float32 inverse frequencies of a rotation over `dim` channels."""
        base = 1.0 / (self.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        if self.kind == "default":
            return base
        if self.kind == "linear":
            return base / self.factor
        pos_freqs = self.theta ** (torch.arange(0, dim, 2).float() / dim)
        extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (self.factor * pos_freqs)
        low, high = self._correction_range(dim)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        keep = 1 - ramp  # the share of extrapolation
        return interpolation * (1 - keep) + extrapolation * keep

    def _correction_range(self, dim: int) -> tuple[float, float]:
        def correction_dim(rotations: float) -> float:
            return (dim * math.log(self.original_max_position_embeddings / (rotations * 2 * math.pi))) / (2 * math.log(self.theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, dim - 1)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
