"""The planner's two-server price (`wisp.plan.hybrid_cost`): the per-step miss distribution against a brute
force LRU, hybrid never above paged (equal when the CPU is never worth it), and the advice it gives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.core.hybrid_split import HybridCosts
from wisp.plan.hybrid_cost import (
    HybridAdvice,
    HybridCapCost,
    advice_lines,
    decode_step_seconds,
    hybrid_advice,
    miss_count_distribution,
    paged_and_hybrid_seconds,
)
from wisp.plan.miss_curves import expert_miss_curve
from wisp.plan.split import SplitProblem

SETTINGS = settings(max_examples=80, deadline=None)


@st.composite
def step_sequences(draw, max_experts=10, max_steps=30, max_set=4):
    n = draw(st.integers(1, max_experts))
    steps = draw(st.lists(st.lists(st.integers(0, n - 1), max_size=max_set), max_size=max_steps))
    return n, steps


@st.composite
def hybrid_costs(draw):
    seconds = st.floats(0, 1e-2, allow_nan=False)
    rows = sorted(draw(st.sets(st.integers(1, 64), min_size=1, max_size=4)))
    cpu = sorted(draw(st.lists(seconds, min_size=len(rows), max_size=len(rows))))
    return HybridCosts(draw(seconds), tuple(rows), tuple(cpu), draw(seconds))


def brute_step_misses(steps, capacity):
    """Each step's miss count under set-semantics LRU (recency list, least recent first; a wide step keeps
    its `capacity` most recent members, as the pager does)."""
    rec: list = []
    out = []
    for s in steps:
        touch = list(dict.fromkeys(reversed(s)))[::-1]  # an id counts at its last place
        out.append(sum(e not in rec for e in touch))
        rec = [e for e in rec if e not in touch] + touch
        rec = rec[-capacity:] if capacity else []
    return out


@SETTINGS
@given(step_sequences())
def test_the_distribution_is_the_brute_force_lru_per_step_and_sums_to_the_curve(case):
    n, steps = case
    dist = miss_count_distribution(steps, n)
    curve = expert_miss_curve(steps, n)
    assert dist.shape[0] == n + 1 and (dist.sum(axis=1) == len(steps)).all()
    assert (dist @ np.arange(dist.shape[1]) == curve).all()
    for cap in range(n + 1):
        counts = np.bincount(brute_step_misses(steps, cap), minlength=dist.shape[1])
        assert counts.tolist() == dist[cap].tolist(), cap


@SETTINGS
@given(step_sequences(), hybrid_costs())
def test_hybrid_never_exceeds_paged_and_paged_is_misses_times_copy(case, costs):
    n, steps = case
    dist = miss_count_distribution(steps, n)
    paged, hybrid = paged_and_hybrid_seconds(dist, costs)
    assert (hybrid <= paged).all() and (hybrid >= 0).all()
    expected = expert_miss_curve(steps, n) * costs.copy_s / max(len(steps), 1)
    assert paged == pytest.approx(expected, rel=1e-12, abs=1e-300)


@SETTINGS
@given(step_sequences(), hybrid_costs())
def test_when_the_cpu_is_never_worth_it_hybrid_is_exactly_paged(case, costs):
    n, steps = case
    widest = max((len(set(s)) for s in steps), default=0)
    # the CPU's fixed cost alone is above copying a whole step: no split beats copying everything
    slow = HybridCosts(costs.copy_s, costs.cpu_rows, costs.cpu_s_at_rows, widest * costs.copy_s + costs.cpu_overhead_s)
    paged, hybrid = paged_and_hybrid_seconds(miss_count_distribution(steps, n), slow)
    assert hybrid.tolist() == paged.tolist()


def test_decode_steps_split_their_misses_between_the_servers():
    costs = HybridCosts(copy_s=6.4e-3, cpu_rows=(1,), cpu_s_at_rows=(5.5e-3,))
    # 1 miss: the CPU (5.5 < 6.4); 2: one each way (6.4); 3: one copy, two on the CPU (11 < 12.8 < 19.2)
    assert [decode_step_seconds(m, costs) for m in range(4)] == pytest.approx([0.0, 5.5e-3, 6.4e-3, 11e-3])


PROBLEM = SplitProblem(budget_bytes=100, slot_bytes=10, block_bytes=1, expert_cost=1.0, kv_cost=1.0, min_cap=2,
                       max_cap=4, kv_floor=0)
# ten steps of one layer, by cap 0..4: how many have 0, 1 or 2 misses
DIST = np.array([[0, 0, 10], [0, 2, 8], [2, 4, 4], [5, 4, 1], [10, 0, 0]])


def advise(cpu_s: float, paged_cap: int, overhead_s: float = 0.0) -> HybridAdvice:
    return hybrid_advice([DIST, DIST], HybridCosts(1.0, (1,), (cpu_s,), overhead_s), PROBLEM, paged_cap)


def test_a_cheap_cpu_buys_the_paged_time_at_a_smaller_cap():
    advice = advise(cpu_s=0.1, paged_cap=3)
    assert [c.expert_cap for c in advice.caps] == [2, 3, 4] and advice.at(2).kv_blocks == 80
    assert advice.at(3).paged_step_s == pytest.approx(2 * 0.6)  # two layers, (4 x 1 + 1 x 2) copies / 10 steps
    assert advice.at(2).hybrid_step_s == pytest.approx(2 * 0.12)  # (4 x 0.1 + 4 x 0.2) / 10
    assert (advice.mode, advice.expert_cap, advice.kv_blocks) == ("hybrid", 2, 80)
    lines = advice_lines(advice, slot_bytes=10)
    assert "recommend --mode hybrid at C=2" in lines[-1] and "10 more KV blocks" in lines[-1]
    assert len(lines) == 2 + 3 + 1 and "<- paged plan" in lines[3]


def test_hybrid_at_the_same_cap_when_only_faster_there_and_paged_when_never():
    same = advise(cpu_s=0.9, paged_cap=3)  # C = 2: 0.76 > 0.6; C = 3: 0.46 < 0.6
    assert (same.mode, same.expert_cap) == ("hybrid", 3)
    full = advise(cpu_s=0.9, paged_cap=4)  # no misses at C = 4: nothing to win
    assert (full.mode, full.expert_cap) == ("paged", 4)
    never = advise(cpu_s=0.9, paged_cap=3, overhead_s=2.0)
    assert (never.mode, never.expert_cap) == ("paged", 3)
    assert all(c.hybrid_step_s == c.paged_step_s for c in never.caps)
    assert "recommend paged at C=3" in advice_lines(never, slot_bytes=10)[-1]


def test_an_advice_checks_its_mode_and_caps():
    row = HybridCapCost(2, 80, 1.0, 0.5)
    costs = HybridCosts(1.0, (1,), (0.5,))
    with pytest.raises(ValueError, match="mode must be one of"):
        HybridAdvice(costs, (row,), 2, "cpu", 2, 80)
    with pytest.raises(ValueError, match="must be among the caps"):
        HybridAdvice(costs, (row,), 3, "paged", 2, 80)
