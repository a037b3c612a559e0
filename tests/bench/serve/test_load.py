"""wisp.bench.serve.load: a closed loop never has more than W requests in flight and starts exactly N; an open
loop's arrivals are seeded, non-decreasing and started once their time has passed; prompts are distinct."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.bench.serve.load import ClosedLoop, OpenLoop, random_prompts


@settings(max_examples=200, deadline=None)
@given(w=st.integers(1, 8), n=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_a_closed_loop_keeps_w_in_flight_and_starts_n(w, n, seed):
    """Requests finish in a random order, a random number at a time; after each finish the loop tops up."""
    load, rng = ClosedLoop(w, n), random.Random(seed)
    started, in_flight, most = 0, 0, 0
    while True:
        new = load.due(rng.random(), started, in_flight)
        assert new >= 0 and in_flight + new <= w and started + new <= n
        started, in_flight = started + new, in_flight + new
        assert in_flight == min(w, n - (started - in_flight))  # topped up to W while requests are left
        most = max(most, in_flight)
        if not in_flight:
            break
        assert load.next_start(started) is None  # a start waits for a finish
        in_flight -= rng.randint(1, in_flight)
    assert started == n and most == min(w, n)


@settings(max_examples=100, deadline=None)
@given(rate=st.floats(0.1, 1000), n=st.integers(1, 50), seed=st.integers(0, 2**16))
def test_open_loop_arrivals_are_seeded_and_non_decreasing(rate, n, seed):
    load = OpenLoop(rate, n, seed)
    assert len(load.arrivals) == n and load.arrivals[0] == 0.0
    assert all(a <= b for a, b in zip(load.arrivals, load.arrivals[1:]))
    assert OpenLoop(rate, n, seed).arrivals == load.arrivals
    if n > 2:
        assert OpenLoop(rate, n, seed + 1).arrivals != load.arrivals


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 30), seed=st.integers(0, 100), polls=st.lists(st.floats(0, 20), min_size=1, max_size=30))
def test_an_open_loop_starts_each_request_once_its_arrival_has_passed(n, seed, polls):
    load, started = OpenLoop(2.0, n, seed), 0
    for elapsed in sorted(polls):
        started += load.due(elapsed, started, in_flight=n)  # whatever is in flight
        assert started == sum(a <= elapsed for a in load.arrivals)
        nxt = load.next_start(started)
        assert nxt is None if started == n else nxt > elapsed
    assert [load.scheduled(i) for i in range(n)] == list(load.arrivals)


def test_the_mean_gap_is_one_over_the_rate():
    load = OpenLoop(50.0, 4001, seed=3)
    assert load.arrivals[-1] / 4000 == pytest.approx(1 / 50, rel=0.05)


@pytest.mark.parametrize("make", [lambda: ClosedLoop(0, 4), lambda: ClosedLoop(2, 0), lambda: OpenLoop(0.0, 4),
                                  lambda: OpenLoop(-1.0, 4), lambda: OpenLoop(float("nan"), 4)])
def test_bad_loads_are_refused(make):
    with pytest.raises(ValueError):
        make()


def test_prompts_are_distinct_per_request_and_run_and_repeatable():
    a, b = random_prompts(300, 40, 8, seed=0, run=0), random_prompts(300, 40, 8, seed=0, run=1)
    assert a == random_prompts(300, 40, 8, seed=0, run=0)
    assert all(len(p) == 40 and all(0 <= t < 300 for t in p) for p in a + b)
    assert len({tuple(p[:16]) for p in a + b}) == 16  # not even a first KV block (16 tokens) in common
