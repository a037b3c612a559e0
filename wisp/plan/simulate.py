"""`wisp sim`: replacement policies on a routing trace, and the paper's allocator arms on one budget.

`policy_table` sums each policy's misses over the trace's layers for every capacity (LRU is the
exact miss curve; OPT is the offline bound). `allocator_arms` prices four ways to spend one pageable
budget with the plan's cost model:
- MV-WSA: the planner's split (latency-minimising, admission floor kept);
- 50-50: half the pageable bytes to each pool;
- KV-blind expert-proportional: as many expert slots as fit after the smallest KV pool the engine
  accepts (the admission floor);
- naive layer offload: no expert cache; every MoE layer copies all N experts per step, and the KV pool
  gets what is left after one layer-sized buffer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wisp.plan.split import SplitProblem, curve_at, latency
from wisp.trace.format import RoutingTrace
from wisp.plan.policies import OUT_OF_DOMAIN, miss_table


def policy_table(trace: RoutingTrace, caps: Sequence[int], policies: Sequence[str]) -> dict[str, list[int]]:
    """policy -> total misses over all layers at each cap (OUT_OF_DOMAIN where a layer can't run)."""
    totals = {p: np.zeros(len(caps), dtype=np.int64) for p in policies}
    for layer in trace.layers:
        table = miss_table(trace.steps(layer), caps, policies)
        for p in policies:
            col = np.asarray(table[p])
            totals[p] = np.where((totals[p] == OUT_OF_DOMAIN) | (col == OUT_OF_DOMAIN), OUT_OF_DOMAIN, totals[p] + col)
    return {p: v.tolist() for p, v in totals.items()}


def references(trace: RoutingTrace) -> int:
    return sum(len(s) for layer in trace.layers for s in trace.steps(layer))


def allocator_arms(plan: dict, num_experts: int) -> list[dict]:
    """Price the four arms with the plan's curves and cost model (see module docstring)."""
    p = SplitProblem(**plan["_curves"]["problem"])
    exp, kv = np.array(plan["_curves"]["expert"]), np.array(plan["_curves"]["kv"])
    rows = []

    def arm(name: str, cap: int | None, kv_blocks: int, exp_misses: float) -> None:
        kv_misses = curve_at(kv, kv_blocks)
        rows.append({
            "arm": name,
            "expert_cap": cap,
            "kv_blocks": kv_blocks,
            "meets_floor": kv_blocks >= p.kv_floor,
            "expert_misses_per_token": exp_misses,
            "kv_block_misses_per_request": kv_misses,
            "predicted_latency_s": p.expert_cost * exp_misses + p.kv_cost * kv_misses,
        })

    best = latency(p, exp, kv, plan["expert_cap"])
    arm("mv-wsa", best.expert_cap, best.kv_blocks, best.expert_misses)
    half = max(p.min_cap, min(p.max_cap, (p.budget_bytes // 2) // p.slot_bytes))
    arm("50-50", half, p.kv_blocks(half), curve_at(exp, half))
    blind = max(p.min_cap, min(p.max_cap, (p.budget_bytes - p.kv_floor * p.block_bytes) // p.slot_bytes))
    arm("kv-blind", blind, p.kv_blocks(blind), curve_at(exp, blind))
    layers = len(plan["per_layer_caps"])
    layer_buffer = num_experts * p.slot_bytes // layers  # N experts of one layer
    arm("offload", None, max(p.budget_bytes - layer_buffer, 0) // p.block_bytes, float(num_experts * layers))
    return rows
