"""`SlotPaging`: one vLLM MoE layer's expert bank paged through wisp's `ExpertPager` (imports no vLLM).

The layer's bank is a dict of [N, ...] tensors in the kernel's own layout (vLLM has already padded and prepacked
them, one expert per row); they become the pager's host masters (pinned host copies when the bank sits on an
accelerator; on the CPU the bank itself) and the layer computes on C slots. Each step, `step(topk_ids)` returns
the bank to run vLLM's kernel on and the routed ids remapped into it:
- a narrow step (at most C distinct experts): `ExpertPager.prepare` in wisp's touch order
  (`wisp.core.experts.recency`) makes them resident; the bank is the C slots and the ids go through expert_map;
- a wide step (a prefill chunk routing to more than C experts): `ExpertPager.decide` takes the same LRU decision
  as wisp's engine; every miss crosses host -> device once, into a staging bank appended after a copy of the slots,
  so vLLM's kernel still runs once over [C + misses] rows; the kept misses are then copied into their slots from
  the staging bank (device to device) and the new map is published. Hits are read from the slots as they were
  before the step, so a hit that the step evicts is still computed from its own bytes.
Counters are wisp's (`ExpertCounters`, tallied by `wisp.core.experts.serve_plan.tally` from the step's serve plan),
so they equal an LRU model fed the same routing (`wisp.plan.miss_curves`).

Invariant: for every (token, k) pair the kernel reads exactly the bytes of the expert vLLM routed it to, and the
pairs keep their order, so the output is torch.equal to vLLM's kernel over the whole bank whenever that kernel's
per-pair arithmetic does not depend on the expert's row index (true of vLLM's CPU kernels; checked end to end by
tests/integrations/vllm).
"""

from __future__ import annotations

import torch

from wisp.core.experts.pager import ExpertPager, plan_of_decision
from wisp.core.experts.recency import order_by_last_token, routed_counts_and_last_token
from wisp.core.experts.serve_plan import tally


def host_master(bank_tensor: torch.Tensor) -> torch.Tensor:
    """A bank tensor as a host master: itself on the CPU, else a pinned host copy."""
    if bank_tensor.device.type == "cpu":
        return bank_tensor
    return bank_tensor.to("cpu").pin_memory()


class SlotPaging:
    def __init__(self, bank: dict[str, torch.Tensor], capacity: int):
        device = next(iter(bank.values())).device
        self.pager = ExpertPager({name: host_master(t) for name, t in bank.items()}, capacity, device)
        self.wide_steps = 0  # steps that routed to more experts than the slots hold

    @property
    def counters(self):
        return self.pager.counters

    @property
    def slots(self) -> dict[str, torch.Tensor]:
        return self.pager.scratch

    def step(self, topk_ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(the bank to run this step's kernel on, topk_ids [T, K] remapped into its rows)."""
        pager = self.pager
        _, last_token = routed_counts_and_last_token(topk_ids, pager.num_experts)
        order = order_by_last_token(last_token)
        if len(order) <= pager.capacity:
            expert_map = pager.prepare(order)
            return pager.scratch, remap(expert_map, topk_ids)
        return self._wide_step(order, topk_ids)

    def _wide_step(self, order: list[int], topk_ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        pager, capacity = self.pager, self.pager.capacity
        self.wide_steps += 1
        slot_before = list(pager.slot_of)
        decision = pager.decide(order)
        missing = [e for e, _ in decision.loads] + list(decision.streamed)
        index = torch.tensor(missing, dtype=torch.long)
        staged = {name: master.index_select(0, index).to(pager.device, non_blocking=True)
                  for name, master in pager.host.items()}  # each miss crosses once
        bank = {name: torch.cat([pager.scratch[name], staged[name]]) for name in pager.scratch}
        for row, (_, slot) in enumerate(decision.loads):
            for name, slots in pager.scratch.items():
                slots[slot].copy_(staged[name][row])
        if decision.loads:
            pager.publish_map()
        tally(pager.counters, plan_of_decision(order, decision), pager.expert_bytes)
        rows = list(slot_before)
        for row, expert in enumerate(missing):
            rows[expert] = capacity + row
        return bank, remap(torch.tensor(rows, dtype=torch.int32, device=topk_ids.device), topk_ids)


def remap(expert_to_row: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """topk_ids [T, K] with each expert id replaced by its row (same dtype and device)."""
    return expert_to_row.to(topk_ids.device)[topk_ids.long()].to(topk_ids.dtype)
