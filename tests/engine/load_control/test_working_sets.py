"""WorkingSets against a brute-force model: masks and joint sizes from the rows each request routed."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.engine.load_control.working_sets import WorkingSets

L, N, K = 3, 8, 2


@st.composite
def routed_rows(draw):
    """Per request, a list of decode rows [L, K] (ids -1..N-1)."""
    requests = draw(st.integers(1, 3))
    return {f"r{i}": [np.array(draw(st.lists(st.lists(st.integers(-1, N - 1), min_size=K, max_size=K),
                                             min_size=L, max_size=L)))
                      for _ in range(draw(st.integers(1, 12)))] for i in range(requests)}


def brute_mask(rows, window):
    mask = np.zeros((L, N), dtype=bool)
    for row in rows[-window:]:
        for layer in range(L):
            for e in row[layer]:
                if e >= 0:
                    mask[layer, e] = True
    return mask


@settings(max_examples=60, deadline=None)
@given(routed_rows(), st.integers(2, 6), st.data())
def test_masks_and_joint_sizes_match_a_brute_force_model(rows, window, data):
    sets = WorkingSets(L, N, K, window=window)
    for rid, seq in rows.items():
        cut = data.draw(st.integers(0, len(seq)))  # fed in two parts: the ring keeps the order across calls
        for part in (seq[:cut], seq[cut:]):
            if part:
                sets.observe(rid, np.stack(part))
    for rid, seq in rows.items():
        assert sets.known(rid) and sets.steps(rid) == min(len(seq), window)
        assert np.array_equal(sets.mask(rid), brute_mask(seq, window))
    ids = list(rows)
    union = np.logical_or.reduce([brute_mask(seq, window) for seq in rows.values()])
    assert np.array_equal(sets.joint_size(ids + ["never-seen"]), union.sum(axis=1))


def test_forget_makes_a_request_unknown_and_bad_rows_are_refused():
    sets = WorkingSets(L, N, K)
    sets.observe("a", np.zeros((1, L, K)))
    sets.forget("a")
    assert not sets.known("a") and sets.mask("a") is None
    with pytest.raises(ValueError):
        sets.observe("a", np.zeros((1, L, K + 1)))
