"""`ExpertStore`: one MoE layer's experts, composed of a residency, a miss policy and this executor.

- the residency (`wisp.core.experts.residency`) says where the device bytes live;
- the miss policy (`wisp.core.experts.miss_policies`) turns each step's routing into a serve plan;
- the executor (`forward`) reads the routing once on the host, asks the policy for the plan, counts it
  (`wisp.core.experts.serve_plan.tally`, the one place) and runs it:
  - a plan whose experts one fused launch reaches (all held after the slots' copies, or all read in place):
    the backend's `fused` through the residency's map (or in place through the identity);
  - otherwise pairs: held experts from the bank in one `pairs_by_map` launch, in-place reads in another, each
    copied or staged expert once, copies overlapping compute (`wisp.core.experts.expert_major`), the CPU's
    experts on the host meanwhile (`wisp.core.experts.cpu_server`), and the [T*K, D] pair outputs summed over
    k in routing order.
`forward_graph_safe` is the residency's graph path: no host sync, counted on the device.

Modes are presets of the three parts (`wisp.core.experts.presets`). A front end asks a store for capabilities
(`slots`, `resize_slots`, `hot`, `hold_hot`, `cpu`, `rank_share`), never for its type.

Invariant: for the same routing a (token, k) pair's output does not depend on where its expert's weights sit
(a bank through the map, a slot, a staging buffer, host memory) or on the other tokens, and the sum over k runs
in routing order, so every preset without the CPU returns torch.equal outputs, eager or graph-safe.
"""

from __future__ import annotations

from typing import Callable

import torch

from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.experts.counters import ExpertCounters, fold_many
from wisp.core.experts.cpu_server import CpuServer
from wisp.core.experts.expert_major import StagingBuffers, compute_from_copies, offsets_of
from wisp.core.experts.expert_major_on_device import wide_step_on_device
from wisp.core.experts.hot_experts import HotExperts
from wisp.core.experts.miss_policies import MissPolicy, RoutedStep
from wisp.core.experts.pager import use_host_many
from wisp.core.experts.recency import order_by_last_token, routed_counts_and_last_token
from wisp.core.experts.residency import HotBank, NoBank, Residency
from wisp.core.experts.serve_plan import Serve, ServePlan, tally
from wisp.core.kernels.expert_extras import extras_of
from wisp.core.kernels.registry import TORCH_KERNELS, MoEKernels


