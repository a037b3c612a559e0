"""Sampler: greedy, temperature with top-k / top-p, per-request seeds."""

from __future__ import annotations

import pytest
import torch

from wisp.engine.sampling import Sampler, SamplingParams
from wisp.errors import WispError

LOGITS = torch.tensor([0.1, 3.0, 2.5, -1.0, 2.9, 0.0])


def draws(params: SamplingParams, n: int = 300) -> list[int]:
    s = Sampler(params)
    return [s(LOGITS) for _ in range(n)]


def test_greedy_is_argmax():
    assert set(draws(SamplingParams(temperature=0.0), 5)) == {1}


def test_top_k_limits_the_support():
    assert set(draws(SamplingParams(temperature=1.0, top_k=2, seed=0))) == {1, 4}


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = torch.softmax(LOGITS, -1)
    assert probs[1] < 0.5 < probs[1] + probs[4]
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.5, seed=0))) == {1, 4}
    assert set(draws(SamplingParams(temperature=1.0, top_p=1e-6, seed=0), 20)) == {1}


def test_seed_reproduces_and_differs_between_seeds():
    a = draws(SamplingParams(temperature=1.0, seed=7), 50)
    assert a == draws(SamplingParams(temperature=1.0, seed=7), 50)
    assert a != draws(SamplingParams(temperature=1.0, seed=8), 50)
    assert len(set(a)) > 2


@pytest.mark.parametrize(
    "kwargs", [dict(max_tokens=0), dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)]
)
def test_invalid_params_are_rejected(kwargs):
    with pytest.raises(WispError):
        SamplingParams(**kwargs)
