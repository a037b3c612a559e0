"""Miss policies compose with residencies: a new policy is one registered class, and the executor runs and counts
whatever plan it makes (here a trivial one, registered by the test, that stages every miss and keeps nothing)."""

from __future__ import annotations

import pytest
import torch

from tests.core.experts.stores import paged_store, resident_store
from tests.core.experts.test_expert_major import bank, batch
from wisp.core.experts.miss_policies import MISS_POLICIES, MissPolicy, register_policy
from wisp.core.experts.residency import LruSlots
from wisp.core.experts.serve_plan import Serve, ServePlan
from wisp.core.experts.store import ExpertStore


@pytest.fixture
def stage_everything():
    """A policy registered for one test: every routed expert not held is staged (copied once, never kept)."""

    @register_policy("stage-everything")
    class StageEverything(MissPolicy):
        def assign(self, step, residency, cpu, staging):
            serve = {e: Serve.HELD if residency.holds(e) else Serve.STAGE for e in step.order}
            return ServePlan(step.order, step.counts, serve, staged=tuple(e for e in step.order if serve[e] is Serve.STAGE))

    yield StageEverything
    del MISS_POLICIES["stage-everything"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_registered_policy_runs_through_the_one_executor(stage_everything, dtype):
    n, k, cap = 8, 2, 3
    host = bank(n, dtype, 5)
    store = ExpertStore(LruSlots(host, torch.device("cpu"), cap), MISS_POLICIES["stage-everything"](), mode="test")
    resident, paged = resident_store({name: t.clone() for name, t in host.items()}), paged_store(host, cap, "cpu")
    routed = 0
    for seed in range(4):
        hidden, ids, weights = batch(n, 3, k, seed, dtype)
        out = store.forward(hidden, ids, weights)
        assert torch.equal(out, resident.forward(hidden, ids, weights))  # the same bits, whoever serves
        assert torch.equal(out, paged.forward(hidden, ids, weights))
        routed += len(set(ids.flatten().tolist()))
    c = store.counters  # staged every time, kept nothing: every routed expert a miss and a load
    assert (c.steps, c.hits, c.misses, c.loads, c.evictions) == (4, 0, routed, routed, 0)
    assert c.bytes_h2d == routed * store.expert_bytes and store.residency.pager.resident_experts() == []
