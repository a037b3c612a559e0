"""SlotPaging (no vLLM needed): every routed pair reads its own expert's bytes from the bank a step returns, and
the counters are wisp's pager's, equal to the exact LRU miss curve, narrow and wide steps alike."""

from __future__ import annotations

import pytest
import torch

from wisp.core.experts.recency import touch_order
from wisp.integrations.vllm.slot_paging import SlotPaging
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


def test_on_the_cpu_the_bank_itself_is_the_master():
    bank = {"w13_weight": torch.randn(N, 2, 2), "w2_weight": torch.randn(N, 2, 2)}
    paging = SlotPaging(bank, 2)
    assert paging.pager.host["w13_weight"] is bank["w13_weight"] and paging.slots["w13_weight"].shape[0] == 2
