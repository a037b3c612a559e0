"""MV-WSA split (`wisp.plan.split`) against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from wisp.plan.split import SplitProblem, equimarginal_cap, lower_hull, split


@st.composite
def miss_curve(draw, n):
    """A non-increasing curve m[0..n] like an LRU miss curve (convex-ish decreasing steps)."""
    drops = sorted(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)), reverse=True)
    jitter = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    steps = [d + j for d, j in zip(drops, jitter)]
    base = draw(st.integers(0, 20))
    return np.array([base + sum(steps[i:]) for i in range(n + 1)], dtype=float)


@st.composite
def problems(draw):
    n_exp = draw(st.integers(4, 64))
    n_kv = draw(st.integers(4, 200))
    slot, block = draw(st.integers(10, 1000)), draw(st.integers(10, 1000))
    top_k = draw(st.integers(1, n_exp))
    floor = draw(st.integers(0, n_kv // 2))
    budget = draw(st.integers(top_k * slot, n_exp * slot + n_kv * block))
    p = SplitProblem(budget, slot, block, draw(st.floats(0.1, 10)), draw(st.floats(0.1, 10)), top_k, n_exp, floor)
    return p, draw(miss_curve(n_exp)), draw(miss_curve(n_kv))


def brute_force(p: SplitProblem, me, mk, floor: bool):
    """Independent reference: try every C, with its own budget arithmetic; ties (1e-9 relative) -> larger C."""
    rows = []
    for cap in range(p.min_cap, p.max_cap + 1):
        kv_blocks = (p.budget_bytes - cap * p.slot_bytes) // p.block_bytes
        if kv_blocks >= (p.kv_floor if floor else 0):
            rows.append((p.expert_cost * me[min(cap, len(me) - 1)] + p.kv_cost * mk[min(kv_blocks, len(mk) - 1)], cap,
                         kv_blocks))
    if not rows:
        return None
    low = min(r[0] for r in rows)
    return max((r for r in rows if r[0] <= low + 1e-9 * max(1.0, abs(low))), key=lambda r: r[1])


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(problems(), st.booleans())
@example(
    (SplitProblem(1800, 10, 10, 5.35289899291852, 5.35289899291852, 1, 26, 0),
     np.array([91, 45, 36, 28, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 4, 1, 0, 0, 0.0]),
     np.full(181, 58.0) - np.minimum(np.arange(181), 58) * 0),
    False,
)  # a flat optimum where float rounding once picked a different cap than the brute force
def test_split_equals_brute_force_and_respects_the_floor(case, with_floor):
    p, me, mk = case
    ours, best = split(p, me, mk, floor=with_floor), brute_force(p, me, mk, with_floor)
    assert (ours is None) == (best is None)
    if best is None:
        return
    assert abs(ours.latency - best[0]) <= 1e-9 * max(1.0, abs(best[0])) and abs(ours.expert_cap - best[1]) <= 1
    assert p.min_cap <= ours.expert_cap <= p.max_cap
    assert ours.expert_cap * p.slot_bytes + ours.kv_blocks * p.block_bytes <= p.budget_bytes
    if with_floor:
        assert ours.kv_blocks >= p.kv_floor


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(problems())
def test_equimarginal_cap_matches_brute_force_on_convex_curves(case):
    p, me, mk = case
    # whole blocks per slot and a whole number of slots in the budget: no rounding anywhere
    p = SplitProblem(**{**p.__dict__, "block_bytes": p.slot_bytes, "budget_bytes": p.budget_bytes // p.slot_bytes * p.slot_bytes})
    he, hk = lower_hull(me), lower_hull(mk)
    cap, best = equimarginal_cap(p, he, hk), brute_force(p, he, hk, True)
    assert (cap is None) == (best is None)
    if cap is not None:
        got = p.expert_cost * he[min(cap, len(he) - 1)] + p.kv_cost * hk[min(p.kv_blocks(cap), len(hk) - 1)]
        assert got <= best[0] + 1e-6


def test_infeasible_budget_gives_none_and_the_smallest_budget():
    p = SplitProblem(1000, 100, 10, 1.0, 1.0, min_cap=4, max_cap=8, kv_floor=70)
    assert split(p, np.zeros(9), np.zeros(100)) is None
    assert p.smallest_feasible_budget() == 4 * 100 + 70 * 10
    assert split(p, np.zeros(9), np.zeros(100), floor=False) is not None


def test_costly_misses_win_the_bytes():
    exp = np.array([100.0 - 10 * c for c in range(9)])  # each 10-byte slot removes 10 expert misses
    kv = np.array([max(0.0, 100.0 - k) for k in range(101)])  # each 1-byte block removes 1 KV miss
    p = SplitProblem(budget_bytes=100, slot_bytes=10, block_bytes=1, expert_cost=10.0, kv_cost=1.0,
                     min_cap=1, max_cap=8, kv_floor=0)
    assert split(p, exp, kv).expert_cap == 8 and equimarginal_cap(p, exp, kv) == 8
    cheap = SplitProblem(**{**p.__dict__, "expert_cost": 0.01})
    assert split(cheap, exp, kv).expert_cap == 1 and equimarginal_cap(cheap, exp, kv) == 1
    floored = SplitProblem(**{**p.__dict__, "kv_floor": 60})
    assert split(floored, exp, kv).expert_cap == 4  # the floor caps the expert side: 100 - 4*10 = 60 blocks
