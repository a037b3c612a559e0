"""`HybridExperts`: paged mode with a second server for misses, the CPU.

Each step, after the routing is read (the one host read paged mode also makes), the layer's missing experts
are divided by `wisp.core.experts.hybrid_split.split_misses` between copies into slots (cached, LRU, exactly as
`PagedExperts` does) and the CPU, which computes its experts' (token, k) pairs straight from the pinned host
masters (`wisp.core.kernels.cpu_expert_kernels`) and caches nothing. The GPU's work is
enqueued first, all of it asynchronous: the hits and the copied experts, expert-major
(`wisp.core.experts.expert_major.expert_major_pairs`: hits first, then each copy's pairs once it lands on a side
stream). Then this thread computes the CPU's pairs while the GPU runs, writes them into the same [T*K, D]
pair outputs, and everything is summed over k in routing order, as every mode does. (Not a worker thread: a
second thread calling torch's CPU kernels brings a second OpenMP team onto the same cores; on the H200's
host that made one OLMoE expert 2.5 ms instead of 0.8.)

The host trips go through pinned buffers (`wisp.core.experts.host_exchange`): a decode-sized step's routing read
brings its hidden rows in the same wait, and the CPU's pair outputs go back with non-blocking copies. (With
`.cpu()` and pageable `.to()` each trip was a sync of its own: on the H200's host a layer spent about as
long in them and the launches around them as in its CPU experts.)

Invariants:
- a step whose split sends nothing to the CPU is a paged step: the same decision, bytes and output;
- every pair is computed exactly once, by the GPU or by the CPU, and the sum over k runs in routing order;
  so with the "reference" kernel on a CPU-only run the output is torch.equal to paged mode's, and otherwise
  it differs only by the CPU's rounding of those pairs: close to resident, not bit-identical, and not batch
  invariant (which experts go to the CPU depends on the whole step's routing);
- CPU-served experts count as misses (`counters.misses`, and `counters.cpu_computed`), never as loads or
  bytes: they do not cross the link, and the slots are not touched for them;
- the split uses the probe's costs as `CpuPace` corrects them (one pace per model): the CPU's by each CPU
  step's CPU side, the copy's by the rank split's device-timed in-place reads where that runs; a step whose
  batch the CPU cannot help (`graph_step_ok`) is a paged step, and `forward_graph_safe` is paged mode's
  (the engine replays CUDA graphs only for such steps: a split needs the routing on the host).
"""

from __future__ import annotations

import time

import torch

from wisp.core.experts.counters import ExpertCounters
from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.experts.expert_major import StagingBuffers, expert_major_pairs
from wisp.core.experts.stores import HeldExperts, PagedExperts, ZeroCopyExperts, routed_counts_and_last_token
from wisp.core.kernels.cpu_expert_kernels import CPU_EXPERT_KERNELS, CpuExperts, default_cpu_kernel
from wisp.core.kernels.expert_extras import SILU, Activation, extras_of
from wisp.core.learners.hybrid_pace import CpuPace
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.core.experts.hybrid_split import MissSplit, split_misses, split_time
from wisp.core.experts.hot_experts import HotExperts
from wisp.core.experts.host_exchange import HostExchange
from wisp.core.kernels.registry import MoEKernels


