"""Per-layer expert miss curves from a routing trace, and uneven per-layer caps over them.

`layer_curves` gives each of the model's MoE layers its exact LRU miss curve in misses per token, for
every cap 0..num_experts (trace layers are reused cyclically when the trace has fewer). Each token is
its own step there: the batch-1 decode view the plan prices. (A recorded wide step, a prefill chunk,
is one pager step too, run expert-major, and `expert_miss_curve` of the recorded steps replays it
exactly; per token, reuse inside a prefill counts as decode reuse.)

`per_layer_caps` hands a fixed number of slots out across layers by greedy marginal gain on each
layer's own curve: optimal when the curves are convex (tested against an exhaustive search).
Invariants: the caps sum to the slots asked for and each lies in [min_cap, max_cap].
"""

from __future__ import annotations

import heapq

import numpy as np

from wisp.config import ModelConfig
from wisp.errors import WispError
from wisp.plan.miss_curves import expert_miss_curve
from wisp.plan.split import curve_at
from wisp.trace.format import RoutingTrace


def layer_curves(trace: RoutingTrace, cfg: ModelConfig) -> list[np.ndarray]:
    """Per model MoE layer: misses per token for cap = 0..num_experts (see the module docstring)."""
    if trace.num_experts > cfg.num_experts:
        raise WispError(f"the routing trace has {trace.num_experts} experts but the model has {cfg.num_experts}")
    curves = [expert_miss_curve(trace.steps(layer, per_token=True), cfg.num_experts) / max(trace.num_tokens, 1)
              for layer in trace.layers]
    return [curves[i % len(curves)] for i in range(len(cfg.moe_layer_ids))]


def _heap_key(curve: np.ndarray, cap: int) -> float:
    """Misses one more slot removes at `cap` (negated, for the min-heap)."""
    return -(curve_at(curve, cap) - curve_at(curve, cap + 1))


def per_layer_caps(curves: list[np.ndarray], total_slots: int, min_cap: int, max_cap: int) -> list[int]:
    """Caps per layer summing to total_slots, each in [min_cap, max_cap], by greedy marginal gain."""
    n = len(curves)
    if not n * min_cap <= total_slots <= n * max_cap:
        raise ValueError(f"{total_slots} slots cannot be split over {n} layers within [{min_cap}, {max_cap}]")
    caps = [min_cap] * n
    heap = [(_heap_key(c, min_cap), i) for i, c in enumerate(curves)]
    heapq.heapify(heap)
    for _ in range(total_slots - n * min_cap):
        while True:
            _, i = heapq.heappop(heap)
            if caps[i] < max_cap:
                break
        caps[i] += 1
        heapq.heappush(heap, (_heap_key(curves[i], caps[i]), i))
    return caps
