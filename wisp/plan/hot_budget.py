"""`hot_split`: hybrid with no slots under a VRAM budget, the hot experts a layer and the KV blocks it holds.

Hybrid with no slots (`--mode hybrid --expert-cap 0`) keeps no expert scratch; its device bank of hot experts
(`--hot-experts H`, `wisp.core.experts.hot_experts`) is the one expert-side use of VRAM. Under `--vram-budget`, the
budget less the non-expert weights and the planner's reserve is pageable, as the planner's split has it
(`wisp.plan.planner`): the KV pool first gets its admission floor (max_concurrency x max_model_len, which it
never goes below), each MoE layer then as many whole hot experts as the rest holds (at most N), and what is
left goes back to KV blocks. With no KV trace (a warm-up plan) that is the planner's own optimum: no measured
KV reuse, so every byte above the floor goes to experts; and unlike slots a bank has no minimum (H = 0 is
plain hybrid with no slots).

Invariants: kv_blocks >= the admission floor; non_expert + reserve + H x slot_bytes + kv_blocks x block_bytes
<= the budget; H <= N, and H + 1 would not fit beside the floor (or H = N).
"""

from __future__ import annotations

from dataclasses import dataclass

from wisp.config import ModelConfig
from wisp.errors import WispError
from wisp.plan.planner import PlanInputs
from wisp.plan.sizes import GiB, ModelSizes


@dataclass(frozen=True)
class HotSplit:
    """A budget's split for hybrid with no slots: hot experts held per MoE layer, and KV blocks."""

    hot_experts: int
    kv_blocks: int


def hot_split(cfg: ModelConfig, inputs: PlanInputs) -> HotSplit:
    """The split of `inputs.vram_budget` (see the module docstring); WispError naming the smallest budget that
    serves the promised concurrency x context when this one does not."""
    sizes = ModelSizes.of(cfg, inputs.block_size, inputs.embedding_on_host, inputs.packed_projections)
    pageable = inputs.vram_budget - sizes.non_expert_bytes - inputs.reserve_bytes
    floor = inputs.admission_floor_blocks * sizes.block_bytes
    if pageable < floor:
        need = floor + sizes.non_expert_bytes + inputs.reserve_bytes
        raise WispError(f"a {inputs.vram_budget / GiB:.2f} GiB budget cannot serve --max-concurrency "
                        f"{inputs.max_concurrency} x --max-model-len {inputs.max_model_len}: the smallest budget "
                        f"that does is {need / GiB:.2f} GiB ({need} bytes)")
    hot = min(cfg.num_experts, (pageable - floor) // sizes.slot_bytes)
    return HotSplit(int(hot), int((pageable - hot * sizes.slot_bytes) // sizes.block_bytes))
