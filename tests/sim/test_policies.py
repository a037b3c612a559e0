"""Policy simulation: LRU equals the exact one-pass curve, OPT is optimal (exhaustive search) and never
worse than LRU/LFU/LRFU/ARC, LRFU follows its definition, has LFU and LRU as extremes and keeps the
inclusion property (a stack algorithm), ARC does not, static pinning is what it says; then the same
checks on the shared real traces (Mixtral all 32 layers, FLAME, OLMoE / Qwen layer 0), skipped when
../shared/data is absent."""

from __future__ import annotations

from itertools import combinations, pairwise
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import demo_routing
from wisp.core.experts.pager import ExpertPager
from wisp.plan.miss_curves import expert_miss_curve, expert_sets
from wisp.sim.policies import (
    OUT_OF_DOMAIN,
    POLICIES,
    lrfu_misses,
    miss_table,
    pinned_set,
    simulate,
)
from wisp.trace.readers import load_any

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def step_sequences(draw, max_experts=10, max_steps=30, max_set=4):
    n = draw(st.integers(1, max_experts))
    return n, draw(st.lists(st.lists(st.integers(0, n - 1), max_size=max_set), max_size=max_steps))


def widest(steps) -> int:
    return max([len(set(s)) for s in steps] + [0])


def exhaustive_min(steps, capacity) -> int:
    """Fewest misses over EVERY demand eviction choice (dynamic programming over resident sets)."""
    states = {frozenset(): 0}
    for s in steps:
        need = frozenset(s)
        nxt: dict[frozenset, int] = {}
        for res, cost in states.items():
            missing = need - res
            k = len(res) + len(missing) - capacity
            options = [res | need] if k <= 0 else [(res - set(v)) | need for v in combinations(sorted(res - need), k)]
            for o in options:
                nxt[o] = min(nxt.get(o, 1 << 30), cost + len(missing))
        states = nxt
    return min(states.values())


@SETTINGS
@given(step_sequences())
def test_lru_equals_curve_and_opt_is_best(case):
    n, steps = case
    m = expert_miss_curve(steps, n)
    distinct = len({e for s in steps for e in s})
    for c in range(max(widest(steps), 1), n + 1):
        lru, opt, lfu = (simulate(steps, c, p) for p in ("lru", "opt", "lfu"))
        assert lru == m[c]
        assert distinct <= opt <= min(lru, lfu)
    for p in ("lru", "opt", "lfu", "lrfu", "static"):  # stack algorithms (and static); ARC is not
        counts = [simulate(steps, c, p) for c in range(max(widest(steps), 1), n + 1)]
        assert all(a >= b for a, b in pairwise(counts)), p


@SETTINGS
@given(step_sequences(max_experts=8, max_steps=40, max_set=3))
def test_opt_bounds_the_frequency_aware_policies(case):
    n, steps = case
    distinct = len({e for s in steps for e in s})
    for c in range(max(widest(steps), 1), n + 1):
        opt = simulate(steps, c, "opt")
        assert distinct <= opt
        for p in ("lrfu", "arc"):
            assert opt <= simulate(steps, c, p), (p, c)


@SETTINGS
@given(step_sequences())
def test_lrfu_extremes_are_lfu_and_lru(case):
    n, steps = case
    for c in range(max(widest(steps), 1), n + 1):
        assert lrfu_misses(steps, c, 0.0) == simulate(steps, c, "lfu")  # no decay: CRF is the count
        assert lrfu_misses(steps, c, 64.0) == simulate(steps, c, "lru")  # the past is below a double's precision


