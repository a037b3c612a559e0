"""Speculative prefetch: the pager's state stays consistent, outputs never change, and counts add up."""

from __future__ import annotations

import torch

from tests.core.experts.test_experts import make
from tests.core.experts.stores import paged_store, resident_store
from wisp.core.experts.pager import ExpertPager
from wisp.core.experts.prefetch import CrossLayerPrefetch, prefetch_into


def test_pager_prefetch_fills_the_least_recent_slots_and_leaves_them_least_recent():
    host = make(8, 1, 2, 0, torch.float32)[0]
    pager = ExpertPager(host, 3, "cpu")
    pager.prepare([0, 1])  # slots: 0 -> 0, 1 -> 1; slot 2 empty
    placed = pager.prefetch([1, 5, 6, 5])  # 1 is resident; 5 and 6 take the empty slot, then the LRU one (0)
    assert placed == [(5, 2), (6, 0)] and pager.resident_experts() == [1, 5, 6]
    for expert, slot in placed:
        pager.copy_into_slot(expert, slot)
    pager.publish_map()
    pager.check_integrity()
    c = pager.counters
    assert (c.prefetched, c.loads, c.evictions, c.bytes_h2d) == (2, 4, 1, 4 * pager.expert_bytes)
    pager.prepare([1, 7])  # a wrong guess is the first victim: 7 replaces 5 or 6 (last_used -1), never 1
    assert 1 in pager.resident_experts() and 7 in pager.resident_experts()
    pager.check_integrity()


def test_prefetch_changes_no_output_and_a_right_guess_is_a_hit():
    n, k, cap, layers = 16, 4, 6, 3
    banks = [make(n, 1, k, 10 + i, torch.float32)[0] for i in range(layers)]
    plain = [paged_store(b, cap, "cpu") for b in banks]
    fetched = [paged_store(b, cap, "cpu") for b in banks]
    resident = [resident_store(b) for b in banks]
    prefetch = CrossLayerPrefetch(fetched, n, k)
    for step in range(30):
        _, hidden, ids, weights = make(n, 1 + step % 3, k, 100 + step, torch.float32)
        ids = ids % 8  # a narrower set, so guesses can be right
        for layer in range(layers):
            ref = resident[layer].forward(hidden, ids, weights)
            assert torch.equal(plain[layer].forward(hidden, ids, weights), ref)
            assert torch.equal(fetched[layer].forward(hidden, ids, weights), ref)
            fetched[layer].residency.pager.check_integrity()
    assert fetched[0].counters.prefetched == 0  # nothing before the first layer
    assert sum(s.counters.prefetched for s in fetched[1:]) > 0
    for p, f in zip(plain, fetched):  # every routed expert is a hit or a miss, whoever copied it
        assert p.counters.hits + p.counters.misses == f.counters.hits + f.counters.misses
    prefetch.detach()
    assert all(s.after_step is None for s in fetched)


def test_prefetch_into_a_store_without_anything_to_fetch_does_nothing():
    host = make(8, 1, 2, 0, torch.float32)[0]
    store = paged_store(host, 4, "cpu")
    store.residency.pager.prepare([2, 3])
    assert prefetch_into(store, [2, 3]) == 0 and store.counters.prefetched == 0
