"""Residencies: where one MoE layer's experts live on the device, the first of an expert store's three parts.

A residency holds some experts on the device and says which (`holds`), gives the bank and map the kernels read
them through (`bank_and_map`), and, for a CUDA-graph step, the weights and map a captured kernel reads with the
step counted on the device (`graph_weights`). It never decides how a miss is served: that is the miss policy's
(`wisp.core.experts.miss_policies`), and the executor (`wisp.core.experts.store.ExpertStore`) runs both.

Registered by name (`RESIDENCIES`):
- "none": nothing on the device; the host masters are read in place (UVA) or streamed;
- "full-bank": every expert on the device, map = identity;
- "layer-buffer": one layer-sized device buffer shared by a model's layers, refilled with the whole layer at every
  step (layer offload, the baseline of vLLM's --cpu-offload-gb without UVA and of accelerate);
- "lru-slots": C slots managed LRU by an `ExpertPager` (`wisp.core.experts.pager`), decided on the host or, in a
  graph, on the device (`wisp.core.experts.device_pager`);
- "hot-bank": the H most-routed experts by decayed counts (`wisp.core.experts.hot_experts`), refreshed between steps.

Invariants: `holds` answers for the state before the step; `begin` is the only call that may copy into the bank
for the step (what it returns are loads); the map `bank_and_map` returns keeps its address, so graphs captured
over it stay valid; `device_bytes` counts a shared buffer once, on its owner.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from wisp.core.bank_keys import GATE_UP
from wisp.core.experts.counters import COUNT_FIELDS, ExpertCounters
from wisp.core.experts.expert_major import StagingBuffers
from wisp.core.experts.hot_experts import HotExperts
from wisp.core.experts.pager import ExpertPager, StepDecision, expert_bytes
from wisp.core.experts.registry import registrar
from wisp.core.kernels.step_count import StepCount

Bank = dict[str, torch.Tensor]
RESIDENCIES: dict[str, type["Residency"]] = {}


register_residency = registrar(RESIDENCIES)  # @register_residency("name") on a class registers it


class Residency(ABC):
    name: str
    hot: HotExperts | None = None  # a bank of most-routed experts ("hot-bank")
    pager: ExpertPager | None = None  # the LRU state of slots ("lru-slots")
    reads_in_place = False  # what it does not hold, the GPU reads from the host masters in place ("none", "hot-bank")

    def __init__(self, host: Bank, device: torch.device):
        self.host, self.device = host, torch.device(device)  # host: the masters [N, ...] (pinned on CUDA)
        self.num_experts = host[GATE_UP].shape[0]
        self.expert_bytes = expert_bytes(host)
        self._counts: torch.Tensor | None = None  # graph steps' device count vector, made on first use
        self._counters = ExpertCounters()

    @property
    def counters(self) -> ExpertCounters:
        """The layer's traffic counters (an LRU residency's are its pager's, which its device twin folds into)."""
        return self._counters

    @classmethod
    def create(cls, host: Bank, device: torch.device, capacity: int, shared: "SharedParts") -> "Residency":
        """One layer's residency from its masters, its capacity (slots or hot experts) and the model's shared parts."""
        return cls(host, device)

    # -- capabilities ---------------------------------------------------------------------------------
    @property
    @abstractmethod
    def capacity(self) -> int:
        """Experts it can hold on the device at once."""

    @property
    def device_bytes(self) -> int:
        return 0

    resizable = False  # `resize(capacity)` gives it a new capacity, empty

    def resize(self, capacity: int) -> None:
        raise NotImplementedError(f"a {self.name} residency has a fixed capacity")

    # -- an eager step --------------------------------------------------------------------------------
    def holds(self, expert: int) -> bool:
        return False

    def held_experts(self) -> list[int]:
        """The experts on the device now, ascending (a layer buffer's count as none: it refills every step)."""
        return [e for e in range(self.num_experts) if self.holds(e)] if self.capacity else []

    def begin(self, counts: Sequence[int], tokens: int) -> frozenset[int]:
        """Before a step is planned: observe its routing (`counts` [N] pairs per expert over `tokens` tokens) and
        copy into the bank what it refills now; returns the experts copied (loads of this step)."""
        return frozenset()

    def place(self, order: Sequence[int]) -> StepDecision:
        """The device-bound experts of a step (touch order): which are held (hits), which get a slot they keep
        (loads), which are streamed (not kept). Without slots, every one not held is streamed."""
        held = tuple(e for e in order if self.holds(e))
        return StepDecision(held, (), tuple(e for e in order if not self.holds(e)))

    @property
    def in_place_map(self) -> torch.Tensor:
        """The identity map expert -> its row of the host masters, for kernels reading them in place."""
        if getattr(self, "_in_place_map", None) is None:
            self._in_place_map = _identity(self.num_experts, self.device)
        return self._in_place_map

    def bank_and_map(self) -> tuple[Bank, torch.Tensor] | None:
        """The device bank held experts are read from and its map expert -> row (-1: not held); None: no bank."""
        return None

    def copy_into_slot(self, expert: int, slot: int) -> None:
        raise NotImplementedError(f"a {self.name} residency has no slots to copy into")

    def after_copies(self) -> None:
        """After a step's copies into slots are queued: publish the map they changed."""

    # -- a graph step (no host sync) ------------------------------------------------------------------
    @abstractmethod
    def graph_forward(self, fused: Callable, hidden: torch.Tensor, topk_ids: torch.Tensor,
                      topk_weights: torch.Tensor, wide: Callable | None = None) -> torch.Tensor:
        """The step with no host sync and fixed shapes, counted on the device: `fused(hidden, bank, ids, weights,
        map)` over whatever this residency reads (capturable in a CUDA graph with the Triton backend). `wide(pager,
        hidden, ids, weights)`, where the store has one, runs a step wider than a pager's slots
        (`wisp.core.experts.expert_major_on_device`)."""

    def device_count_vector(self) -> torch.Tensor | None:
        return self._counts

    def _device_counts(self, device: torch.device) -> torch.Tensor:
        if self._counts is None:
            self._counts = torch.zeros((len(COUNT_FIELDS),), dtype=torch.int64, device=device)
        return self._counts

    def forget(self) -> None:
        """Forget what it holds (state only), e.g. after a graph capture's warm-up wrote the slots."""

    def use_host(self) -> None:
        """Bring its decision state to the host (a no-op unless it decides on the device too)."""