def lrfu_by_definition(steps, capacity, decay_per_step):
    """LRFU straight from the definition (CRF = sum of 2^(-lambda * age) over every past reference,
    ties by least recent touch), with the resident set after every step."""
    refs: dict[int, list[int]] = {}
    last: dict[int, int] = {}
    resident: set[int] = set()
    misses, history, clock = 0, [], 0
    for t, need in enumerate(expert_sets(steps, None)):
        missing = [e for e in need if e not in resident]
        misses += len(missing)
        evict = len(resident) + len(missing) - capacity
        if evict > 0:
            def crf(e):
                return sum(2.0 ** (-decay_per_step * (t - r)) for r in refs[e])

            others = sorted((e for e in resident if e not in need), key=lambda e: (crf(e), last[e]))
            resident.difference_update(others[:evict])
        resident.update(need)
        for e in need:
            refs.setdefault(e, []).append(t)
            last[e], clock = clock, clock + 1
        history.append(frozenset(resident))
    return misses, history


@SETTINGS
@given(step_sequences(max_experts=8, max_steps=30, max_set=3))
def test_lrfu_matches_its_definition_and_is_a_stack_algorithm(case):
    n, steps = case
    for decay in (0.1, 1.0):
        runs = [lrfu_by_definition(steps, c, decay) for c in range(max(widest(steps), 1), n + 1)]
        for c, (misses, _) in zip(range(max(widest(steps), 1), n + 1), runs):
            assert lrfu_misses(steps, c, decay) == misses
        for (_, smaller), (_, larger) in pairwise(runs):  # inclusion: C slots hold a subset of C + 1's
            assert all(a <= b for a, b in zip(smaller, larger))


def test_arc_is_not_a_stack_algorithm():
    # one expert per step (plain ARC): a third slot costs a miss here, so ARC's curve is simulated per C
    steps = [[3], [1], [2], [1], [4], [3], [0], [1]]
    assert [simulate(steps, c, "arc") for c in (1, 2, 3, 4)] == [8, 6, 7, 5]


def test_lrfu_weighs_frequency_against_recency():
    # C = 2: 0 is used three times, then 1 once, then 2 arrives. LRU drops 0 (least recent); LFU and LRFU
    # with slow decay drop 1; with fast decay (lambda = 1) the older references of 0 count for less than 1.
    steps = [[0], [0], [0], [1], [2], [0]]
    assert simulate(steps, 2, "lru") == 4
    assert simulate(steps, 2, "lfu") == simulate(steps, 2, "lrfu") == lrfu_misses(steps, 2, 0.1) == 3
    assert lrfu_misses(steps, 2, 1.0) == 4
    with pytest.raises(ValueError):
        lrfu_misses(steps, 2, -1.0)


@settings(max_examples=60, deadline=None)
@given(step_sequences(max_experts=5, max_steps=9, max_set=3))
def test_opt_equals_exhaustive_search(case):
    n, steps = case
    for c in range(max(widest(steps), 1), n + 1):
        assert simulate(steps, c, "opt") == exhaustive_min(steps, c)


def test_static_pins_the_most_referenced():
    steps = [[0, 1], [1], [1, 2], [2], [3]]
    assert pinned_set(steps, 2) == [1, 2]
    assert simulate(steps, 2, "static") == 2  # 0 and 3
    assert simulate(steps, 0, "static") == 7
    assert pinned_set(steps, 3) == [0, 1, 2]  # ties broken by lowest id
    # static can beat every demand policy: alternating singletons at C = 1
    alt = [[0], [1]] * 5
    assert simulate(alt, 1, "static") == 5 < simulate(alt, 1, "opt") == 10


def test_miss_table_and_errors():
    steps = [[0, 1, 2], [2, 3], [0], [4]]
    table = miss_table(steps, [1, 3, 5, 9])
    assert set(table) == set(POLICIES)
    assert all(table[p][0] == OUT_OF_DOMAIN for p in POLICIES if p != "static") and table["static"][0] >= 0
    for p in POLICIES:
        for i, c in enumerate([3, 5, 9]):
            assert table[p][i + 1] == simulate(steps, c, p)
    with pytest.raises(ValueError):
        simulate(steps, 2, "lru")  # below the widest step
    with pytest.raises(ValueError):
        simulate(steps, 3, "fifo")
    with pytest.raises(ValueError):
        miss_table(steps, [3], ["fifo"])


