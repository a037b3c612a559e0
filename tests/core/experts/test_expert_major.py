"""Expert-major wide steps (`wisp.core.experts.expert_major`): against the resident bank and an LRU model.

For random routing streams (hypothesis) whose steps route to more experts than the slots hold:
- the paged output is torch.equal to the resident one, step by step;
- each missing expert is copied exactly once per step (copies counted at the copy functions);
- hits and misses equal `wisp.plan.miss_curves`'s miss curve at the pager's cap, for every cap;
- after each step the slots hold what a plain LRU cache of C items would (set-valued steps touched by
  the last token routing to each expert, then id: `wisp.core.experts.recency`), and every pager invariant holds;
- any split of a batch's tokens into consecutive chunks gives the same bits (chunked prefill).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.core.experts import expert_major
from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.experts.miss_policies import STREAM_REUSE
from tests.core.experts.stores import paged_store, resident_store
from wisp.core.experts.pager import ExpertPager
from wisp.core.experts.recency import touch_order
from wisp.plan.miss_curves import expert_miss_curve

D, I = 24, 40  # odd widths: the CPU's SIMD tails would show if any op followed the row count


def bank(n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {GATE_UP: (torch.randn(n, 2 * I, D, generator=g) * 0.3).to(dtype),
            DOWN: (torch.randn(n, D, I, generator=g) * 0.3).to(dtype)}


def batch(n, t, k, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(t, D, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)])
    weights = torch.softmax(torch.randn(t, k, generator=g), -1).to(dtype)
    return hidden, ids, weights


def lru_model(steps, cap):
    """A plain LRU cache of `cap` items fed steps of tokens ([T][K] ids), a step's experts touched by
    (last token routing to it, id): (hits, misses) per step and the resident set after each."""
    order: list[int] = []  # least recent first
    out = []
    for tokens in steps:
        last = {e: t for t, row in enumerate(tokens) for e in row}
        need = sorted(last, key=lambda e: (last[e], e))
        resident = set(order[-cap:])
        hits = sum(e in resident for e in need)
        order = [e for e in order if e not in need] + need
        out.append((hits, len(need) - hits, sorted(order[-cap:])))
    return out


@st.composite
def streams(draw, max_tokens: int = 24, max_steps: int = 6):
    """(experts, top_k, cap, tokens per step, seed) of a random stream of steps, some wider than the cap."""
    n = draw(st.sampled_from([6, 8, 16]))
    k = draw(st.integers(1, 4))
    cap = draw(st.integers(k, n))
    lengths = draw(st.lists(st.integers(1, max_tokens), min_size=1, max_size=max_steps))
    return n, k, cap, lengths, draw(st.integers(0, 2**20))


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(case=streams(), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_wide_steps_equal_resident_and_the_lru_model(case, dtype):
    with pytest.MonkeyPatch.context() as monkeypatch:
        check_stream(case, dtype, monkeypatch)


def check_stream(case, dtype, monkeypatch):
    n, k, cap, lengths, seed = case
    host = bank(n, dtype, seed)
    resident = resident_store({name: t.clone() for name, t in host.items()})
    store = paged_store(host, cap, "cpu")
    copies = []
    real_copy, real_slot_copy = expert_major._copy_expert, ExpertPager.copy_into_slot
    monkeypatch.setattr(expert_major, "_copy_expert", lambda p, e, dest: (copies.append(e), real_copy(p, e, dest)))
    monkeypatch.setattr(ExpertPager, "copy_into_slot", lambda p, e, s: (copies.append(e), real_slot_copy(p, e, s)))
    steps, touch_orders = [], []
    model_misses = 0
    for i, t in enumerate(lengths):
        hidden, ids, weights = batch(n, t, k, seed + i, dtype)
        steps.append(ids.tolist())
        touch_orders.append(touch_order(ids.tolist()))
        before = store.counters.misses
        copies.clear()
        assert torch.equal(store.forward(hidden, ids, weights), resident.forward(hidden, ids, weights))
        misses = store.counters.misses - before
        assert sorted(copies) == sorted(set(copies)) and len(copies) == misses  # each miss copied once
        hits, model_step_misses, model_resident = lru_model(steps, cap)[-1]
        assert misses == model_step_misses
        assert store.residency.pager.resident_experts() == model_resident
        model_misses += model_step_misses
        store.residency.pager.check_integrity()
    c = store.counters
    assert c.misses == model_misses == expert_miss_curve(touch_orders, n)[cap]
    assert c.loads == c.misses and c.bytes_h2d == c.misses * store.residency.pager.expert_bytes
    assert c.steps == len(lengths)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(1, 17), min_size=1, max_size=5), cap=st.integers(2, 8), seed=st.integers(0, 999))
def test_chunking_a_batch_does_not_change_its_bits(dtype, sizes, cap, seed):
    n, k = 8, 2
    host = bank(n, dtype, seed)
    hidden, ids, weights = batch(n, sum(sizes), k, seed, dtype)
    whole = paged_store(host, cap, "cpu").forward(hidden, ids, weights)
    chunked_store = paged_store(host, cap, "cpu")
    parts, at = [], 0
    for size in sizes:
        parts.append(chunked_store.forward(hidden[at : at + size], ids[at : at + size], weights[at : at + size]))
        at += size
    assert torch.equal(torch.cat(parts), whole)


def test_a_wide_step_keeps_what_its_last_tokens_route_to_and_streams_the_rest(monkeypatch):
    n, k, cap = 8, 2, 3
    host = bank(n, torch.float32)
    store = paged_store(host, cap, "cpu")
    hidden, _, weights = batch(n, 3, k, 0, torch.float32)
    store.forward(hidden[:2], torch.tensor([[5, 6], [6, 5]]), weights[:2])  # narrow: 5 and 6 resident
    decisions = []
    real_decide = ExpertPager.decide
    monkeypatch.setattr(ExpertPager, "decide", lambda p, order: decisions.append(real_decide(p, order)) or decisions[-1])
    # last tokens: 6 -> 0, 1 and 5 -> 1, 0 and 2 -> 2; touch order 6, 1, 5, 0, 2; the last three stay
    store.forward(hidden, torch.tensor([[0, 6], [5, 1], [2, 0]]), weights)
    (decision,) = decisions
    assert decision.hits == (5, 6)
    assert [e for e, _ in decision.loads] == [0, 2] and decision.streamed == (1,)
    assert store.residency.pager.resident_experts() == [0, 2, 5]
    assert store.counters.misses == 2 + 3


ZERO_COPY_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on the GPU: the side stream and its events


def zero_copy_stores(host):
    from tests.core.experts.stores import zero_copy_store

    if ZERO_COPY_DEVICE == "cuda":  # reading host memory in place needs the Triton kernels (UVA)
        host = {name: t.pin_memory() for name, t in host.items()}
    staged = zero_copy_store(host, ZERO_COPY_DEVICE, expert_major.StagingBuffers(host, ZERO_COPY_DEVICE))
    in_place = zero_copy_store(host, ZERO_COPY_DEVICE)  # no staging: it always reads in place
    if ZERO_COPY_DEVICE == "cuda":
        from wisp.core.kernels.registry import moe_kernels

        staged.kernels = in_place.kernels = moe_kernels("triton")
    return staged, in_place


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@settings(max_examples=15, deadline=None)
@given(t=st.integers(1, 24), k=st.integers(1, 4), seed=st.integers(0, 999))
def test_zero_copy_stages_a_step_that_reuses_its_experts_and_copies_each_once(dtype, t, k, seed):

    n = 8
    host = bank(n, dtype, seed)
    hidden, ids, weights = (x.to(ZERO_COPY_DEVICE) for x in batch(n, t, k, seed, dtype))
    staged, in_place = zero_copy_stores(host)
    copies = []
    real_copy = expert_major._copy_expert
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(expert_major, "_copy_expert", lambda h, e, dest: (copies.append(e), real_copy(h, e, dest)))
        out = staged.forward(hidden, ids, weights)
    resident = resident_store({name: w.to(ZERO_COPY_DEVICE) for name, w in host.items()})
    if ZERO_COPY_DEVICE == "cpu":  # on CUDA both run Triton's kernels, whose bits are not the torch reference's
        assert torch.equal(out, resident.forward(hidden, ids, weights))
    assert torch.equal(out, in_place.forward(hidden, ids, weights))
    distinct = sorted(set(ids.flatten().tolist()))
    stages = ids.numel() >= STREAM_REUSE * len(distinct)
    assert sorted(copies) == (distinct if stages else [])  # each routed expert copied once, or none
    bytes_of = staged.expert_bytes
    assert staged.counters.bytes_h2d == (len(distinct) if stages else ids.numel()) * bytes_of
    assert in_place.counters.bytes_h2d == ids.numel() * bytes_of and staged.counters.misses == len(distinct)


@pytest.mark.parametrize("rows, stages", [([[0, 1], [1, 0]], True),  # 4 pairs, 2 experts: twice each
                                          ([[0, 1], [1, 2]], False)])  # 4 pairs, 3 experts: under twice
def test_zero_copy_stages_from_twice_per_expert_on_average(rows, stages):
    staged, _ = zero_copy_stores(bank(4, torch.float32))
    hidden, _, weights = (x.to(ZERO_COPY_DEVICE) for x in batch(4, 2, 2, 0, torch.float32))
    staged.forward(hidden, torch.tensor(rows, device=ZERO_COPY_DEVICE), weights)
    assert staged.counters.loads == (len({e for row in rows for e in row}) if stages else 0)
