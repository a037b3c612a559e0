"""The offline configurator: model shape + traces + cost model -> a `Plan` for both pools (`wisp plan`).

The pageable budget is the VRAM budget minus the non-expert weights minus a reserve for activations
and workspace. The expert side is measured by the routing trace's exact per-layer LRU miss curves
(misses per token, `wisp.plan.per_layer`), the KV side by the KV trace's prefix-cache miss curve (block
misses per request); both are put in seconds per request by the `CostModel` and `tokens_per_request`
(the KV trace's mean output length unless given, else 256). Without a KV trace the KV side has no
measured reuse, so everything above the admission floor goes to experts. The uniform cap is the exact
optimum (`wisp.plan.split`); per-layer caps spend the same slots unevenly, and are used only when they
predict no more misses than the uniform cap.

With `hybrid_costs` (`wisp plan --hybrid-costs`) the plan also carries a `HybridAdvice`
(`wisp.plan.hybrid_cost`): every feasible cap's expected decode miss time per token, paged (the exact LRU
curve) against hybrid (simulated: hybrid does not cache the CPU's experts, so it is not a stack algorithm),
and whether hybrid at a smaller cap (more KV) or at the same cap wins. The caps and KV blocks the plan
applies stay the paged optimum's.

The plan is a pure function of its inputs: give seconds_per_byte and recompute_seconds_per_token
(--seconds-per-byte, --recompute-cost) and it is deterministic; left out, they are probed on `device`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from wisp.config import ModelConfig
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.errors import WispError
from wisp.plan.cost_model import CostModel
from wisp.plan.hybrid_cost import HybridAdvice, hybrid_advice
from wisp.plan.miss_curves import kv_miss_curve
from wisp.plan.per_layer import layer_curves, per_layer_caps
from wisp.plan.plan import Plan, PlanCurves, PlanReport, SplitOption, TraceSummary
from wisp.plan.probes import estimate_recompute_cost, probe_seconds_per_byte
from wisp.plan.sizes import DEFAULT_RESERVE_BYTES, GiB, ModelSizes
from wisp.plan.split import Split, SplitProblem, equimarginal_cap, split
from wisp.trace.format import RoutingTrace
from wisp.trace.kv_trace import KVTrace

DEFAULT_TOKENS_PER_REQUEST = 256  # without --tokens-per-request or a KV trace's output lengths


@dataclass(frozen=True)
class PlanInputs:
    vram_budget: int
    max_concurrency: int
    max_model_len: int
    block_size: int = 16
    seconds_per_byte: float | None = None  # host->device copy time per byte; None: probe
    recompute_seconds_per_token: float | None = None  # None: estimate
    reserve_bytes: int = DEFAULT_RESERVE_BYTES
    tokens_per_request: int | None = None
    hybrid_costs: HybridCosts | None = None  # given: the plan carries a HybridAdvice
    embedding_on_host: bool = False  # the token embedding table in pinned host memory (--embedding): not budgeted
    packed_projections: bool = False  # a GGUF file's projections kept packed (`wisp.config.packs_projections`)

    @property
    def admission_floor_blocks(self) -> int:
        """KV blocks for max_concurrency requests of max_model_len tokens: the pool never goes below it."""
        return self.max_concurrency * -(-self.max_model_len // self.block_size)


def make_plan(cfg: ModelConfig, inputs: PlanInputs, trace: RoutingTrace, kv: KVTrace | None,
              device: torch.device) -> Plan:
    """The plan for `inputs` (see the module docstring); WispError when the budget cannot meet the floor."""
    sizes = ModelSizes.of(cfg, inputs.block_size, inputs.embedding_on_host, inputs.packed_projections)
    costs = cost_model(cfg, inputs, sizes, kv, device)
    per_layer = layer_curves(trace, cfg)
    curves = PlanCurves.of(np.sum(per_layer, axis=0), kv_curve_per_request(kv, inputs.admission_floor_blocks),
                           split_problem(cfg, inputs, sizes, costs))
    best = best_split(curves, inputs, sizes)
    caps, per_layer_misses = layer_caps(per_layer, best, cfg)
    report = plan_report(cfg, inputs, sizes, curves, best, per_layer_misses, costs, trace_summary(trace, kv))
    hybrid = None
    if inputs.hybrid_costs is not None:
        hybrid = compare_hybrid(cfg, trace, inputs.hybrid_costs, curves.problem, best.expert_cap)
    return Plan(tuple(caps), best.kv_blocks, inputs.block_size, report, curves, hybrid)


def compare_hybrid(cfg: ModelConfig, trace: RoutingTrace, costs: HybridCosts, problem: SplitProblem,
                   paged_cap: int) -> HybridAdvice:
    """Paged (exact LRU) against hybrid (simulated) at every feasible cap, on the trace's per-token steps in
    every MoE layer."""
    steps = [trace.steps(layer, per_token=True) for layer in trace.layers]
    return hybrid_advice(steps, cfg.num_experts, len(cfg.moe_layer_ids), costs, problem, paged_cap)


def cost_model(cfg: ModelConfig, inputs: PlanInputs, sizes: ModelSizes, kv: KVTrace | None,
               device: torch.device) -> CostModel:
    """The given costs, or the probed ones; tokens per request as the module docstring says."""
    seconds_per_byte = inputs.seconds_per_byte
    if seconds_per_byte is None:
        seconds_per_byte = probe_seconds_per_byte(device)
    recompute = inputs.recompute_seconds_per_token
    if recompute is None:
        recompute = estimate_recompute_cost(cfg, device)
    tokens = inputs.tokens_per_request or (
        int(np.mean(kv.output_tokens)) if kv and kv.output_tokens else DEFAULT_TOKENS_PER_REQUEST)
    return CostModel.of(seconds_per_byte, recompute, tokens, sizes.expert_bytes, inputs.block_size)


def kv_curve_per_request(kv: KVTrace | None, floor: int) -> np.ndarray:
    """KV block misses per request by pool size (flat zero without a KV trace: no measured reuse)."""
    if kv is None:
        return np.zeros(1)
    return kv_miss_curve(kv.requests, max(kv.max_blocks * 8, floor * 2)) / max(len(kv.requests), 1)


def split_problem(cfg: ModelConfig, inputs: PlanInputs, sizes: ModelSizes, costs: CostModel) -> SplitProblem:
    pageable = inputs.vram_budget - sizes.non_expert_bytes - inputs.reserve_bytes
    return SplitProblem(
        budget_bytes=max(pageable, 0),
        slot_bytes=sizes.slot_bytes,
        block_bytes=sizes.block_bytes,
        expert_cost=costs.expert_seconds_per_request,
        kv_cost=costs.kv_miss_seconds,
        min_cap=cfg.top_k,
        max_cap=cfg.num_experts,
        kv_floor=inputs.admission_floor_blocks,
    )


def best_split(curves: PlanCurves, inputs: PlanInputs, sizes: ModelSizes) -> Split:
    """The optimum with the admission floor kept, or a WispError naming the smallest budget that has one."""
    best = split(curves.problem, *curves.arrays())
    if best is None:
        need = curves.problem.smallest_feasible_budget() + sizes.non_expert_bytes + inputs.reserve_bytes
        raise WispError(
            f"a {inputs.vram_budget / GiB:.2f} GiB budget cannot serve --max-concurrency {inputs.max_concurrency} x "
            f"--max-model-len {inputs.max_model_len}: the smallest budget that does is {need / GiB:.2f} GiB ({need} bytes)"
        )
    return best


def layer_caps(per_layer: list[np.ndarray], best: Split, cfg: ModelConfig) -> tuple[list[int], float]:
    """Per-layer caps spending best's slots, and their expert misses per token; the uniform cap when the
    greedy split predicts more misses (it can, on non-convex curves)."""
    caps = per_layer_caps(per_layer, best.expert_cap * len(per_layer), cfg.top_k, cfg.num_experts)
    misses = float(sum(c[k] for c, k in zip(per_layer, caps)))
    if misses > best.expert_misses:
        return [best.expert_cap] * len(per_layer), best.expert_misses
    return caps, misses


def trace_summary(trace: RoutingTrace, kv: KVTrace | None) -> TraceSummary:
    return TraceSummary(trace.num_tokens, len(trace.layers), len(kv.requests) if kv else 0)


def plan_report(cfg: ModelConfig, inputs: PlanInputs, sizes: ModelSizes, curves: PlanCurves, best: Split,
                per_layer_misses: float, costs: CostModel, trace: TraceSummary) -> PlanReport:
    problem, (expert_curve, kv_curve) = curves.problem, curves.arrays()
    free = split(problem, expert_curve, kv_curve, floor=False)
    return PlanReport(
        model=cfg.architecture,
        expert_cap=best.expert_cap,
        kv_bytes=best.kv_blocks * sizes.block_bytes,
        expert_bytes=best.expert_cap * sizes.slot_bytes,
        budget_bytes=inputs.vram_budget,
        pageable_bytes=problem.budget_bytes,
        non_expert_bytes=sizes.non_expert_bytes,
        reserve_bytes=inputs.reserve_bytes,
        slot_bytes=sizes.slot_bytes,
        block_bytes=sizes.block_bytes,
        admission_floor_blocks=problem.kv_floor,
        max_concurrency=inputs.max_concurrency,
        max_model_len=inputs.max_model_len,
        predicted_expert_misses_per_token=best.expert_misses,
        predicted_expert_misses_per_token_per_layer_caps=per_layer_misses,
        predicted_kv_block_misses_per_request=best.kv_misses,
        predicted_latency_s=best.latency,
        equimarginal_cap=equimarginal_cap(problem, expert_curve, kv_curve),
        unconstrained=SplitOption(free.expert_cap, free.kv_blocks, free.latency),
        cost_model=costs,
        trace=trace,
    )
