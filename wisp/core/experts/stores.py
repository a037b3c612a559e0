"""Expert stores: where one MoE layer's experts live, and how a routed batch reaches fused_moe.

Four modes share one contract, `ExpertStore.forward(hidden, topk_ids, topk_weights) -> [T, D]`:
- `ResidentExperts`: the whole bank on the device, expert_map = identity;
- `PagedExperts`: an `ExpertPager` of C slots; a step whose expert union fits runs once through the
  map; a wider one runs expert-major (`wisp.core.experts.expert_major`): each missing expert is copied once;
- `OffloadExperts`: the baseline of layer offload (vLLM --cpu-offload-gb without UVA, accelerate):
  every forward copies all N experts of the layer into one layer-sized device buffer shared by layers;
- `ZeroCopyExperts`: no expert slots at all: a decode step's kernel reads the routed experts in place
  from the pinned host masters (UVA on CUDA; needs the Triton kernel), the cache-less baseline; a step
  whose experts are each routed twice or more on average (a prefill chunk) copies each once through the
  two shared staging buffers instead (`wisp.core.experts.expert_major.run_streamed_step`), as paged mode's
  streamed misses are, rather than reading it over PCIe once per routed pair.

`forward_graph_safe` is the same computation with no host sync (CUDA, Triton backend), for CUDA-graph
decode: counters go to a device count vector (`sync_all_counters` folds them in with one read), and the
paged store runs the paging decision on the device in fixed groups of C // top_k tokens (a group's
experts always fit). The engine replays graphs only for batches of at most C // top_k tokens (one
group, so one MoE step as in eager mode); wider decode batches run eagerly, expert-major.

Invariant: for the same routing all four return torch.equal outputs, in `forward` and `forward_graph_safe`
alike: whatever the backend, a (token, k) pair's output does not depend on where its expert's weights
sit (a bank through the map, a slot, a staging buffer, host memory) or on the other tokens, and the sum
over k runs in routing order; an expert-major step gives the bits `fused` gives (`wisp.core.kernels.registry`).
So modes can be swapped without changing a single token.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from wisp.core.experts.counters import COUNT_FIELDS, ExpertCounters, fold_many
from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.experts.expert_major import StagingBuffers, run_streamed_step, run_wide_step
from wisp.core.kernels.expert_extras import extras_of
from wisp.core.kernels.registry import TORCH_KERNELS, MoEKernels
from wisp.core.experts.pager import ExpertPager, expert_bytes
from wisp.core.experts.recency import order_by_last_token


class ExpertStore(ABC):
    mode: str
    counters: ExpertCounters
    kernels: MoEKernels = TORCH_KERNELS  # the loader sets the backend's family
    staging: StagingBuffers | None = None  # wide steps' two buffers, shared by a model's layers (paged, zero-copy)

    def moe_fn(self, hidden: torch.Tensor, bank: dict[str, torch.Tensor], topk_ids: torch.Tensor,
               topk_weights: torch.Tensor, expert_map: torch.Tensor | None) -> torch.Tensor:
        """The backend's fused MoE over `bank` (weights, and the scales and biases where the bank has them)."""
        return self.kernels.fused(hidden, bank[GATE_UP], bank[DOWN], topk_ids, topk_weights, expert_map,
                                  extras=extras_of(bank))

    @abstractmethod
    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor: ...

    @property
    @abstractmethod
    def device_bytes(self) -> int:
        """Expert bytes this layer holds on the device (a shared buffer counts once, on its owner)."""

    def forward_graph_safe(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """`forward` with no host sync and fixed shapes, capturable in a CUDA graph (Triton backend)."""
        self._count_on_device(topk_ids)
        w, expert_map = self._weights()
        return self.moe_fn(hidden, w, topk_ids, topk_weights, expert_map)

    def graph_step_ok(self, max_misses: int) -> bool:
        """Whether a decode step with at most `max_misses` misses per layer may replay a CUDA graph (hybrid
        mode: only when its CPU could not help; every other store: always)."""
        return True

    def begin_step(self, step: int) -> None:
        """Called by the model before step number `step` runs (hybrid's pace counts steps)."""

    def _read_routing(self, hidden: torch.Tensor, topk_ids: torch.Tensor, num_experts: int) -> tuple[list[int], list[int]]:
        """An eager step's one host read: pairs routed to each expert and each expert's last token (hybrid
        mode brings the step's hidden rows to the host in the same read)."""
        return routed_counts_and_last_token(topk_ids, num_experts)

    def _weights(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        raise NotImplementedError

    def _count_on_device(self, topk_ids: torch.Tensor) -> None:
        raise NotImplementedError

    _counts: torch.Tensor | None = None  # the device count vector of graph steps, made on first use

    def device_counts(self, device: torch.device) -> torch.Tensor:
        if self._counts is None:
            self._counts = torch.zeros((len(COUNT_FIELDS),), dtype=torch.int64, device=device)
        return self._counts

    def device_count_vector(self) -> torch.Tensor | None:
        """The device count vector of graph steps (None if none was made)."""
        return self._counts


def sync_all_counters(stores) -> None:
    """Fold every store's device counts into its counters with one host read in all."""
    fold_many((v, s.counters) for s in stores if (v := s.device_count_vector()) is not None)


def routed_counts_and_last_token(topk_ids: torch.Tensor, num_experts: int) -> tuple[list[int], list[int]]:
    """Per expert: the pairs of `topk_ids` [T, K] routed to it and the last token that routes to it (-1:
    none), in one host read."""
    ids = topk_ids.reshape(-1).long()
    token = torch.arange(topk_ids.shape[0], device=ids.device).repeat_interleave(topk_ids.shape[1])  # [T*K]
    last = torch.full((num_experts,), -1, dtype=torch.long, device=ids.device).scatter_reduce_(0, ids, token, "amax")
    both = torch.stack([torch.bincount(ids, minlength=num_experts), last]).tolist()
    return both[0], both[1]


def _distinct(topk_ids: torch.Tensor) -> list[int]:
    return torch.unique(topk_ids).tolist()


class ResidentExperts(ExpertStore):
    mode = "resident"

    def __init__(self, bank: dict[str, torch.Tensor]):
        self.bank = bank  # on the device, [N, ...] per tensor
        n = bank[GATE_UP].shape[0]
        self.expert_map = torch.arange(n, dtype=torch.int32, device=bank[GATE_UP].device)
        self.counters = ExpertCounters()

    def forward(self, hidden, topk_ids, topk_weights):
        self.counters.steps += 1
        self.counters.hits += len(_distinct(topk_ids))
        return self.moe_fn(hidden, self.bank, topk_ids, topk_weights, self.expert_map)

    def _weights(self):
        return self.bank, self.expert_map

    def _count_on_device(self, topk_ids):
        from wisp.core.experts.device_pager import count_step

        count_step(self.device_counts(topk_ids.device), topk_ids, self.expert_map.numel(), hits=True)

    @property
    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.bank.values())


class PagedExperts(ExpertStore):
    mode = "paged"

    def __init__(self, host: dict[str, torch.Tensor], capacity: int, device: torch.device,
                 staging: StagingBuffers | None = None):
        self.pager = ExpertPager(host, capacity, device)
        self.staging = staging  # shared by a model's layers; made on the first wide step if not given

    @property
    def counters(self) -> ExpertCounters:
        return self.pager.counters

    def resize(self, capacity: int) -> None:
        """A new scratch of `capacity` slots (empty: experts page back in on demand); counters carry over.
        The old scratch is released before the new one is allocated."""
        if capacity == self.pager.capacity:
            return
        host, device, counters = self.pager.host, self.pager.device, self.pager.counters
        self.pager.sync_counters()
        self.pager = None
        self.pager = ExpertPager(host, capacity, device)
        self.pager.counters = counters

    after_step = None  # called with each eager step's distinct experts (`wisp.core.experts.prefetch` sets it)
    slots_ready = None  # CUDA event: speculative copies into the slots have landed (`wisp.core.experts.prefetch`)
    slots_read = None  # CUDA event: the last kernel that read the slots is done

    def forward(self, hidden, topk_ids, topk_weights):
        counts, last_token = self._read_routing(hidden, topk_ids, self.pager.num_experts)
        distinct = order_by_last_token(last_token)  # the step's touch order (wisp.core.experts.recency)
        if self.slots_ready is not None:
            torch.cuda.current_stream(hidden.device).wait_event(self.slots_ready)
            self.slots_ready = None
        out = self._step(hidden, topk_ids, topk_weights, distinct, counts)
        if self.after_step is not None:
            if hidden.device.type == "cuda":
                self.slots_read = torch.cuda.current_stream(hidden.device).record_event()
            self.after_step(distinct)
        return out

    def _step(self, hidden, topk_ids, topk_weights, distinct: list[int], counts: list[int]) -> torch.Tensor:
        """One eager step, its routing already read: `distinct` in touch order, `counts` [N] pairs per expert
        (hybrid mode overrides this)."""
        pager = self.pager
        if len(distinct) <= pager.capacity:
            expert_map = pager.prepare(distinct)
            return self.moe_fn(hidden, pager.scratch, topk_ids, topk_weights, expert_map)
        return run_wide_step(pager, self._staging(), self.kernels, hidden, topk_ids, topk_weights, distinct, counts)

    def _staging(self) -> StagingBuffers:
        if self.staging is None:
            self.staging = StagingBuffers(self.pager.host, self.pager.device)
        return self.staging

    def forward_graph_safe(self, hidden, topk_ids, topk_weights):
        pager = self.pager
        w = pager.scratch
        group = pager.capacity // topk_ids.shape[1]  # tokens whose experts always fit in C slots (C >= top_k)
        outs = []
        for start in range(0, hidden.shape[0], group):
            ids = topk_ids[start : start + group]
            expert_map = pager.prepare_on_device(ids)
            outs.append(self.moe_fn(hidden[start : start + group], w, ids, topk_weights[start : start + group], expert_map))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def device_count_vector(self):
        lru = self.pager.device_lru
        return lru.counts if lru is not None else None

    @property
    def device_bytes(self) -> int:
        return self.pager.capacity * self.pager.expert_bytes


class LayerBuffer:
    """One layer-sized device buffer shared by every OffloadExperts of a model."""

    def __init__(self, like: dict[str, torch.Tensor], device: torch.device):
        self.tensors = {n: torch.empty(t.shape, dtype=t.dtype, device=device) for n, t in like.items()}


class OffloadExperts(ExpertStore):
    mode = "offload"

    def __init__(self, host: dict[str, torch.Tensor], buffer: LayerBuffer, owns_buffer: bool):
        self.host = host
        self.buffer = buffer
        self.owns_buffer = owns_buffer
        n = host[GATE_UP].shape[0]
        self.layer_bytes = sum(t.numel() * t.element_size() for t in host.values())
        self.expert_map = torch.arange(n, dtype=torch.int32, device=buffer.tensors[GATE_UP].device)
        self.counters = ExpertCounters()

    def forward(self, hidden, topk_ids, topk_weights):
        for name, master in self.host.items():
            self.buffer.tensors[name].copy_(master, non_blocking=True)
        c = self.counters
        n_routed = len(_distinct(topk_ids))
        c.steps += 1
        c.misses += n_routed
        c.loads += self.host[GATE_UP].shape[0]
        c.bytes_h2d += self.layer_bytes
        w = self.buffer.tensors
        return self.moe_fn(hidden, w, topk_ids, topk_weights, self.expert_map)

    def _weights(self):
        for name, master in self.host.items():
            self.buffer.tensors[name].copy_(master, non_blocking=True)
        return self.buffer.tensors, self.expert_map

    def _count_on_device(self, topk_ids):
        from wisp.core.experts.device_pager import count_step

        n = self.host[GATE_UP].shape[0]
        count_step(self.device_counts(topk_ids.device), topk_ids, n, hits=False, loads=n, fixed_bytes=self.layer_bytes)

    @property
    def device_bytes(self) -> int:
        return self.layer_bytes if self.owns_buffer else 0


class HeldExperts(NamedTuple):
    """A device bank a wide step reads some experts from (`ZeroCopyExperts._held_on_device`)."""

    bank: dict[str, torch.Tensor]  # [H, ...] per tensor
    slot_map: torch.Tensor  # [N (+1)] int32: expert -> its slot in the bank or -1
    ids: set[int]  # the experts held
    copied: set[int]  # those copied into the bank for this step (loads, not hits)


class ZeroCopyExperts(ExpertStore):
    mode = "zero-copy"
    STREAM_REUSE = 2  # stage a step's experts when its pairs number at least this many times its experts

    def __init__(self, host: dict[str, torch.Tensor], device: torch.device, staging: StagingBuffers | None = None):
        self.host = host  # pinned on CUDA: the kernel reads it in place
        n = host[GATE_UP].shape[0]
        self.expert_bytes = expert_bytes(host)
        self.expert_map = torch.arange(n, dtype=torch.int32, device=device)
        self.staging = staging  # shared by a model's layers; without it every step reads in place
        self.counters = ExpertCounters()

    def forward(self, hidden, topk_ids, topk_weights):
        c = self.counters
        c.steps += 1
        counts, last_token = self._read_routing(hidden, topk_ids, self.expert_map.numel())
        distinct = order_by_last_token(last_token)
        if self.staging is not None and topk_ids.numel() >= self.STREAM_REUSE * len(distinct):
            held = self._held_on_device(counts, topk_ids.shape[0])
            streamed = distinct if held is None else [e for e in distinct if e not in held.ids]
            copied = set() if held is None else held.copied  # into the bank just now: misses too, loaded
            fresh = sum(e in copied for e in distinct)
            c.hits += len(distinct) - len(streamed) - fresh
            c.misses += len(streamed) + fresh
            c.loads += len(streamed) + len(copied)
            c.bytes_h2d += (len(streamed) + len(copied)) * self.expert_bytes  # each crosses the link once
            return run_streamed_step(self.host, self.staging, self.kernels, hidden, topk_ids, topk_weights, streamed,
                                     counts, held=None if held is None else (held.bank, held.slot_map))
        return self._in_place_step(hidden, topk_ids, topk_weights, distinct, counts)

    def _held_on_device(self, counts: list[int], tokens: int) -> "HeldExperts | None":
        """Experts a wide step of `tokens` tokens routed as `counts` [N] computes from a device bank instead of
        copying them; none here (hybrid mode's hot experts override this)."""
        return None

    def _in_place_step(self, hidden, topk_ids, topk_weights, distinct: list[int], counts: list[int]) -> torch.Tensor:
        """A narrow step, its routing already read: the kernel reads each routed expert in place (hybrid
        mode with no slots overrides this)."""
        c = self.counters
        c.misses += len(distinct)
        c.bytes_h2d += topk_ids.numel() * self.expert_bytes  # the kernel reads an expert once per routed pair
        return self.moe_fn(hidden, self.host, topk_ids, topk_weights, self.expert_map)

    def _weights(self):
        return self.host, self.expert_map

    def _count_on_device(self, topk_ids):
        from wisp.core.experts.device_pager import count_step

        count_step(self.device_counts(topk_ids.device), topk_ids, self.expert_map.numel(), hits=False,
                   pair_bytes=self.expert_bytes)

    @property
    def device_bytes(self) -> int:
        return 0
