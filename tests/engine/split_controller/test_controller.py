"""The online split controller (`wisp.engine.split_controller.controller`): bounds, hysteresis, agreement with the offline
split on exact counts, and the direction it moves when the workload drifts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.engine.split_controller.controller import ControllerConfig, SplitController
from wisp.plan.miss_curves import COLD, kv_miss_curve, kv_stack_distances, miss_curve_from_distances, stack_distances
from wisp.plan.split import SplitProblem, split


def problem(budget_slots=40, floor=4, min_cap=2, max_cap=16, expert_cost=1.0, kv_cost=1.0) -> SplitProblem:
    # a slot costs 3 blocks' bytes; the budget is counted in blocks
    return SplitProblem(budget_bytes=budget_slots * 100, slot_bytes=300, block_bytes=100, expert_cost=expert_cost,
                        kv_cost=kv_cost, min_cap=min_cap, max_cap=max_cap, kv_floor=floor)


def distances(draw_list, top):
    return [COLD if d == 0 else d for d in draw_list if d <= top]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), budget=st.integers(20, 80), floor=st.integers(0, 10), min_gain=st.sampled_from([0.0, 0.02, 0.2]))
def test_every_resize_fits_the_budget_and_the_floor_and_none_flaps(data, budget, floor, min_gain):
    p = problem(budget_slots=budget, floor=floor)
    if not p.feasible_caps():
        return
    cfg = ControllerConfig(p, resolve_every=3, min_gain=min_gain, half_life=50.0, min_observations=0)
    start = p.feasible_caps().start
    ctl = SplitController(cfg, start, p.kv_blocks(start))
    for _ in range(data.draw(st.integers(1, 12))):
        ctl.observe_experts(distances(data.draw(st.lists(st.integers(0, 16), max_size=30)), 16), tokens=4)
        ctl.observe_kv(distances(data.draw(st.lists(st.integers(0, 60), max_size=20)), 60))
        for _ in range(3):
            r = ctl.step()
            if r is not None:
                assert r.to_cap * p.slot_bytes + r.to_kv_blocks * p.block_bytes <= p.budget_bytes
                assert r.to_kv_blocks >= p.kv_floor and p.min_cap <= r.to_cap <= p.max_cap
                assert r.latency_after <= r.latency_before * (1 - min_gain) and r.to_cap != r.from_cap
                assert (r.from_cap, r.from_kv_blocks) != (r.to_cap, r.to_kv_blocks) and r.reason
                # the same curves again: no second move (no flapping)
                assert all(ctl.step() is None for _ in range(2 * cfg.resolve_every))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_on_exact_counts_it_picks_the_offline_split(data):
    n = 16
    steps = data.draw(st.lists(st.lists(st.integers(0, n - 1), min_size=1, max_size=4), min_size=1, max_size=60))
    requests = data.draw(st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=12), min_size=1, max_size=20))
    p = problem(budget_slots=50, floor=2, min_cap=1, max_cap=n, expert_cost=2.0, kv_cost=0.5)
    d_exp, d_kv = stack_distances(steps), kv_stack_distances(requests)
    offline = split(p, miss_curve_from_distances(d_exp, n) / len(steps),
                    kv_miss_curve(requests, p.kv_blocks(p.min_cap)) / len(requests))
    cfg = ControllerConfig(p, resolve_every=1, min_gain=0.0, half_life=None, min_observations=0)
    start = p.max_cap if offline.expert_cap != p.max_cap and p.max_cap in p.feasible_caps() else p.min_cap
    ctl = SplitController(cfg, start, p.kv_blocks(start))
    ctl.observe_experts(d_exp.tolist(), tokens=len(steps))
    for i, req in enumerate(requests):
        lo = sum(len(dict.fromkeys(r)) for r in requests[:i])
        ctl.observe_kv(d_kv[lo : lo + len(dict.fromkeys(req))].tolist())
    ctl.step()
    if offline.expert_cap != start:
        assert (ctl.expert_cap, ctl.kv_blocks) == (offline.expert_cap, offline.kv_blocks)
        assert ctl.resizes[-1].latency_after == pytest.approx(offline.latency)


def test_it_follows_a_drift_from_expert_bound_to_kv_bound():
    p = problem(budget_slots=60, floor=4, min_cap=2, max_cap=16)
    cfg = ControllerConfig(p, resolve_every=8, min_gain=0.05, half_life=200.0, min_observations=64)
    ctl = SplitController(cfg, 8, p.kv_blocks(8))
    rng = np.random.default_rng(0)
    for _ in range(200):  # experts reused at distances up to 16; every KV block hits at distance 1
        ctl.observe_experts(rng.integers(1, 17, size=8).tolist(), tokens=1)
        ctl.observe_kv([1, 1, 1])
        ctl.step()
    grown = ctl.expert_cap
    assert grown > 8 and ctl.resizes and ctl.resizes[-1].to_cap == grown
    for _ in range(400):  # experts now hit at 2 slots; KV blocks come back from far away
        ctl.observe_experts([1, 2] * 4, tokens=1)
        ctl.observe_kv(rng.integers(1, 150, size=6).tolist())
        ctl.step()
    assert ctl.expert_cap < grown and ctl.kv_blocks > p.kv_blocks(grown)
    assert "KV blocks" in ctl.resizes[-1].reason
    slot_gain, block_gain = ctl.marginal_values()
    assert slot_gain >= 0 and block_gain >= 0


def test_bad_settings_and_starts_are_refused():
    p = problem()
    with pytest.raises(ValueError):
        ControllerConfig(p, min_gain=1.5)
    with pytest.raises(ValueError):
        ControllerConfig(p, resolve_every=0)
    with pytest.raises(ValueError):
        ControllerConfig(problem(budget_slots=5, floor=10))  # not even min_cap and the floor fit
    with pytest.raises(ValueError):
        SplitController(ControllerConfig(p), 2, p.kv_blocks(2) + 1)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), budget=st.integers(30, 80), unit=st.integers(1, 6))
def test_a_moving_kv_floor_is_always_kept_and_a_raised_one_at_once(data, budget, unit):
    """The admission floor moves in multiples of one request's blocks; whatever the curves and the hysteresis,
    the pool never holds less than the floor of its time, and raising the floor above it resizes at once."""
    p = problem(budget_slots=budget, floor=unit, min_cap=2, max_cap=16)
    cfg = ControllerConfig(p, resolve_every=2, min_gain=data.draw(st.sampled_from([0.0, 0.05, 0.5])), half_life=40.0,
                           min_observations=0, admission_window=4)
    start = data.draw(st.sampled_from(list(p.feasible_caps())))
    ctl = SplitController(cfg, start, p.kv_blocks(start))
    most = p.kv_blocks(p.min_cap) // unit
    for _ in range(data.draw(st.integers(1, 25))):
        ctl.observe_experts(distances(data.draw(st.lists(st.integers(0, 16), max_size=20)), 16), tokens=3)
        ctl.observe_kv(distances(data.draw(st.lists(st.integers(0, 60), max_size=10)), 60))
        floor = unit * data.draw(st.integers(1, most))
        before = ctl.kv_blocks
        forced = ctl.require_kv_floor(floor)
        assert (forced is not None) == (before < floor) and ctl.kv_blocks >= floor == ctl.kv_floor
        if forced is not None:
            assert forced.reason.startswith("admission") and forced.to_kv_blocks >= floor
        resize = ctl.step()
        for r in (forced, resize):
            if r is not None:
                assert r.to_cap * p.slot_bytes + r.to_kv_blocks * p.block_bytes <= p.budget_bytes
                assert p.min_cap <= r.to_cap <= p.max_cap
        assert ctl.kv_blocks >= ctl.kv_floor
    with pytest.raises(ValueError):
        ctl.require_kv_floor(unit - 1 if unit > 1 else p.kv_blocks(p.min_cap) + 1)


def test_payback_holds_a_resize_until_its_gain_repays_the_stall():
    p = problem(budget_slots=60, floor=4, min_cap=2, max_cap=16)
    cfg = ControllerConfig(p, resolve_every=1, min_gain=0.05, half_life=None, min_observations=0, resize_cost_s=2.0)
    ctl = SplitController(cfg, 2, p.kv_blocks(2))
    ctl.observe_experts(list(range(1, 17)) * 8, tokens=8)  # every slot up to 16 removes misses; KV never misses
    ctl.observe_kv([1, 1])
    expert, kv = ctl.curves()
    best = split(p, expert, kv)
    gain = 1 - best.latency / ctl._current_latency(expert, kv)
    assert gain > 0.05 and ctl.expected_stall_s == 2.0
    assert ctl.step(held_s=0.99 * 2.0 / gain) is None  # it would not repay 2 s in the time the conditions held
    resize = ctl.step(held_s=1.01 * 2.0 / gain)
    assert resize is not None and resize.to_cap == best.expert_cap
    ctl.measured_stall(0.5)
    ctl.measured_stall(1.5)
    assert ctl.expected_stall_s == 1.0  # measured stalls replace the prior
    assert ControllerConfig(p).resize_cost_s is None and SplitController(ControllerConfig(p), 2, 10).expected_stall_s is None
