"""`assign_misses` against a brute force over every subset, and `HybridCosts`' interpolation."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.core.experts.cpu_assignment import HybridCosts, assign_misses, assignment_time


def brute_force(misses, costs):
    best = float("inf")
    for n_copy in range(min(1, len(misses)), len(misses) + 1):  # at least one copy
        for copied in itertools.combinations(range(len(misses)), n_copy):
            cpu_rows = [rows for i, (_, rows) in enumerate(misses) if i not in copied]
            best = min(best, assignment_time(n_copy, cpu_rows, costs))
    return best


costs_strategy = st.builds(
    lambda copy_s, base, slope, overhead: HybridCosts(copy_s, (1, 4, 16), (base, base + slope, base + 5 * slope), overhead),
    st.floats(0.0, 10.0), st.floats(0.0, 10.0), st.floats(0.0, 5.0), st.floats(0.0, 5.0))


@settings(max_examples=300, deadline=None)
@given(misses=st.lists(st.integers(1, 40), min_size=0, max_size=7), costs=costs_strategy)
def test_the_assignment_is_optimal(misses, costs):
    misses = [(expert, rows) for expert, rows in enumerate(misses)]
    assignment = assign_misses(misses, costs)
    assert sorted(assignment.to_copy + assignment.to_cpu) == [e for e, _ in misses]
    rows_of = dict(misses)
    cpu_rows = [rows_of[e] for e in assignment.to_cpu]
    assert assignment.predicted_s == pytest.approx(assignment_time(len(assignment.to_copy), cpu_rows, costs))
    assert assignment.predicted_s == pytest.approx(brute_force(misses, costs), rel=1e-12, abs=1e-12)


def test_a_free_link_copies_everything_and_a_dear_one_sends_light_experts_to_the_cpu():
    costs = HybridCosts(copy_s=1.0, cpu_rows=(1, 8), cpu_s_at_rows=(1.0, 8.0))
    misses = [(3, 1), (5, 8), (9, 1), (11, 2)]
    assert assign_misses(misses, HybridCosts(0.0, (1,), (1.0,))).to_cpu == ()
    assignment = assign_misses(misses, costs)  # copying all 4: 4 s; 2 light ones on the CPU: max(2, 2) = 2 s
    assert assignment.to_cpu == (3, 9) and assignment.to_copy == (5, 11)
    assert assignment.predicted_s == 2.0 and assignment.cpu_rows == (1, 1)
    slow_link = assign_misses(misses, HybridCosts(100.0, (1, 8), (1.0, 8.0)))  # the CPU takes all but one copy
    assert slow_link.to_copy == (5,) and slow_link.predicted_s == 100.0
    assert slow_link.to_cpu == (3, 9, 11) and slow_link.cpu_rows == (1, 1, 2)  # each CPU expert's rows, in order
    lone = assign_misses([(4, 1)], HybridCosts(10.0, (1,), (1.0,)))  # a lone miss is copied (cached), however dear
    assert lone.to_copy == (4,) and lone.to_cpu == ()


def test_cpu_cost_interpolates_and_extrapolates():
    costs = HybridCosts(1.0, (1, 4, 16), (2.0, 5.0, 11.0))
    assert costs.cpu_s(0) == 0.0
    assert costs.cpu_s(1) == 2.0 and costs.cpu_s(4) == 5.0 and costs.cpu_s(16) == 11.0
    assert costs.cpu_s(2) == pytest.approx(3.0) and costs.cpu_s(10) == pytest.approx(8.0)
    assert costs.cpu_s(28) == pytest.approx(17.0)  # the last segment's slope, 0.5 s a row
    assert HybridCosts(1.0, (2,), (4.0,)).cpu_s(6) == pytest.approx(12.0)


@pytest.mark.parametrize("kwargs", [
    dict(copy_s=1.0, cpu_rows=(), cpu_s_at_rows=()),
    dict(copy_s=1.0, cpu_rows=(4, 1), cpu_s_at_rows=(1.0, 2.0)),
    dict(copy_s=1.0, cpu_rows=(1, 4), cpu_s_at_rows=(2.0, 1.0)),
    dict(copy_s=-1.0, cpu_rows=(1,), cpu_s_at_rows=(1.0,)),
])
def test_bad_costs_are_refused(kwargs):
    with pytest.raises(ValueError):
        HybridCosts(**kwargs)
