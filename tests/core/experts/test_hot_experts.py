"""HotExperts: a layer's most-routed experts held on the device. The bank always holds its experts' exact
bytes, the map and its inverse agree, a refresh fills every slot it can and swaps only a newcomer whose lead pays
for its copy and is more than noise, keeps a held expert in its slot and copies only newcomers; stale experts
decay out; routing with no locality leaves the set nearly still, and a real shift moves it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.core.experts.hot_experts import REFRESH_EVERY, HotExperts


def masters(n: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"gate_up": torch.randn((n, 6, 4), generator=g), "down": torch.randn((n, 4, 3), generator=g)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-1, 7), min_size=1, max_size=4), min_size=1, max_size=25),
       st.integers(1, 8), st.sampled_from([1.0, 0.9, 0.5]))
def test_a_refresh_holds_the_top_scores_and_copies_only_newcomers(steps, capacity, decay):
    hot = HotExperts(masters(), capacity, torch.device("cpu"), decay=decay)
    for ids in steps:
        before = {e: s for s, e in enumerate(hot.expert_in_slot) if e >= 0}
        hot.observe(np.array(ids))
        copied = hot.refresh()
        hot.check_integrity()
        outsiders = [e for e in hot.ranked() if e not in hot.held]
        assert not outsiders or -1 not in hot.expert_in_slot  # no slot left empty while a routed expert waits
        if outsiders and hot.held:
            weakest = min(hot.held, key=lambda e: (hot.scores[e], -e))
            assert not hot.worth_swapping(outsiders[0], weakest)
        assert copied == len(hot.held - set(before))
        assert all(hot.expert_in_slot[s] == e for e, s in before.items() if e in hot.held)  # kept where it was
        assert -1 not in hot.held and len(hot.held) <= capacity


def test_ties_go_to_the_lower_id_the_unrouted_wait_and_the_stale_decay_out():
    hot = HotExperts(masters(), 2, torch.device("cpu"), decay=0.9)
    hot.observe(np.array([[6, 3, 6]]))
    hot.observe(np.array([[3]]))
    assert hot.ranked() == [3, 6]  # equal scores: the lower id first
    assert hot.refresh() == 2 and hot.held == {3, 6}  # empty slots take whatever is routed, with no margin
    for _ in range(40):
        hot.observe(np.array([5, 3]))
    assert hot.ranked()[:2] == [3, 5] and hot.worth_swapping(5, 6)  # 6's score decayed 40 times
    assert hot.refresh() == 1 and hot.held == {3, 5}
    assert hot.copies == 3
    hot.check_integrity()
    one = HotExperts(masters(), 4, torch.device("cpu"))
    one.observe(np.array([2]))
    assert one.ranked() == [2] and one.refresh() == 1 and one.expert_in_slot.count(-1) == 3


def test_a_lead_within_noise_does_not_swap():
    """Decayed by 0.99 over many steps (a window of 100 steps, squared weights 50.25): 12 against 10 pairs is a
    lead of 0.02 pairs a step, 1.28 pairs until the next refresh (it would pay the copy), but within noise
    (2 standard deviations: 2 x sqrt(22 x 0.5025) = 6.6); 40 against 10 is past both."""
    hot = HotExperts(masters(), 1, torch.device("cpu"), decay=0.99)
    hot.steps = 10_000
    hot.scores[0], hot.scores[1] = 10.0, 12.0
    assert 2.0 / 100 * REFRESH_EVERY > 1 and not hot.worth_swapping(1, 0)
    hot.scores[1] = 40.0
    assert hot.worth_swapping(1, 0) and not hot.worth_swapping(0, 1)


def test_a_lead_too_small_to_pay_its_copy_does_not_swap():
    """Undecayed counts over 64,000 steps: a lead of 900 pairs is 0.014 a step, 0.9 pairs until the next refresh (it
    does not pay the one copy) though far past noise (2 x sqrt(39,100) = 395); 1,100 pays it."""
    hot = HotExperts(masters(), 1, torch.device("cpu"), decay=1.0)
    hot.steps = 64_000
    hot.scores[0], hot.scores[1] = 19_100.0, 20_000.0
    assert 900 > 2 * (39_100 ** 0.5) and not hot.worth_swapping(1, 0)
    hot.scores[1] = 20_200.0
    assert hot.worth_swapping(1, 0)


def test_routing_with_no_locality_leaves_the_set_nearly_still_and_a_shift_moves_it():
    """Uniform i.i.d. routing (Qwen3-30B-A3B's 128 experts, top 8, 62 held): once the set is full (step 16),
    refreshes copy a few experts (the top-62 rule copied 18-29 at each, on the same routing); then the routing
    moves to 16 experts and the set takes them in within two refreshes."""
    rng = np.random.default_rng(0)
    hot = HotExperts({"w": torch.zeros((128, 1))}, 62, torch.device("cpu"))
    for step in range(1, 321):
        hot.observe(rng.choice(128, size=(1, 8), replace=False))
        if hot.refresh_due():
            hot.refresh()
        if step == 16:
            assert hot.expert_in_slot.count(-1) == 0 and hot.copies == 62
    assert hot.copies - 62 <= 20  # over the five refreshes at steps 64-320: at most 4 a refresh
    for step in range(321, 321 + 2 * REFRESH_EVERY):
        hot.observe(rng.choice(range(40, 56), size=(1, 8), replace=False))
        if hot.refresh_due():
            hot.refresh()
    assert set(range(40, 56)) <= hot.held


def test_refreshes_come_after_steps_1_4_and_16_then_every_64th():
    hot = HotExperts(masters(), 2, torch.device("cpu"))
    due = []
    for step in range(1, 200):
        hot.observe(np.array([step % 8]))
        if hot.refresh_due():
            due.append(step)
    assert due == [1, 4, 16, 64, 128, 192]


@pytest.mark.parametrize("capacity, decay", [(0, 0.9), (9, 0.9), (2, 0.0), (2, 1.5)])
def test_bad_sizes_are_refused(capacity, decay):
    with pytest.raises(ValueError):
        HotExperts(masters(), capacity, torch.device("cpu"), decay=decay)
