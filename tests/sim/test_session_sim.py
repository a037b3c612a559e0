"""Agent sessions as controller-simulation streams (`wisp.sim.session_sim`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wisp.plan.miss_curves import COLD, expert_miss_curve, stack_distances
from wisp.sim.controller_sim import misses
from wisp.sim.session_sim import session_requests
from wisp.trace.format import RoutingTrace
from wisp.trace.kv_trace import KVTrace, read_kv_trace

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "agent_sessions"


def routing(tokens=7, layers=2, k=2, n=6, seed=0) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    ids = np.stack([[rng.choice(n, k, replace=False) for _ in range(layers)] for _ in range(tokens)]).astype(np.int16)
    return RoutingTrace(ids, layers=list(range(layers)), num_experts=n)


def kv(turns: list[tuple[str, int, int]], block_size=4) -> KVTrace:
    t = KVTrace(block_size)
    for session, prompt, output in turns:
        t.add(session, prompt, output)
    return t


def test_two_workflows_back_to_back():
    a = kv([("s0", 8, 3), ("s0", 17, 2)])  # the second turn re-reads the first one's two blocks
    b = kv([("s0", 8, 1)])  # same session name in another workflow: its blocks are not shared
    tr = routing()
    reqs = session_requests(tr, [("a", a), ("b", b)], max_tokens=100)
    assert [r.workflow for r in reqs] == ["a", "a", "b"]
    assert [np.count_nonzero(r.kv_distances == COLD) for r in reqs] == [2, 2, 2]
    assert [r.tokens for r in reqs] == [3 + 8, 2 + 2 * 4 + 1, 1 + 8]
    # experts: each token brings k references per layer; summed over requests the misses at every cap
    # are the LRU curve of the cyclic token stream, layer by layer
    assert all(len(r.expert_distances) == r.tokens * 2 * 2 for r in reqs)
    total = sum(r.tokens for r in reqs)
    for cap in range(1, 7):
        want = sum(expert_miss_curve([tr.steps(l, per_token=True)[t % 7] for t in range(total)], 6)[cap] for l in (0, 1))
        assert sum(misses(r.expert_distances, cap) for r in reqs) == want


def test_expert_distances_of_many_periods_equal_the_direct_computation():
    """The stream is cut from only two periods of the routing trace (later periods repeat the second)."""
    tr = routing(tokens=5, layers=2, seed=3)
    reqs = session_requests(tr, [("a", kv([("s", 4 * i, 1 + i) for i in range(1, 9)]))], max_tokens=100)
    total = sum(r.tokens for r in reqs)
    assert total > 5 * tr.num_tokens
    direct = [stack_distances([tr.steps(l, per_token=True)[t % 5] for t in range(total)]) for l in (0, 1)]
    start = [0, 0]
    for r in reqs:
        want = []
        for j, d in enumerate(direct):
            want.append(d[start[j] : start[j] + 2 * r.tokens])  # k = 2 references per token
            start[j] += 2 * r.tokens
        assert np.array_equal(r.expert_distances, np.concatenate(want))


def test_tokens_are_capped():
    reqs = session_requests(routing(), [("a", kv([("s", 40, 30)]))], max_tokens=16)
    assert reqs[0].tokens == 16 and len(reqs[0].expert_distances) == 16 * 4


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not here")
def test_the_shared_agentinstruct_sessions_make_a_stream():
    os_kv = read_kv_trace(SHARED / "agentinstruct_os_sample5.json")
    reqs = session_requests(routing(), [("os", os_kv)], max_tokens=64)
    assert len(reqs) == len(os_kv.requests) and all(0 < r.tokens <= 64 for r in reqs)
    assert sum(np.count_nonzero(r.kv_distances != COLD) for r in reqs) > 0  # later turns re-read history
