"""LoadController on a simulated clock: the wait bound holds, nobody starves, everyone decodes when the joint
working set fits, and the answer is always a non-empty subset of the ready requests in their order."""

from dataclasses import dataclass

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from wisp.engine.load_control.controller import LoadController
from wisp.engine.load_control.step_costs import DecodeStepCosts
from wisp.engine.load_control.working_sets import WorkingSets

L, N, K, WINDOW = 2, 16, 2, 8


@dataclass
class Ready:
    request_id: str
    last_token_time: float


def rows_cycling(experts: list[list[int]]) -> np.ndarray:
    """WINDOW decode rows [WINDOW, L, K] that route, per layer, to exactly `experts[layer]` (cycled K at a time)."""
    rows = np.zeros((WINDOW, L, K), dtype=np.int16)
    for layer, chosen in enumerate(experts):
        for t in range(WINDOW):
            rows[t, layer] = [chosen[(t * K + j) % len(chosen)] for j in range(K)]
    return rows


def controller(sets: dict[str, list[list[int]]], caps, max_wait_s: float) -> LoadController:
    ws = WorkingSets(L, N, K, window=WINDOW)
    for rid, experts in sets.items():
        ws.observe(rid, rows_cycling(experts))
    return LoadController(ws, DecodeStepCosts(copy_s=1e-3, prior_compute_s=1e-2), caps, max_wait_s)


def simulate(ctl: LoadController, rids: list[str], steps: int):
    """Run `steps` decode steps on a clock that advances by each step's predicted seconds; returns the chosen
    sets and each request's gaps between its tokens (the first gap counted from time 0, all ready then)."""
    now, ready = 0.0, [Ready(r, 0.0) for r in rids]
    chosen_sets, gaps = [], {r: [] for r in rids}
    for _ in range(steps):
        chosen = ctl.choose(ready, now)
        chosen_sets.append([s.request_id for s in chosen])
        now += ctl.costs.step_s(len(chosen), ctl._misses([s.request_id for s in chosen]))
        for s in chosen:
            gaps[s.request_id].append(now - s.last_token_time)
            s.last_token_time = now
    for s in ready:  # a request still waiting at the end has waited this long
        gaps[s.request_id].append(now - s.last_token_time)
    return chosen_sets, gaps


working_set = st.lists(st.integers(0, N - 1), min_size=K, max_size=N, unique=True)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(working_set, working_set), min_size=2, max_size=6),
       st.integers(K, N), st.floats(0.15, 1.0))
# a turn's new set, with a longer step than the set before it, left a request its lead had not warned past the bound
@example([([0, 1], [0, 1]), ([0, 1], [0, 7]), ([7, 0], [0, 1, 2, 8, 9]), ([0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6]),
          ([0, 1, 2, 3, 4, 5, 9, 10], [0, 1]), ([0, 1, 2, 8, 6], [0, 1])], 2, 1.0)
# several requests came due in the same step, and their set's step was longer than any one's lead
@example([([0, 1], [0, 1]), ([0, 1], [0, 1]), ([0, 1], [0, 1]), ([0, 1], [0, 1, 2]),
          ([0, 1], [0, 1, 2, 3, 4, 5, 6, 7, 8]), ([0, 1, 2, 3, 4, 5], [0, 1, 2, 3])], 2, 1.0)
def test_the_wait_bound_holds_and_nobody_starves(sets, cap, max_wait_s):
    rids = [f"r{i}" for i in range(len(sets))]
    ctl = controller({r: [list(a), list(b)] for r, (a, b) in zip(rids, sets)}, [cap] * L, max_wait_s)
    chosen_sets, gaps = simulate(ctl, rids, steps=400)
    for chosen in chosen_sets:
        assert chosen and chosen == [r for r in rids if r in chosen]  # non-empty, in the ready order
    for rid, waits in gaps.items():
        assert len(waits) > 1, f"{rid} never decoded"
        assert max(waits) <= max_wait_s + 1e-9, (rid, max(waits), max_wait_s)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(working_set, working_set), min_size=2, max_size=6), st.integers(K, N))
def test_everyone_decodes_when_the_joint_working_set_fits(sets, cap):
    rids = [f"r{i}" for i in range(len(sets))]
    experts = {r: [list(a), list(b)] for r, (a, b) in zip(rids, sets)}
    union = [len(set().union(*(experts[r][layer] for r in rids))) for layer in range(L)]
    ctl = controller(experts, [max(cap, *union)] * L, 1.0)
    chosen_sets, _ = simulate(ctl, rids, steps=50)
    assert all(chosen == rids for chosen in chosen_sets)


def test_thrashing_requests_take_turns_and_overlapping_ones_go_together():
    # a and b share their experts; c and d each need all the slots
    sets = {"a": [[0, 1, 2, 3]] * L, "b": [[0, 1, 2, 3]] * L, "c": [list(range(4, 10))] * L, "d": [list(range(10, 16))] * L}
    ctl = controller(sets, [6] * L, 1.0)
    chosen_sets, gaps = simulate(ctl, list(sets), steps=300)
    assert all(len(c) < 4 for c in chosen_sets)  # never everyone: the union is 16 > 6
    assert any(c == ["a", "b"] for c in chosen_sets)  # overlapping working sets decode together
    assert not any({"c", "d"} <= set(c) for c in chosen_sets)  # two that each fill the slots never do
    assert all(max(w) <= 1.0 for w in gaps.values())
    state = ctl.state()
    assert state.switches > 2 and sum(state.width_steps.values()) == 300


def test_a_fixed_width_takes_turns_in_groups_of_that_width_within_the_bound():
    sets = {f"r{i}": [[0, 1]] * L for i in range(5)}  # everything fits: only the width holds requests back
    ws = WorkingSets(L, N, K, window=WINDOW)
    for rid, experts in sets.items():
        ws.observe(rid, rows_cycling(experts))
    ctl = LoadController(ws, DecodeStepCosts(copy_s=1e-3, prior_compute_s=1e-2), [N] * L, 0.5, fixed_width=2)
    chosen_sets, gaps = simulate(ctl, list(sets), steps=300)
    assert all(len(c) == 2 for c in chosen_sets)
    assert all(len(w) > 1 and max(w) <= 0.5 + 1e-9 for w in gaps.values())


def test_everyone_together_is_looked_at_again_when_working_sets_drift_apart():
    """Everyone fits at first (all route to experts 0 and 1); then a and b move to 0-3 and c and d to 4-7, with 4
    slots: everyone together would thrash, the pairs fit. No request arrives or leaves, yet within a bound the
    controller stops decoding everyone (it used to keep that set until someone left)."""
    rids = ["a", "b", "c", "d"]
    ctl = controller({r: [[0, 1]] * L for r in rids}, [4] * L, 0.5)
    ctl.costs.copy_s = 1e-2  # a miss costs as much as a step's compute: thrashing would show
    chosen_sets, _ = simulate(ctl, rids, steps=20)
    assert all(c == rids for c in chosen_sets)
    for rid, experts in {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3], "c": [4, 5, 6, 7], "d": [4, 5, 6, 7]}.items():
        ctl.ws.observe(rid, rows_cycling([experts] * L))
    chosen_sets, gaps = simulate(ctl, rids, steps=300)
    assert {tuple(c) for c in chosen_sets[-100:]} <= {("a", "b"), ("c", "d")}
    assert all(max(w) <= 0.5 + 1e-9 for w in gaps.values())
