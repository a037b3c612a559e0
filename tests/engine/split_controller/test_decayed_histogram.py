"""The decayed histogram (`wisp.engine.split_controller.decayed_histogram`): without decay it is the exact miss curve;
half-lives, explicit decay, the far bucket and long runs behave as documented."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.plan.test_miss_curves import SETTINGS, step_sequences
from wisp.engine.split_controller.decayed_histogram import DecayedHistogram
from wisp.plan.miss_curves import COLD, expert_miss_curve, stack_distances


@SETTINGS
@given(step_sequences())
def test_decayed_histogram_without_decay_is_the_exact_curve(case):
    n, steps = case
    h = DecayedHistogram(n)
    h.add_many(stack_distances(steps, n))
    h.decay(1.0)
    m = expert_miss_curve(steps, n)
    if m[0] == 0:
        assert np.array_equal(h.miss_curve(), np.ones(n + 1))
    else:
        np.testing.assert_allclose(h.miss_curve() * m[0], m, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(h.total, m[0])


def test_decayed_histogram_half_life_and_decay():
    h = DecayedHistogram(4, half_life=3)
    h.add(1)
    for _ in range(3):
        h.add(COLD)
    w = h.weights()
    assert w[1] == pytest.approx(0.5) and w[5] == pytest.approx(1 + 2 ** (-1 / 3) + 2 ** (-2 / 3))
    h.decay(0.5)
    assert h.total == pytest.approx(0.5 * (0.5 + 1 + 2 ** (-1 / 3) + 2 ** (-2 / 3)))
    curve = h.miss_curve()
    assert np.all(np.diff(curve) <= 0) and 0 <= curve.min() and curve.max() <= 1
    # distance 9 > max_distance lands in the cold/far bucket: a miss at every C
    g = DecayedHistogram(2)
    g.add(9)
    g.add(2)
    assert g.miss_curve().tolist() == [1.0, 1.0, 0.5]
    # long runs stay finite (the per-add scale is renormalised); steady state is 1 / (1 - 2**-1) = 2
    f = DecayedHistogram(3, half_life=1)
    f.add_many([1] * 5000)
    assert f.total == pytest.approx(2.0) and np.isfinite(f.weights()).all()
    for bad in (lambda: DecayedHistogram(0), lambda: DecayedHistogram(2, half_life=0), lambda: g.add(0),
                lambda: g.decay(0), lambda: g.miss_curve(3)):
        with pytest.raises(ValueError):
            bad()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.just(COLD), st.integers(1, 12)), max_size=300),
       st.sampled_from([None, 0.01, 0.3, 1.0, 50.0]), st.integers(1, 5))
def test_add_many_is_add_in_order_to_the_last_bit(distances, half_life, chunks):
    """Vectorised add_many against one `add` per reference, through renormalisations (tiny half-lives)."""
    one, many = DecayedHistogram(8, half_life), DecayedHistogram(8, half_life)
    for d in distances:
        one.add(d)
    for part in np.array_split(np.asarray(distances, dtype=np.int64), chunks):
        many.add_many(part)
    assert np.array_equal(one._w, many._w) and one._scale == many._scale
    assert one.total == many.total and np.array_equal(one.miss_curve(), many.miss_curve())


def test_add_many_rejects_what_add_rejects():
    h = DecayedHistogram(4, half_life=8)
    for bad in ([1, 0], [3, -2]):
        with pytest.raises(ValueError):
            h.add_many(bad)
    assert h.total == 0.0  # nothing of a rejected batch was recorded
