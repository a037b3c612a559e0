"""The planner's two-server price (`wisp.plan.hybrid_cost`): paged's per-step miss distribution against a
brute force LRU, hybrid's simulation against the real `HybridExperts` store step by step, hybrid equal to paged
when the CPU is never worth it (and not bounded by paged in general), and the advice it gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.experts.test_experts import make
from tests.plan.test_miss_curves import step_sequences
from tests.core.experts.stores import paged_store
from tests.core.experts.stores import hybrid_store
from wisp.core.learners.hybrid_pace import CpuPace
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.plan.hybrid_cost import (
    HybridAdvice,
    HybridCapCost,
    SlotLRU,
    advice_lines,
    choose_mode,
    decode_step_seconds,
    expected_step_seconds,
    hybrid_advice,
    hybrid_miss_distribution,
    hybrid_assignments,
    miss_count_distribution,
    paged_and_hybrid_seconds,
)
from wisp.plan.miss_curves import expert_miss_curve
from wisp.plan.split import SplitProblem

SETTINGS = settings(max_examples=80, deadline=None)


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


@st.composite
def decode_traces(draw, max_experts=10, max_steps=25):
    """One layer's batch-1 decode steps: each a token's top-k distinct ids, in routing order."""
    n = draw(st.integers(1, max_experts))
    k = draw(st.integers(1, min(n, 4)))
    steps = draw(st.lists(st.lists(st.integers(0, n - 1), min_size=k, max_size=k, unique=True), max_size=max_steps))
    return n, k, steps


def replay_store(store, k: int, steps):
    """Run every step through a real store on the CPU; per step its CPU assignment (hybrid) and resident experts."""
    host_d = store.residency.pager.host[next(iter(store.residency.pager.host))].shape[-1]
    g = torch.Generator().manual_seed(len(steps))
    out = []
    for ids in steps:
        hidden = torch.randn(1, host_d, generator=g)
        weights = torch.softmax(torch.randn(1, k, generator=g), -1)
        store.forward(hidden, torch.tensor([ids]), weights)
        out.append((store.cpu.last_assignment if store.cpu else None, store.residency.pager.resident_experts()))
    return out


@settings(max_examples=40, deadline=None)
@given(decode_traces(), hybrid_costs(), st.data())
def test_the_simulation_is_the_hybrid_store_step_by_step(trace, costs, data):
    n, k, steps = trace
    cap = data.draw(st.integers(1, n), label="cap")  # below k too: wide steps on the GPU side
    host, _, _, _ = make(n, 1, k, 0, torch.float32)
    store = hybrid_store(host, cap, torch.device("cpu"), costs, pace=CpuPace(learn=False))  # costs as given
    real = replay_store(store, k, steps)
    lru = SlotLRU(cap)
    loads = cpu = 0
    for t, assignment in enumerate(hybrid_assignments(steps, cap, costs, lru)):
        real_assignment, resident = real[t]
        assert assignment == real_assignment, t  # the same copies, CPU experts and predicted_s
        assert lru.resident() == resident, t  # and the same experts left in the slots
        loads, cpu = loads + len(assignment.to_copy), cpu + len(assignment.to_cpu)
    c = store.counters
    assert (c.loads, c.cpu_computed, c.misses, c.steps) == (loads, cpu, loads + cpu, len(steps))
    dist = hybrid_miss_distribution(steps, cap, costs)
    assert dist.sum() == len(steps) and int(dist @ np.arange(len(dist))) == loads + cpu
    predicted = sum(s.predicted_s for s, _ in real)
    assert float(dist @ [decode_step_seconds(m, costs) for m in range(len(dist))]) == pytest.approx(predicted, abs=1e-15)


@SETTINGS
@given(decode_traces(), hybrid_costs())
def test_when_the_cpu_is_never_worth_it_hybrid_is_exactly_paged_lru(trace, costs):
    n, k, steps = trace
    steps = [sorted(s) for s in steps]  # one token's touch order
    # the CPU's fixed cost alone is above copying a whole step: no assignment beats copying everything
    slow = HybridCosts(costs.copy_s, costs.cpu_rows, costs.cpu_s_at_rows, k * costs.copy_s + costs.cpu_overhead_s)
    lru = miss_count_distribution(steps, n)
    caps = list(range(n + 1))
    assert np.array_equal(np.stack([hybrid_miss_distribution(steps, c, slow, lru.shape[1] - 1) for c in caps]), lru)
    paged, hybrid = paged_and_hybrid_seconds(steps, n, slow, caps)
    assert hybrid.tolist() == paged.tolist()
    expected = expert_miss_curve(steps, n) * costs.copy_s / max(len(steps), 1)
    assert paged == pytest.approx(expected, rel=1e-12, abs=1e-300)


@settings(max_examples=20, deadline=None)
@given(decode_traces(max_steps=15))
def test_with_the_cpu_never_chosen_the_store_is_paged_mode(trace):
    """The other side of the equality: the real hybrid store, too, is paged mode when the CPU never wins."""
    n, k, steps = trace
    host, _, _, _ = make(n, 1, k, 0, torch.float32)
    never = HybridCosts(copy_s=1.0, cpu_rows=(1,), cpu_s_at_rows=(1.0,), cpu_overhead_s=k + 1.0)
    for cap in {1, min(k, n), n}:
        hybrid = hybrid_store(host, cap, torch.device("cpu"), never)
        paged = paged_store(host, cap, "cpu")
        assert [r for _, r in replay_store(hybrid, k, steps)] == [r for _, r in replay_store(paged, k, steps)]
        assert hybrid.counters.as_dict() == paged.counters.as_dict()


def test_a_lone_miss_is_copied_so_it_is_not_missed_again():
    """The CPU caches nothing: serving a lone miss there (5.5 < 6.4 ms) would miss it again every step."""
    costs = HybridCosts(copy_s=6.4e-3, cpu_rows=(1,), cpu_s_at_rows=(5.5e-3,))
    steps = [[0]] * 4
    paged, hybrid = paged_and_hybrid_seconds(steps, 2, costs, [1])
    assert paged[0] == pytest.approx(6.4e-3 / 4) and hybrid[0] == pytest.approx(6.4e-3 / 4)
    assert [s.to_copy for s in hybrid_assignments(steps, 1, costs)] == [(0,), (), (), ()]


def test_a_wide_decode_step_keeps_its_last_touched_experts():
    costs = HybridCosts(copy_s=1.0, cpu_rows=(1,), cpu_s_at_rows=(10.0,))  # never the CPU
    lru = SlotLRU(2)
    assignments = list(hybrid_assignments([[0, 1, 2], [5, 3]], 2, costs, lru))
    assert [s.to_copy for s in assignments] == [(0, 1, 2), (3, 5)] and lru.resident() == [3, 5]
    lru = SlotLRU(2)
    assert [lru.decide(s) for s in ([0, 1, 2], [2, 0], [1])] == [3, 1, 1] and lru.resident() == [0, 1]  # 2 touched before 0


def test_decode_steps_assign_their_misses_to_the_servers():
    costs = HybridCosts(copy_s=6.4e-3, cpu_rows=(1,), cpu_s_at_rows=(5.5e-3,))
    # 1 miss: copied (at least one copy); 2: one each way (6.4); 3: one copy, two on the CPU (11 < 12.8 < 19.2)
    assert [decode_step_seconds(m, costs) for m in range(4)] == pytest.approx([0.0, 6.4e-3, 6.4e-3, 11e-3])


PROBLEM = SplitProblem(budget_bytes=100, slot_bytes=10, block_bytes=1, expert_cost=1.0, kv_cost=1.0, min_cap=2,
                       max_cap=4, kv_floor=0)
# ten steps of one layer, by cap 0..4: how many have 0, 1, 2 or 3 misses
DIST = np.array([[0, 0, 0, 10], [0, 0, 2, 8], [3, 2, 1, 4], [4, 4, 2, 0], [10, 0, 0, 0]])


def advise(cpu_s: float, paged_cap: int, overhead_s: float = 0.0) -> HybridAdvice:
    """Two layers with DIST as both modes' distribution (the pricing alone, not a replay)."""
    costs = HybridCosts(1.0, (1,), (cpu_s,), overhead_s)
    paged = 2 * expected_step_seconds(DIST, [m * costs.copy_s for m in range(4)])
    hybrid = 2 * expected_step_seconds(DIST, [decode_step_seconds(m, costs) for m in range(4)])
    caps = [HybridCapCost(c, PROBLEM.kv_blocks(c), paged[c], hybrid[c]) for c in PROBLEM.feasible_caps()]
    return choose_mode(caps, costs, paged_cap)


