"""Property tests of `ExpertPager` against a plain-Python LRU model.

The model (`LRUModel`) is an OrderedDict LRU cache of capacity C, written independently of the pager:
a step is a list of expert ids in touch order (an id repeated counts at its last place, as
`wisp.core.experts.recency` defines it), touched in that order; the misses, in ascending id order, take the
lowest empty slot if there is one, otherwise the slot of the least recently used resident expert that the step does not need. Random routing sequences are replayed on
both and compared after every step (residency, slot map, evictions, counters, slot bytes).
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.core.experts.counters import ExpertCounters
from tests.helpers import demo_routing
from wisp.core.experts.pager import ExpertPager

SETTINGS = settings(max_examples=80, deadline=None)

# (name, per-expert shape, dtype): "two" = float32 gate_up/down; "fp8" = FP8 weights + float32 scales
TENSOR_SETS = {
    "two": [("gate_up", (4, 3), torch.float32), ("down", (3, 2), torch.float32)],
    "fp8": [
        ("gate_up", (4, 3), torch.float8_e4m3fn),
        ("down", (3, 2), torch.float8_e4m3fn),
        ("scale", (2,), torch.float32),
    ],
}


def make_host(n: int, kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random host masters; element 0 of every expert encodes its id, so no two experts share bytes."""
    g = torch.Generator().manual_seed(seed)
    host = {}
    for name, shape, dtype in TENSOR_SETS[kind]:
        t = torch.randn((n, *shape), generator=g)
        t.view(n, -1)[:, 0] = torch.arange(n, dtype=torch.float32) + 1.0  # exact in fp8 up to 16
        host[name] = t.to(dtype)
    return host


def expert_nbytes(host: dict[str, torch.Tensor]) -> int:
    return sum(t[0].numel() * t.element_size() for t in host.values())


class LRUModel:
    """Reference LRU: `lru` maps resident expert -> slot, least recently used first."""

    def __init__(self, capacity: int, expert_bytes: int):
        self.capacity = capacity
        self.expert_bytes = expert_bytes
        self.lru: OrderedDict[int, int] = OrderedDict()
        self.c = dict(hits=0, misses=0, evictions=0, loads=0, bytes_h2d=0, steps=0, cpu_computed=0, prefetched=0)

    def step(self, experts) -> tuple[list[int], list[int]]:
        touch = list(dict.fromkeys(reversed(experts)))[::-1]  # each id at its last place
        need = sorted(touch)
        assert len(need) <= self.capacity
        misses = [e for e in need if e not in self.lru]
        evicted = []
        for e in misses:
            used = set(self.lru.values())
            free = [s for s in range(self.capacity) if s not in used]
            if free:
                slot = free[0]
            else:
                victim = next(x for x in self.lru if x not in need)  # LRU among the non-needed
                slot = self.lru.pop(victim)
                evicted.append(victim)
            self.lru[e] = slot
        for e in touch:
            self.lru.move_to_end(e)
        self.c["steps"] += 1
        self.c["hits"] += len(need) - len(misses)
        self.c["misses"] += len(misses)
        self.c["loads"] += len(misses)
        self.c["evictions"] += len(evicted)
        self.c["bytes_h2d"] += len(misses) * self.expert_bytes
        return misses, evicted


@st.composite
def routing(draw):
    n = draw(st.integers(2, 16))
    cap = draw(st.integers(1, n))
    step = st.sets(st.integers(0, n - 1), min_size=1, max_size=cap)
    steps = draw(st.lists(step, min_size=1, max_size=40))
    return n, cap, steps


