"""sample_batch: every row's token is the one it gets alone (whatever shares its batch), a greedy row's is its argmax,
a drawn token follows softmax(row / temperature) over its top-k / top-p support, and a request's draws come from its
own generator, once per sampled token."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from wisp.engine.batch_sampler import sample_batch
from wisp.engine.sampling import Sampler, SamplingParams

params_strategy = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]),
    top_p=st.sampled_from([1.0, 0.9, 0.5, 1e-6]),
    top_k=st.sampled_from([0, 1, 3, 50]),
    seed=st.integers(0, 2**40),
)


@given(st.lists(params_strategy, min_size=1, max_size=6), st.integers(2, 70), st.integers(0, 2**31))
@settings(max_examples=80, deadline=None)
def test_each_rows_token_is_the_one_it_gets_alone(device, params, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    rows = (torch.randn((len(params), vocab), generator=g) * 3).to(device)
    rows[0, : vocab // 2] = rows[0, 0].clone()  # ties (a copy: CUDA refuses a write that reads its own target)
    noise = [Sampler(p).noise(vocab, rows.device) for p in params]
    together = sample_batch(rows, params, noise)
    alone = [int(sample_batch(rows[i : i + 1], [p], [noise[i]])[0]) for i, p in enumerate(params)]
    assert together.tolist() == alone
    for i, p in enumerate(params):
        if p.temperature == 0:
            assert alone[i] == int(rows[i].argmax())


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=3),
                                    SamplingParams(temperature=1.0, top_p=0.8)])
def test_drawn_tokens_follow_the_softmax_over_their_support(device, params):
    """4000 draws of one row (fixed seeds: the same counts every run) against softmax(row / T) renormalised over the
    support top-k and top-p leave: every count within 5 standard deviations, nothing outside the support."""
    row = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -3.0])
    probs = torch.softmax(row / params.temperature, -1)
    row = row.to(device)
    support = torch.ones(6, dtype=torch.bool)
    if params.top_k:
        support[params.top_k :] = False
    if params.top_p < 1:
        before = torch.cumsum(probs, 0) - probs
        support &= before < params.top_p
    want = torch.where(support, probs, torch.zeros(())) / probs[support].sum()
    sampler = Sampler(SamplingParams(**{**params.__dict__, "seed": 11}))
    n = 4000
    noise = torch.stack([sampler.noise(6, row.device) for _ in range(n)])
    counts = torch.bincount(sample_batch(row.expand(n, 6), [sampler.params] * n, list(noise)).cpu(), minlength=6).double()
    assert (counts[~support] == 0).all()
    sd = (n * want * (1 - want)).sqrt()
    assert ((counts - n * want).abs() <= 5 * sd + 1e-9).all(), (counts, n * want)


def test_a_requests_draws_are_its_own_and_taken_once_a_token():
    """Two samplers of one seed give the same draws in turn; a batch neighbour's draws do not move them."""
    a, b = Sampler(SamplingParams(temperature=1.0, seed=5)), Sampler(SamplingParams(temperature=1.0, seed=5))
    other = Sampler(SamplingParams(temperature=1.0, seed=6))
    first = a.noise(10, torch.device("cpu"))
    other.noise(10, torch.device("cpu"))
    assert torch.equal(first, b.noise(10, torch.device("cpu")))
    assert torch.equal(a.noise(10, torch.device("cpu")), b.noise(10, torch.device("cpu")))
    assert not torch.equal(first, a.noise(10, torch.device("cpu")))
    assert Sampler(SamplingParams(temperature=0.0, seed=5)).noise(10, torch.device("cpu")) is None


def test_a_row_whose_largest_value_is_not_finite_takes_its_argmax(device):
    rows = torch.tensor([[0.0, float("inf"), 1.0], [float("nan"), 0.0, 1.0]], device=device)
    params = [SamplingParams(temperature=1.0, seed=1)] * 2
    noise = [Sampler(p).noise(3, rows.device) for p in params]
    assert sample_batch(rows, params, noise).tolist() == rows.argmax(-1).tolist()