class CpuServed:
    """The CPU as a second server of a store's experts: the probed costs, their pace and the CPU kernel, and
    the step that computes some experts' pairs on the CPU while the GPU computes the rest."""

    counters: ExpertCounters
    kernels: MoEKernels
    ROWS_WITH_ROUTING = 64  # steps of at most this many tokens (decode) bring their hidden rows with the routing

    def _serve_with_cpu(self, host: dict[str, torch.Tensor], device, costs: HybridCosts, cpu_kernel: str | None,
                        pace: CpuPace | None) -> None:
        self.costs = costs  # as probed
        self.pace = pace or CpuPace()
        self.cpu_kernel = cpu_kernel or default_cpu_kernel(torch.device(device))
        self.cpu_experts = CpuExperts(host, CPU_EXPERT_KERNELS[self.cpu_kernel])  # from the pinned masters
        self.last_split: MissSplit | None = None
        self.exchange = HostExchange(device)  # the step's trips to the host and back, through pinned buffers
        self._rows_read: tuple[torch.Tensor, torch.Tensor] | None = None  # this step's (hidden, ids) on the host

    def _read_routing(self, hidden, topk_ids, num_experts):
        """The routing read, with the hidden rows in the same trip for a decode-sized step (its CPU experts
        need them)."""
        if topk_ids.shape[0] <= self.ROWS_WITH_ROUTING:
            self._rows_read = hidden_host, ids_host = self.exchange.to_host(hidden, topk_ids)
        else:
            self._rows_read = None
            (ids_host,) = self.exchange.to_host(topk_ids)
        return routed_counts_and_last_token(ids_host, num_experts)

    def _split(self, misses: list[tuple[int, int]]) -> MissSplit:
        self.last_split = split_misses(misses, self.pace.costs(self.costs))
        return self.last_split

    def _step_with_cpu(self, hidden, topk_ids, topk_weights, split: MissSplit, gpu_pairs) -> torch.Tensor:
        """`gpu_pairs()` enqueues the GPU's pairs and returns the [T*K, D] float32 pair outputs (the CPU's
        pairs left zero); meanwhile this thread computes `split.to_cpu`'s pairs, then all are summed. The pace
        learns from the CPU side alone (the rows' trip to the host and the kernels) against its time at the
        probe's costs; the wall, which runs to the later of the two sides, goes to its stats."""
        start = time.perf_counter()
        t, k = topk_ids.shape
        rows_read, self._rows_read = self._rows_read, None
        hidden_host, ids_host = rows_read or self.exchange.to_host(hidden, topk_ids)
        per_k = gpu_pairs()  # enqueued
        gpu_done = torch.cuda.current_stream(hidden.device).record_event() if self.exchange.cuda else None
        kernel_start = time.perf_counter()
        pairs, rows = cpu_pair_rows(hidden_host, ids_host, self.cpu_experts, split.to_cpu, k,
                                    self.kernels.activation)  # meanwhile
        cpu_done = time.perf_counter()
        kernel_s = cpu_done - kernel_start
        if gpu_done is not None:
            gpu_done.synchronize()
        pairs_dev, rows_dev = self.exchange.to_device(pairs, rows)
        per_k[pairs_dev] = rows_dev
        wall_s = time.perf_counter() - start
        at_probe_s = split_time(0, split.cpu_rows, self.costs)  # the CPU side at the probe's costs
        self.pace.observe(wall_s, split.predicted_s, kernel_s, ratio=(cpu_done - start, at_probe_s))
        c = self.counters
        c.misses += len(split.to_cpu)
        c.cpu_computed += len(split.to_cpu)
        return self.kernels.combine(per_k.view(t, k, -1), topk_weights, hidden.dtype)

    def graph_step_ok(self, max_misses: int) -> bool:
        return self.pace.graph_step_ok(self.costs, max_misses)

    def begin_step(self, step: int) -> None:
        self.pace.begin_step(step)


class HybridExperts(CpuServed, PagedExperts):
    mode = "hybrid"

    def __init__(self, host: dict[str, torch.Tensor], capacity: int, device: torch.device, costs: HybridCosts,
                 staging: StagingBuffers | None = None, cpu_kernel: str | None = None, pace: CpuPace | None = None):
        super().__init__(host, capacity, device, staging)
        self._serve_with_cpu(host, device, costs, cpu_kernel, pace)

    def _step(self, hidden, topk_ids, topk_weights, order: list[int], counts: list[int]) -> torch.Tensor:
        pager = self.pager
        pager.use_host()
        split = self._split([(e, counts[e]) for e in order if pager.slot_of[e] < 0])
        if not split.to_cpu:  # a paged step
            return super()._step(hidden, topk_ids, topk_weights, order, counts)
        on_cpu = set(split.to_cpu)
        gpu_order = [e for e in order if e not in on_cpu]
        return self._step_with_cpu(hidden, topk_ids, topk_weights, split, lambda: expert_major_pairs(
            pager, self._staging(), self.kernels, hidden, topk_ids, gpu_order, counts))


