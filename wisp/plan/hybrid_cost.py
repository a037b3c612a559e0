"""The planner's price of a cap when misses have two servers (`--mode hybrid`), and its hybrid advice.

Paged mode serves every miss by a copy, so a layer-step with m misses costs m x copy_s and the expected
cost is linear in the expected miss count (what `CostModel` prices). Hybrid mode divides a step's misses
between copies and the CPU (`wisp.core.experts.cpu_assignment.assign_misses`) and pays the longer of the two paths,
which is not linear in m: one step with two misses is cheaper than two steps with one each. So this module
prices a cap from the DISTRIBUTION of misses per step, not from the expected count:

    expected seconds per layer-step at cap C = sum over m of P(a step has m misses at C) x step_s(m),

with step_s(m) the time of `assign_misses` over m missing experts of one routed row each: the batch-1 decode
step (each token its own step, as `wisp.plan.per_layer` views the trace). Paged's price is the same sum
with step_s(m) = m x copy_s, which equals (expected misses) x copy_s.

Paged's distribution is exact for LRU at every cap in one pass, LRU being a stack algorithm: a step has at
least j misses at C exactly when its j-th largest stack distance (a first reference: infinite) exceeds C, so
the number of such steps is the miss curve (`wisp.plan.miss_curves.miss_curve_from_distances`) of each
step's j-th largest distance; the per-cap counts of steps with exactly m misses are differences of those
curves (`miss_count_distribution`).

Hybrid's distribution is SIMULATED, one cap at a time (`hybrid_assignments`): hybrid is not a stack algorithm.
The CPU's experts are not cached (they are not touched, evict nothing and are not kept), so which experts a
step misses depends on earlier assignments, and no one-pass curve holds for every cap.
The replay is `HybridExperts`' own policy on the host: each step's misses assigned by `assign_misses`, the
copied ones through `ExpertPager.decide`'s LRU (`SlotLRU`, which keeps only ids; in a wide step the last C
touched stay and the rest are streamed), the CPU's left out. It is tested step by step against the store
itself (the same assignments, `predicted_s`, loads and CPU counts).

Invariants: step_s(m) <= m x copy_s for every m (the assignment may always copy everything, and ties go to
copying); when the CPU is never worth using the replay is paged's LRU and both prices are bitwise equal;
summed over m, m x (steps with m misses at C) is the miss curve at C for paged. Hybrid is NOT bounded by
paged at the same cap: an expert served on the CPU misses again next time, where paged would have paid one
copy and then hit (e.g. one expert routed every step, copy 6.4 ms, CPU 5.5 ms: hybrid pays 5.5 ms a step,
paged 6.4 ms once; tested).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.core.experts.cpu_assignment import CpuAssignment, assign_misses
from wisp.core.experts.recency import distinct_in_order, touch_order
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
    return assign_misses([(e, 1) for e in range(misses)], costs).predicted_s


def expected_step_seconds(distribution: np.ndarray, seconds_with: Sequence[float]) -> np.ndarray:
    """Per row (a cap): the mean over steps of seconds_with[m] for a step with m misses (float64)."""
    steps = max(int(distribution[0].sum()), 1) if len(distribution) else 1
    return distribution @ np.asarray(seconds_with, dtype=np.float64) / steps


class SlotLRU:
    """`ExpertPager.decide`'s state machine with ids only: which experts hold a slot, and each one's latest
    touch number. The pager's victims are its slots by (last_used, slot): empty slots first (never used,
    -1), then occupied ones by their expert's latest touch, which are distinct; so keeping the resident
    experts and their touch numbers, without slots, decides the same loads and evictions."""

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self.touched: dict[int, int] = {}  # resident expert -> its latest touch number
        self.clock = 0

    def __contains__(self, expert: int) -> bool:
        return expert in self.touched

    def resident(self) -> list[int]:
        return sorted(self.touched)

    def decide(self, order: Sequence[int]) -> int:
        """One step in touch order (`ExpertPager.decide`): its last C distinct experts end resident (misses
        among them loaded into empty slots, then over the least recently touched residents it does not
        keep), its other misses are streamed; returns the misses (loaded or streamed: each is one copy)."""
        order = distinct_in_order(order)
        kept = set(order[-self.capacity:]) if self.capacity else set()
        misses = [e for e in order if e not in self.touched]
        loads = [e for e in misses if e in kept]
        evict = len(self.touched) + len(loads) - self.capacity
        if evict > 0:
            keep = {e for e in order if e in kept and e in self.touched}
            victims = heapq.nsmallest(evict, (e for e in self.touched if e not in keep), key=self.touched.__getitem__)
            for e in victims:
                del self.touched[e]
        for e in loads:
            self.touched[e] = -1
        for e in order:
            if e in self.touched:
                self.touched[e] = self.clock
            self.clock += 1
        return len(misses)


def hybrid_assignments(steps: Iterable[Sequence[int]], capacity: int, costs: HybridCosts,
                       lru: SlotLRU | None = None) -> Iterator[CpuAssignment]:
    """Replay `HybridExperts` on one layer's batch-1 decode steps (each step one token's routed ids, one
    row each; a repeated id counts once, as `RoutingTrace.steps` gives them) with `capacity` slots; yield
    each step's `assign_misses` assignment. As the store does: the step's touch order is its ids ascending
    (`wisp.core.experts.recency`), its non-resident experts are assigned, the CPU's are left out of the pager's step
    (not touched, not cached, evicting nothing) and the rest go through `ExpertPager.decide`. `lru`: the
    state to replay on (a fresh one by default; a caller passing its own can read it after each step)."""
    lru = SlotLRU(capacity) if lru is None else lru
    for step in steps:
        order = touch_order([step])
        assignment = assign_misses([(e, 1) for e in order if e not in lru], costs)
        on_cpu = set(assignment.to_cpu)
        lru.decide([e for e in order if e not in on_cpu])
        yield assignment


def hybrid_miss_distribution(steps: Sequence[Sequence[int]], capacity: int, costs: HybridCosts,
                             widest: int | None = None) -> np.ndarray:
    """int64 [widest + 1]: the number of steps with 0, 1, ... misses (copied or computed on the CPU) in the
    replay of `hybrid_assignments` (widest: the most distinct experts in one step, by default)."""
    if widest is None:
        widest = max((len(set(s)) for s in steps), default=0)
    counts = np.zeros(widest + 1, dtype=np.int64)
    for assignment in hybrid_assignments(steps, capacity, costs):
        counts[len(assignment.to_copy) + len(assignment.to_cpu)] += 1
    return counts


def paged_and_hybrid_seconds(steps: Sequence[Sequence[int]], num_experts: int, costs: HybridCosts,
                             caps: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Mean miss seconds per layer-step at each of `caps` (float64 [len(caps)] each): paged, every miss of
    the exact LRU copied; hybrid, the simulated replay (`hybrid_assignments`). Both price a step by its miss count
    (one row per expert: the assignment's time depends on nothing else), in the same arithmetic, so when the CPU
    is never chosen the two are bitwise equal. `steps`: one token's ids each, ascending (its touch order, as
    `RoutingTrace.steps(layer, per_token=True)` gives them; paged reads the order as listed)."""
    lru = miss_count_distribution(steps, num_experts)
    widest = lru.shape[1] - 1
    hybrid = np.stack([hybrid_miss_distribution(steps, c, costs, widest) for c in caps]) if len(caps) else \
        np.zeros((0, widest + 1), dtype=np.int64)
    paged = expected_step_seconds(lru[list(caps)], [m * costs.copy_s for m in range(widest + 1)])
    return paged, expected_step_seconds(hybrid, [decode_step_seconds(m, costs) for m in range(widest + 1)])


