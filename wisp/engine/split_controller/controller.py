"""The online split controller: the VRAM split re-solved while serving, as the workload drifts.

The offline planner (`wisp.plan.planner`) splits one pageable budget between expert slots and KV blocks
from recorded traces. The controller makes the same decision from the recent past: it is fed the stack
distances of live references (`wisp.plan.miss_curves` semantics) on both sides, keeps them in
`DecayedHistogram`s, and every `resolve_every` steps solves `wisp.plan.split.split` on the curves they
give. Units are the planner's: the expert curve is misses per token at a uniform per-layer cap (every
layer's references pooled: each layer is its own LRU of C slots), the KV curve block misses per request,
priced by the `SplitProblem`'s expert_cost and kv_cost.

Hysteresis: a re-solved split is adopted only when its predicted latency is below the current split's
by at least `min_gain` (relative). With unchanged curves a second re-solve proposes the split just
adopted, so the controller never flaps between two splits; noise below `min_gain` never moves it.

Invariants (tested): every adopted split fits the budget (cap * slot_bytes + kv_blocks * block_bytes <=
budget_bytes), keeps kv_blocks >= the admission floor and min_cap <= cap <= max_cap; a resize is reported
as a frozen `Resize` saying when, from -> to, and why. The controller only decides: applying a resize
(and keeping outputs byte-identical across it) is the engine's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from wisp.engine.split_controller.decayed_histogram import DecayedHistogram
from wisp.plan.split import Split, SplitProblem, curve_at, latency, split


@dataclass(frozen=True)
class ControllerConfig:
    problem: SplitProblem  # the budget, sizes, costs, bounds and floor the split is solved under
    resolve_every: int = 64  # engine steps between re-solves
    min_gain: float = 0.05  # adopt a new split only if it cuts predicted latency by this fraction
    half_life: float | None = 4096.0  # references after which an observation counts half
    min_observations: int = 256  # expert references seen before the first decision

    def __post_init__(self):
        if self.resolve_every < 1 or self.min_observations < 0:
            raise ValueError("resolve_every must be >= 1 and min_observations >= 0")
        if not 0.0 <= self.min_gain < 1.0:
            raise ValueError(f"min_gain must be in [0, 1), got {self.min_gain}")
        if not self.problem.feasible_caps():
            raise ValueError("the budget cannot hold min_cap slots and the admission floor")


@dataclass(frozen=True)
class Resize:
    step: int  # the controller step at which it was decided
    from_cap: int
    from_kv_blocks: int
    to_cap: int
    to_kv_blocks: int
    latency_before: float  # predicted seconds per request at the old split, on the current curves
    latency_after: float  # ... and at the new one
    reason: str


def problem_of_plan(report, top_k: int, num_experts: int) -> SplitProblem:
    """The split problem a written plan was solved under (`PlanReport`: its budget arithmetic and costs)."""
    costs = report.cost_model
    return SplitProblem(report.pageable_bytes, report.slot_bytes, report.block_bytes, costs.expert_seconds_per_request,
                        costs.kv_miss_seconds, top_k, num_experts, report.admission_floor_blocks)


def _as_array(distances: Iterable[int]) -> np.ndarray:
    return distances if isinstance(distances, np.ndarray) else np.fromiter(distances, dtype=np.int64)


class _UnitsSeen:
    """Tokens (or requests) seen, forgotten per reference at the histogram's pace, so that the
    histogram's decayed `total` over it is the recent references per token (or request)."""

    def __init__(self, half_life: float | None):
        self.factor = 1.0 if half_life is None else 2.0 ** (-1.0 / half_life)
        self.value = 0.0

    def add(self, refs: int, units: int) -> None:
        self.value = self.value * self.factor ** refs + units

    def per_unit(self, histogram: DecayedHistogram) -> float:
        return histogram.total / self.value if self.value > 0 else 0.0