class ZeroCopyHybridExperts(CpuServed, ZeroCopyExperts):
    """Hybrid mode with no slots (`--mode hybrid --expert-cap 0`): every routed expert of a decode step is
    either read in place by the GPU's kernel (zero-copy) or computed by the CPU from the same pinned
    master, split by `split_misses` with the in-place read priced as a copy. Both servers read host memory
    at once, so a step can go faster than the link alone allows (the llama.cpp `--n-cpu-moe` setting, with
    the GPU reading the rest rather than idling). A wide step (a prefill chunk) is zero-copy's streamed step.

    `hot` > 0 also holds that many of the layer's most-routed experts on the device (`wisp.core.experts.hot_experts`);
    the rank split (`wisp.core.experts.rank_split`, the decode steps under CUDA graphs), the wide steps (prefill
    chunks) and the eager narrow steps serve their pairs from there (hits: neither copied nor sent to the CPU).

    Invariants: a step that sends nothing to the CPU and routes nothing hot is a zero-copy step (same output,
    same counts, and a refresh's copies as loads); every routed expert counts as a miss but a held one (a hit), the CPU's also in
    `cpu_computed`, and bytes only for the pairs the GPU reads over the link and the bank's copies; graph
    steps are zero-copy's."""

    mode = "hybrid"

    def __init__(self, host: dict[str, torch.Tensor], device: torch.device, costs: HybridCosts,
                 staging: StagingBuffers | None = None, cpu_kernel: str | None = None, pace: CpuPace | None = None,
                 hot: int = 0):
        super().__init__(host, device, staging)
        self._serve_with_cpu(host, device, costs, cpu_kernel, pace)
        self._device = torch.device(device)
        self.hot = HotExperts(host, hot, self._device) if hot else None

    def hold_hot(self, hot: int) -> None:
        """Hold `hot` experts on the device from now on (0: none): a new bank, empty (the old one freed first;
        the next steps' routing fills it). Captured graphs read the old bank: the owner re-captures them."""
        self.hot = None
        self.hot = HotExperts(self.host, hot, self._device) if hot else None

    @property
    def device_bytes(self) -> int:
        return 0 if self.hot is None else self.hot.bytes

    def graph_step_ok(self, max_misses: int) -> bool:
        """With hot experts never: zero-copy's whole graph would read their pairs over the link too, where the
        rank split reads them from the bank even with no CPU share."""
        return self.hot is None and super().graph_step_ok(max_misses)

    def _held_on_device(self, counts: list[int], tokens: int):
        """The hot experts, after the chunk's routing joined their scores (a token's worth: one step's) and, when
        due, a refresh (the first chunk fills the bank, so the prompt's later chunks copy fewer experts)."""
        hot = self.hot
        if hot is None:
            return None
        copied = self._observe_hot(counts, tokens)
        return HeldExperts(hot.bank, hot.slot_map, hot.held, copied) if hot.held else None

    def _observe_hot(self, counts: list[int], tokens: int) -> set[int]:
        """A step's routing into the hot experts' scores (`HotExperts.observe_counts`) and, when due, a refresh
        before the step computes; returns the experts the refresh copied into the bank."""
        hot = self.hot
        hot.observe_counts(counts, tokens)
        before = hot.held
        if hot.refresh_due():
            hot.refresh()
        return hot.held - before

    def _in_place_step(self, hidden, topk_ids, topk_weights, distinct: list[int], counts: list[int]) -> torch.Tensor:
        # an eager narrow step: every pair counted, as the rank split counts a decode step's
        copied = set() if self.hot is None else self._observe_hot(counts, 1)
        held = set() if self.hot is None else self.hot.held
        split = self._split([(e, counts[e]) for e in distinct if e not in held])
        c = self.counters
        c.loads += len(copied)
        c.bytes_h2d += len(copied) * self.expert_bytes
        routed_held = [e for e in distinct if e in held]
        if not split.to_cpu and not routed_held:
            return super()._in_place_step(hidden, topk_ids, topk_weights, distinct, counts)
        fresh = sum(e in copied for e in routed_held)  # into the bank just now: misses too, loaded (as a wide step)
        c.hits += len(routed_held) - fresh
        c.misses += len(split.to_copy) + fresh
        c.bytes_h2d += sum(counts[e] for e in split.to_copy) * self.expert_bytes
        host_map = torch.arange(self.expert_map.numel(), dtype=torch.int32)
        host_map[list(split.to_cpu) + routed_held] = -1  # the CPU's experts and the bank's: not read in place
        (gpu_map,) = self.exchange.to_device(host_map)
        t, k = topk_ids.shape

        def gpu_pairs() -> torch.Tensor:
            per_k = torch.zeros((t * k, hidden.shape[1]), dtype=torch.float32, device=hidden.device)  # [T*K, D]
            if routed_held:  # from the device bank (its map sends every other expert nowhere)
                bank = self.hot.bank
                self.kernels.pairs_by_map(per_k, hidden, bank[GATE_UP], bank[DOWN], topk_ids, self.hot.slot_map,
                                          extras=extras_of(bank))
            self.kernels.pairs_by_map(per_k, hidden, self.host[GATE_UP], self.host[DOWN], topk_ids, gpu_map,
                                      extras=extras_of(self.host))  # in place, over the link
            return per_k

        if not split.to_cpu:
            return self.kernels.combine(gpu_pairs().view(t, k, -1), topk_weights, hidden.dtype)
        return self._step_with_cpu(hidden, topk_ids, topk_weights, split, gpu_pairs)


def cpu_pair_rows(hidden: torch.Tensor, topk_ids: torch.Tensor, cpu_experts: CpuExperts, experts, top_k: int,
                  activation: Activation = SILU) -> tuple[torch.Tensor, torch.Tensor]:
    """On the CPU: the flat (token, k) pair indices routed to `experts` and their float32 outputs
    ([M], [M, D]), each expert's pairs in token order, computed from the host masters in one kernel call."""
    flat = topk_ids.reshape(-1)
    routed = [(flat == expert).nonzero().squeeze(1) for expert in experts]  # [m] each, ascending: token order
    pairs = torch.cat(routed)
    return pairs, cpu_experts.rows(hidden, pairs, [len(r) for r in routed], list(experts), top_k, activation)
