"""What an expert computes with beyond its two weights: quantization scales, biases, and the activation.

An expert bank is a dict of [N, ...] tensors: always "gate_up" [N, 2I, D] (gate rows first, then up rows) and
"down" [N, D, I]; optionally
- "gate_up_scale", "down_scale": the quantized weights' block scales (`wisp.core.kernels.quantized_weights`);
- "gate_up_bias" [N, 2I], "down_bias" [N, D]: GPT-OSS's expert biases (gate's first, then up's).
Every store pages a bank's tensors together (the pager, staging buffers, the device pager, prefetch move
whatever the bank holds), so a slot always holds a whole expert. `extras_of(bank)` gathers the optional
tensors as an `ExpertExtras`, `at(slot)` takes one slot's, and the kernels take them as `extras=`.

The activation between the two GEMMs is a model property, not a bank tensor (`Activation`): SiLU-gated
(`silu(gate) * up`, every family but GPT-OSS) or GPT-OSS's clamped SwiGLU:
    gate = min(gate, limit); up = clamp(up, -limit, limit); out = (up + 1) * gate * sigmoid(alpha * gate).
Both are elementwise and row-invariant (`wisp.core.kernels.rows.pointwise`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

import torch

from wisp.core.kernels.rows import pointwise, silu_mul

GATE_UP_SCALE, DOWN_SCALE = "gate_up_scale", "down_scale"
GATE_UP_BIAS, DOWN_BIAS = "gate_up_bias", "down_bias"
EXTRA_KEYS = (GATE_UP_SCALE, DOWN_SCALE, GATE_UP_BIAS, DOWN_BIAS)


@dataclass(frozen=True)
class ExpertExtras:
    """A bank's (or one slot's) optional tensors, by role; None where the bank has none."""

    gate_up_scale: torch.Tensor | None = None
    down_scale: torch.Tensor | None = None
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None

    @property
    def scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(gate_up's, down's) scales of quantized weights, or None for plain weights."""
        return None if self.gate_up_scale is None else (self.gate_up_scale, self.down_scale)

    def at(self, index) -> "ExpertExtras":
        """One slot's (or expert's) extras of a bank's."""
        return ExpertExtras(*(None if t is None else t[index] for t in self.tensors()))

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def contiguous(self) -> "ExpertExtras":
        return ExpertExtras(*(None if t is None else t.contiguous() for t in self.tensors()))


def extras_of(bank: Mapping[str, torch.Tensor]) -> ExpertExtras | None:
    """A bank's extras, or None for a bank of plain weights without biases (the common case)."""
    if not any(key in bank for key in EXTRA_KEYS):
        return None
    return ExpertExtras(*(bank.get(key) for key in EXTRA_KEYS))


def extras_at(extras: ExpertExtras | None, index) -> ExpertExtras | None:
    return None if extras is None else extras.at(index)


@dataclass(frozen=True)
class Activation:
    """The expert MLP's gated activation: "silu" or "clamped_swiglu" (alpha, limit: GPT-OSS's)."""

    kind: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self):
        if self.kind not in ("silu", "clamped_swiglu"):
            raise ValueError(f"unknown expert activation {self.kind!r}; supported: silu, clamped_swiglu")

    def __call__(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """[M, I] gate and up -> [M, I], elementwise and row-invariant, in their dtype."""
        if self.kind == "silu":
            return silu_mul(gate, up)
        return pointwise(self._clamped_swiglu, gate, up)

    def _clamped_swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


SILU = Activation()
