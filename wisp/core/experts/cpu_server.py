"""`CpuServer`: the host CPU as a server of a layer's misses (the CPU way of a serve plan), computed straight
from the pinned host masters and never cached.

It owns the costs probed at load (`wisp.core.learners.hybrid_probe`) and their pace (`CpuPace`, one per
model, corrected while serving), the CPU kernel (`wisp.core.kernels.cpu_expert_kernels`), and the trips
between the device and the host (`wisp.core.experts.host_exchange`: a decode-sized step's routing read brings
its hidden rows in the same wait). `step` runs a plan with CPU experts: the GPU's pairs are enqueued first
(`gpu_pairs()`, asynchronous), then this thread computes the CPU's pairs while the GPU runs, writes them into
the same [T*K, D] pair outputs, and everything is summed over k in routing order, as every store does. (Not a
worker thread: a second thread calling torch's CPU kernels brings a second OpenMP team onto the same cores.)

Invariants: every pair is computed once, by the GPU or by the CPU; with the "reference" kernel on a CPU-only
run the output is torch.equal to paging's, otherwise it differs only by the CPU's rounding of its pairs (not
batch invariant: which experts go to the CPU depends on the whole step's routing). The pace learns from the
CPU's side alone (the rows' trip and the kernels) against its time at the probe's costs. Counting is the
serve plan's (`wisp.core.experts.serve_plan.tally`), not this server's.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from wisp.core.bank_keys import GATE_UP
from wisp.core.experts.host_exchange import HostExchange
from wisp.core.experts.cpu_assignment import CpuAssignment, assign_misses, assignment_time
from wisp.core.experts.recency import routed_counts_and_last_token
from wisp.core.experts.serve_plan import ServePlan
from wisp.core.kernels.cpu_expert_kernels import CPU_EXPERT_KERNELS, CpuExperts, default_cpu_kernel
from wisp.core.kernels.expert_extras import SILU, Activation
from wisp.core.kernels.registry import MoEKernels
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.core.learners.hybrid_pace import CpuPace
from wisp.core.learners.hybrid_probe import timed_s


class CpuServer:
    ROWS_WITH_ROUTING = 64  # steps of at most this many tokens (decode) bring their hidden rows with the routing

    def __init__(self, host: dict[str, torch.Tensor], device: torch.device, costs: HybridCosts,
                 cpu_kernel: str | None = None, pace: CpuPace | None = None, dtype: torch.dtype | None = None):
        """dtype: the model's compute dtype, which `one_row_s` computes in (None: plain weights' own, else bf16)."""
        self.costs = costs  # as probed
        self.pace = pace or CpuPace()
        self.cpu_kernel = cpu_kernel or default_cpu_kernel(torch.device(device))
        self.cpu_experts = CpuExperts(host, CPU_EXPERT_KERNELS[self.cpu_kernel])  # from the pinned masters
        self.exchange = HostExchange(device)
        self.last_assignment: CpuAssignment | None = None
        self._rows_read: tuple[torch.Tensor, torch.Tensor] | None = None  # this step's (hidden, ids) on the host
        self._retimed_expert = 0  # the next expert `one_row_s` times (a different one each call)
        w = host[GATE_UP]
        self.dtype = dtype or (w.dtype if w.dtype.is_floating_point and w.element_size() > 1 else torch.bfloat16)

    def read_routing(self, hidden: torch.Tensor, topk_ids: torch.Tensor, num_experts: int) -> tuple[list[int], list[int]]:
        """The step's one host read (`routed_counts_and_last_token`), with the hidden rows in the same trip for a
        decode-sized step (its CPU experts need them)."""
        if topk_ids.shape[0] <= self.ROWS_WITH_ROUTING:
            self._rows_read = hidden_host, ids_host = self.exchange.to_host(hidden, topk_ids)
        else:
            self._rows_read = None
            (ids_host,) = self.exchange.to_host(topk_ids)
        return routed_counts_and_last_token(ids_host, num_experts)

    def assign(self, misses: Sequence[tuple[int, int]]) -> CpuAssignment:
        """`assign_misses` of (expert, rows) at the paced costs."""
        self.last_assignment = assign_misses(misses, self.pace.costs(self.costs))
        return self.last_assignment

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        (on_device,) = self.exchange.to_device(tensor)
        return on_device

    def step(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, plan: ServePlan,
             gpu_pairs: Callable[[], torch.Tensor], kernels: MoEKernels) -> torch.Tensor:
        """`gpu_pairs()` enqueues the GPU's pairs and returns the [T*K, D] float32 pair outputs (the CPU's pairs
        left zero); meanwhile this thread computes `plan.on_cpu`'s pairs, then all are summed: [T, D]."""
        start = time.perf_counter()
        t, k = topk_ids.shape
        rows_read, self._rows_read = self._rows_read, None
        hidden_host, ids_host = rows_read or self.exchange.to_host(hidden, topk_ids)
        per_k = gpu_pairs()  # enqueued
        gpu_done = torch.cuda.current_stream(hidden.device).record_event() if self.exchange.cuda else None
        kernel_start = time.perf_counter()
        pairs, rows = cpu_pair_rows(hidden_host, ids_host, self.cpu_experts, plan.on_cpu, k, kernels.activation)
        cpu_done = time.perf_counter()
        if gpu_done is not None:
            gpu_done.synchronize()
        pairs_dev, rows_dev = self.exchange.to_device(pairs, rows)
        per_k[pairs_dev] = rows_dev
        wall_s = time.perf_counter() - start
        at_probe_s = assignment_time(0, [plan.counts[e] for e in plan.on_cpu], self.costs)  # the CPU side at the probe's costs
        self.pace.observe(wall_s, plan.cpu_predicted_s, cpu_done - kernel_start, ratio=(cpu_done - start, at_probe_s))
        return kernels.combine(per_k.view(t, k, -1), topk_weights, hidden.dtype)

    def graph_step_ok(self, max_misses: int) -> bool:
        """Whether a step with at most `max_misses` misses a layer is one the CPU could not help."""
        return self.pace.graph_step_ok(self.costs, max_misses)

    def begin_step(self, step: int, activation: Activation = SILU) -> None:
        """Before model step number `step`: the pace's step, and where it asks (a CPU left idle since the last
        exploration: `CpuPace.retime_due`) one expert of one row re-timed against the probe's price of it."""
        self.pace.begin_step(step)
        if self.pace.retime_due():
            self.pace.retimed(self.one_row_s(activation), self.costs.cpu_s(1))

    def one_row_s(self, activation: Activation = SILU, repeats: int = 3) -> float:
        """The fastest of `repeats` CPU experts of one row after one warm-up, each a different expert (as the
        probe times them: `wisp.core.learners.hybrid_probe`)."""
        experts = self.cpu_experts
        x = torch.zeros((1, experts.downs[0].shape[0]), dtype=self.dtype)  # down [D, ...]: one hidden row

        def one() -> None:
            e = self._retimed_expert % len(experts.gate_ups)
            self._retimed_expert += 1
            experts.kernel(x, [1], [experts.gate_ups[e]], [experts.downs[e]], [experts.extras[e]], activation)

        return timed_s(one, torch.device("cpu"), repeats, pick=min)

def cpu_pair_rows(hidden: torch.Tensor, topk_ids: torch.Tensor, cpu_experts: CpuExperts, experts, top_k: int,
                  activation: Activation = SILU) -> tuple[torch.Tensor, torch.Tensor]:
    """On the CPU: the flat (token, k) pair indices routed to `experts` and their float32 outputs
    ([M], [M, D]), each expert's pairs in token order, computed from the host masters in one kernel call."""
    flat = topk_ids.reshape(-1)
    routed = [(flat == expert).nonzero().squeeze(1) for expert in experts]  # [m] each, ascending: token order
    pairs = torch.cat(routed)
    return pairs, cpu_experts.rows(hidden, pairs, [len(r) for r in routed], list(experts), top_k, activation)
