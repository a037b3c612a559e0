"""Property tests of `plan_groups(token_experts, capacity)`: the greedy split of a batch's tokens into
consecutive [start, end) groups whose expert unions each fit in the scratch capacity.

Properties: groups are non-empty, consecutive and cover all tokens in order exactly once; each group's
expert union fits; greedy maximality (the next token would overflow the group it does not join).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.core.pager import plan_groups

SETTINGS = settings(max_examples=100, deadline=None)


@st.composite
def batches(draw):
    n = draw(st.integers(1, 12))
    cap = draw(st.integers(1, n))
    top_k = draw(st.integers(1, cap))
    token = st.lists(st.integers(0, n - 1), min_size=1, max_size=top_k, unique=True)
    tokens = draw(st.lists(token, min_size=0, max_size=60))
    return tokens, cap


def union(tokens, start, end) -> set[int]:
    return set().union(*map(set, tokens[start:end]))


def check_groups(tokens, cap, groups):
    # consecutive, non-empty, covering [0, T) in order exactly once
    pos = 0
    for start, end in groups:
        assert start == pos and end > start, groups
        pos = end
    assert pos == len(tokens)
    for i, (start, end) in enumerate(groups):
        assert len(union(tokens, start, end)) <= cap
        if i + 1 < len(groups):  # greedy maximality: adding the next token would overflow
            assert len(union(tokens, start, end + 1)) > cap, (groups, i)


@SETTINGS
@given(case=batches())
def test_groups_partition_fit_and_are_maximal(case):
    tokens, cap = case
    groups = plan_groups(tokens, cap)
    check_groups(tokens, cap, groups)
    # tuples of ints, so they can slice tensors
    assert all(isinstance(s, int) and isinstance(e, int) for s, e in groups)


@SETTINGS
@given(case=batches())
def test_groups_minimal_count(case):
    """Greedy is optimal for consecutive splits: no split into fewer fitting groups exists."""
    tokens, cap = case
    t = len(tokens)
    best = [0] + [None] * t  # best[i]: fewest fitting groups covering tokens[:i]
    for i in range(1, t + 1):
        u: set[int] = set()
        for j in range(i - 1, -1, -1):  # grow the last group tokens[j:i] backwards while it fits
            u |= set(tokens[j])
            if len(u) > cap:
                break
            best[i] = best[j] + 1 if best[i] is None else min(best[i], best[j] + 1)
    assert len(plan_groups(tokens, cap)) == best[t]


@SETTINGS
@given(case=batches())
def test_accepts_tuples(case):
    tokens, cap = case
    as_tuples = [tuple(x) for x in tokens]
    assert plan_groups(as_tuples, cap) == plan_groups(tokens, cap)


def test_empty_input():
    assert plan_groups([], 1) == []
    assert plan_groups([], 4) == []


def test_all_tokens_fit_in_one_group():
    tokens = [[0, 1], [1, 2], [2, 0], [1, 0], [2, 1]]
    assert plan_groups(tokens, 3) == [(0, 5)]
    assert plan_groups(tokens, 8) == [(0, 5)]
    assert plan_groups([[4, 5]], 2) == [(0, 1)]


def test_union_exactly_capacity_stays_one_group():
    assert plan_groups([[0], [1], [2], [0, 2]], 3) == [(0, 4)]


def test_hand_examples():
    assert plan_groups([[0, 1], [2, 3], [0, 1], [0, 2]], 2) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert plan_groups([[0, 1], [1, 2], [3, 4], [3]], 3) == [(0, 2), (2, 4)]
    assert plan_groups([[0], [1], [2], [3], [0]], 2) == [(0, 2), (2, 4), (4, 5)]
    # a group restarts from the overflowing token's own experts, not the old union
    assert plan_groups([[0, 1], [2, 3], [2], [3], [4]], 2) == [(0, 1), (1, 4), (4, 5)]


def test_a_token_wider_than_capacity_raises():
    import pytest

    with pytest.raises(ValueError, match="token 0"):
        plan_groups([[0, 1, 2], [3]], 2)