def assert_consistent(pager: ExpertPager) -> None:
    """Independent of check_integrity: slot_of/expert_in_slot inverse, expert_map == slot_of, slot bytes == master bytes."""
    n, c = pager.num_experts, pager.capacity
    assert len(pager.slot_of) == n and len(pager.expert_in_slot) == c
    for e, s in enumerate(pager.slot_of):
        assert s == -1 or (0 <= s < c and pager.expert_in_slot[s] == e)
    for s, e in enumerate(pager.expert_in_slot):
        assert e == -1 or (0 <= e < n and pager.slot_of[e] == s)
    assert pager.expert_map.dtype == torch.int32
    assert pager.expert_map.tolist() == pager.slot_of
    for s, e in enumerate(pager.expert_in_slot):
        if e >= 0:
            for name, master in pager.host.items():
                assert torch.equal(pager.scratch[name][s], master[e]), (s, e, name)


@pytest.mark.parametrize("kind", list(TENSOR_SETS))
@SETTINGS
@given(case=routing())
def test_pager_matches_lru_model(kind, case):
    n, cap, steps = case
    replay_against_model(make_host(n, kind), cap, steps)


@pytest.mark.parametrize("cap", [4, 6, 9, 12])
def test_pager_matches_lru_model_on_the_demo_s_trained_routing(cap):
    """The trained demo's routing over its held-out text (real locality: consecutive tokens share experts), every
    layer, one token a step."""
    trace = demo_routing()
    host = make_host(trace.num_experts, "two")
    for layer in trace.layers:
        replay_against_model(host, cap, trace.steps(layer, per_token=True)[:1500])


def replay_against_model(host: dict[str, torch.Tensor], cap: int, steps) -> None:
    """Replay `steps` on a pager and on `LRUModel`, checking them against each other after every step."""
    pager = ExpertPager(host, cap, "cpu")
    model = LRUModel(cap, expert_nbytes(host))
    map_ptr = pager.expert_map.data_ptr()
    scratch_ptrs = {k: v.data_ptr() for k, v in pager.scratch.items()}
    assert set(pager.scratch) == set(host)

    for experts in steps:
        # a touch order that is not ascending, with a duplicate (the smallest id counts last)
        arg = sorted(experts, reverse=True) + [min(experts)]
        before = set(pager.resident_experts())
        slot_before = list(pager.slot_of)
        misses, evicted = model.step(arg)

        out = pager.prepare(arg)

        assert out is pager.expert_map
        assert pager.expert_map.data_ptr() == map_ptr
        assert {k: v.data_ptr() for k, v in pager.scratch.items()} == scratch_ptrs
        pager.check_integrity()
        assert_consistent(pager)
        for e in experts:
            assert pager.slot_of[e] >= 0, f"routed expert {e} not resident"
        after = set(pager.resident_experts())
        assert after == set(model.lru), (after, set(model.lru))
        assert {e: pager.slot_of[e] for e in after} == dict(model.lru)
        # evictions: only experts the step did not need, exactly the model's LRU choice
        gone = before - after
        assert not gone & set(experts)
        assert gone == set(evicted)
        # an evicted expert's slot now holds one of this step's misses; hits did not move
        for e in gone:
            assert pager.expert_in_slot[slot_before[e]] in misses
        for e in set(experts) - set(misses):
            assert pager.slot_of[e] == slot_before[e]
        assert pager.counters.as_dict() == model.c


@SETTINGS
@given(case=routing())
def test_counters_accumulate_per_step(case):
    """bytes_h2d == misses * expert bytes; hits + misses == sum of distinct experts per step."""
    n, cap, steps = case
    host = make_host(n, "fp8")
    pager = ExpertPager(host, cap, "cpu")
    one = 4 * 3 * 1 + 3 * 2 * 1 + 2 * 4  # fp8 gate_up + fp8 down + float32 scale
    assert pager.expert_bytes == one
    for i, experts in enumerate(steps):
        pager.prepare(list(experts))
        c = pager.counters
        assert c.steps == i + 1
        assert c.hits + c.misses == sum(len(s) for s in steps[: i + 1])
        assert c.loads == c.misses
        assert c.bytes_h2d == c.misses * one
        assert c.evictions == max(0, c.misses - cap)  # slots are never emptied once filled