def _identity(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int32, device=device)


@register_residency("none")
class NoBank(Residency):
    capacity = 0
    reads_in_place = True

    def graph_forward(self, fused, hidden, topk_ids, topk_weights, wide=None):
        count = StepCount(self._device_counts(topk_ids.device), self.num_experts, hits=False,
                          pair_bytes=self.expert_bytes)
        return fused(hidden, self.host, topk_ids, topk_weights, self.in_place_map, count=count)


@register_residency("full-bank")
class FullBank(Residency):
    def __init__(self, bank: Bank, device: torch.device):
        super().__init__(bank, device)  # the bank is on the device already: it is its own master
        self.bank = bank
        self.expert_map = _identity(self.num_experts, bank[GATE_UP].device)

    @property
    def capacity(self) -> int:
        return self.num_experts

    @property
    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.bank.values())

    def holds(self, expert):
        return True

    def bank_and_map(self):
        return self.bank, self.expert_map

    def graph_forward(self, fused, hidden, topk_ids, topk_weights, wide=None):
        count = StepCount(self._device_counts(topk_ids.device), self.num_experts, hits=True)
        return fused(hidden, self.bank, topk_ids, topk_weights, self.expert_map, count=count)


class SharedLayerBuffer:
    """One layer-sized device buffer shared by every layer-buffer residency of a model (layers run in turn)."""

    def __init__(self, like: Bank, device: torch.device):
        self.tensors = {n: torch.empty(t.shape, dtype=t.dtype, device=device) for n, t in like.items()}


@dataclass
class SharedParts:
    """Device buffers a model's layers share, made by the first layer that needs them."""

    layer_buffer: SharedLayerBuffer | None = None  # "layer-buffer": one layer-sized buffer
    staging: StagingBuffers | None = None  # wide steps' two expert-sized buffers (`wisp.core.experts.expert_major`)