class ExpertStore:
    def __init__(self, residency: Residency, policy: MissPolicy, staging: StagingBuffers | None = None,
                 cpu: CpuServer | None = None, kernels: MoEKernels = TORCH_KERNELS, mode: str = ""):
        if policy.needs_cpu and cpu is None:
            raise ValueError(f"miss policy {policy.name!r} serves misses on the CPU: give it a CpuServer")
        self.residency, self.policy, self.staging, self.cpu = residency, policy, staging, cpu
        self.kernels = kernels  # the backend's family (the loader sets it)
        self.mode = mode  # the preset's name, for messages and stats
        self.after_step: Callable[[list[int]], None] | None = None  # each eager step's experts (`prefetch` sets it)
        self.slots_ready = None  # CUDA event: speculative copies into the slots have landed (`prefetch`)
        self.slots_read = None  # CUDA event: the last kernel that read the slots is done

    # -- what it is made of, as capabilities ------------------------------------------------------------
    @property
    def counters(self) -> ExpertCounters:
        return self.residency.counters

    @property
    def host(self) -> dict[str, torch.Tensor]:
        return self.residency.host

    @property
    def expert_bytes(self) -> int:
        return self.residency.expert_bytes

    @property
    def num_experts(self) -> int:
        return self.residency.num_experts

    @property
    def device_bytes(self) -> int:
        """Expert bytes this layer holds on the device (a shared buffer counts once, on its owner)."""
        return self.residency.device_bytes

    @property
    def slots(self) -> int | None:
        """LRU slots that a graph step pages through and a plan resizes (None: no slots)."""
        return self.residency.capacity if self.residency.resizable else None

    def resize_slots(self, capacity: int) -> None:
        """New empty slots (`slots` is not None); counters carry over, the old scratch freed first."""
        if not self.residency.resizable:
            raise ValueError(f"{self.mode or self.residency.name} has no slots to resize")
        self.residency.resize(capacity)

    @property
    def hot(self) -> HotExperts | None:
        """The bank of most-routed experts, if its residency holds one."""
        return self.residency.hot

    @property
    def rank_share(self) -> bool:
        """Whether its decode steps may share each token's ranks between the GPU and the CPU inside graphs."""
        return self.policy.rank_share and self.residency.reads_in_place

    def hold_hot(self, hot: int) -> None:
        """Hold `hot` most-routed experts on the device from now on (0: none): a new bank, empty (the old one
        freed first; the next steps' routing fills it). Captured graphs read the old bank: the owner re-captures."""
        if not self.rank_share:
            raise ValueError(f"hot experts go with the in-place-or-cpu policy and no slots, not {self.mode}")
        counters, host, device = self.counters, self.host, self.residency.device
        self.residency = None
        self.residency = HotBank(host, device, hot) if hot else NoBank(host, device)
        self.residency.counters.copy_from(counters)

    def resident_experts(self) -> list[int]:
        """The experts whose weights sit on the device now (ascending)."""
        return self.residency.held_experts()

    def forget_residents(self) -> None:
        """Forget which experts the device holds (state only): after a capture's warm-up wrote the slots."""
        self.residency.forget()

    # -- an eager step ------------------------------------------------------------------------------------
    def moe_fn(self, hidden, bank, topk_ids, topk_weights, expert_map, count=None) -> torch.Tensor:
        """The backend's fused MoE over `bank` (weights, and the scales and biases where the bank has them);
        `count` (a `StepCount`): the step is added to those device counts."""
        return self.kernels.fused(hidden, bank[GATE_UP], bank[DOWN], topk_ids, topk_weights, expert_map,
                                  extras=extras_of(bank), count=count)

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """hidden [T, D], topk_ids / topk_weights [T, K] -> [T, D]."""
        n = self.num_experts
        counts, last_token = (self.cpu.read_routing(hidden, topk_ids, n) if self.cpu is not None
                              else routed_counts_and_last_token(topk_ids, n))
        order = order_by_last_token(last_token)  # the step's touch order (wisp.core.experts.recency)
        if self.slots_ready is not None:
            torch.cuda.current_stream(hidden.device).wait_event(self.slots_ready)
            self.slots_ready = None
        step = RoutedStep(tuple(order), tuple(counts), topk_ids.shape[0], topk_ids.numel())
        plan = self.policy.assign(step, self.residency, self.cpu, self.staging is not None)
        tally(self.counters, plan, self.expert_bytes)
        out = self.run(plan, hidden, topk_ids, topk_weights)
        if self.after_step is not None:
            if hidden.device.type == "cuda":
                self.slots_read = torch.cuda.current_stream(hidden.device).record_event()
            self.after_step(order)
        return out

    def run(self, plan: ServePlan, hidden: torch.Tensor, topk_ids: torch.Tensor,
            topk_weights: torch.Tensor) -> torch.Tensor:
        """Run a serve plan (counted already): one fused launch where it allows, else pairs (see the docstring)."""
        if plan.single_launch:
            if plan.uses(Serve.IN_PLACE):
                return self.moe_fn(hidden, self.host, topk_ids, topk_weights, self.residency.in_place_map)
            for expert, slot in plan.loads:
                self.residency.copy_into_slot(expert, slot)
            if plan.loads:
                self.residency.after_copies()
            bank, expert_map = self.residency.bank_and_map()
            return self.moe_fn(hidden, bank, topk_ids, topk_weights, expert_map)
        gpu_pairs = lambda: self._gpu_pairs(plan, hidden, topk_ids)  # noqa: E731
        if plan.on_cpu:
            return self.cpu.step(hidden, topk_ids, topk_weights, plan, gpu_pairs, self.kernels)
        t, k = topk_ids.shape
        return self.kernels.combine(gpu_pairs().view(t, k, -1), topk_weights, hidden.dtype)

    def _gpu_pairs(self, plan: ServePlan, hidden: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """The [T*K, D] float32 outputs of every pair the GPU serves (the CPU's left zero): held from the bank
        through its map as it was before the step, read in place, then each copied or staged expert."""
        t, k = topk_ids.shape
        per_k = torch.zeros((t * k, hidden.shape[1]), dtype=torch.float32, device=hidden.device)  # [T*K, D]
        kernels, host = self.kernels, self.host
        held = self.residency.bank_and_map()
        if held is not None and (plan.loads or plan.uses(Serve.HELD)):
            bank, expert_map = held
            kernels.pairs_by_map(per_k, hidden, bank[GATE_UP], bank[DOWN], topk_ids, expert_map, extras=extras_of(bank))
        in_place = plan.of(Serve.IN_PLACE)
        if in_place:
            in_place_map = torch.full((self.num_experts,), -1, dtype=torch.int32)
            in_place_map[in_place] = torch.tensor(in_place, dtype=torch.int32)
            in_place_map = self.cpu.to_device(in_place_map) if self.cpu is not None else in_place_map.to(hidden.device)
            kernels.pairs_by_map(per_k, hidden, host[GATE_UP], host[DOWN], topk_ids, in_place_map, extras=extras_of(host))
        copies = [(e, None) for e in plan.staged] + list(plan.loads)
        if copies:
            scratch = held[0] if plan.loads else None
            compute_from_copies(host, self._staging(), kernels, per_k, hidden, topk_ids, copies, offsets_of(plan.counts),
                                scratch)
        if plan.loads:
            self.residency.after_copies()
        return per_k

    def _staging(self) -> StagingBuffers:
        if self.staging is None:
            self.staging = StagingBuffers(self.host, self.residency.device)
        return self.staging

    # -- a graph step -------------------------------------------------------------------------------------
    def forward_graph_safe(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """`forward` with no host sync and fixed shapes, capturable in a CUDA graph (Triton backend): the
        residency's graph path, counted on the device (`sync_all_counters` folds the counts in)."""
        wide = self._wide_on_device if self.wide_in_graph else None
        return self.residency.graph_forward(self.moe_fn, hidden, topk_ids, topk_weights, wide)

    @property
    def wide_in_graph(self) -> bool:
        """Whether a graph step may be wider than the slots: it then runs expert-major on the device through the
        staging rows (`wisp.core.experts.expert_major_on_device`), each miss copied once."""
        return self.staging is not None and self.residency.pager is not None

    def _wide_on_device(self, pager, hidden, topk_ids, topk_weights) -> torch.Tensor:
        return wide_step_on_device(pager, self.staging, self.kernels, hidden, topk_ids, topk_weights)

    def device_count_vector(self) -> torch.Tensor | None:
        return self.residency.device_count_vector()

    def graph_step_ok(self, max_misses: int) -> bool:
        """Whether a decode step with at most `max_misses` misses a layer may replay the whole CUDA graph: its
        graph path serves what it holds, and its CPU (if any) could not have helped."""
        if self.residency.hot is not None:
            return False  # the whole graph reads even the held experts in place; the rank share reads the bank
        return self.cpu is None or self.cpu.graph_step_ok(max_misses)

    def begin_step(self, step: int) -> None:
        """Called by the model before step number `step` runs (the CPU's pace counts steps)."""
        if self.cpu is not None:
            self.cpu.begin_step(step, self.kernels.activation)


def sync_all_counters(stores) -> None:
    """Fold every store's device counts into its counters with one host read in all."""
    fold_many((v, s.counters) for s in stores if (v := s.device_count_vector()) is not None)


def lru_state_on(stores, where: str) -> None:
    """Hand the LRU slot state of every store that has slots to the "host" (one read for all) or the "device"
    (no-op where it already is): eager steps decide on the host, graph steps on the device."""
    pagers = [p for s in stores if (p := s.residency.pager) is not None]
    if where == "host":
        use_host_many(pagers)
    elif where == "device":
        for pager in pagers:
            pager.use_device()
    else:
        raise ValueError(f"LRU state lives on the host or the device, not {where!r}")
