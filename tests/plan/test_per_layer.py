"""Per-layer caps (`wisp.plan.per_layer`) against an exhaustive search."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.plan.test_split import miss_curve
from wisp.plan.per_layer import per_layer_caps
from wisp.plan.split import lower_hull


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5), st.integers(2, 16), st.data())
def test_per_layer_caps_match_exhaustive_search_on_convex_curves(layers, n, data):
    curves = [lower_hull(data.draw(miss_curve(n))) for _ in range(layers)]
    min_cap = data.draw(st.integers(1, n))
    total = data.draw(st.integers(layers * min_cap, layers * n))
    caps = per_layer_caps(curves, total, min_cap, n)
    assert sum(caps) == total and all(min_cap <= c <= n for c in caps)
    got = sum(c[k] for c, k in zip(curves, caps))
    best = min_total(curves, total, min_cap, n)
    assert got <= best + 1e-6


def min_total(curves, total, lo, hi):
    """Exhaustive DP over layers."""
    best = {0: 0.0}
    for c in curves:
        nxt = {}
        for used, val in best.items():
            for k in range(lo, hi + 1):
                if used + k <= total:
                    v = val + c[k]
                    if v < nxt.get(used + k, float("inf")):
                        nxt[used + k] = v
        best = nxt
    return best[total]


def test_per_layer_caps_rejects_impossible_totals():
    with pytest.raises(ValueError):
        per_layer_caps([np.zeros(5)], 10, 1, 4)