@register_residency("layer-buffer")
class LayerBuffer(Residency):
    def __init__(self, host: Bank, device: torch.device, buffer: SharedLayerBuffer, owns_buffer: bool):
        super().__init__(host, device)
        self.buffer, self.owns_buffer = buffer, owns_buffer
        self.layer_bytes = sum(t.numel() * t.element_size() for t in host.values())
        self.expert_map = _identity(self.num_experts, self.device)

    @classmethod
    def create(cls, host, device, capacity, shared):
        owner = shared.layer_buffer is None
        if owner:
            shared.layer_buffer = SharedLayerBuffer(host, device)
        return cls(host, device, shared.layer_buffer, owns_buffer=owner)

    @property
    def capacity(self) -> int:
        return self.num_experts

    @property
    def device_bytes(self) -> int:
        return self.layer_bytes if self.owns_buffer else 0

    def _fill(self) -> None:
        for name, master in self.host.items():
            self.buffer.tensors[name].copy_(master, non_blocking=True)

    def holds(self, expert):
        return True  # after `begin`, which copies the whole layer in

    def held_experts(self):
        return []

    def begin(self, counts, tokens):
        self._fill()
        return frozenset(range(self.num_experts))

    def bank_and_map(self):
        return self.buffer.tensors, self.expert_map

    def graph_forward(self, fused, hidden, topk_ids, topk_weights, wide=None):
        self._fill()
        n = self.num_experts
        count = StepCount(self._device_counts(topk_ids.device), n, hits=False, loads=n, fixed_bytes=self.layer_bytes)
        return fused(hidden, self.buffer.tensors, topk_ids, topk_weights, self.expert_map, count=count)


@register_residency("lru-slots")
class LruSlots(Residency):
    def __init__(self, host: Bank, device: torch.device, capacity: int):
        super().__init__(host, device)
        self.pager = ExpertPager(host, capacity, device)

    @classmethod
    def create(cls, host, device, capacity, shared):
        return cls(host, device, capacity)

    @property
    def capacity(self) -> int:
        return self.pager.capacity

    @property
    def counters(self) -> ExpertCounters:
        return self.pager.counters

    @property
    def device_bytes(self) -> int:
        return self.pager.capacity * self.pager.expert_bytes

    resizable = True

    def resize(self, capacity: int) -> None:
        """A new scratch of `capacity` slots (empty: experts page back in on demand); counters carry over.
        The old scratch is released before the new one is allocated."""
        if capacity == self.pager.capacity:
            return
        counters = self.pager.counters
        self.pager.sync_counters()
        self.pager = None
        self.pager = ExpertPager(self.host, capacity, self.device)
        self.pager.counters = counters

    def holds(self, expert):
        return self.pager.slot_of[expert] >= 0

    def held_experts(self):
        return self.pager.resident_experts()

    def place(self, order):
        return self.pager.decide(order)

    def bank_and_map(self):
        return self.pager.scratch, self.pager.expert_map

    def copy_into_slot(self, expert, slot):
        self.pager.copy_into_slot(expert, slot)

    def after_copies(self):
        self.pager.publish_map()

    def graph_forward(self, fused, hidden, topk_ids, topk_weights, wide=None):
        """A step of at most C // top_k tokens (its experts always fit) is decided on the device and runs `fused`
        over the slots; a wider one runs expert-major on the device (`wide`), or, with no `wide`, in groups of
        C // top_k tokens, each its own step."""
        pager = self.pager
        group = pager.capacity // topk_ids.shape[1]
        if wide is not None and hidden.shape[0] > group:
            return wide(pager, hidden, topk_ids, topk_weights)
        outs = []
        for start in range(0, hidden.shape[0], group):
            ids = topk_ids[start : start + group]
            expert_map = pager.prepare_on_device(ids)
            outs.append(fused(hidden[start : start + group], pager.scratch, ids, topk_weights[start : start + group],
                              expert_map))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def device_count_vector(self):
        lru = self.pager.device_lru
        return lru.counts if lru is not None else None

    def forget(self):
        self.pager.clear()

    def use_host(self):
        self.pager.use_host()


@register_residency("hot-bank")
class HotBank(NoBank):
    """NoBank's in-place reads for what it does not hold, plus a bank of the H most-routed experts. Graph steps
    are NoBank's (the whole-graph path reads every expert in place; the rank share reads the bank itself)."""

    def __init__(self, host: Bank, device: torch.device, capacity: int):
        super().__init__(host, device)
        self.hot = HotExperts(host, capacity, self.device)

    @classmethod
    def create(cls, host, device, capacity, shared):
        return cls(host, device, capacity)

    @property
    def capacity(self) -> int:
        return self.hot.capacity

    @property
    def device_bytes(self) -> int:
        return self.hot.bytes

    def holds(self, expert):
        return bool(self.hot.is_hot[expert])

    def begin(self, counts, tokens):
        hot = self.hot
        hot.observe_counts(counts, tokens)
        before = hot.held
        if hot.refresh_due():
            hot.refresh()
        return frozenset(hot.held - before)

    def bank_and_map(self):
        return (self.hot.bank, self.hot.slot_map) if self.hot.held else None
