"""A `wisp plan` file applied to the model vLLM serves: checked to be that model's, then read as vLLM needs it.

A plan records what it was made for in its report (`wisp.plan.plan.PlanReport`), and those fields are the
plan's fingerprint of the model: the architecture, the number of MoE layers (its per_layer_caps), one
expert's bytes (slot_bytes over the MoE layers: hidden size, expert width and dtype), one KV block's bytes
(layers, KV heads, head size, dtype) and the bytes outside the routed experts (vocabulary, hidden size,
attention, dense layers and the routers, so the expert count). `fit_plan` computes the same fields for
the served model with the planner's own sizing (`wisp.plan.sizes.ModelSizes`, in the dtype vLLM runs) and
refuses any difference with one error naming both. A hand-written plan (no report) is checked only for its
number of caps and each cap's range.

`PlanFit` is what the plug-in applies: the caps by decoder layer index (the plan lists them in MoE layer
order) and the plan's KV pool in bytes for the whole model; `kv_bytes_per_rank` is one tensor-parallel
rank's share. Imports no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from wisp.config import ModelConfig
from wisp.integrations.vllm.settings import WispVllmConfigError
from wisp.plan.plan import Plan
from wisp.plan.sizes import ModelSizes


@dataclass(frozen=True)
class PlanFit:
    layer_caps: dict[int, int]  # decoder layer index -> expert slots
    kv_bytes: int  # the plan's KV pool: kv_blocks blocks of kv_block_size tokens, all layers and KV heads
    kv_tokens: int


@dataclass(frozen=True)
class Fingerprint:
    """What a plan was made for, as its report records it (non_expert_bytes: the values it may take)."""

    architecture: str
    moe_layers: int
    expert_bytes: int
    kv_block_bytes: int
    non_expert_bytes: tuple[int, ...]

    def matches(self, other: "Fingerprint") -> bool:
        same = (self.architecture, self.moe_layers, self.expert_bytes, self.kv_block_bytes) == (
            other.architecture, other.moe_layers, other.expert_bytes, other.kv_block_bytes)
        return same and bool(set(self.non_expert_bytes) & set(other.non_expert_bytes))

    def describe(self, block_size: int) -> str:
        rest = " or ".join(str(b) for b in self.non_expert_bytes)
        return (f"{self.architecture}, {self.moe_layers} MoE layers, {self.expert_bytes}-byte experts, "
                f"{self.kv_block_bytes}-byte KV blocks of {block_size} tokens, {rest} bytes outside the experts")


def plan_fingerprint(plan: Plan) -> Fingerprint | None:
    """The model a planner-made plan records (None for a hand-written plan with no report)."""
    report = plan.report
    if report is None:
        return None
    layers = len(plan.per_layer_caps)
    return Fingerprint(report.model, layers, report.slot_bytes // max(layers, 1), report.block_bytes,
                       (report.non_expert_bytes,))


def model_fingerprint(cfg: ModelConfig, block_size: int) -> Fingerprint:
    """The same fields for `cfg`, sized as `wisp plan` sizes them (the token embedding table counted on the
    device or in host memory: a plan may have been made either way)."""
    sizes = [ModelSizes.of(cfg, block_size, on_host) for on_host in (False, True)]
    return Fingerprint(cfg.architecture, len(cfg.moe_layer_ids), cfg.expert_bytes, sizes[0].block_bytes,
                       tuple(dict.fromkeys(s.non_expert_bytes for s in sizes)))


def fit_plan(plan: Plan, cfg: ModelConfig, source: str) -> PlanFit:
    """The plan's caps and KV bytes for the served model `cfg`; WispVllmConfigError if it is another model's,
    or if its caps do not fit this one. `source` names the plan in errors ("plan path/plan.json")."""
    served = model_fingerprint(cfg, plan.kv_block_size)
    recorded = plan_fingerprint(plan)
    if recorded is not None and not recorded.matches(served):
        raise WispVllmConfigError(
            f"{source} was made for another model: it records {recorded.describe(plan.kv_block_size)}; vLLM serves "
            f"{served.describe(plan.kv_block_size)}. Make a plan for this model (wisp plan --model <this "
            f"checkpoint> --dtype <vLLM's dtype>)")
    layers = cfg.moe_layer_ids
    if len(plan.per_layer_caps) != len(layers):
        raise WispVllmConfigError(f"{source} has {len(plan.per_layer_caps)} per-layer caps; the model vLLM serves "
                                  f"has {len(layers)} MoE layers")
    for layer, cap in zip(layers, plan.per_layer_caps):
        if not cfg.top_k <= cap <= cfg.num_experts:
            raise WispVllmConfigError(f"{source} gives MoE layer {layer} {cap} expert slots; the model needs "
                                      f"top_k {cfg.top_k} <= cap <= {cfg.num_experts} experts")
    return PlanFit(dict(zip(layers, plan.per_layer_caps)), plan.kv_blocks * served.kv_block_bytes,
                   plan.kv_blocks * plan.kv_block_size)


def kv_bytes_per_rank(kv_bytes: int, total_kv_heads: int, rank_kv_heads: int) -> int:
    """One rank's share of a KV pool of `kv_bytes` when each rank holds `rank_kv_heads` of the model's
    `total_kv_heads` (tensor parallel splits the heads; a head replicated on several ranks counts on each)."""
    return kv_bytes * rank_kv_heads // total_kv_heads
