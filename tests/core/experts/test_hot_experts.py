"""HotExperts: a layer's most-routed experts held on the device. The bank always holds its experts' exact
bytes, the map and its inverse agree, a refresh holds the top scores, keeps a held expert in its slot and
copies only newcomers; stale experts decay out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.core.experts.hot_experts import HotExperts


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
        assert hot.held == set(hot.top())
        assert copied == len(hot.held - set(before))
        assert all(hot.expert_in_slot[s] == e for e, s in before.items() if e in hot.held)  # kept where it was
        assert -1 not in hot.held and len(hot.held) <= capacity


def test_the_top_breaks_ties_by_id_skips_the_unrouted_and_lets_the_stale_decay_out():
    hot = HotExperts(masters(), 2, torch.device("cpu"), decay=0.5)
    hot.observe(np.array([[6, 3]]))
    assert hot.top() == [3, 6]  # equal scores: the lower id first
    hot.refresh()
    for _ in range(3):
        hot.observe(np.array([5, 3]))
    assert hot.top() == [3, 5]  # 6's score halved three times
    assert hot.refresh() == 1 and hot.held == {3, 5}
    assert hot.copies == 3
    hot.check_integrity()
    one = HotExperts(masters(), 4, torch.device("cpu"))
    one.observe(np.array([2]))
    assert one.top() == [2] and one.refresh() == 1 and one.expert_in_slot.count(-1) == 3


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
