"""The touch order of a step (`wisp.core.experts.recency`) and its device-read form in `wisp.core.experts.stores`.

- `touch_order` sorts a step's distinct experts by (last token routing to it, id) and ignores negative
  ids; one token's step is its ids ascending;
- the store's one host read (`routed_counts_and_last_token`, torch) gives the same order through
  `order_by_last_token`, and the right per-expert pair counts;
- `distinct_in_order` keeps each id at its last reference.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.core.experts.recency import routed_counts_and_last_token
from wisp.core.experts.recency import distinct_in_order, order_by_last_token, touch_order


@st.composite
def routed_tokens(draw):
    n = draw(st.integers(1, 20))
    k = draw(st.integers(1, min(n, 4)))
    t = draw(st.integers(1, 12))
    rows = [draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k, unique=True)) for _ in range(t)]
    return n, rows


def test_the_last_token_decides_then_the_id():
    assert touch_order([[5, 2]]) == [2, 5]
    assert touch_order([[0, 6], [5, 1], [2, 0]]) == [6, 1, 5, 0, 2]
    assert touch_order([[3, -1], [-1, 1]]) == [3, 1]
    assert touch_order([]) == []


@settings(max_examples=100, deadline=None)
@given(routed_tokens())
def test_the_device_read_gives_the_same_order_and_counts(case):
    n, rows = case
    counts, last_token = routed_counts_and_last_token(torch.tensor(rows), n)
    assert order_by_last_token(last_token) == touch_order(rows)
    assert counts == [sum(row.count(e) for row in rows) for e in range(n)]


def test_distinct_in_order_keeps_the_last_reference():
    assert distinct_in_order([4, 1, 4, 2, 1]) == [4, 2, 1]
    assert distinct_in_order([]) == []