def test_a_cheap_cpu_buys_the_paged_time_at_a_smaller_cap():
    advice = advise(cpu_s=0.1, paged_cap=3)
    assert [c.expert_cap for c in advice.caps] == [2, 3, 4] and advice.at(2).kv_blocks == 80
    assert advice.at(3).paged_step_s == pytest.approx(2 * 0.8)  # two layers, (4 x 1 + 2 x 2) copies / 10 steps
    assert advice.at(2).hybrid_step_s == pytest.approx(2 * 0.7)  # 1, 2 or 3 misses: one copy each, (2 + 1 + 4) / 10
    assert (advice.mode, advice.expert_cap, advice.kv_blocks) == ("hybrid", 2, 80)
    lines = advice_lines(advice, slot_bytes=10)
    assert "recommend --mode hybrid at C=2" in lines[-1] and "10 more KV blocks" in lines[-1]
    assert len(lines) == 2 + 3 + 1 and "<- paged plan" in lines[3]


def test_hybrid_at_the_same_cap_when_only_faster_there_and_paged_when_never():
    same = advise(cpu_s=0.9, paged_cap=3)  # C = 2: 1.02 > 0.8; C = 3: 0.6 < 0.8 (per layer)
    assert (same.mode, same.expert_cap) == ("hybrid", 3)
    full = advise(cpu_s=0.9, paged_cap=4)  # no misses at C = 4: nothing to win
    assert (full.mode, full.expert_cap) == ("paged", 4)
    never = advise(cpu_s=0.9, paged_cap=3, overhead_s=3.0)
    assert (never.mode, never.expert_cap) == ("paged", 3)
    assert all(c.hybrid_step_s == c.paged_step_s for c in never.caps)
    assert "recommend paged at C=3" in advice_lines(never, slot_bytes=10)[-1]


