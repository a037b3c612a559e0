"""The controller replayed over a drifting request stream (`wisp.sim.controller_sim`)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.engine.split_controller.controller import ControllerConfig
from wisp.plan.miss_curves import COLD, miss_curve_from_distances
from wisp.plan.split import SplitProblem
from wisp.sim.controller_sim import SimRequest, misses, simulate_controller, stream_seconds

EXPERT_MISS_S, TOKENS = 1e-3, 8


def problem(kv_cost: float = 2e-3) -> SplitProblem:
    return SplitProblem(budget_bytes=6000, slot_bytes=300, block_bytes=100, expert_cost=EXPERT_MISS_S * TOKENS,
                        kv_cost=kv_cost, min_cap=2, max_cap=16, kv_floor=4)


def drifting_stream(n_each: int, seed: int = 0) -> list[SimRequest]:
    """An expert-bound workflow (experts reused up to 16 deep, every KV block hits), then a KV-bound one
    (experts hit at 2 slots, KV blocks come back from up to 150 blocks away)."""
    rng = np.random.default_rng(seed)
    a = [SimRequest("experts", TOKENS, rng.integers(1, 17, 8 * TOKENS), np.ones(3, np.int64)) for _ in range(n_each)]
    b = [SimRequest("kv", TOKENS, np.tile([1, 2], 4 * TOKENS), rng.integers(1, 150, 6)) for _ in range(n_each)]
    return a + b


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(-1, 20), max_size=15), min_size=1, max_size=10), st.integers(0, 20))
def test_per_request_misses_add_up_to_the_miss_curve(chunks, size):
    arrays = [np.array([COLD if d <= 0 else d for d in c], dtype=np.int64) for c in chunks]
    assert sum(misses(a, size) for a in arrays) == miss_curve_from_distances(np.concatenate(arrays), 20)[size]


def test_the_controller_beats_every_static_split_on_a_drift_and_nears_the_oracle():
    p, stream = problem(), drifting_stream(300)
    cfg = ControllerConfig(p, resolve_every=8, min_gain=0.05, half_life=400.0, min_observations=64)
    res = {r.arm: r for r in simulate_controller(cfg, stream, EXPERT_MISS_S)}
    best, oracle, ctl = res["best-static"].seconds, res["oracle"].seconds, res["controller"]
    assert best == min(r.seconds for name, r in res.items() if name.startswith("static:"))
    assert oracle < best  # the two workflows want different splits
    assert ctl.seconds < best and ctl.resizes >= 1
    assert ctl.seconds <= oracle * 1.10


def test_on_one_workflow_the_controller_lands_within_5_percent_of_its_best_split():
    """A workflow with geometric reuse distances on both sides (convex miss curves, an interior best split,
    misses that never vanish), the controller started at the smallest cap."""
    p, rng = problem(kv_cost=5e-3), np.random.default_rng(1)
    stream = [SimRequest("mixed", TOKENS, rng.geometric(0.2, 8 * TOKENS), rng.geometric(0.05, 6)) for _ in range(1500)]
    cfg = ControllerConfig(p, resolve_every=8, min_gain=0.05, half_life=400.0, min_observations=64)
    res = {r.arm: r for r in simulate_controller(cfg, stream, EXPERT_MISS_S, start_cap=p.min_cap)}
    assert res["oracle"].seconds == res["best-static"].seconds > 0
    best_cap = min(p.feasible_caps(), key=lambda c: (res[f"static:{c}"].seconds, -c))
    assert p.min_cap < best_cap < p.max_cap  # interior: both sides matter
    assert res["best-static"].seconds == stream_seconds(p, stream, best_cap, EXPERT_MISS_S)
    assert res["controller"].seconds <= res["oracle"].seconds * 1.05
