"""wisp.bench.predictor_scores: how the prefetch probe scores an online expert predictor on a trace.

- the online precision equals a brute-force recount (a fresh predictor fed only the past);
- the LRU replay agrees with `wisp.plan.miss_curves`; the last-token predictor names no LRU miss.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import routing_traces
from wisp.bench.predictor_scores import lru_resident_before, lru_breakdown, online_precision, routed
from wisp.core.learners.coactivation import (CrossLayerPredictor, FrequencyPredictor, RecencyPredictor, TransitionPredictor,
                                             predict_online)
from wisp.plan.miss_curves import expert_miss_curve

KINDS = (RecencyPredictor, FrequencyPredictor, TransitionPredictor, CrossLayerPredictor)


@settings(max_examples=60, deadline=None)
@given(routing_traces(max_tokens=8), st.integers(1, 4), st.sampled_from(KINDS))
def test_online_precision_equals_a_brute_force_recount(case, k, kind):
    ids, n = case
    T, L, _ = ids.shape
    layers = list(range(L))
    online = online_precision(kind, ids, n, k, layers)
    for layer in layers:
        hits = made = 0
        for t in range(T):
            fresh = kind(L, n)  # fed only what came before cell (t, layer)
            for past in range(t + 1):
                for earlier in range(L if past < t else layer):
                    fresh.observe(earlier, ids[past, earlier].tolist())
            actual = {int(e) for e in ids[t, layer] if e >= 0}
            if actual:
                guess = fresh.predict(layer, k)
                hits, made = hits + len(set(guess) & actual), made + len(guess)
        expected = hits / made if made else float("nan")
        assert online[layer] == pytest.approx(expected, nan_ok=True)


@settings(max_examples=40, deadline=None)
@given(routing_traces(max_tokens=16), st.integers(1, 6))
def test_lru_replay_matches_the_miss_curves(case, cap):
    ids, n = case
    for layer in range(ids.shape[1]):
        resident = lru_resident_before(ids, layer, cap)
        misses = sum(len(routed(ids, t, layer) - r) for t, r in enumerate(resident))
        steps = [sorted(routed(ids, t, layer)) for t in range(ids.shape[0])]
        assert misses == expert_miss_curve(steps, n)[min(cap, n)]  # the curve stops at C = n


@settings(max_examples=30, deadline=None)
@given(routing_traces(max_tokens=16))
def test_the_last_token_predictor_names_no_lru_miss(case):
    ids, n = case
    K = ids.shape[2]
    predicted = predict_online(RecencyPredictor(ids.shape[1], n), ids, K)
    for cap in (K, K + 2):
        breakdown = lru_breakdown(predicted, ids, list(range(ids.shape[1])), cap)
        assert breakdown["useful"] == 0
