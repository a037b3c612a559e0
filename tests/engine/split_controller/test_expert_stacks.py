"""ExpertStacks (all layers at once, numpy) against the simple reference it replaces: one LruStack per
layer touched in `order_by_last_token` order; and a controller fed by either keeps the same histograms
and decides the same resizes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from wisp.core.experts.recency import order_by_last_token
from wisp.engine.split_controller.controller import ControllerConfig, SplitController
from wisp.engine.split_controller.expert_stacks import ExpertStacks
from wisp.engine.split_controller.lru_stack import LruStack
from wisp.plan.split import SplitProblem


def reference_touch(stacks: list[LruStack], rows: np.ndarray, num_experts: int) -> list[int]:
    """The per-layer Python loop: each layer's experts by last token, touched on its own LruStack."""
    distances = []
    for layer, stack in enumerate(stacks):
        last = [-1] * num_experts
        for t, ids in enumerate(rows[:, layer].tolist()):
            for e in ids:
                if e >= 0:
                    last[e] = t
        distances += stack.touch(order_by_last_token(last))
    return distances


@st.composite
def routing_streams(draw):
    layers, experts = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    k = draw(st.integers(1, min(experts, 4)))
    seed, steps = draw(st.integers(0, 2**32 - 1)), draw(st.lists(st.integers(1, 9), min_size=1, max_size=25))
    rng = np.random.default_rng(seed)
    stream = []
    for t in steps:  # each token routes k distinct experts; some rows unknown (-1)
        rows = np.stack([[rng.permutation(experts)[:k] for _ in range(layers)] for _ in range(t)])
        rows[rng.random((t, layers, k)) < 0.1] = -1
        stream.append(rows.astype(np.int64))
    return layers, experts, stream


@settings(max_examples=150, deadline=None)
@given(routing_streams())
def test_distances_match_one_lru_stack_per_layer(case):
    layers, experts, stream = case
    fast, stacks = ExpertStacks(layers, experts), [LruStack() for _ in range(layers)]
    for rows in stream:
        assert fast.touch(rows).tolist() == reference_touch(stacks, rows, experts)


def _controller(experts: int, k: int) -> SplitController:
    p = SplitProblem(budget_bytes=experts * 500 + 300 * 10, slot_bytes=1000, block_bytes=10, expert_cost=1e-3,
                     kv_cost=1e-3, min_cap=k, max_cap=experts, kv_floor=20)
    cfg = ControllerConfig(p, resolve_every=4, min_gain=0.0, half_life=50.0, min_observations=10)
    return SplitController(cfg, expert_cap=k, kv_blocks=p.kv_blocks(k))


def _drifting_steps(rng, layers: int, experts: int, k: int, steps: int = 120):
    """Steps of 1, 4 or 16 tokens routed within a working set that changes every 40 steps (a drift)."""
    for step in range(steps):
        if step % 40 == 0:
            hot = rng.permutation(experts)[: rng.integers(k, experts + 1)]
        t = int(rng.choice([1, 4, 16]))
        yield np.stack([[rng.choice(hot, k, replace=False) for _ in range(layers)] for _ in range(t)])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_a_controller_fed_either_way_decides_the_same(seed):
    rng = np.random.default_rng(seed)
    layers, experts, k = 3, 16, 2
    fast, slow = _controller(experts, k), _controller(experts, k)
    stacks, ref = ExpertStacks(layers, experts), [LruStack() for _ in range(layers)]
    for step, rows in enumerate(_drifting_steps(rng, layers, experts, k)):
        t = len(rows)
        fast.observe_experts(stacks.touch(rows), t)
        slow.observe_experts(reference_touch(ref, rows, experts), t)
        if step % 7 == 0:
            kv = rng.integers(-1, 40, size=rng.integers(0, 6))
            kv[kv == 0] = -1
            fast.observe_kv(kv)
            slow.observe_kv(kv.tolist())
        assert fast.step() == slow.step()
        assert np.array_equal(fast._experts.weights(), slow._experts.weights())
        assert np.array_equal(fast._kv.weights(), slow._kv.weights())


@settings(max_examples=150, deadline=None)
@given(routing_streams(), st.integers(1, 6))
def test_steps_touched_in_bulk_match_one_at_a_time(case, batch):
    """touch_steps over consecutive steps gives every step's distances, in order, as touch gives them
    one step at a time, and leaves the stacks in the same state."""
    layers, experts, stream = case
    bulk, single = ExpertStacks(layers, experts), ExpertStacks(layers, experts)
    for i in range(0, len(stream), batch):
        steps = stream[i : i + batch]
        one_by_one = [single.touch(rows) for rows in steps]
        distances, refs = bulk.touch_steps(np.concatenate(steps), [len(rows) for rows in steps])
        assert distances.tolist() == np.concatenate(one_by_one).tolist()
        assert refs.tolist() == [len(d) for d in one_by_one]
    assert np.array_equal(bulk._stamp.argsort(axis=1), single._stamp.argsort(axis=1))  # same order in every layer


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_a_controller_fed_in_bulk_decides_as_one_fed_every_step(seed):
    """What the live split does: steps held and fed together just before each re-solve."""
    every, held = _controller(16, 2), _controller(16, 2)
    stacks, bulk_stacks, waiting = ExpertStacks(3, 16), ExpertStacks(3, 16), []
    for rows in _drifting_steps(np.random.default_rng(seed), 3, 16, 2):
        every.observe_experts(stacks.touch(rows), len(rows))
        waiting.append(rows)
        if (held.steps + 1) % held.config.resolve_every == 0:
            tokens = [len(r) for r in waiting]
            distances, refs = bulk_stacks.touch_steps(np.concatenate(waiting), tokens)
            held.observe_expert_steps(distances, refs, tokens)
            waiting = []
            assert np.array_equal(every._experts.weights(), held._experts.weights())
            assert every._tokens.value == held._tokens.value
        assert every.step() == held.step()
    assert every.resizes == held.resizes
