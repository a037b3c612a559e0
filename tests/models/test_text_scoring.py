"""`wisp.models.text_scoring`: the windows a text is cut into, and bits counted by hand."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st

from wisp.models.text_scoring import score, window_bits, windows


@given(st.integers(0, 300), st.integers(2, 64))
def test_windows_cover_the_text_in_order_and_drop_only_a_lone_last_token(n, size):
    spans = windows(n, size)
    assert all(2 <= end - start <= size for start, end in spans)
    assert [s for s, _ in spans] == list(range(0, len(spans) * size, size))
    covered = spans[-1][1] if spans else 0
    assert n - covered == (1 if n % size == 1 else 0)  # a trailing one-token window predicts nothing


def test_a_window_must_predict_something():
    with pytest.raises(ValueError):
        windows(10, 1)


def test_bits_by_hand():
    """Uniform logits over V tokens: log2(V) bits a predicted token; a token given probability 1/2: one bit."""
    v = 16
    s = score(list(range(10)), lambda chunk: torch.zeros(len(chunk), v), window=4)  # windows 4, 4, 2
    assert s.predicted == 3 + 3 + 1
    assert s.bits_per_token == pytest.approx(math.log2(v))
    logits = torch.full((3, v), -1e9)
    logits[0, 5] = logits[0, 6] = 0.0  # p(5) = p(6) = 1/2 after token 0
    logits[1, 2] = 0.0  # p(2) = 1 after token 1
    assert window_bits(logits, [0, 5, 2]) == pytest.approx(1.0)


def test_each_window_is_scored_from_scratch():
    seen = []
    score(list(range(11)), lambda chunk: seen.append(list(chunk)) or torch.zeros(len(chunk), 16), window=5)
    assert seen == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # token 10 alone predicts nothing
