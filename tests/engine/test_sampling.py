"""Sampler: greedy, temperature with top-k / top-p, per-request seeds; values float32 cannot hold are refused;
logit bias, penalties, a constraint's mask and the logprobs of the row it sampled from."""

from __future__ import annotations

import pytest
import torch

from hypothesis import given, settings, strategies as st

from wisp.engine.sampling import FLOAT32_MAX, FLOAT32_MIN_POSITIVE, Sampler, SamplingParams
from wisp.errors import InvalidParameter, WispError

LOGITS = torch.tensor([0.1, 3.0, 2.5, -1.0, 2.9, 0.0])


def draws(params: SamplingParams, n: int = 300) -> list[int]:
    s = Sampler(params)
    return [s(LOGITS).token for _ in range(n)]


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


def test_logit_bias_moves_the_argmax_and_ignores_ids_past_the_row():
    params = SamplingParams(logit_bias=((3, 10.0), (1, -100.0), (99, 5.0)))
    assert Sampler(params)(LOGITS).token == 3
    assert Sampler(SamplingParams(logit_bias=((1, -0.6),)))(LOGITS).token == 4  # 2.4 < 2.9


def test_penalties_count_the_history():
    history = [1, 1, 4]
    # presence: 1 and 4 lose 1.0 each -> 2 (2.5) leads; frequency 0.3: 1 loses 0.6 -> 4 (2.9 - 0.3 = 2.6) leads
    assert Sampler(SamplingParams(presence_penalty=1.0))(LOGITS, history).token == 2
    assert Sampler(SamplingParams(frequency_penalty=0.3))(LOGITS, history).token == 4
    assert Sampler(SamplingParams(frequency_penalty=0.3))(LOGITS, ()).token == 1  # nothing generated yet


@given(st.lists(st.floats(-30, 30), min_size=2, max_size=40), st.integers(0, 20), st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_logprobs_are_log_softmax_of_the_row_sampled_from(values, top, seed):
    logits = torch.tensor(values)
    for temperature in (0.0, 0.7):
        out = Sampler(SamplingParams(temperature=temperature, logprobs=top, seed=seed))(logits)
        expected = torch.log_softmax(logits, -1)
        assert abs(out.logprobs.logprob - float(expected[out.token])) <= 1e-5
        assert out.logprobs.token == out.token
        assert len(out.logprobs.top) == min(top, len(values))
        assert [lp for _, lp in out.logprobs.top] == sorted((lp for _, lp in out.logprobs.top), reverse=True)
        for token, lp in out.logprobs.top:
            assert abs(lp - float(expected[token])) <= 1e-5
        if top:
            assert out.logprobs.top[0][1] == pytest.approx(float(expected.max()), abs=1e-6)


def test_no_logprobs_unless_asked():
    assert Sampler(SamplingParams())(LOGITS).logprobs is None


class OnlyEven:
    finished = False

    def __init__(self):
        self.accepted = []

    def mask(self, logits):
        logits[1::2] = float("-inf")

    def accept(self, token):
        self.accepted.append(token)


def test_a_constraint_masks_the_row_and_logprobs_follow_the_mask():
    constraint = OnlyEven()
    row = LOGITS.clone()
    out = Sampler(SamplingParams(logprobs=2))(row, (), constraint)
    assert out.token == 4  # 1 (3.0) is odd: the best even id is 4 (2.9)
    assert torch.equal(row, LOGITS)  # the caller's row is untouched
    assert out.logprobs.logprob == pytest.approx(float(torch.log_softmax(LOGITS[::2], -1)[2]), abs=1e-6)
    assert all(token % 2 == 0 for token, _ in out.logprobs.top)
    for _ in range(50):
        assert Sampler(SamplingParams(temperature=1.0, seed=_))(LOGITS, (), constraint).token % 2 == 0


@pytest.mark.parametrize("kwargs, param", [
    (dict(logprobs=21), "logprobs"), (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"), (dict(logit_bias=((1, 101.0),)), "logit_bias"),
    (dict(logit_bias=((-1, 1.0),)), "logit_bias"), (dict(logit_bias=((1, 1.0), (1, 2.0))), "logit_bias"),
])
def test_out_of_range_adjustments_are_refused_naming_the_field(kwargs, param):
    with pytest.raises(InvalidParameter) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param
