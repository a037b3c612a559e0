"""AdmissionFloor: the peak demand over a sliding window of steps, clamped to [1, max_requests]."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.engine.split_controller.admission_floor import AdmissionFloor


@settings(max_examples=200, deadline=None)
@given(demands=st.lists(st.integers(0, 12), max_size=60), window=st.integers(1, 10), most=st.integers(1, 9),
       request_blocks=st.integers(1, 5))
def test_it_is_the_clamped_peak_of_the_last_window(demands, window, most, request_blocks):
    floor = AdmissionFloor(most, request_blocks, window)
    assert floor.requests == 1  # before any step: one request always gets in
    for i, d in enumerate(demands):
        floor.observe(d)
        expected = max(min(max(x, 1), most) for x in demands[max(0, i + 1 - window) : i + 1])
        assert floor.requests == expected and 1 <= floor.requests <= most
        assert floor.blocks == floor.requests * request_blocks


def test_a_dip_shorter_than_the_window_does_not_lower_it():
    floor = AdmissionFloor(8, 16, window=4)
    for d in [8, 7, 8, 7, 8]:  # a turn ends, the next is sent a step later
        floor.observe(d)
    assert floor.requests == 8
    for _ in range(4):  # the phase's tail: the demand stays lower
        floor.observe(3)
    assert floor.requests == 3


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        AdmissionFloor(0, 16, 4)
    with pytest.raises(ValueError):
        AdmissionFloor(4, 16, 0)