def test_lru_hand_trace():
    """A fixed trace, so the model itself is checked against hand-derived slots."""
    host = make_host(6, "two")
    pager = ExpertPager(host, 3, "cpu")
    pager.prepare([2, 0])  # slots: 0->e0, 1->e2 (ascending misses); LRU (touch order): 2, 0
    assert pager.expert_in_slot == [0, 2, -1]
    pager.prepare([5])  # empty slot 2; LRU: 2, 0, 5
    assert pager.expert_in_slot == [0, 2, 5]
    pager.prepare([0])  # hit; LRU: 2, 5, 0
    pager.prepare([1, 5])  # evict 2 (LRU, not needed) -> slot 1; LRU: 0, 1, 5
    assert pager.expert_in_slot == [0, 1, 5]
    pager.prepare([3, 4])  # evict 0 then 1: e3 -> slot 0, e4 -> slot 1
    assert pager.expert_in_slot == [3, 4, 5]
    assert pager.slot_of == [-1, -1, -1, 0, 1, 2]
    assert pager.counters.as_dict() == dict(hits=2, misses=6, evictions=3, loads=6, bytes_h2d=6 * 18 * 4, steps=5, cpu_computed=0, prefetched=0)
    pager.check_integrity()


def test_check_integrity_detects_corruption():
    """The byte and map checks used above are not vacuous."""
    host = make_host(4, "two")
    pager = ExpertPager(host, 2, "cpu")
    pager.prepare([1, 3])
    pager.check_integrity()
    pager.scratch["down"][0].view(-1)[0] += 1.0
    with pytest.raises(AssertionError):
        pager.check_integrity()
    pager.check_integrity(check_bytes=False)
    pager.expert_map[0] = 1
    with pytest.raises(AssertionError):
        pager.check_integrity(check_bytes=False)


@pytest.mark.parametrize("kind", list(TENSOR_SETS))
def test_too_many_experts_raises_and_leaves_state(kind):
    host = make_host(8, kind)
    pager = ExpertPager(host, 3, "cpu")
    pager.prepare([0, 1, 2])
    state = (list(pager.slot_of), list(pager.expert_in_slot), list(pager.last_used), pager.counters.as_dict())
    with pytest.raises(ValueError):
        pager.prepare([3, 4, 5, 6])
    with pytest.raises(ValueError):
        pager.prepare([0, 1, 2, 3])
    assert (pager.slot_of, pager.expert_in_slot, pager.last_used, pager.counters.as_dict()) == state
    pager.prepare([0, 0, 1, 1, 2])  # duplicates count once: fits
    assert pager.counters.hits == 3


@pytest.mark.parametrize("cap", [0, -1, 5, 100])
def test_capacity_out_of_range_raises(cap):
    with pytest.raises(ValueError):
        ExpertPager(make_host(4, "two"), cap, "cpu")


@pytest.mark.parametrize("cap", [1, 4])
def test_capacity_bounds_accepted(cap):
    pager = ExpertPager(make_host(4, "two"), cap, "cpu")
    assert pager.capacity == cap and all(t.shape[0] == cap for t in pager.scratch.values())
    assert pager.slot_of == [-1] * 4 and pager.expert_map.tolist() == [-1] * 4
    assert pager.counters == ExpertCounters()


def test_mismatched_expert_dims_raise():
    with pytest.raises(ValueError):
        ExpertPager({"gate_up": torch.zeros(4, 2), "down": torch.zeros(5, 2)}, 2, "cpu")


@pytest.mark.parametrize("bad", [[-1], [4], [0, 7]])
def test_out_of_range_expert_ids_raise_and_leave_state(bad):
    pager = ExpertPager(make_host(4, "two"), 2, "cpu")
    pager.prepare([1])
    with pytest.raises(ValueError, match="expert ids"):
        pager.prepare(bad)
    assert pager.resident_experts() == [1]
    pager.check_integrity()
