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

The bank may hold any tensors with one row per expert (FP8 weights and their block scales, say): the pager moves
every tensor of an expert together, narrow and wide steps alike, so an expert's scales always sit in the row of
its weights.

Expert parallel (`step_expert_parallel`): the ids are global and vLLM's `expert_map` [G] sends each to its local
expert on this rank or -1. The pager works on the local experts; the step returns the composition global id ->
row of the step's bank (-1: not on this rank, `compose_expert_maps`), which the kernel takes as its expert_map.

On CUDA (unverified: written for vLLM's CUDA build, never run on a GPU): a step of at most C routed pairs
(`capacity // top_k` tokens, so every decode batch that small) is decided and copied on the device
(`ExpertPager.prepare_on_device`, no host sync, so it can be captured in a CUDA graph); larger steps decide on
the host, which a CUDA graph capture cannot contain: such a capture is refused with a RuntimeError.

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
    def __init__(self, bank: dict[str, torch.Tensor], capacity: int, device: torch.device | None = None):
        """device: where the slots live (default: the bank's; a host bank pages into CUDA slots)."""
        device = device or next(iter(bank.values())).device
        self.pager = ExpertPager({name: host_master(t) for name, t in bank.items()}, capacity, device)
        self.wide_steps = 0  # steps that routed to more experts than the slots hold

    @property
    def counters(self):
        self.pager.sync_counters()  # decisions taken on the device (CUDA) count there
        return self.pager.counters

    @property
    def slots(self) -> dict[str, torch.Tensor]:
        return self.pager.scratch

    def resize(self, capacity: int) -> None:
        """New C slots over the same host masters, empty (experts page back in on demand); counters carry over.
        The old slots are released once nothing else holds them (the caller points the layer's weights here)."""
        old = self.pager
        if capacity == old.capacity:
            return
        counters = self.counters
        self.pager = None
        self.pager = ExpertPager(old.host, capacity, old.device)
        self.pager.counters = counters

    def step(self, topk_ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(the bank to run this step's kernel on, topk_ids [T, K] remapped into its rows)."""
        bank, rows = self.rows_for(topk_ids)
        return bank, remap(rows, topk_ids)

    def step_expert_parallel(self, topk_ids: torch.Tensor,
                             global_to_local: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(the bank, the expert_map [G] global id -> its row there or -1) for global topk_ids [T, K] on a rank
        whose local experts `global_to_local` [G] names (-1: another rank's)."""
        bank, rows = self.rows_for(remap(global_to_local, topk_ids))
        return bank, compose_expert_maps(global_to_local, rows)

    def rows_for(self, topk_ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Make the experts of topk_ids [T, K] (-1: none) resident for one step: (the bank, expert -> row [N],
        -1 for experts the step neither routes to nor finds in the slots)."""
        pager = self.pager
        if pager.device.type == "cuda" and topk_ids.numel() <= pager.capacity:
            return pager.scratch, pager.prepare_on_device(topk_ids)
        if pager.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"a CUDA graph captured over {topk_ids.shape[0]} tokens may route to more than the "
                               f"{pager.capacity} expert slots: capture at most {pager.capacity} routed pairs a step "
                               f"(vLLM: max_cudagraph_capture_size <= C // top_k), or run eagerly")
        order = touch_order_of(topk_ids, pager.num_experts)
        if len(order) <= pager.capacity:
            return pager.scratch, pager.prepare(order)
        return self._wide_step(order)

    def _wide_step(self, order: list[int]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
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
        return bank, torch.tensor(rows, dtype=torch.int32, device=pager.device)


def touch_order_of(topk_ids: torch.Tensor, num_experts: int) -> list[int]:
    """The step's distinct experts in wisp's touch order (`wisp.core.experts.recency`), ids < 0 left out."""
    ids = torch.where(topk_ids < 0, num_experts, topk_ids)  # -1 (another rank's expert): an extra bucket
    _, last_token = routed_counts_and_last_token(ids, num_experts + 1)
    return order_by_last_token(last_token[:num_experts])


def compose_expert_maps(first: torch.Tensor, then: torch.Tensor) -> torch.Tensor:
    """The map x -> then[first[x]], -1 wherever first[x] is -1 (or then[...] is): e.g. vLLM's global -> local
    expert map, then the pager's local expert -> row. Same dtype and device as `first`; no host sync."""
    inner = first.long()
    if then.numel() == 0:  # nothing to map into (a rank that holds no expert)
        return torch.full_like(first, -1)
    composed = then.to(first.device)[inner.clamp(min=0)].to(first.dtype)
    return torch.where(inner >= 0, composed, torch.full_like(composed, -1))


def remap(expert_to_row: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """topk_ids [T, K] with each expert id replaced by its row (same dtype and device; -1 stays -1)."""
    return compose_expert_maps(topk_ids, expert_to_row)
