"""Counters come from serve plans in one place (`wisp.core.experts.serve_plan.tally`): its rule on plans built by
hand, and, over random routing, every preset's store counts each routed expert once (a hit or a miss) whoever
serves it, and moves bytes only for what crosses the link."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.experts.stores import (StagingBuffers, hybrid_store, hybrid_zero_copy_store, offload_store, paged_store,
                               resident_store, zero_copy_store, SharedLayerBuffer)
from tests.core.experts.test_expert_major import bank
from wisp.core.experts.counters import ExpertCounters
from wisp.core.experts.serve_plan import Serve, ServePlan, tally
from wisp.core.learners.hybrid_costs import HybridCosts

CPU_CHEAP = HybridCosts(copy_s=1.0, cpu_rows=(1, 64), cpu_s_at_rows=(0.1, 6.4))


def test_tally_counts_each_way_as_the_contract_says():
    counts = (0, 3, 1, 2, 5, 0)  # pairs per expert
    serve = {1: Serve.HELD, 2: Serve.COPY, 3: Serve.STAGE, 4: Serve.IN_PLACE, 5: Serve.CPU, 0: Serve.HELD}
    plan = ServePlan((0, 1, 2, 3, 4, 5), counts, serve, loads=((2, 0),), staged=(3,), on_cpu=(5,),
                     filled=frozenset({0, 5}), evictions=1)  # 0 copied into the bank for this step; 5 too, unused
    plan.check_integrity()
    c = ExpertCounters()
    tally(c, plan, expert_bytes=10)
    assert (c.steps, c.hits, c.misses, c.evictions, c.cpu_computed) == (1, 1, 5, 1, 1)  # 0 was filled: a miss
    assert c.loads == 2 + 2  # the COPY and the STAGE, and the two experts filled
    assert c.bytes_h2d == (4 + counts[4]) * 10  # every load once, the in-place expert once per pair


PRESETS = {
    "resident": lambda h: resident_store({k: t.clone() for k, t in h.items()}),
    "paged": lambda h: paged_store(h, 3, "cpu"),
    "offload": lambda h: offload_store(h, SharedLayerBuffer(h, torch.device("cpu")), True),
    "zero-copy": lambda h: zero_copy_store(h, "cpu", StagingBuffers(h, torch.device("cpu"))),
    "hybrid": lambda h: hybrid_store(h, 3, "cpu", CPU_CHEAP),
    "hybrid-zero-copy": lambda h: hybrid_zero_copy_store(h, "cpu", CPU_CHEAP, StagingBuffers(h, torch.device("cpu")), hot=2),
}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.lists(st.integers(0, 7), min_size=2, max_size=2, unique=True), min_size=1, max_size=6),
                min_size=1, max_size=5), st.sampled_from(sorted(PRESETS)))
def test_every_routed_expert_is_one_hit_or_one_miss_and_bytes_follow_the_link(steps, mode):
    host = bank(8, torch.float32, 3)
    store = PRESETS[mode](host)
    ref = resident_store({k: t.clone() for k, t in host.items()})
    g = torch.Generator().manual_seed(len(steps))
    routed = 0
    for rows in steps:
        ids = torch.tensor(rows)
        hidden = torch.randn(len(rows), host["down"].shape[1], generator=g)
        weights = torch.softmax(torch.randn(len(rows), 2, generator=g), -1)
        assert torch.equal(store.forward(hidden, ids, weights), ref.forward(hidden, ids, weights))  # CPU: bit for bit
        routed += len(set(ids.flatten().tolist()))
    c = store.counters
    assert c.steps == len(steps) and c.hits + c.misses == routed and c.cpu_computed <= c.misses
    assert c.bytes_h2d % store.expert_bytes == 0 and c.bytes_h2d >= c.loads * store.expert_bytes
    if mode in ("resident",):
        assert c.misses == c.loads == c.bytes_h2d == 0
    if mode in ("paged", "offload", "hybrid"):  # nothing read in place: bytes are exactly the loads
        assert c.bytes_h2d == c.loads * store.expert_bytes
