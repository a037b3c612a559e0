"""The arms of `wisp bench agent`: six ways to serve one VRAM budget, sized from one plan.

Every arm gets the same budget; the planner's arithmetic (`wisp.plan.planner`) splits it into the
non-expert weights, a reserve (activations, attention partials, CUDA graphs' memory pool, the wide steps'
staging buffers are counted with the weights) and the pageable bytes, which each arm spends its way:
- "mv-wsa": the plan as `wisp plan` writes it (per-layer caps, KV blocks by marginal value, floor kept);
- "50-50": half the pageable bytes to expert slots, the rest to KV;
- "kv-blind": expert-proportional: every slot that fits beside the smallest pool the engine accepts
  (the admission floor);
- "zero-copy": no expert scratch, experts read over PCIe in place; all pageable bytes to KV;
- "offload": no expert cache, each MoE layer copies all its experts per step into one layer-sized buffer;
  the KV pool gets what is left after that buffer (at least the floor);
- "controller": starts at the plan's uniform split (or, with `controller_start`, at the 50-50 or KV-blind
  split, to see it recover from a poor start); the online controller (`wisp.engine.live_split`) moves bytes
  between the two while serving.

Invariant: every arm's kv_blocks >= the admission floor, so no arm refuses to start for lack of KV.
"""

from __future__ import annotations

from dataclasses import dataclass

from wisp.errors import WispError
from wisp.plan.plan import Plan
from wisp.sim.arms import half_half_cap, kv_blind_cap

ARMS = ("mv-wsa", "50-50", "kv-blind", "zero-copy", "offload", "controller")
CONTROLLER_STARTS = ("plan", "50-50", "kv-blind")


@dataclass(frozen=True)
class ArmSpec:
    arm: str
    mode: str  # the engine's expert mode
    expert_caps: tuple[int, ...] | None  # per MoE layer (paged arms)
    kv_blocks: int
    controller: bool = False

    @property
    def expert_cap(self) -> int | None:
        return max(self.expert_caps) if self.expert_caps else None


def parse_arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise WispError(f"unknown arm {bad[0] if bad else text!r}; choose from: {', '.join(ARMS)}")
    return arms


def arm_specs(plan: Plan, names: list[str], num_experts: int, controller_start: str = "plan") -> list[ArmSpec]:
    """The named arms, sized from `plan` (see the module docstring)."""
    p = plan.curves.problem
    layers = len(plan.per_layer_caps)
    floor = p.kv_floor

    def uniform(name: str, cap: int, controller: bool = False) -> ArmSpec:
        return ArmSpec(name, "paged", (cap,) * layers, p.kv_blocks(cap), controller)

    layer_buffer = num_experts * p.slot_bytes // layers  # every expert of one layer
    start_caps = {"plan": lambda: plan.report.expert_cap, "50-50": lambda: half_half_cap(p), "kv-blind": lambda: kv_blind_cap(p)}
    if controller_start not in start_caps:
        raise WispError(f"unknown controller start {controller_start!r}; choose from: {', '.join(CONTROLLER_STARTS)}")
    table = {
        "mv-wsa": lambda: ArmSpec("mv-wsa", "paged", tuple(plan.per_layer_caps), plan.kv_blocks),
        "50-50": lambda: uniform("50-50", half_half_cap(p)),
        "kv-blind": lambda: uniform("kv-blind", kv_blind_cap(p)),
        "zero-copy": lambda: ArmSpec("zero-copy", "zero-copy", None, max(p.budget_bytes // p.block_bytes, floor)),
        "offload": lambda: ArmSpec("offload", "offload", None, max((p.budget_bytes - layer_buffer) // p.block_bytes, floor)),
        "controller": lambda: uniform("controller", start_caps[controller_start](), controller=True),
    }
    return [table[n]() for n in names]
