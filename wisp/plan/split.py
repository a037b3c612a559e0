"""The VRAM split: one pageable budget divided between the expert scratch and the KV pool.

A `SplitProblem` holds everything the split needs in plain bytes and seconds: `budget_bytes` pageable
bytes, `slot_bytes` per expert slot (one expert in every MoE layer), `block_bytes` per KV block (all
layers), and `expert_cost` / `kv_cost`, the seconds one unit of each miss curve costs (the planner's
expert curve counts misses per token, so its expert_cost is one miss's seconds times the tokens of a
request, and latency comes out in seconds per request). A split gives each MoE layer `expert_cap`
slots and the pool `kv_blocks` blocks, with

    expert_cap * slot_bytes + kv_blocks * block_bytes <= budget_bytes,
    latency = expert_cost * expert_curve[expert_cap] + kv_cost * kv_curve[kv_blocks],

where the two curves are exact LRU miss curves over the same work (`wisp.plan.miss_curves`). It is
clamped by the admission floor (kv_blocks >= kv_floor, every admitted request's whole context) and by
expert_cap >= min_cap (top_k: one token's experts fit). The paper's symbols for all of these are
mapped to these names in `wisp.plan`'s docstring.

`split` returns the exact optimum over every feasible cap (at most num_experts evaluations of two
precomputed curves: cheaper than being clever, and exact on non-convex curves too), and
`equimarginal_cap` the paper's characterisation: walking the cap up while one more slot removes more
latency per byte on the expert side than it adds on the KV side, both read off the curves' convex
hulls with KV treated as continuous. The two agree on convex curves; the plan reports both.

Invariants: a returned split fits the budget and, with floor=True, keeps kv_blocks >= kv_floor; ties
(latencies within 1e-9 relative) go to the larger cap, so the answer does not hinge on rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


TIE = 1e-9  # relative latency difference treated as a tie


@dataclass(frozen=True)
class SplitProblem:
    budget_bytes: int  # pageable bytes to split
    slot_bytes: int  # one expert slot in every MoE layer
    block_bytes: int  # one KV block across layers
    expert_cost: float  # seconds per unit of the expert miss curve
    kv_cost: float  # seconds per unit of the KV miss curve (one block's recompute)
    min_cap: int  # top_k
    max_cap: int  # num_experts
    kv_floor: int  # the admission floor, in blocks

    def kv_blocks(self, cap: int) -> int:
        return (self.budget_bytes - cap * self.slot_bytes) // self.block_bytes

    def feasible_caps(self, floor: bool = True) -> range:
        hi = self.max_cap
        while hi >= self.min_cap and self.kv_blocks(hi) < (self.kv_floor if floor else 0):
            hi -= 1
        return range(self.min_cap, hi + 1)

    def smallest_feasible_budget(self) -> int:
        return self.min_cap * self.slot_bytes + self.kv_floor * self.block_bytes


@dataclass(frozen=True)
class Split:
    expert_cap: int
    kv_blocks: int
    latency: float
    expert_misses: float
    kv_misses: float


def curve_at(curve: np.ndarray, x: int) -> float:
    """curve[x], holding the last value past the end of the curve (more room never adds misses)."""
    return float(curve[min(max(x, 0), len(curve) - 1)])


def latency(p: SplitProblem, exp_curve: np.ndarray, kv_curve: np.ndarray, cap: int) -> Split:
    kv_blocks = p.kv_blocks(cap)
    expert_misses, kv_misses = curve_at(exp_curve, cap), curve_at(kv_curve, kv_blocks)
    return Split(cap, kv_blocks, p.expert_cost * expert_misses + p.kv_cost * kv_misses, expert_misses, kv_misses)


def lower_hull(curve: np.ndarray) -> np.ndarray:
    """The greatest convex minorant of a curve sampled at 0..n-1 (its lower convex hull)."""
    pts: list[int] = []
    for x in range(len(curve)):
        while len(pts) >= 2:
            x0, x1 = pts[-2], pts[-1]
            if (curve[x1] - curve[x0]) * (x - x0) >= (curve[x] - curve[x0]) * (x1 - x0):
                pts.pop()
            else:
                break
        pts.append(x)
    return np.interp(np.arange(len(curve)), pts, curve[pts])


def split(p: SplitProblem, exp_curve: np.ndarray, kv_curve: np.ndarray, floor: bool = True) -> Split | None:
    """The latency-minimising split; None when no cap >= min_cap fits the budget. Ties (latencies equal
    to within float rounding, 1e-9 relative) go to the larger cap."""
    caps = p.feasible_caps(floor)
    if not caps:
        return None
    options = [latency(p, exp_curve, kv_curve, c) for c in caps]
    best = min(s.latency for s in options)
    return max((s for s in options if s.latency <= best + TIE * max(1.0, abs(best))), key=lambda s: s.expert_cap)


def equimarginal_cap(p: SplitProblem, exp_curve: np.ndarray, kv_curve: np.ndarray, floor: bool = True) -> int | None:
    """Where latency removed per byte is equal on both sides (on the convex hulls), clamped to the floor."""
    caps = p.feasible_caps(floor)
    if not caps:
        return None
    he, hk = lower_hull(np.asarray(exp_curve, float)), lower_hull(np.asarray(kv_curve, float))
    kx = np.arange(len(hk))

    def kv_at(cap: int) -> float:
        return float(np.interp((p.budget_bytes - cap * p.slot_bytes) / p.block_bytes, kx, hk))

    cap = caps.start
    while cap + 1 in caps:
        exp_gain = p.expert_cost * (curve_at(he, cap) - curve_at(he, cap + 1))
        kv_loss = p.kv_cost * (kv_at(cap + 1) - kv_at(cap))
        if exp_gain <= kv_loss:
            break
        cap += 1
    return cap
