"""SlotPaging (no vLLM needed): every routed pair reads its own expert's bytes from the bank a step returns, and
the counters are wisp's pager's, equal to the exact LRU miss curve, narrow and wide steps alike; banks of FP8
weights with their scales; expert parallel steps through vLLM's global -> local map."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from wisp.core.experts.recency import touch_order
from wisp.integrations.vllm.slot_paging import SlotPaging, compose_expert_maps, remap
from wisp.plan.miss_curves import expert_miss_curve

N, K = 8, 2


def random_steps(seed: int, count: int = 12):
    g = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(count):
        tokens = int(torch.randint(1, 6, (1,), generator=g))
        steps.append(torch.stack([torch.randperm(N, generator=g)[:K] for _ in range(tokens)]).to(torch.int32))
    return steps


@pytest.mark.parametrize("capacity", range(1, N + 1))
@pytest.mark.parametrize("seed", [0, 1])
def test_rows_read_the_routed_experts_and_misses_follow_lru(capacity, seed):
    g = torch.Generator().manual_seed(seed)
    bank = {"w13_weight": torch.randn(N, 6, 4, generator=g), "w2_weight": torch.randn(N, 4, 3, generator=g)}
    paging = SlotPaging(bank, capacity)
    steps = random_steps(seed)
    for topk_ids in steps:
        step_bank, rows = paging.step(topk_ids)
        assert rows.dtype == topk_ids.dtype and rows.shape == topk_ids.shape
        for name, full in bank.items():
            assert torch.equal(step_bank[name][rows.long()], full[topk_ids.long()])
        paging.pager.check_integrity()
    trace = [touch_order(step.tolist()) for step in steps]
    assert paging.counters.misses == expert_miss_curve(trace, N)[capacity]
    assert paging.counters.steps == len(steps) and paging.counters.bytes_h2d == paging.counters.loads * paging.pager.expert_bytes
    assert (paging.wide_steps > 0) == any(len(t) > capacity for t in trace)


def test_a_resize_empties_the_slots_keeps_the_counters_and_pages_on_from_the_same_masters():
    g = torch.Generator().manual_seed(3)
    bank = {"w13_weight": torch.randn(N, 6, 4, generator=g), "w2_weight": torch.randn(N, 4, 3, generator=g)}
    paging = SlotPaging(bank, 3)
    steps = random_steps(3)
    for topk_ids in steps[:6]:
        paging.step(topk_ids)
    counted = paging.counters.as_dict()
    paging.resize(5)
    assert paging.pager.capacity == 5 and paging.pager.resident_experts() == []
    assert paging.counters.as_dict() == counted and paging.pager.host["w13_weight"] is bank["w13_weight"]
    for topk_ids in steps[6:]:
        step_bank, rows = paging.step(topk_ids)
        for name, full in bank.items():
            assert torch.equal(step_bank[name][rows.long()], full[topk_ids.long()])
    after = [touch_order(step.tolist()) for step in steps[6:]]
    assert paging.counters.misses - counted["misses"] == expert_miss_curve(after, N)[5]  # LRU from empty at C = 5


def test_on_the_cpu_the_bank_itself_is_the_master():
    bank = {"w13_weight": torch.randn(N, 2, 2), "w2_weight": torch.randn(N, 2, 2)}
    paging = SlotPaging(bank, 2)
    assert paging.pager.host["w13_weight"] is bank["w13_weight"] and paging.slots["w13_weight"].shape[0] == 2


def test_fp8_weights_and_their_block_scales_page_together():
    """vLLM's Fp8MoEMethod bank (block [128, 128]): FP8 weights and float32 scales, one row per expert; every
    step's rows read an expert's weights and its scales from the same row, narrow and wide steps alike."""
    g = torch.Generator().manual_seed(0)
    bank = {"w13_weight": torch.randn(N, 256, 128, generator=g).to(torch.float8_e4m3fn),
            "w2_weight": torch.randn(N, 128, 128, generator=g).to(torch.float8_e4m3fn),
            "w13_weight_scale_inv": torch.rand(N, 2, 1, generator=g), "w2_weight_scale_inv": torch.rand(N, 1, 1, generator=g)}
    paging = SlotPaging(bank, 3)
    for topk_ids in random_steps(2):
        step_bank, rows = paging.step(topk_ids)
        for name, full in bank.items():  # float8 has no torch.equal on the CPU: compare the bytes
            assert torch.equal(step_bank[name][rows.long()].view(torch.uint8), full[topk_ids.long()].view(torch.uint8))
    assert paging.wide_steps > 0 and paging.pager.expert_bytes == 256 * 128 + 128 * 128 + 4 * 3
    paging.pager.check_integrity()


@st.composite
def expert_maps(draw):
    """(global expert count, the global ids this rank holds in local order, a local -> row map with -1s)."""
    g = draw(st.integers(1, 12))
    held = draw(st.permutations(range(g)))[: draw(st.integers(0, g))]
    return g, held, draw(st.lists(st.integers(-1, 2 * g), min_size=len(held), max_size=len(held)))


@given(expert_maps())
def test_composed_map_is_one_map_then_the_other_and_minus_one_off_this_rank(case):
    """vLLM's expert-parallel map (global -> local, -1 on other ranks) composed with a local -> row map."""
    g, local_experts, rows = case
    global_to_local = torch.full((g,), -1, dtype=torch.int32)
    for local, expert in enumerate(local_experts):
        global_to_local[expert] = local
    local_to_row = torch.tensor(rows, dtype=torch.int32)
    composed = compose_expert_maps(global_to_local, local_to_row)
    expected = [rows[l] if l >= 0 else -1 for l in global_to_local.tolist()]
    assert composed.tolist() == expected and composed.dtype == torch.int32
    every_id = torch.arange(g, dtype=torch.int32).reshape(-1, 1)  # as routed ids [T, 1]: one then the other
    assert remap(local_to_row, remap(global_to_local, every_id)).tolist() == composed[every_id.long()].tolist()


@pytest.mark.parametrize("capacity", [2, 3, 6])
def test_an_expert_parallel_step_sends_each_local_pair_to_its_expert_and_others_to_minus_one(capacity):
    """A rank holding 6 of 12 global experts: the pager sees only them; the composed map sends every global id
    this rank holds to the row of its bytes, and every other to -1 (which the kernel skips)."""
    g = torch.Generator().manual_seed(capacity)
    held = torch.randperm(12, generator=g)[:6]
    global_to_local = torch.full((12,), -1, dtype=torch.int32)
    global_to_local[held] = torch.arange(6, dtype=torch.int32)
    bank = {"w13_weight": torch.randn(6, 4, 2, generator=g), "w2_weight": torch.randn(6, 2, 2, generator=g)}
    paging = SlotPaging(bank, capacity)
    local_trace = []
    for _ in range(10):
        topk_ids = torch.stack([torch.randperm(12, generator=g)[:K] for _ in range(int(torch.randint(1, 5, (1,), generator=g)))]).int()
        step_bank, expert_map = paging.step_expert_parallel(topk_ids, global_to_local)
        assert expert_map.shape == (12,) and (expert_map[global_to_local < 0] == -1).all()
        local = global_to_local[topk_ids.long()]
        on_rank = local >= 0
        for name, full in bank.items():
            assert torch.equal(step_bank[name][expert_map[topk_ids.long()][on_rank].long()], full[local[on_rank].long()])
        local_trace.append(touch_order(local.tolist()))
    assert paging.counters.misses == expert_miss_curve(local_trace, 6)[capacity]
