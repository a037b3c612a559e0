"""What a MoE step adds to a store's device count vector (`StepCount`), for the launch that counts it: its own
(`wisp.core.kernels.triton_step_count.count_step`) or one that already reads the step's routing (the Triton MoE's
one-program decode sort), so a decode step's counting costs no launch of its own there.

The vector is int64 [6] in `wisp.core.experts.counters.COUNT_FIELDS` order (steps, hits, misses, evictions, loads,
bytes_h2d). A step adds: steps += 1; the distinct routed experts to hits (or to misses); loads += `loads`;
bytes_h2d += fixed_bytes + pairs * pair_bytes. (No Triton import here: the stores name a count on any machine.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepCount:
    """Where and how a store counts a step: its vector, its expert count, and what the step adds."""

    counts: torch.Tensor  # int64 [6], COUNT_FIELDS order, on the device
    num_experts: int
    hits: bool  # the distinct routed experts count as hits (else as misses)
    loads: int = 0
    fixed_bytes: int = 0
    pair_bytes: int = 0

    def step_bytes(self, pairs: int) -> int:
        return self.fixed_bytes + pairs * self.pair_bytes  # in Python: past 2**31 it is passed as int64
