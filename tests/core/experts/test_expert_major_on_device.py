"""Wide steps decided and run on the device (`wisp.core.experts.expert_major_on_device`), against the eager path.

Two paged stores over the same masters see the same stream of steps, narrow and wide (more distinct experts than
the slots): one runs `forward` (decided on the host, `wisp.core.experts.expert_major`), the other
`forward_graph_safe` (decided on the device, no host sync). After every step:
- both outputs are torch.equal to the resident bank's;
- the slots, map, touch numbers and counters are the same (each miss counted, and copied, once).
On the GPU machine the masters are pinned and read in place; elsewhere the kernels run under Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.experts.stores import StagingBuffers, paged_store, resident_store
from tests.core.experts.test_expert_major import bank, batch, streams

pytest.importorskip("triton")
ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def stores(n, cap, dtype, seed):
    host = bank(n, dtype, seed)
    if ON_GPU:
        host = {name: t.pin_memory() for name, t in host.items()}
    resident = resident_store({name: t.to(DEVICE) for name, t in host.items()})
    eager = paged_store(host, cap, DEVICE, StagingBuffers(host, DEVICE))
    on_device = paged_store(host, cap, DEVICE, StagingBuffers(host, DEVICE))
    return resident, eager, on_device


def same_state(eager, on_device):
    a, b = eager.residency.pager, on_device.residency.pager
    b.use_host()
    assert (b.slot_of, b.expert_in_slot, b.last_used, b._touch_count) == (a.slot_of, a.expert_in_slot, a.last_used,
                                                                          a._touch_count)
    assert b.counters == a.counters
    b.check_integrity()


def run_stream(n, k, cap, lengths, seed, dtype):
    resident, eager, on_device = stores(n, cap, dtype, seed)
    assert on_device.wide_in_graph
    for i, t in enumerate(lengths):
        hidden, ids, weights = (x.to(DEVICE) for x in batch(n, t, k, seed + i, dtype))
        want = resident.forward(hidden, ids, weights)
        assert torch.equal(eager.forward(hidden, ids, weights), want)
        assert torch.equal(on_device.forward_graph_safe(hidden, ids, weights), want)
        same_state(eager, on_device)
    c = on_device.counters
    assert c.loads == c.misses and c.bytes_h2d == c.misses * on_device.residency.pager.expert_bytes
    assert c.steps == len(lengths)
    return c


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(case=streams(max_tokens=8, max_steps=4), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_device_wide_steps_equal_the_eager_ones(case, dtype):
    run_stream(*case, dtype)


def test_a_wide_step_streams_several_waves_and_evicts_a_hit_it_does_not_keep():
    """16 experts, 3 slots, top-2: 6 tokens route to up to 12 experts, so up to 9 stream through the 2 staging
    rows (5 waves); a token early in a step hits a slot that a kept miss then takes."""
    c = run_stream(16, 2, 3, [1, 6, 2, 6, 1, 6], seed=7, dtype=torch.bfloat16)
    assert c.misses > 3 * 6 and c.hits > 0 and c.evictions > 0