# -- the shared real traces -------------------------------------------------------------------------
def real(rel: str):
    path = DATA / rel
    if not path.exists():
        pytest.skip(f"shared data not present: {path}")
    return load_any(path)


def check_layer(steps, n, caps=None, opt=True, others=False):
    m = expert_miss_curve(steps, n)
    lo = max(widest(steps), 1)
    for c in caps or range(lo, n + 1):
        lru = simulate(steps, c, "lru")
        assert lru == m[c], c
        if opt:
            best = simulate(steps, c, "opt")
            assert best <= lru
            if others:  # the other demand policies too (Mixtral only: it keeps the slow tests short)
                assert all(best <= simulate(steps, c, p) for p in ("lfu", "lrfu", "arc")), c
    return m


@pytest.mark.parametrize("name", ["humaneval_2", "gsm8k_2"])
def test_mixtral_every_layer_every_capacity(name):
    tr = real(f"routing_mixtral8x7b/{name}_decode_TxLxK.npz")
    for layer in tr.layers.tolist():
        steps = tr.steps(layer)
        m = check_layer(steps, tr.num_experts, others=True)
        if layer in (0, 31):  # the real pager too, on two layers
            for c in range(2, 9):
                pager = ExpertPager({"w": torch.zeros(8, 1)}, c, "cpu")
                for s in steps:
                    pager.prepare(s)
                assert pager.counters.misses == m[c]


def test_demo_s_trained_routing_every_layer():
    """The trained demo's routing (shipped, never skipped): LRU equals its curve and OPT bounds every demand policy,
    every layer, every C from top-k; and its locality beats i.i.d. uniform choice at every C in between."""
    tr = demo_routing()
    n, k = tr.num_experts, tr.top_k
    rng = np.random.default_rng(0)
    for layer in tr.layers.tolist():
        steps = tr.steps(layer, per_token=True)[:600]
        m = check_layer(steps, n, others=True)
        uniform = expert_miss_curve([sorted(rng.permutation(n)[:k].tolist()) for _ in steps], n)
        assert all(m[c] < uniform[c] for c in range(k, n)), (layer, m, uniform)


@pytest.mark.slow
def test_flame_curves_and_brute_force():
    tr = real("flame_moe_290m_dynande/flame290m_iter5473_32seq_x64tok_TxLxK.npz")
    curves = {layer: expert_miss_curve(tr.steps(layer), 64) for layer in tr.layers.tolist()}  # all 8 layers
    assert all(m[0] == 2048 * 6 and np.all(np.diff(m) <= 0) for m in curves.values())
    check_layer(tr.steps(2), 64)  # every capacity 6..64
    check_layer(tr.steps(9), 64, caps=range(6, 65, 7))


@pytest.mark.slow
def test_olmoe_layer0_prefix():
    tr = real("layer0_only_vllm_logs/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl")
    full = expert_miss_curve(tr.steps(0), 64)
    assert full[0] == 4471 * 8
    check_layer(tr.steps(0)[:2000], 64)


@pytest.mark.slow
def test_qwen_layer0_tokens_and_passes():
    tr = real("layer0_only_vllm_logs/qwen15moe_a27b_layer0_gsm8k_TotaniYash.jsonl")
    check_layer(tr.steps(0, per_token=True), 60)
    passes = tr.steps(0)  # batched forward passes: sets of up to 57 experts
    check_layer(passes, 60)


def test_lru_row_takes_every_expert_of_a_step_whatever_its_place_in_the_touch_order():
    steps = [[7, 1], [7, 1], [2]]  # the largest id is never last in a step's touch order
    assert miss_table(steps, [2], ["lru"])["lru"].tolist() == [3]  # 7 and 1, then both hit, then 2
