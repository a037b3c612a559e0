"""Sampler: greedy, temperature with top-k / top-p, per-request seeds; values float32 cannot hold are refused."""

from __future__ import annotations

import pytest
import torch

from wisp.engine.sampling import FLOAT32_MAX, FLOAT32_MIN_POSITIVE, Sampler, SamplingParams
from wisp.errors import InvalidParameter, WispError

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


@pytest.mark.parametrize(
    "kwargs, param",
    [(dict(temperature=1e-50), "temperature"), (dict(temperature=7e-46), "temperature"),  # both round to 0
     (dict(temperature=1e39), "temperature"), (dict(top_p=1e-50), "top_p"), (dict(top_p=7e-46), "top_p"),
     (dict(top_p=float("nan")), "top_p"), (dict(max_tokens=0), "max_tokens"), (dict(top_k=-1), "top_k")],
)
def test_values_the_float32_sampler_cannot_hold_are_rejected_naming_the_field(kwargs, param):
    with pytest.raises(InvalidParameter) as err:
        SamplingParams(**kwargs)
    assert err.value.param == param and param in str(err.value)


@pytest.mark.parametrize("tiny", [FLOAT32_MIN_POSITIVE, 8e-46, 1e-40, 1.2e-38])  # subnormals, then the smallest normal
def test_the_smallest_values_float32_holds_sample_the_most_likely_token(tiny):
    assert set(draws(SamplingParams(temperature=tiny, seed=0), 20)) == {1}
    assert set(draws(SamplingParams(temperature=1.0, top_p=tiny, seed=0), 20)) == {1}


def test_the_largest_temperature_float32_holds_samples_uniformly():
    assert len(set(draws(SamplingParams(temperature=FLOAT32_MAX, seed=0), 200))) == len(LOGITS)
