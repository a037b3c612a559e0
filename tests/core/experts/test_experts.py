"""Expert stores: resident, paged (any capacity, including the expert-major wide path) and offload return
torch.equal outputs for the same routing, and keep their counters and device-byte accounting.
"""

from __future__ import annotations

import pytest
import torch

from wisp.core.bank_keys import DOWN, GATE_UP
from tests.core.experts.stores import SharedLayerBuffer, offload_store, paged_store, resident_store
from wisp.core.kernels.moe import fused_moe
from wisp.core.experts.recency import touch_order

D, I = 16, 8


def make(n, t, k, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    host = {
        GATE_UP: (torch.randn(n, 2 * I, D, generator=g) * 0.5).to(dtype),
        DOWN: (torch.randn(n, D, I, generator=g) * 0.5).to(dtype),
    }
    hidden = torch.randn(t, D, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)])
    weights = torch.softmax(torch.randn(t, k, generator=g), -1).to(dtype)
    return host, hidden, ids, weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, k", [(8, 2), (16, 4)])
def test_modes_are_byte_identical(dtype, n, k):
    host, _, _, _ = make(n, 1, k, 0, dtype)
    resident = resident_store({name: t.clone() for name, t in host.items()})
    paged = [paged_store(host, cap, "cpu") for cap in sorted({k, n // 2, n})]
    buffer = SharedLayerBuffer(host, torch.device("cpu"))
    offload = offload_store(host, buffer, owns_buffer=True)
    wide = False
    for step, t in enumerate([40, 1, 1, 7, 1, 23, 1]):  # prefill-like and decode-like batches
        _, hidden, ids, weights = make(n, t, k, 100 + step, dtype)
        ref = resident.forward(hidden, ids, weights)
        assert torch.equal(ref, fused_moe(hidden, host[GATE_UP], host[DOWN], ids, weights))
        for store in paged:
            assert torch.equal(store.forward(hidden, ids, weights), ref), store.residency.pager.capacity
            store.residency.pager.check_integrity()
            wide |= len(torch.unique(ids)) > store.residency.pager.capacity
        assert torch.equal(offload.forward(hidden, ids, weights), ref)
    assert wide  # the expert-major path ran


def test_a_wide_step_counts_one_step_and_loads_each_miss_once():
    n, k, cap = 8, 2, 2
    host, hidden, ids, weights = make(n, 30, k, 1, torch.float32)
    store = paged_store(host, cap, "cpu")
    store.forward(hidden, ids, weights)
    distinct = len(torch.unique(ids))
    assert distinct > cap
    c = store.counters
    assert (c.steps, c.hits, c.misses, c.loads, c.evictions) == (1, 0, distinct, distinct, 0)
    assert c.bytes_h2d == c.misses * store.residency.pager.expert_bytes
    assert store.residency.pager.resident_experts() == sorted(touch_order(ids.tolist())[-cap:])  # what the last tokens used
    assert store.device_bytes == cap * (2 * I * D + D * I) * 4


def test_resident_and_offload_counters():
    n, k = 8, 2
    host, hidden, ids, weights = make(n, 5, k, 2, torch.float32)
    layer_bytes = n * (2 * I * D + D * I) * 4
    resident = resident_store(host)
    resident.forward(hidden, ids, weights)
    distinct = len(torch.unique(ids))
    assert resident.counters.as_dict() == dict(hits=distinct, misses=0, evictions=0, loads=0, bytes_h2d=0, steps=1, cpu_computed=0, prefetched=0)
    assert resident.device_bytes == layer_bytes
    buffer = SharedLayerBuffer(host, torch.device("cpu"))
    owner, other = offload_store(host, buffer, True), offload_store(host, buffer, False)
    owner.forward(hidden, ids, weights)
    owner.forward(hidden, ids, weights)
    assert owner.counters.as_dict() == dict(
        hits=0, misses=2 * distinct, evictions=0, loads=2 * n, bytes_h2d=2 * layer_bytes, steps=2, cpu_computed=0, prefetched=0
    )
    assert owner.device_bytes == layer_bytes and other.device_bytes == 0
