"""ExpertPager: one MoE layer's C-slot device scratch over pinned host masters, managed LRU.

The pager owns, for one layer:
- `host[name]`  [N, ...]  every expert's tensors in host memory (pinned when the device is CUDA);
- `scratch[name]` [C, ...] the device slots; a slot holds all tensors of one expert;
- `slot_of` (list, N) logical expert -> slot or -1 (the paper's pi); `expert_in_slot` (list, C) its
  inverse, slot -> logical expert or -1;
- `expert_map` (int32 tensor, N, on the device) `slot_of` as the MoE kernel reads it; updated in place,
  so its address never changes (CUDA graphs captured over it stay valid);
- `last_used` (list, C) per slot, the touch number of its expert's latest touch (-1: never used), and
  `_touch_count` the number of touches so far (the next touch's number).

`prepare(experts)` makes a narrow step's routed experts (at most C) resident: misses are copied, each
expert alone (all of its tensors, never the layer), from its host master into a victim slot, on the
current stream, so the copies are ordered before the kernel that follows. Victims are the least
recently used slots that the step does not need (empty slots first, in slot order).

A wide step (more than C distinct experts: a prefill chunk, a big decode batch) is decided by the same
rule, `decide`, and run expert-major by `wisp.core.experts.expert_major`: its C most recently touched experts
end in the slots, its other misses are computed from a staging buffer and not kept.
Every miss crosses PCIe once per step, and hits and misses are exactly what an LRU cache of C items
with set-valued steps gives, so `wisp.plan.miss_curves`'s miss curves hold for every C, wide steps included.

Recency is defined exactly so a plain LRU model can replay it: a step's experts are touched in the order
`wisp.core.experts.recency` defines (by the last token that routes to each, then id), each getting the next
touch number. `prepare` and `decide` take that order: a flat list of expert ids, least recent first (a
repeated id counts at its last place).

Where the state lives (`state_on`): on the host (`prepare`, used by prefill and eager steps) or on the
device (`prepare_on_device`, CUDA only: `wisp.core.experts.device_pager` decides and copies with no host sync,
so a decode step can be one CUDA graph; a wide one through `wisp.core.experts.expert_major_on_device`). `use_host()` / `use_device()` hand the state over (a no-op
when it is already there); each `prepare*` call takes it where it needs it.

Invariants (`check_integrity`): slot_of[e] == s <=> expert_in_slot[s] == e; expert_map == slot_of;
slot s holds exactly the bytes of expert expert_in_slot[s]; an expert routed in the current step is
never evicted before its tokens are computed (in a narrow step, never during it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from wisp.core.experts.counters import ExpertCounters, add_counts, fold_counts
from wisp.core.experts.recency import distinct_in_order
from wisp.core.experts.serve_plan import Serve, ServePlan, tally


@dataclass(frozen=True)
class StepDecision:
    """What one step does to a layer's slots (`ExpertPager.decide`): `hits` were resident before the
    step (they run from their slots through the map as it was); `loads` (expert, slot) are misses copied
    into a slot and kept; `streamed` are misses of a wide step run from a staging buffer, not kept;
    `evictions` the slots taken from other experts."""

    hits: tuple[int, ...]
    loads: tuple[tuple[int, int], ...]
    streamed: tuple[int, ...]
    evictions: int = 0


class ExpertPager:
    def __init__(self, host: dict[str, torch.Tensor], capacity: int, device: torch.device | str):
        shapes = {t.shape[0] for t in host.values()}
        if len(shapes) != 1:
            raise ValueError("every host master tensor must have the expert count as its first dim")
        self.num_experts = shapes.pop()
        if not 1 <= capacity <= self.num_experts:
            raise ValueError(f"capacity {capacity} must be in [1, {self.num_experts}]")
        self.capacity = capacity
        self.device = torch.device(device)
        self.host = host
        self.scratch = {
            name: torch.empty((capacity, *t.shape[1:]), dtype=t.dtype, device=self.device) for name, t in host.items()
        }
        self.expert_bytes = expert_bytes(host)
        self.slot_of: list[int] = [-1] * self.num_experts
        self.expert_in_slot: list[int] = [-1] * capacity
        self.last_used: list[int] = [-1] * capacity
        self._touch_count = 0
        self.expert_map = torch.full((self.num_experts,), -1, dtype=torch.int32, device=self.device)
        # pinned like the masters: after a failed pin (the loader's pageable fallback) it stays pageable too
        pin = self.device.type == "cuda" and all(t.is_pinned() for t in host.values())
        self._map_staging = torch.full((self.num_experts,), -1, dtype=torch.int32, pin_memory=pin)
        self.counters = ExpertCounters()
        self.device_lru = None  # DeviceLRU, made on first use_device()
        self.state_on = "host"

    # -- where the state lives ----------------------------------------------------------------------
    @torch.inference_mode()
    def use_device(self) -> None:
        if self.state_on == "device":
            return
        if self.device_lru is None:
            from wisp.core.experts.device_pager import DeviceLRU

            self.device_lru = DeviceLRU(self.num_experts, self.capacity, self.expert_bytes, self.device)
        lru = self.device_lru
        lru.expert_in_slot.copy_(torch.tensor(self.expert_in_slot, dtype=torch.int32))
        lru.last_used.copy_(torch.tensor(self.last_used, dtype=torch.int64))
        lru.touch_count.fill_(self._touch_count)
        self.state_on = "device"

    def use_host(self) -> None:
        use_host_many([self])

    def _device_state(self) -> torch.Tensor:
        lru = self.device_lru
        return torch.cat([self.expert_map.long(), lru.expert_in_slot.long(), lru.last_used, lru.touch_count,
                          lru.counts])

    def _take_state(self, state: list[int]) -> None:
        n, c = self.num_experts, self.capacity
        self.slot_of, self.expert_in_slot, self.last_used = state[:n], state[n : n + c], state[n + c : n + 2 * c]
        self._touch_count = state[n + 2 * c]
        add_counts(self.counters, state[n + 2 * c + 1 :])
        self.state_on = "host"

    def sync_counters(self) -> None:
        """Fold the device-side counts into `counters` (one host read; nothing to do if never on device)."""
        if self.device_lru is not None:
            fold_counts(self.device_lru.counts, self.counters)

    def prepare_on_device(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """`prepare` of topk_ids' distinct experts, decided and copied on the device; returns expert_map.
        The caller guarantees they number at most `capacity` (e.g. capacity // top_k tokens)."""
        self.use_device()
        self.device_lru.prepare(self.expert_map, topk_ids, self.host, self.scratch)
        return self.expert_map

    def clear(self) -> None:
        """Empty every slot (state only; the bytes stay and are never read through the map)."""
        self.use_host()
        self.slot_of, self.expert_in_slot = [-1] * self.num_experts, [-1] * self.capacity
        self.last_used, self._touch_count = [-1] * self.capacity, 0
        self.publish_map()

    # -- the state on the host ----------------------------------------------------------------------
    def prepare(self, experts: Sequence[int]) -> torch.Tensor:
        """Make the routed `experts` of one narrow step (at most C distinct, in touch order) resident;
        return `expert_map`. A wider step runs expert-major (`wisp.core.experts.expert_major`)."""
        n_need = len(set(int(e) for e in experts))
        if n_need > self.capacity:
            raise ValueError(f"step needs {n_need} experts but the scratch has {self.capacity} slots")
        decision = self.decide(experts)
        for expert, slot in decision.loads:
            self.copy_into_slot(expert, slot)
        if decision.loads:
            self.publish_map()
        tally(self.counters, plan_of_decision(distinct_in_order(experts), decision), self.expert_bytes)
        return self.expert_map

    def decide(self, experts: Sequence[int]) -> "StepDecision":
        """One step's LRU decision on the host state (no bytes move and nothing is counted here; the caller
        copies `loads` into their slots, streams `streamed` through staging, calls `publish_map`, and tallies
        the step's serve plan, `wisp.core.experts.serve_plan.tally`).

        `experts` is the step's touch order (`wisp.core.experts.recency`), so its last C distinct experts are
        the most recently used after it (all of them when they number at most C): those stay in the
        slots; misses among them, in ascending id, are loaded into the least recently used slots holding
        anything else (empty first, by (last_used, slot)); the other misses of a wide step are streamed
        (computed from a staging buffer, not kept). Each miss crosses PCIe once either way."""
        self.use_host()
        order = distinct_in_order(experts)
        if order and not (0 <= min(order) and max(order) < self.num_experts):
            raise ValueError(f"expert ids must be in [0, {self.num_experts}), got {sorted(order)}")
        need = sorted(order)
        kept = set(order[-self.capacity :])
        hits = [e for e in need if self.slot_of[e] >= 0]
        misses = [e for e in need if self.slot_of[e] < 0]
        keep_slots = {self.slot_of[e] for e in hits if e in kept}
        victims = sorted((s for s in range(self.capacity) if s not in keep_slots), key=lambda s: (self.last_used[s], s))
        loads, evictions = [], 0
        for expert, slot in zip((e for e in misses if e in kept), victims):
            evictions += self._assign(expert, slot)
            loads.append((expert, slot))
        for e in order:
            if self.slot_of[e] >= 0:
                self.last_used[self.slot_of[e]] = self._touch_count
            self._touch_count += 1
        return StepDecision(tuple(hits), tuple(loads), tuple(e for e in misses if e not in kept), evictions)

    def prefetch(self, experts: Sequence[int]) -> list[tuple[int, int]]:
        """Speculatively give each of `experts` not resident a slot (no bytes move here; the caller copies
        them, then calls `publish_map`): the least recently used slots (empty first) take them, and a
        prefetched slot is left least recent (last_used -1), so a wrong guess is the next step's first victim.
        Counted as loads, bytes and `prefetched`; the step that uses one counts a hit."""
        self.use_host()
        wanted = [e for e in dict.fromkeys(int(e) for e in experts) if 0 <= e < self.num_experts and self.slot_of[e] < 0]
        victims = sorted(range(self.capacity), key=lambda s: (self.last_used[s], s))[: len(wanted)]
        placed = list(zip(wanted, victims))
        c = self.counters
        for expert, slot in placed:
            c.evictions += self._assign(expert, slot)
            self.last_used[slot] = -1
        c.loads += len(placed)
        c.prefetched += len(placed)
        c.bytes_h2d += len(placed) * self.expert_bytes
        return placed

    def _assign(self, expert: int, slot: int) -> int:
        """Give `slot` to `expert`, evicting whatever held it (returns 1 if it did); no bytes move here."""
        old = self.expert_in_slot[slot]
        if old >= 0:
            self.slot_of[old] = -1
        self.slot_of[expert] = slot
        self.expert_in_slot[slot] = expert
        return int(old >= 0)

    def copy_into_slot(self, expert: int, slot: int) -> None:
        """Copy one expert's tensors from its host master into a slot, on the current stream."""
        for name, master in self.host.items():
            self.scratch[name][slot].copy_(master[expert], non_blocking=True)

    @torch.inference_mode()
    def publish_map(self) -> None:
        # A pinned staging buffer keeps the update asynchronous; it is safe to rewrite because the next
        # prepare() runs after the host has read that step's routing, which waited for this copy.
        self._map_staging.copy_(torch.tensor(self.slot_of, dtype=torch.int32))
        self.expert_map.copy_(self._map_staging, non_blocking=True)

    def resident_experts(self) -> list[int]:
        self.use_host()
        return sorted(e for e in self.expert_in_slot if e >= 0)

    def check_integrity(self, check_bytes: bool = True) -> None:
        """Assert every invariant in the module docstring (used by tests)."""
        self.use_host()
        for e, s in enumerate(self.slot_of):
            assert s == -1 or self.expert_in_slot[s] == e, (
                f"slot_of[{e}]={s} but expert_in_slot[{s}]={self.expert_in_slot[s]}")
        for s, e in enumerate(self.expert_in_slot):
            assert e == -1 or self.slot_of[e] == s, f"expert_in_slot[{s}]={e} but slot_of[{e}]={self.slot_of[e]}"
        assert self.expert_map.tolist() == self.slot_of, "expert_map differs from slot_of"
        if check_bytes:
            for s, e in enumerate(self.expert_in_slot):
                if e >= 0:
                    for name, master in self.host.items():
                        assert torch.equal(self.scratch[name][s].cpu(), master[e]), f"slot {s} != expert {e} ({name})"


def expert_bytes(host: dict[str, torch.Tensor]) -> int:
    """Bytes of one expert across a bank's [N, ...] tensors."""
    return sum(t[0].numel() * t.element_size() for t in host.values())


def use_host_many(pagers: Sequence[ExpertPager]) -> None:
    """`use_host` of many pagers (a model's layers) with one host read for all of their states and counts."""
    on_device = [p for p in pagers if p.state_on == "device"]
    if not on_device:
        return
    parts = [p._device_state() for p in on_device]
    states = torch.cat(parts).tolist()
    at = 0
    for p, part in zip(on_device, parts):
        p._take_state(states[at : at + part.numel()])
        at += part.numel()
    with torch.inference_mode():
        torch._foreach_zero_([p.device_lru.counts for p in on_device])


def plan_of_decision(order: Sequence[int], decision: StepDecision, counts: Sequence[int] = ()) -> ServePlan:
    """A pager step's serve plan: hits HELD, loads COPY, streamed STAGE (`order`: the step's distinct experts)."""
    serve = {e: Serve.HELD for e in decision.hits}
    serve.update({e: Serve.COPY for e, _ in decision.loads})
    serve.update({e: Serve.STAGE for e in decision.streamed})
    return ServePlan(tuple(order), tuple(counts), serve, loads=decision.loads, staged=decision.streamed,
                     evictions=decision.evictions)