@dataclass(frozen=True)
class HybridCapCost:
    """One candidate cap: expected MoE miss seconds per decode token (all MoE layers) in each mode."""

    expert_cap: int
    kv_blocks: int
    paged_step_s: float  # every miss copied (copy_s from the hybrid costs)
    hybrid_step_s: float  # each layer-step's misses assigned by `assign_misses`


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


def per_layer_seconds(layer_steps: Sequence[Sequence[Sequence[int]]], num_experts: int, moe_layers: int,
                      costs: HybridCosts, caps: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Paged and hybrid miss seconds per decode token at each of `caps`: each model MoE layer's mean
    layer-step seconds, summed (trace layers reused cyclically, as `wisp.plan.per_layer.layer_curves` does)."""
    per_trace_layer = [paged_and_hybrid_seconds(steps, num_experts, costs, caps) for steps in layer_steps]
    paged, hybrid = np.zeros(len(caps)), np.zeros(len(caps))
    for i in range(moe_layers):
        p, h = per_trace_layer[i % len(per_trace_layer)]
        paged, hybrid = paged + p, hybrid + h
    return paged, hybrid


def hybrid_advice(layer_steps: Sequence[Sequence[Sequence[int]]], num_experts: int, moe_layers: int,
                  costs: HybridCosts, problem: SplitProblem, paged_cap: int) -> HybridAdvice:
    """Paged against hybrid at every feasible cap, per decode token (`per_layer_seconds`), and the
    recommendation (`choose_mode`)."""
    feasible = list(problem.feasible_caps())
    paged_s, hybrid_s = per_layer_seconds(layer_steps, num_experts, moe_layers, costs, feasible)
    caps = tuple(HybridCapCost(c, problem.kv_blocks(c), float(p), float(h))
                 for c, p, h in zip(feasible, paged_s, hybrid_s))
    return choose_mode(caps, costs, paged_cap)


def choose_mode(caps: Sequence[HybridCapCost], costs: HybridCosts, paged_cap: int) -> HybridAdvice:
    """The recommendation over priced caps (ascending): hybrid at the smallest cap up to the paged plan's
    whose hybrid time is within the paged plan's (it frees slots for KV), or hybrid at the paged cap when
    strictly faster there, else paged."""
    target = next(c.paged_step_s for c in caps if c.expert_cap == paged_cap)
    within = [c for c in caps if c.expert_cap <= paged_cap and c.hybrid_step_s <= target + TIE * max(1.0, target)]
    best = within[0] if within else None
    faster = best is not None and (best.expert_cap < paged_cap or best.hybrid_step_s < target - TIE * max(1.0, target))
    chosen = best if faster else next(c for c in caps if c.expert_cap == paged_cap)
    return HybridAdvice(costs, tuple(caps), paged_cap, "hybrid" if faster else "paged", chosen.expert_cap,
                        chosen.kv_blocks)


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
