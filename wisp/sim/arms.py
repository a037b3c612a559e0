"""The paper's allocator arms: four ways to spend one pageable budget, priced by a plan's cost model.

- "mv-wsa": the planner's split (latency-minimising, admission floor kept);
- "50-50": half the pageable bytes to each pool;
- "kv-blind": expert-proportional, as many expert slots as fit after the smallest KV pool the engine
  accepts (the admission floor);
- "offload": naive layer offload, no expert cache; every MoE layer copies all its experts per token,
  and the KV pool gets what is left after one layer-sized buffer.

Every arm's caps are clamped to [top_k, num_experts]; its latency uses the plan's curves and costs
exactly as the planner does, so the "mv-wsa" row repeats the plan's prediction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from wisp.plan.plan import Plan
from wisp.plan.split import SplitProblem, curve_at, latency


@dataclass(frozen=True)
class Arm:
    arm: str  # its name
    expert_cap: int | None  # None: no expert cache
    kv_blocks: int
    meets_floor: bool
    expert_misses_per_token: float
    kv_block_misses_per_request: float
    predicted_latency_s: float

    def to_json(self) -> dict:
        return asdict(self)


def allocator_arms(plan: Plan, num_experts: int) -> list[Arm]:
    """Price the four arms with the plan's curves and cost model (see the module docstring)."""
    p = plan.curves.problem
    exp, kv = plan.curves.arrays()

    def arm(name: str, cap: int | None, kv_blocks: int, exp_misses: float) -> Arm:
        kv_misses = curve_at(kv, kv_blocks)
        return Arm(name, cap, kv_blocks, kv_blocks >= p.kv_floor, exp_misses, kv_misses,
                   p.expert_cost * exp_misses + p.kv_cost * kv_misses)

    best = latency(p, exp, kv, plan.report.expert_cap)
    half, blind = half_half_cap(p), kv_blind_cap(p)
    layers = len(plan.per_layer_caps)
    layer_buffer = num_experts * p.slot_bytes // layers  # all experts of one layer
    return [
        arm("mv-wsa", best.expert_cap, best.kv_blocks, best.expert_misses),
        arm("50-50", half, p.kv_blocks(half), curve_at(exp, half)),
        arm("kv-blind", blind, p.kv_blocks(blind), curve_at(exp, blind)),
        arm("offload", None, max(p.budget_bytes - layer_buffer, 0) // p.block_bytes, float(num_experts * layers)),
    ]


def _clamp(p: SplitProblem, cap: int) -> int:
    return max(p.min_cap, min(p.max_cap, cap))


def half_half_cap(p: SplitProblem) -> int:
    """The "50-50" arm's cap: half the pageable bytes in expert slots."""
    return _clamp(p, (p.budget_bytes // 2) // p.slot_bytes)


def kv_blind_cap(p: SplitProblem) -> int:
    """The "kv-blind" arm's cap: every slot that fits beside the admission floor's KV blocks."""
    return _clamp(p, (p.budget_bytes - p.kv_floor * p.block_bytes) // p.slot_bytes)
