"""ARC with set steps: on one-expert steps it is the textbook ARC (a direct transcription of Megiddo and
Modha's pseudocode), its lists keep ARC's bounds on set steps, and it never evicts a needed expert."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.plan.miss_curves import expert_sets
from wisp.sim.adaptive_replacement import ArcLists, arc_misses

SETTINGS = settings(max_examples=80, deadline=None)


def textbook_arc(requests: list[int], capacity: int) -> int:
    """ARC as in the paper's Fig. 4 (one id per request), with plain lists, least recent first."""
    recent, frequent, recent_ghosts, frequent_ghosts = [], [], [], []
    target = 0.0
    misses = 0

    def replace(x):
        if recent and (len(recent) > target or (x in frequent_ghosts and len(recent) == target)):
            recent_ghosts.append(recent.pop(0))
        else:
            frequent_ghosts.append(frequent.pop(0))

    for x in requests:
        if x in recent or x in frequent:
            (recent if x in recent else frequent).remove(x)
            frequent.append(x)
            continue
        misses += 1
        if x in recent_ghosts:
            target = min(capacity, target + max(len(frequent_ghosts) / len(recent_ghosts), 1))
            replace(x)
            recent_ghosts.remove(x)
            frequent.append(x)
        elif x in frequent_ghosts:
            target = max(0, target - max(len(recent_ghosts) / len(frequent_ghosts), 1))
            replace(x)
            frequent_ghosts.remove(x)
            frequent.append(x)
        else:
            if len(recent) + len(recent_ghosts) == capacity:
                if len(recent) < capacity:
                    recent_ghosts.pop(0)
                    replace(x)
                else:
                    recent.pop(0)
            else:
                total = len(recent) + len(frequent) + len(recent_ghosts) + len(frequent_ghosts)
                if total >= capacity:
                    if total == 2 * capacity:
                        frequent_ghosts.pop(0)
                    replace(x)
            recent.append(x)
    return misses


@SETTINGS
@given(st.integers(1, 6), st.lists(st.integers(0, 9), max_size=60))
def test_singleton_steps_are_textbook_arc(capacity, requests):
    assert arc_misses([[e] for e in requests], capacity) == textbook_arc(requests, capacity)


@SETTINGS
@given(st.data())
def test_set_steps_keep_the_bounds_and_the_needed_experts(data):
    capacity = data.draw(st.integers(1, 6))
    steps = data.draw(st.lists(st.lists(st.integers(0, 11), max_size=capacity), max_size=40))
    lists = ArcLists(capacity)
    for need in expert_sets(steps, None):
        needed = set(need)
        for expert in need:
            lists.request(expert, needed)
        assert all(lists.resident(e) for e in need)  # the whole step is resident together
        residents = set(lists.recent) | set(lists.frequent)
        ghosts = set(lists.recent_ghosts) | set(lists.frequent_ghosts)
        assert len(residents) <= capacity and not residents & ghosts
        assert len(lists.recent) + len(lists.recent_ghosts) <= capacity
        assert len(residents) + len(ghosts) <= 2 * capacity
        assert 0 <= lists.target_recent <= capacity


def test_arc_keeps_a_frequent_expert_through_a_scan():
    # 0 is used over and over; a one-off scan of 1..6 passes through. LRU at C = 2 loses 0 at every scan
    # step; ARC keeps it in T2 (frequency list) and lets the scan churn T1.
    steps = [[0]] * 4 + [[e] for e in range(1, 7)] + [[0]]
    assert arc_misses(steps, 2) == 7  # 0 once, the six scan experts; 0 still resident at the end