def test_the_advice_prices_a_trace_by_simulation():
    """hybrid_advice end to end on one trace layer reused for three model layers."""
    costs = HybridCosts(copy_s=6.4e-3, cpu_rows=(1,), cpu_s_at_rows=(5.5e-3,))
    steps = [[0, 1], [0, 2], [1, 3], [0, 1], [2, 3], [0, 3]]
    advice = hybrid_advice([steps], 4, 3, costs, PROBLEM, paged_cap=3)
    paged, hybrid = paged_and_hybrid_seconds(steps, 4, costs, [2, 3, 4])
    assert [c.expert_cap for c in advice.caps] == [2, 3, 4]
    assert [c.paged_step_s for c in advice.caps] == pytest.approx(3 * paged)
    assert [c.hybrid_step_s for c in advice.caps] == pytest.approx(3 * hybrid)
    # C = 4 holds every expert: paged pays the 4 cold copies; hybrid sends a two-miss step's higher id to the
    # CPU (uncached) and copies the other, so 3 and 2 miss again later, alone, and are copied then: steps of
    # 2, 1, 2, 0, 1, 0 misses, each 6.4 ms, the same 4 copies' time as paged
    assert [len(s.to_copy) + len(s.to_cpu) for s in hybrid_assignments(steps, 4, costs)] == [2, 1, 2, 0, 1, 0]
    assert advice.at(4).paged_step_s == pytest.approx(3 * 4 * 6.4e-3 / 6)
    assert advice.at(4).hybrid_step_s == pytest.approx(3 * 4 * 6.4e-3 / 6)


def test_an_advice_checks_its_mode_and_caps():
    row = HybridCapCost(2, 80, 1.0, 0.5)
    costs = HybridCosts(1.0, (1,), (0.5,))
    with pytest.raises(ValueError, match="mode must be one of"):
        HybridAdvice(costs, (row,), 2, "cpu", 2, 80)
    with pytest.raises(ValueError, match="must be among the caps"):
        HybridAdvice(costs, (row,), 3, "paged", 2, 80)
