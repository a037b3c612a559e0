"""`CpuPace`: the CPU's costs corrected by measured steps. Its window and clamps, exploration, and that
`cpu_can_help` is exact: false exactly when no split of at most that many misses sends anything to the CPU."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from wisp.core.learners.hybrid_pace import MAX_FACTOR, MIN_FACTOR, CpuPace
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.core.experts.cpu_assignment import assign_misses


def step(pace: CpuPace, wall_s: float, predicted_s: float) -> None:
    """One model step whose CPU layers took wall_s against predicted_s."""
    pace.observe(wall_s, predicted_s)
    pace.end_step()

COSTS = HybridCosts(copy_s=6.5e-3, cpu_rows=(1, 4), cpu_s_at_rows=(5.5e-3, 6.0e-3), cpu_overhead_s=1e-4)


def test_the_factor_is_one_until_measured_then_the_window_median_within_the_clamps():
    pace = CpuPace(window=3, min_ratios=2)
    assert pace.factor == 1.0 and pace.costs(COSTS) is COSTS
    step(pace, 16.0, 1.0)  # one slow step (a cold first one) changes nothing yet
    assert pace.factor == 1.0 and pace.costs(COSTS) is COSTS
    for wall in (3.0, 100.0, 2.5):  # the first ratio leaves the window of 3
        step(pace, wall, 1.0)
    assert pace.factor == 3.0 and max(pace.ratios) == MAX_FACTOR
    step(pace, 1e-9, 1.0)
    step(pace, 1e-9, 1.0)
    assert pace.factor == MIN_FACTOR
    step(pace, 1.0, 0.0)  # nothing predicted: nothing learnt
    assert len(pace.ratios) == 3
    fixed = CpuPace(learn=False, min_ratios=1)
    step(fixed, 5.0, 1.0)
    assert fixed.factor == 1.0 and fixed.totals.steps == 1 and fixed.costs(COSTS) is COSTS


def test_scaled_costs_scale_the_cpu_side_only():
    pace = CpuPace(min_ratios=1)
    step(pace, 2.0, 1.0)
    scaled = pace.costs(COSTS)
    assert scaled.copy_s == COSTS.copy_s and scaled.cpu_rows == COSTS.cpu_rows
    assert scaled.cpu_s_at_rows == pytest.approx([2 * s for s in COSTS.cpu_s_at_rows])
    assert scaled.cpu_overhead_s == pytest.approx(2 * COSTS.cpu_overhead_s)
    assert pace.costs(COSTS) is scaled  # made once per factor


def test_a_steps_ratio_is_what_observe_is_given_as_ratio_not_the_wall():
    pace = CpuPace(min_ratios=1)
    pace.observe(3.0, 1.0, ratio=(1.5, 0.5))  # a wall of 3 against 1 predicted; its CPU side 1.5 against 0.5
    pace.end_step()
    assert pace.factor == pytest.approx(3.0) and pace.totals.wall_s == 3.0  # the stats keep the wall


def test_the_link_factor_scales_the_copy_from_device_timed_gpu_pairs_on_the_same_rules():
    pace = CpuPace(window=3, min_ratios=2)
    pace.observe(1.0, 1.0, ratio=(1.0, 1.0), link=(1.3, 1.0))  # the GPU's pairs 1.3x their copy price
    pace.end_step()
    assert pace.link_factor == 1.0 and pace.costs(COSTS) is COSTS  # one step: not yet
    pace.observe(1.0, 1.0, ratio=(1.0, 1.0))  # a step with no GPU pairs adds no link ratio
    pace.end_step()
    assert len(pace.link_ratios) == 1
    for _ in range(2):  # two layers of one step: one ratio of their sums
        pace.observe(1.0, 1.0, ratio=(1.0, 1.0), link=(0.7, 0.5))
    pace.end_step()
    assert pace.link_ratios[-1] == pytest.approx(1.4) and pace.link_factor == pytest.approx(1.35)
    scaled = pace.costs(COSTS)
    assert scaled.copy_s == pytest.approx(1.35 * COSTS.copy_s) and scaled.cpu_s_at_rows == COSTS.cpu_s_at_rows
    pace.observe(1.0, 1.0, ratio=(1.0, 1.0), link=(1e3, 1.0))
    pace.end_step()
    assert max(pace.link_ratios) == MAX_FACTOR  # clamped as the CPU's
    assert pace.factor == 1.0 and pace.link_factor == pytest.approx(1.4)  # only the link's factor moved: rebuilt
    assert pace.costs(COSTS).copy_s == pytest.approx(1.4 * COSTS.copy_s)
    pace.explore_every = 7
    pace.begin_step(7)
    assert pace.exploring and not pace.link_ratios and pace.link_factor == 1.0 and pace.costs(COSTS) is COSTS


def test_every_explore_every_th_step_uses_the_probe_and_starts_a_fresh_window():
    pace = CpuPace(explore_every=4)
    for _ in range(pace.min_ratios):
        step(pace, 10.0, 1.0)
    for number in (1, 2, 3):
        pace.begin_step(number)
        pace.begin_step(number)  # every layer calls it: one step
        assert not pace.exploring and pace.costs(COSTS) is not COSTS
    assert not pace.cpu_can_help(COSTS, 2) and pace.graph_step_ok(COSTS, 2)  # 10x slower: no use for the CPU
    pace.begin_step(4)
    assert pace.exploring and not pace.ratios and pace.costs(COSTS) is COSTS
    assert pace.cpu_can_help(COSTS, 2) and not pace.graph_step_ok(COSTS, 2)
    pace.observe(4.0, 1.0)
    pace.begin_step(5)  # closes step 4
    assert not pace.exploring and pace.factor == 1.0  # one ratio in the fresh window: not yet used


@settings(max_examples=200, deadline=None)
@given(copy_ms=st.floats(0.01, 10), cpu_ms=st.lists(st.floats(0.01, 30), min_size=1, max_size=4),
       overhead_ms=st.floats(0, 5), factor=st.floats(0.1, 20), max_misses=st.integers(1, 8),
       rows=st.lists(st.integers(1, 6), min_size=8, max_size=8))
def test_cpu_can_help_is_exact(copy_ms, cpu_ms, overhead_ms, factor, max_misses, rows):
    cpu = sorted(cpu_ms)
    costs = HybridCosts(copy_ms / 1e3, tuple(range(1, len(cpu) + 1)), tuple(c / 1e3 for c in cpu), overhead_ms / 1e3)
    pace = CpuPace(min_ratios=1)
    step(pace, factor, 1.0)
    scaled = pace.costs(costs)
    used = [assign_misses(list(enumerate(rows[:n])), scaled).to_cpu for n in range(1, max_misses + 1)]
    one_row_each = assign_misses([(e, 1) for e in range(max_misses)], scaled).to_cpu
    if not pace.cpu_can_help(costs, max_misses):
        assert not any(used) and not one_row_each  # a graph step loses nothing
    else:
        assert one_row_each  # the lightest such step uses the CPU


def test_the_window_needs_min_ratios_of_whole_steps_and_refuses_impossible_ones():
    pace = CpuPace(window=4, min_ratios=3)
    pace.begin_step(1)
    for layer in range(16):  # a cold first step: every layer slow, one ratio
        pace.observe(8.0, 1.0)
        assert pace.factor == 1.0 and not pace.ratios
    for number, wall in ((2, 1.0), (3, 1.2)):
        pace.begin_step(number)
        assert pace.factor == 1.0
        pace.observe(wall, 1.0)
        pace.observe(wall, 1.0)  # a step's layers: their sums make its ratio
    pace.begin_step(4)
    assert list(pace.ratios) == [8.0, 1.0, 1.2] and pace.factor == 1.2  # the cold step outvoted
    with pytest.raises(ValueError, match="min_ratios"):
        CpuPace(window=2, min_ratios=3)


def test_a_cpu_left_idle_is_retimed_and_a_faster_time_lowers_the_probes_cpu_side_for_good():
    """A CPU the probe timed too slow gets no expert, so no step measures it: where no step used it since the last
    look (step FIRST_RETIME, then every exploring step), one layer re-times it once; a faster time scales the
    probe's CPU side down (exploring steps included), a slower one brings it back to the probe's, never above."""
    from wisp.core.learners.hybrid_pace import FIRST_RETIME

    pace = CpuPace(explore_every=16)
    for number in range(1, FIRST_RETIME):
        pace.begin_step(number)
        assert not pace.retime_due()
    pace.begin_step(FIRST_RETIME)
    assert pace.retime_due() and not pace.retime_due()  # once a step, whichever layer asks first
    pace.retimed(COSTS.cpu_s(1) / 4, COSTS.cpu_s(1))
    assert pace.probe_scale == 0.25 and pace.costs(COSTS).cpu_s(1) == pytest.approx(COSTS.cpu_s(1) / 4)
    assert pace.costs(COSTS).copy_s == COSTS.copy_s
    pace.begin_step(16)  # exploring, and still no CPU step: due again; the re-timed probe is what it uses
    assert pace.exploring and pace.costs(COSTS).cpu_s(1) == pytest.approx(COSTS.cpu_s(1) / 4) and pace.retime_due()
    pace.retimed(COSTS.cpu_s(1) * 3, COSTS.cpu_s(1))  # slower now: back to the probe's, never above it
    assert pace.probe_scale == 1.0 and pace.costs(COSTS) is COSTS
    pace.observe(1.0, 1.0)  # a step used the CPU
    pace.begin_step(17)
    pace.begin_step(32)  # the next exploration: the CPU was used since the last one, so no re-timing
    assert pace.exploring and not pace.retime_due()
    learning_off = CpuPace(explore_every=16, learn=False)
    learning_off.begin_step(FIRST_RETIME)
    assert not learning_off.retime_due()


def test_the_first_retime_step_keeps_the_windows_of_a_cpu_in_use():
    """Step FIRST_RETIME only looks whether the CPU was used; it is no exploration: the window and its factor stay."""
    from wisp.core.learners.hybrid_pace import FIRST_RETIME

    pace = CpuPace(explore_every=128)
    for number in range(1, FIRST_RETIME):
        pace.begin_step(number)
        pace.observe(2.0, 1.0)
    pace.begin_step(FIRST_RETIME)  # closes step FIRST_RETIME - 1
    assert not pace.exploring and not pace.retime_due()  # the CPU was used
    assert len(pace.ratios) == FIRST_RETIME - 1 and pace.factor == 2.0
