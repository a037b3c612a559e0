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

Payback (with `resize_cost_s`): a resize stalls serving (on a GPU mostly re-capturing the decode graphs, about
2 s for OLMoE-1B-7B), so a re-solved split is adopted only when its relative gain g = 1 - after / before repays
the expected stall within the time the conditions have held (`step(held_s)`: since the last resize or change of
the KV floor; what has lasted that long is expected to last about as long again): stall <= g x held_s. The
expected stall is `resize_cost_s` until a resize was measured (`measured_stall`), then the mean of those measured.
A resize the admission floor forces is never held back.

The KV floor: re-solves keep kv_blocks >= `kv_floor`, which starts at the problem's (the engine's admission
floor, W x L). With `admission_window` set, the floor follows the requests in flight instead
(`wisp.engine.split_controller.admission_floor`; the live split moves it with `require_kv_floor`, never below the
problem's floor, which is then one request's context): lowered, it only lets later re-solves shrink KV (with the
same hysteresis); raised above the pool, it moves at once to the best split under the new floor, hysteresis and
cadence aside, because requests wait for it to be admitted.

Invariants (tested): every adopted split fits the budget (cap * slot_bytes + kv_blocks * block_bytes <=
budget_bytes), keeps kv_blocks >= the KV floor of its time (>= the problem's floor) and min_cap <= cap <= max_cap;
after `require_kv_floor(b)`, kv_blocks >= b. A resize is reported as a frozen `Resize` saying when, from -> to,
and why. The controller only decides: applying a resize (and keeping outputs byte-identical across it) is the
engine's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

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
    # None: the KV floor stays the problem's (W x L); steps: it follows the peak of requests in flight over that
    # many steps (`admission_floor`), and the problem's floor is the lowest it may go (one request's context)
    admission_window: int | None = None
    resize_cost_s: float | None = None  # a resize's stall before one is measured (None: no payback rule)

    def __post_init__(self):
        if self.resolve_every < 1 or self.min_observations < 0:
            raise ValueError("resolve_every must be >= 1 and min_observations >= 0")
        if self.admission_window is not None and self.admission_window < 1:
            raise ValueError(f"admission_window must be >= 1 steps (or None), got {self.admission_window}")
        if self.resize_cost_s is not None and self.resize_cost_s < 0:
            raise ValueError(f"resize_cost_s must be >= 0 seconds (or None), got {self.resize_cost_s}")
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
        self.kv_floor = p.kv_floor  # what re-solves keep; `require_kv_floor` moves it
        self.steps = 0
        self.resizes: list[Resize] = []
        self._stalls: list[float] = []  # measured stalls of applied resizes
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

    @property
    def expected_stall_s(self) -> float | None:
        """What the next resize is expected to stall serving (None: no payback rule)."""
        if self.config.resize_cost_s is None:
            return None
        return sum(self._stalls) / len(self._stalls) if self._stalls else self.config.resize_cost_s

    def measured_stall(self, seconds: float) -> None:
        """An applied resize stalled serving this long."""
        self._stalls.append(seconds)

    def step(self, held_s: float = float("inf")) -> Resize | None:
        """One engine step passed; every `resolve_every` steps, re-solve and maybe adopt a new split. held_s: seconds
        since the last resize or change of the KV floor (the payback rule's horizon)."""
        self.steps += 1
        cfg = self.config
        if self.steps % cfg.resolve_every or self._experts.total < cfg.min_observations:
            return None
        expert, kv = self.curves()
        best = split(replace(cfg.problem, kv_floor=self.kv_floor), expert, kv)
        current = self._current_latency(expert, kv)
        if best is None or best.expert_cap == self.expert_cap or best.latency > current * (1.0 - cfg.min_gain):
            return None
        stall, gain = self.expected_stall_s, 1.0 - best.latency / current if current > 0 else 0.0
        if stall is not None and stall > gain * held_s:
            return None
        return self._adopt(best, current)

    def require_kv_floor(self, blocks: int) -> Resize | None:
        """Keep kv_blocks >= blocks from now on (see the module docstring). Returns the resize when the pool must
        grow now: the best split under the new floor on the current curves (with none observed yet, every split
        ties and the largest cap that fits wins). ValueError below the problem's floor or past what the budget holds
        beside min_cap slots."""
        p = self.config.problem
        if not p.kv_floor <= blocks <= p.kv_blocks(p.min_cap):
            raise ValueError(f"a KV floor of {blocks} blocks is outside [{p.kv_floor}, {p.kv_blocks(p.min_cap)}]")
        self.kv_floor = blocks
        if self.kv_blocks >= blocks:
            return None
        expert, kv = self.curves()
        best = split(replace(p, kv_floor=blocks), expert, kv)
        reason = f"admission: the requests in flight need {blocks} KV blocks, the pool holds {self.kv_blocks}"
        return self._adopt(best, self._current_latency(expert, kv), reason)

    # -- internals ------------------------------------------------------------------------------------
    def _current_latency(self, expert: np.ndarray, kv: np.ndarray) -> float:
        p = self.config.problem  # the pool may hold fewer blocks than the cap leaves room for
        return p.expert_cost * latency(p, expert, kv, self.expert_cap).expert_misses + p.kv_cost * curve_at(kv, self.kv_blocks)

    def _adopt(self, best: Split, before: float, reason: str | None = None) -> Resize:
        grown = "expert slots" if best.expert_cap > self.expert_cap else "KV blocks"
        reason = reason or (f"{grown} remove more latency per byte: predicted {before * 1e3:.2f} -> "
                            f"{best.latency * 1e3:.2f} ms per request")
        resize = Resize(self.steps, self.expert_cap, self.kv_blocks, best.expert_cap, best.kv_blocks, before,
                        best.latency, reason)
        self.expert_cap, self.kv_blocks = best.expert_cap, best.kv_blocks
        self.resizes.append(resize)
        return resize
