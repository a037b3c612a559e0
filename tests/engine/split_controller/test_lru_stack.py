"""LruStack against the whole-stream stack distances of wisp.plan.miss_curves."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from wisp.core.experts.recency import distinct_in_order
from wisp.engine.split_controller.lru_stack import LruStack
from wisp.plan.miss_curves import COLD, kv_stack_distances, stack_distances

steps = st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=6), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_expert_steps_match_the_whole_stream(stream):
    stack = LruStack()
    online = [d for step in stream for d in stack.touch(distinct_in_order(step))]
    assert online == stack_distances(stream).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), min_size=0, max_size=8), min_size=1, max_size=30))
def test_kv_requests_match_the_whole_stream(requests):
    stack = LruStack()
    online = [d for req in requests for d in stack.touch_blocks(req)]
    assert online == kv_stack_distances(requests).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), min_size=0, max_size=8), min_size=1, max_size=30), st.integers(1, 12))
def test_a_bounded_stack_forgets_only_what_is_deeper_than_its_capacity(requests, capacity):
    whole, bounded = LruStack(), LruStack(capacity)
    for req in requests:
        expected = [COLD if d > capacity else d for d in whole.touch_blocks(req)]
        assert bounded.touch_blocks(req) == expected
        assert len(bounded) <= capacity
