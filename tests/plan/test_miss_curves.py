"""Exact LRU miss curves (`wisp.plan.miss_curves`) against the real pager, the real block pool, and brute force.

Brute force here is a recency LIST (most recent last), written independently of the Fenwick code and
of the pager's slots/ticks: a step evicts the least recent non-needed residents, then moves its items
to the end in touch order. It also checks the stack property the module docstring proves: after every
step the real `ExpertPager` holds exactly the top-C of that recency order.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import demo_routing
from wisp.core.experts.pager import ExpertPager
from wisp.engine.block_pool import BlockPool
from wisp.plan.miss_curves import (
    COLD,
    Fenwick,
    expert_miss_curve,
    kv_miss_curve,
    kv_stack_distances,
    miss_curve_from_distances,
    stack_distances,
)

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def step_sequences(draw, max_experts=12, max_steps=40, max_set=5):
    n = draw(st.integers(1, max_experts))
    steps = draw(st.lists(st.lists(st.integers(0, n - 1), max_size=max_set), max_size=max_steps))
    return n, steps


def brute_lru(steps, capacity, order=None):
    """Misses of set-semantics LRU; `order(step)` gives the touch order (default: a flat step lists its
    references in order, an id counting at its last place, as `ExpertPager.decide` reads it)."""
    order = order or (lambda s: list(dict.fromkeys(reversed(s)))[::-1])
    rec: list = []  # resident, least recent first
    misses = 0
    for s in steps:
        touch = order(s)
        need = set(touch)
        missing = [e for e in touch if e not in rec]
        misses += len(missing)
        evict = len(rec) + len(missing) - capacity
        victims = [e for e in rec if e not in need][: max(evict, 0)]
        rec = [e for e in rec if e not in victims and e not in need] + touch
        assert len(rec) <= capacity
    return misses


def tiny_host(n: int) -> dict[str, torch.Tensor]:
    return {"w": torch.arange(n, dtype=torch.float32).reshape(n, 1)}


# -- expert stream ----------------------------------------------------------------------------------
@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(step_sequences())
def test_curve_equals_pager_and_brute_force_at_every_capacity(case):
    n, steps = case
    m = expert_miss_curve(steps, n)
    assert m.shape == (n + 1,)
    widest = max([len(set(s)) for s in steps] + [1])
    for c in range(widest, n + 1):
        pager = ExpertPager(tiny_host(n), c, "cpu")
        order: list[int] = []  # global recency order, most recent last
        for s in steps:
            pager.prepare(s)
            need = list(dict.fromkeys(reversed(s)))[::-1]  # touch order: each id at its last place
            order = [e for e in order if e not in need] + need
            assert pager.resident_experts() == sorted(order[-c:]), "pager is not the top-C of the recency order"
        assert pager.counters.misses == m[c] == brute_lru(steps, c), (c, m)
        assert pager.counters.hits == m[0] - m[c]


def test_curve_equals_pager_and_brute_force_on_the_demo_s_trained_routing():
    """Real routing (the trained demo over its held-out text, one token a step), every layer, every C from top-k."""
    trace = demo_routing()
    for layer in trace.layers:
        steps = trace.steps(layer, per_token=True)[:1000]
        m = expert_miss_curve(steps, trace.num_experts)
        for c in range(trace.top_k, trace.num_experts + 1):
            pager = ExpertPager(tiny_host(trace.num_experts), c, "cpu")
            for s in steps:
                pager.prepare(s)
            assert pager.counters.misses == m[c] == brute_lru(steps, c), (layer, c)


@SETTINGS
@given(step_sequences())
def test_curve_invariants(case):
    n, steps = case
    d = stack_distances(steps, n)
    m = expert_miss_curve(steps, n)
    refs = sum(len(set(s)) for s in steps)
    distinct = len({e for s in steps for e in s})
    assert len(d) == refs == m[0]
    assert np.all((d == COLD) | ((d >= 1) & (d <= distinct)))
    assert int(np.count_nonzero(d == COLD)) == distinct == m[n]
    assert np.all(np.diff(m) <= 0)
    # below the pager's domain the formula still holds
    for c in range(n + 1):
        assert m[c] == np.count_nonzero(d == COLD) + np.count_nonzero(d > c)


def test_stack_distances_by_hand():
    # steps in touch order (a repeat counts at its last place): 0,1 | 2,1 | 0 | 3,1
    # recency orders (most recent first) 1,0 -> 1,2,0 -> 0,1,2 -> 1,3,0,2
    steps = [[1, 0, 1], [2, 1], [0], [3, 1]]
    assert stack_distances(steps).tolist() == [COLD, COLD, COLD, 1, 3, COLD, 2]
    assert expert_miss_curve(steps, 4).tolist() == [7, 6, 5, 4, 4]
    # same-step experts never count against each other: {0,1} twice is all hits at C = 2
    assert stack_distances([[0, 1], [0, 1]]).tolist() == [COLD, COLD, 2, 1]
    assert expert_miss_curve([[0, 1], [0, 1]], 2).tolist() == [4, 3, 2]


def test_out_of_range_ids_and_bad_max_c():
    with pytest.raises(ValueError):
        expert_miss_curve([[0, 3]], 3)
    with pytest.raises(ValueError):
        stack_distances([[-1]], 4)
    with pytest.raises(ValueError):
        miss_curve_from_distances(np.array([1]), -1)
    assert expert_miss_curve([], 3).tolist() == [0, 0, 0, 0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(-3, 3)), max_size=60))
def test_fenwick_matches_a_list(ops):
    fen, ref = Fenwick(31), [0] * 31
    for i, delta in ops:
        fen.add(i, delta)
        ref[i] += delta
        assert fen.prefix(i + 1) == sum(ref[: i + 1]) and fen.total == sum(ref)


# -- KV stream --------------------------------------------------------------------------------------
@st.composite
def kv_requests(draw, max_requests=14, max_blocks=6):
    """Requests as block-content lists over a tiny alphabet, so prefixes are shared often."""
    return draw(st.lists(st.lists(st.integers(0, 2), max_size=max_blocks), max_size=max_requests))


def chain_keys(requests):
    ids: dict[tuple, int] = {}
    return [[ids.setdefault(tuple(r[: i + 1]), len(ids)) for i in range(len(r))] for r in requests]


def pool_misses(requests, num_blocks, bs=2):
    """Replay requests one at a time on the real BlockPool; a miss = a full block to recompute."""
    pool, misses = BlockPool(num_blocks, bs), 0
    for r in requests:
        tokens = [c for c in r for _ in range(bs)]
        hits, parent = pool.match_prefix(tokens)
        pool.acquire(hits)
        new = pool.allocate(len(r) - len(hits))
        for i, b in enumerate(new):
            j = len(hits) + i
            parent = pool.register(b, parent, tokens[j * bs : (j + 1) * bs])
        pool.release(hits + new)
        pool.check_integrity()
        misses += len(new)
    return misses


@SETTINGS
@given(kv_requests())
def test_kv_curve_equals_block_pool_and_brute_force(requests):
    keys = chain_keys(requests)
    distinct = len({k for r in keys for k in r})
    top = distinct + 2
    m = kv_miss_curve(keys, top)
    later = kv_miss_curve(keys, top, evict_tail_first=False)
    widest = max([len(r) for r in keys] + [1])
    for blocks in range(widest, top + 1):
        assert m[blocks] == brute_lru(keys, blocks, order=lambda r: list(r)[::-1]) == pool_misses(requests, blocks)
        assert later[blocks] == brute_lru(keys, blocks, order=list)
    d = kv_stack_distances(keys)
    assert len(d) == m[0] == sum(len(r) for r in keys)


def test_kv_tail_first_keeps_prefixes_later_first_does_not():
    # request A = blocks a0 a1 a2; then B (unrelated, 2 blocks); then A again, pool of 3 blocks.
    a, b = [10, 11, 12], [20, 21]
    reqs = [a, b, a]
    # tail first: B evicts a2 and a1 (least recent), A's prefix a0 survives -> A recomputes 2 blocks
    assert kv_miss_curve(reqs, 3)[3] == 3 + 2 + 2 == pool_misses([[0, 1, 2], [3, 4], [0, 1, 2]], 3)
    # later-is-newer: B evicts a0 and a1, keeping a2, which a prefix cache cannot use (its head is gone):
    # the curve counts 2 misses for the second A, but the pool must recompute all 3 blocks
    assert kv_miss_curve(reqs, 3, evict_tail_first=False)[3] == 3 + 2 + 2
    assert kv_stack_distances(reqs, evict_tail_first=False).tolist()[-3:] == [5, 4, 3]
    assert kv_stack_distances(reqs).tolist()[-3:] == [3, 4, 5]
    # duplicate keys within one request are one block
    assert kv_stack_distances([[5, 5, 6]]).tolist() == [COLD, COLD]
