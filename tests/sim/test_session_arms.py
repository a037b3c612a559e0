"""The controller against fixed splits on session workloads (`wisp.sim.session_arms`), on synthetic streams."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wisp.plan.split import SplitProblem
from wisp.sim.controller_sim import SimRequest
from wisp.sim.session_arms import SessionSetup, WorkloadResult, compare, compare_workloads, workflow_name
from wisp.trace.format import RoutingTrace
from wisp.trace.kv_trace import KVTrace

EXPERT_MISS_S, TOKENS = 1e-3, 8
# 6000 bytes: caps 2..16 of 300 bytes, blocks of 100 bytes, floor 4 blocks (caps above 18 would break it)
PROBLEM = SplitProblem(budget_bytes=6000, slot_bytes=300, block_bytes=100, expert_cost=0.0, kv_cost=2e-3,
                       min_cap=2, max_cap=16, kv_floor=4)


def setup(plan_cap: int = 10, problem: SplitProblem = PROBLEM) -> SessionSetup:
    return SessionSetup(problem, EXPERT_MISS_S, plan_cap)


def expert_bound(rng, n: int) -> list[SimRequest]:
    """Experts reused up to 17 deep, every KV block a hit: wants the most slots."""
    return [SimRequest("experts", TOKENS, rng.integers(1, 18, 8 * TOKENS), np.ones(30, np.int64)) for _ in range(n)]


def kv_bound(rng, n: int) -> list[SimRequest]:
    """Experts hit at 2 slots, KV blocks come back from up to 60 blocks away: wants the most blocks."""
    return [SimRequest("kv", TOKENS, np.tile([1, 2], 4 * TOKENS), rng.integers(1, 61, 30)) for _ in range(n)]


def mixed(rng, n: int) -> list[SimRequest]:
    """Geometric reuse on both sides: an interior best split."""
    return [SimRequest("mixed", TOKENS, rng.geometric(0.2, 8 * TOKENS), rng.geometric(0.05, 6)) for _ in range(n)]


def check_invariants(w: WorkloadResult, p: SplitProblem) -> None:
    for a in w.arms:
        assert all(p.min_cap <= c <= p.max_cap for c in a.caps), a
        assert all(c * p.slot_bytes + b * p.block_bytes <= p.budget_bytes for c, b in zip(a.caps, a.kv_blocks)), a
        assert a.meets_floor == (min(a.kv_blocks) >= p.kv_floor)
        assert w.oracle.seconds > 0 and a.ratio_to_oracle == pytest.approx(a.seconds / w.oracle.seconds)
        if a.meets_floor and a is not w.controller:  # the controller may also adapt within a workflow
            assert w.oracle.seconds <= a.seconds * (1 + 1e-12)
    for a in (w.oracle, w.controller, w.best_static, w.plan, w.kv_blind):
        assert a.meets_floor, a
    assert len(w.controller.caps) == len(w.controller.resizes) + 1
    assert len(w.oracle.caps) == len(w.workflows)


@pytest.mark.parametrize("make", [expert_bound, kv_bound])
def test_on_one_workflow_the_arms_keep_their_bounds_and_the_controller_finds_the_oracle_split(make):
    w = compare(setup(), "one", make(np.random.default_rng(0), 800))
    check_invariants(w, PROBLEM)
    assert w.oracle.seconds == w.best_static.seconds and w.oracle.caps == w.best_static.caps
    assert w.controller.caps[-1] == w.oracle.caps[0]


def test_on_one_workflow_with_an_interior_best_split_the_controller_is_within_5_percent_of_the_oracle():
    w = compare(setup(), "mixed", mixed(np.random.default_rng(0), 800))
    check_invariants(w, PROBLEM)
    assert PROBLEM.min_cap < w.oracle.caps[0] < PROBLEM.max_cap
    assert w.controller.seconds <= w.oracle.seconds * 1.05


def test_on_a_drift_the_controller_beats_the_best_static_split():
    rng = np.random.default_rng(1)
    stream = expert_bound(rng, 800) + kv_bound(rng, 800) + expert_bound(rng, 800)
    w = compare(setup(), "experts->kv->experts", stream)
    check_invariants(w, PROBLEM)
    assert w.workflows == ("experts", "kv") and w.oracle.caps == (16, 2)  # they want different splits
    assert w.oracle.seconds < w.best_static.seconds
    assert w.controller.seconds < w.best_static.seconds
    assert w.controller.caps[-3:] == (16, 2, 16)  # it follows the drift there and back


def test_fifty_fifty_reports_a_broken_floor():
    tight = SplitProblem(budget_bytes=6000, slot_bytes=300, block_bytes=100, expert_cost=0.0, kv_cost=2e-3,
                         min_cap=2, max_cap=16, kv_floor=40)  # half the bytes in blocks is 30 < 40
    w = compare(setup(plan_cap=6, problem=tight), "mixed", mixed(np.random.default_rng(2), 50))
    assert not w.half_half.meets_floor and w.half_half.caps == (10,)
    check_invariants(w, tight)


def test_workloads_from_kv_traces_are_each_alone_then_back_to_back():
    ids = np.random.default_rng(3).integers(0, 6, (9, 2, 2)).astype(np.int16)
    routing = RoutingTrace(ids, layers=[0, 1], num_experts=16)
    a, b = KVTrace(16), KVTrace(16)
    for i in range(5):
        a.add("s", 32 * (i + 1), 5)
        b.add(f"t{i}", 40, 3)
    results = compare_workloads(setup(), routing, [("a", a), ("b", b)])
    assert [w.name for w in results] == ["a", "b", "a->b"]
    assert results[2].requests == results[0].requests + results[1].requests == 10
    assert results[2].tokens == results[0].tokens + results[1].tokens
    assert results[2].workflows == ("a", "b") and len(results[2].oracle.caps) == 2
    row = json.loads(json.dumps(results[2].to_json()))
    assert [arm["arm"] for arm in row["arms"]] == ["oracle", "controller", "best-static", "mv-wsa", "50-50", "kv-blind"]
    assert len(compare_workloads(setup(), routing, [("a", a)])) == 1


@pytest.mark.parametrize("path, name", [
    ("../shared/data/agent_sessions/agentinstruct_os_sample5.json", "os"),
    ("agentinstruct_webshop_sample5.json", "webshop"),
    ("agentinstruct_db_full538_clean.jsonl", "db_full538_clean"),
    ("agentinfer_trace_requests.jsonl", "agentinfer_trace_requests"),
    ("mine.jsonl", "mine"),
    ("x_sample.json", "x_sample"),
])
def test_workflow_names_come_from_file_names(path, name):
    assert workflow_name(path) == name
