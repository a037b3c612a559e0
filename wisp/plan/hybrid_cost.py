"""The planner's price of a cap when misses have two servers (`--mode hybrid`), and its hybrid advice.

Paged mode serves every miss by a copy, so a layer-step with m misses costs m x copy_s and the expected
cost is linear in the expected miss count (what `CostModel` prices). Hybrid mode splits a step's misses
between copies and the CPU (`wisp.core.hybrid_split.split_misses`) and pays the longer of the two paths,
which is not linear in m: one step with two misses is cheaper than two steps with one each. So this module
prices a cap from the DISTRIBUTION of misses per step, not from the expected count:

    expected seconds per layer-step at cap C = sum over m of P(a step has m misses at C) x step_s(m),

with step_s(m) the time of `split_misses` over m missing experts of one routed row each: the batch-1 decode
step (each token its own step, as `wisp.plan.per_layer` views the trace). Paged's price is the same sum
with step_s(m) = m x copy_s, which equals (expected misses) x copy_s.

The distribution is exact for LRU at every cap in one pass: a step has at least j misses at C exactly when
its j-th largest stack distance (a first reference: infinite) exceeds C, so the number of such steps is the
miss curve (`wisp.plan.miss_curves.miss_curve_from_distances`) of each step's j-th largest distance. The
per-cap counts of steps with exactly m misses are differences of those curves (`miss_count_distribution`).

Approximation: the distribution is paged mode's LRU, every miss entering the cache. In hybrid mode the
CPU's experts are not cached (they evict nothing and are not kept), so the real hybrid miss sequence can
differ; the price is of paged's misses served by two servers.

Invariants: step_s(m) <= m x copy_s for every m (the split may always copy everything, and ties go to
copying), so the hybrid price never exceeds paged's at any cap, and equals it exactly when the CPU is never
worth using; summed over m, m x (steps with m misses at C) is the miss curve at C.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from wisp.core.hybrid_split import HybridCosts, split_misses
from wisp.plan.miss_curves import COLD, expert_sets, miss_curve_from_distances, stack_distances
from wisp.plan.split import TIE, SplitProblem

MODES = ("paged", "hybrid")


def miss_count_distribution(steps: Sequence[Sequence[int]], num_experts: int) -> np.ndarray:
    """int64 [num_experts + 1, widest + 1]: row C counts the steps with 0, 1, ..., widest misses at cap C
    (LRU, `expert_miss_curve`'s semantics; widest = the most distinct experts in one step). Each row sums
    to the number of steps."""
    sets = expert_sets(steps, num_experts)
    distances = stack_distances(sets)
    sizes = np.array([len(s) for s in sets], dtype=np.int64)
    widest = int(sizes.max()) if len(sizes) else 0
    step_of = np.repeat(np.arange(len(sizes)), sizes)
    infinite = np.where(distances == COLD, num_experts + 1, distances)  # a first reference misses at every cap
    order = np.lexsort((-infinite, step_of))  # by step, largest distance first
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order)) - starts  # 0 = the step's largest distance
    at_least = np.empty((widest + 2, num_experts + 1), dtype=np.int64)  # at_least[j][C]: steps with >= j misses
    at_least[0] = len(sizes)
    for j in range(1, widest + 1):
        at_least[j] = miss_curve_from_distances(distances[rank == j - 1], num_experts)
    at_least[widest + 1] = 0
    return (at_least[:-1] - at_least[1:]).T.copy()


def decode_step_seconds(misses: int, costs: HybridCosts) -> float:
    """One layer-step's miss time in hybrid mode with `misses` missing experts of one routed row each."""
    return split_misses([(e, 1) for e in range(misses)], costs).predicted_s


def expected_step_seconds(distribution: np.ndarray, seconds_with: Sequence[float]) -> np.ndarray:
    """Per cap: the mean over steps of seconds_with[m] for a step with m misses (float64 [caps])."""
    steps = max(int(distribution[0].sum()), 1)
    return distribution @ np.asarray(seconds_with, dtype=np.float64) / steps


def paged_and_hybrid_seconds(distribution: np.ndarray, costs: HybridCosts) -> tuple[np.ndarray, np.ndarray]:
    """Expected miss seconds per layer-step at every cap: every miss copied, and split by `split_misses`."""
    widest = distribution.shape[1] - 1
    paged = expected_step_seconds(distribution, [m * costs.copy_s for m in range(widest + 1)])
    hybrid = expected_step_seconds(distribution, [decode_step_seconds(m, costs) for m in range(widest + 1)])
    return paged, hybrid


@dataclass(frozen=True)
class HybridCapCost:
    """One candidate cap: expected MoE miss seconds per decode token (all MoE layers) in each mode."""

    expert_cap: int
    kv_blocks: int
    paged_step_s: float  # every miss copied (copy_s from the hybrid costs)
    hybrid_step_s: float  # each layer-step's misses split by `split_misses`


@dataclass(frozen=True)
class HybridAdvice:
    """The hybrid comparison `wisp plan --hybrid-costs` adds to a plan; `mode` at `expert_cap` is the
    recommendation, against the paged plan's `paged_cap`."""

    costs: HybridCosts
    caps: tuple[HybridCapCost, ...]  # every cap the budget allows, ascending
    paged_cap: int
    mode: str  # "hybrid" or "paged"
    expert_cap: int
    kv_blocks: int

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        listed = [c.expert_cap for c in self.caps]
        if self.paged_cap not in listed or self.expert_cap not in listed:
            raise ValueError(f"expert_cap {self.expert_cap} and paged_cap {self.paged_cap} must be among the caps")

    def at(self, cap: int) -> HybridCapCost:
        return next(c for c in self.caps if c.expert_cap == cap)


def per_layer_distributions(layer_steps: Sequence[Sequence[Sequence[int]]], num_experts: int,
                            moe_layers: int) -> list[np.ndarray]:
    """Per model MoE layer, its steps' miss-count distribution (trace layers reused cyclically, as
    `wisp.plan.per_layer.layer_curves` does)."""
    dists = [miss_count_distribution(steps, num_experts) for steps in layer_steps]
    return [dists[i % len(dists)] for i in range(moe_layers)]


def hybrid_advice(distributions: Sequence[np.ndarray], costs: HybridCosts, problem: SplitProblem,
                  paged_cap: int) -> HybridAdvice:
    """Paged against hybrid at every feasible cap, per decode token (the layers' expected layer-step
    seconds summed), and the recommendation: hybrid at the smallest cap whose hybrid time is within the
    paged plan's (it frees slots for KV), or hybrid at the paged cap when strictly faster, else paged."""
    paged = hybrid = 0.0
    for d in distributions:
        p, h = paged_and_hybrid_seconds(d, costs)
        paged, hybrid = paged + p, hybrid + h
    caps = tuple(HybridCapCost(c, problem.kv_blocks(c), float(paged[c]), float(hybrid[c]))
                 for c in problem.feasible_caps())
    target = paged[paged_cap]
    within = [c for c in caps if c.expert_cap <= paged_cap and c.hybrid_step_s <= target + TIE * max(1.0, target)]
    best = within[0] if within else None
    faster = best is not None and (best.expert_cap < paged_cap or best.hybrid_step_s < target - TIE * max(1.0, target))
    chosen = best if faster else next(c for c in caps if c.expert_cap == paged_cap)
    return HybridAdvice(costs, caps, paged_cap, "hybrid" if faster else "paged", chosen.expert_cap, chosen.kv_blocks)


def advice_lines(advice: HybridAdvice, slot_bytes: int) -> list[str]:
    """The comparison as `wisp plan` prints it (stderr), one line per cap, then the recommendation."""
    c = advice.costs
    lines = [f"wisp: hybrid costs: copy {1e3 * c.copy_s:.2f} ms/expert, CPU {1e3 * c.cpu_s(1):.2f} ms/expert at "
             f"1 row, overhead {1e3 * c.cpu_overhead_s:.2f} ms; expected MoE miss ms per decode token (batch 1)",
             f"{'cap':>6}{'kv blocks':>11}{'paged ms':>11}{'hybrid ms':>11}"]
    for row in advice.caps:
        mark = "  <- paged plan" if row.expert_cap == advice.paged_cap else ""
        lines.append(f"{row.expert_cap:>6}{row.kv_blocks:>11}{1e3 * row.paged_step_s:>11.2f}"
                     f"{1e3 * row.hybrid_step_s:>11.2f}{mark}")
    paged, chosen = advice.at(advice.paged_cap), advice.at(advice.expert_cap)
    if advice.mode == "paged":
        lines.append(f"wisp: recommend paged at C={paged.expert_cap}: hybrid is no faster at any cap up to it")
    else:
        freed = (paged.expert_cap - chosen.expert_cap) * slot_bytes
        lines.append(f"wisp: recommend --mode hybrid at C={chosen.expert_cap}: {1e3 * chosen.hybrid_step_s:.2f} ms "
                     f"against paged C={paged.expert_cap} {1e3 * paged.paged_step_s:.2f} ms per token, "
                     f"{chosen.kv_blocks - paged.kv_blocks} more KV blocks ({freed / 2**30:.2f} GiB of slots freed)")
    return lines
