"""The online expert predictors (`wisp.core.learners.coactivation`); their scores are
tests/bench/test_predictor_scores.py's.

- counts after a hand-made sequence (frequency, same-layer transitions, cross-layer pairs; decay);
- `predict` returns at most k distinct, seen, in-range ids, and the top-k is a prefix of the top-(k+1);
- no look-ahead: changing the trace from cell (t, l) on never changes the predictions up to that cell.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import routing_traces
from wisp.core.learners.coactivation import (CrossLayerPredictor, FrequencyPredictor, RecencyPredictor, TransitionPredictor,
                                    predict_online)

KINDS = (RecencyPredictor, FrequencyPredictor, TransitionPredictor, CrossLayerPredictor)


def test_counts_after_a_hand_made_sequence():
    tokens = [([0, 1], [2, 3]), ([1, 2], [2, 0]), ([0, 1], [3, 1])]  # (layer 0, layer 1) per token
    freq, trans, cross = FrequencyPredictor(2, 4), TransitionPredictor(2, 4), CrossLayerPredictor(2, 4)
    for layer0, layer1 in tokens:
        for p in (freq, trans, cross):
            p.observe(0, layer0)
            p.observe(1, layer1)
    assert freq.frequency(0).tolist() == [2, 3, 1, 0]
    assert freq.frequency(1).tolist() == [1, 1, 2, 2]
    expected = np.zeros((4, 4))
    for a, b in [(0, 1), (0, 2), (1, 1), (1, 2), (1, 0), (1, 1), (2, 0), (2, 1)]:  # layer 0, t-1 -> t
        expected[a, b] += 1
    assert np.array_equal(trans.pairs(0), expected)
    assert trans.pairs(1)[2].tolist() == [1, 1, 1, 1] and trans.pairs(1)[0].tolist() == [0, 1, 0, 1]
    expected = np.zeros((4, 4))
    for a, b in [(0, 2), (0, 3), (1, 2), (1, 3), (1, 2), (1, 0), (2, 2), (2, 0), (0, 3), (0, 1), (1, 3), (1, 1)]:
        expected[a, b] += 1
    assert np.array_equal(cross.pairs(1), expected)
    assert not cross.pairs(0).any()
    assert trans.predict(0, 2) == [1, 2]  # from the last token's {0, 1}: rows 0 + 1 = [1, 3, 2, 0]
    assert cross.predict(1, 1) == [3]  # from layer 0's latest {0, 1}: rows 0 + 1 = [1, 2, 3, 4]
    assert freq.predict(0, 3) == [1, 0, 2]


def test_decay_weighs_an_observation_n_steps_old_by_decay_to_the_n():
    p = FrequencyPredictor(1, 3, decay=0.5)
    for experts in ([0], [1], [1]):
        p.observe(0, experts)
    assert p.frequency(0).tolist() == [0.25, 1.5, 0.0]
    with pytest.raises(ValueError):
        FrequencyPredictor(1, 3, decay=0.0)


def test_missing_cells_and_bad_input():
    p = CrossLayerPredictor(2, 4)
    p.observe(0, [-1, -1])  # a missing cell: nothing counted, and layer 1 has no source
    p.observe(1, [2, 3])
    assert not p.pairs(1).any() and p.frequency(0).sum() == 0
    assert p.predict(0, 2) == []  # nothing seen at layer 0 yet
    with pytest.raises(ValueError):
        p.observe(2, [0])
    with pytest.raises(ValueError):
        p.observe(0, [4])


def test_recency_at_top_k_is_the_last_token():
    p = RecencyPredictor(1, 8)
    for experts in ([5, 1], [2, 7], [7, 3]):
        p.observe(0, experts)
    assert sorted(p.predict(0, 2)) == [3, 7]
    assert p.predict(0, 3)[2] == 2  # then the one before


@settings(max_examples=60, deadline=None)
@given(routing_traces(), st.integers(0, 9), st.sampled_from(KINDS), st.sampled_from([1.0, 0.8]))
def test_predict_returns_at_most_k_distinct_seen_ids(case, k, kind, decay):
    ids, n = case
    predictor = kind(ids.shape[1], n, decay)
    seen: list[set[int]] = [set() for _ in range(ids.shape[1])]
    for t in range(ids.shape[0]):
        for layer in range(ids.shape[1]):
            guess = predictor.predict(layer, k)
            assert len(guess) <= k and len(set(guess)) == len(guess)
            assert set(guess) <= seen[layer]
            assert len(guess) == min(k, len(seen[layer]))
            assert predictor.predict(layer, k + 1)[: len(guess)] == guess
            predictor.observe(layer, ids[t, layer].tolist())
            seen[layer] |= {int(e) for e in ids[t, layer] if e >= 0}


@settings(max_examples=60, deadline=None)
@given(routing_traces(), st.integers(1, 4), st.sampled_from(KINDS), st.data())
def test_no_look_ahead(case, k, kind, data):
    ids, n = case
    T, L, K = ids.shape
    t = data.draw(st.integers(0, T - 1))
    layer = data.draw(st.integers(0, L - 1))
    changed = ids.copy()
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    flat = changed.reshape(T * L, K)
    for cell in range(t * L + layer, T * L):  # cell (t, layer) and everything after it
        flat[cell] = rng.permutation(n)[:K]
    before = predict_online(kind(L, n), ids, k).reshape(T * L, k)
    after = predict_online(kind(L, n), changed, k).reshape(T * L, k)
    assert np.array_equal(before[: t * L + layer + 1], after[: t * L + layer + 1])