class SplitController:
    """Decides resizes of a running split (see the module docstring)."""

    def __init__(self, config: ControllerConfig, expert_cap: int, kv_blocks: int):
        p = config.problem
        if expert_cap not in p.feasible_caps() or p.kv_blocks(expert_cap) < kv_blocks:
            raise ValueError(f"the starting split ({expert_cap} slots, {kv_blocks} blocks) does not fit the problem")
        self.config = config
        self.expert_cap, self.kv_blocks = expert_cap, kv_blocks
        self.steps = 0
        self.resizes: list[Resize] = []
        max_blocks = max(p.kv_blocks(p.min_cap), 1)
        self._experts = DecayedHistogram(p.max_cap, config.half_life)
        self._kv = DecayedHistogram(max_blocks, config.half_life)
        self._tokens, self._requests = _UnitsSeen(config.half_life), _UnitsSeen(config.half_life)

    # -- what it is fed -------------------------------------------------------------------------------
    def observe_experts(self, distances: Iterable[int], tokens: int) -> None:
        """Stack distances of the expert references of `tokens` tokens (all MoE layers)."""
        d = _as_array(distances)
        self.observe_expert_steps(d, [len(d)], [tokens])

    def observe_expert_steps(self, distances: np.ndarray, refs: Sequence[int], tokens: Sequence[int]) -> None:
        """Several steps' `observe_experts` in one call, the same weights to the last bit: `distances` step
        after step, `refs[s]` of them from step s, which computed `tokens[s]` tokens."""
        self._experts.add_many(distances)
        for r, t in zip(refs, tokens):
            self._tokens.add(int(r), t)

    def observe_kv(self, distances: Iterable[int]) -> None:
        """Stack distances of one request's full KV blocks (`wisp.plan.miss_curves.kv_stack_distances`)."""
        d = _as_array(distances)
        self._kv.add_many(d)
        self._requests.add(len(d), 1)

    @property
    def kv_max_distance(self) -> int:
        """The deepest KV stack distance told apart; deeper ones count as misses at every pool size."""
        return self._kv.max_distance

    # -- what it answers ------------------------------------------------------------------------------
    def curves(self) -> tuple[np.ndarray, np.ndarray]:
        """(expert misses per token by cap, KV block misses per request by pool size), recent past."""
        expert = self._experts.miss_curve() * self._tokens.per_unit(self._experts)
        kv = self._kv.miss_curve() * self._requests.per_unit(self._kv)
        return expert, kv

    def marginal_values(self) -> tuple[float, float]:
        """Seconds per request saved per byte by one more expert slot, and by one more KV block's
        bytes, at the current split (what `/metrics` exports live)."""
        p, (expert, kv) = self.config.problem, self.curves()
        slot_gain = p.expert_cost * (curve_at(expert, self.expert_cap) - curve_at(expert, self.expert_cap + 1)) / p.slot_bytes
        block_gain = p.kv_cost * (curve_at(kv, self.kv_blocks) - curve_at(kv, self.kv_blocks + 1)) / p.block_bytes
        return slot_gain, block_gain

    def step(self) -> Resize | None:
        """One engine step passed; every `resolve_every` steps, re-solve and maybe adopt a new split."""
        self.steps += 1
        cfg = self.config
        if self.steps % cfg.resolve_every or self._experts.total < cfg.min_observations:
            return None
        expert, kv = self.curves()
        best = split(cfg.problem, expert, kv)
        current = self._current_latency(expert, kv)
        if best is None or best.expert_cap == self.expert_cap or best.latency > current * (1.0 - cfg.min_gain):
            return None
        return self._adopt(best, current)

    # -- internals ------------------------------------------------------------------------------------
    def _current_latency(self, expert: np.ndarray, kv: np.ndarray) -> float:
        p = self.config.problem  # the pool may hold fewer blocks than the cap leaves room for
        return p.expert_cost * latency(p, expert, kv, self.expert_cap).expert_misses + p.kv_cost * curve_at(kv, self.kv_blocks)

    def _adopt(self, best: Split, before: float) -> Resize:
        grown = "expert slots" if best.expert_cap > self.expert_cap else "KV blocks"
        reason = (f"{grown} remove more latency per byte: predicted {before * 1e3:.2f} -> "
                  f"{best.latency * 1e3:.2f} ms per request")
        resize = Resize(self.steps, self.expert_cap, self.kv_blocks, best.expert_cap, best.kv_blocks, before,
                        best.latency, reason)
        self.expert_cap, self.kv_blocks = best.expert_cap, best.kv_blocks
        self.resizes.append(resize)
        return resize
