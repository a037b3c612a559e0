"""MV-WSA: split one pageable VRAM budget between the expert scratch and the KV pool.

Notation (the paper's): B pageable bytes; a = bytes of one expert slot across all MoE layers (L x M_e);
b = bytes of one KV block across layers; C = expert slots per layer, kappa = KV blocks, so
C * a + kappa * b <= B. Latency per unit of work:

    T(C, kappa) = c_exp * m_exp(C) + c_kv * m_kv(kappa),   c_exp = M_e * t_byte,   c_kv = beta * b_tok

with m_exp the expert misses (all layers) and m_kv the KV block misses over the same work, both exact
LRU miss curves. The optimum equalises latency removed per byte on both sides; it is clamped by the
admission floor kappa >= kappa_min = W * ceil(L / b_tok) and by C >= top_k (one token's experts fit).

`split` returns the exact optimum over every feasible C (at most num_experts evaluations of two
precomputed curves: cheaper than being clever, and exact on non-convex curves too), and
`equimarginal_cap` the paper's characterisation: walking C up while one more slot removes more
latency per byte on the expert side than it adds on the KV side, both read off the curves' convex
hulls with KV treated as continuous. The two agree on convex curves; the plan reports both.
`per_layer_caps` hands out a fixed number of slots across layers by greedy marginal gain on each
layer's own curve (optimal when the curves are convex).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


TIE = 1e-9  # relative latency difference treated as a tie


@dataclass(frozen=True)
class SplitProblem:
    budget_bytes: int  # B
    slot_bytes: int  # a: one expert slot in every MoE layer
    block_bytes: int  # b: one KV block across layers
    expert_cost: float  # c_exp: seconds per expert miss (M_e * t_byte)
    kv_cost: float  # c_kv: seconds per KV block miss (beta * b_tok)
    min_cap: int  # top_k
    max_cap: int  # num_experts
    kv_floor: int  # kappa_min

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
    """m(x), holding the last value past the end of the curve (more room never adds misses)."""
    return float(curve[min(max(x, 0), len(curve) - 1)])


def latency(p: SplitProblem, exp_curve: np.ndarray, kv_curve: np.ndarray, cap: int) -> Split:
    kappa = p.kv_blocks(cap)
    me, mk = curve_at(exp_curve, cap), curve_at(kv_curve, kappa)
    return Split(cap, kappa, p.expert_cost * me + p.kv_cost * mk, me, mk)


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
    """The latency-minimising split; None when no C >= top_k fits the budget. Ties (latencies equal to
    within float rounding, 1e-9 relative) go to the larger cap, so the answer does not hinge on rounding."""
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


def per_layer_caps(curves: list[np.ndarray], total_slots: int, min_cap: int, max_cap: int) -> list[int]:
    """Caps per layer summing to total_slots, each in [min_cap, max_cap], by greedy marginal gain."""
    n = len(curves)
    if not n * min_cap <= total_slots <= n * max_cap:
        raise ValueError(f"{total_slots} slots cannot be split over {n} layers within [{min_cap}, {max_cap}]")
    caps = [min_cap] * n
    heap = [(-(curve_at(c, min_cap) - curve_at(c, min_cap + 1)), i) for i, c in enumerate(curves)]
    heapq.heapify(heap)
    for _ in range(total_slots - n * min_cap):
        while True:
            _, i = heapq.heappop(heap)
            if caps[i] < max_cap:
                break
        caps[i] += 1
        c = caps[i]
        heapq.heappush(heap, (-(curve_at(curves[i], c) - curve_at(curves[i], c + 1)), i))
    return caps
