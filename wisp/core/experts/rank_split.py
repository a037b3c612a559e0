"""`RankSplit`: hybrid mode's CPU share of a decode step without slots, by routing rank, inside CUDA graphs.

The eager hybrid step (`wisp.core.experts.miss_policies`' in-place-or-cpu) splits a layer's experts by their measured costs, so it
needs the routing on the host before it can launch anything for the GPU: per layer a host read, a Python
split, the launches, a write back. On the H200's host that is about as long as the CPU's experts take.
Here the share is fixed by rank instead: of each token's top-k pairs, those of rank k < n (`cpu_share`,
a device scalar) are the CPU's and the rest the GPU's. Which experts those are no longer matters to the
GPU's side, so it can be captured (`wisp.engine.cuda_graphs`):
- `send` (end of a piece's graph): the experts' input rows and the routing go to pinned host buffers;
- `gpu_pairs` (a graph): the GPU reads its pairs' experts in place (the CPU's ranks get a placeholder id,
  N, that the map sends nowhere) into the [T*K, D] float32 pair outputs;
- `cpu_rows` (the host, between graphs): waits for the routing, computes its pairs from the pinned
  masters with the CPU kernel (the native kernel's SiLU experts: grouping, kernels and rows in one native
  call, `rank_split_rows`) into pinned host rows, and `account` later counts the layer and feeds the pace.
  Under the graphs the accounting waits until the next layer's graphs are launched
  (`DecodeGraphs.run_split`), so the merge and the next layer's work are queued the moment the CPU's rows
  are: 16 layers of Python bookkeeping left the step's critical path. `serve` is `rows_to_device` (the
  rows, then `rows_in`) and `account` at once (eager callers);
- `rows_in` then `merge` (captured at the head of the next piece's graph, so one launch follows the CPU's
  rows): the rows copied to a device buffer (stream-ordered after the GPU's pairs: the host does not wait
  for them), the CPU's rows take their ranks' places, and the pairs are summed over k in routing order,
  as every mode does.
n is chosen per step from the probed costs as the pace corrects them (`cpu_share_for`): the smallest n
with the least predicted time, max(CPU's experts, GPU's in-place pairs). The pace learns each side apart:
the CPU's from its own side (`CpuPace.observe`'s `ratio`), not from the wall, which includes the wait for the
GPU's; under the graphs, the in-place reads' price from the GPU's pairs timed on the device (`link`).

Invariants:
- every (token, k) pair is computed once: by the CPU iff k < n; the sum over k runs in routing order;
- for a fixed n a pair's output depends only on its token's row and its expert (which server computes
  it depends on its rank alone, not on the batch): the step is batch invariant for a fixed n, and equal
  to the eager hybrid step that sends the same experts to the CPU (for distinct experts), bit for bit;
- counters as hybrid's eager step: each routed expert a miss, the CPU's also `cpu_computed`, bytes for
  the pairs the GPU reads in place;
- the host buffers are rewritten only after the stream has passed the copies that read them: each layer
  has its own, and `cpu_rows` waits for this layer's routing, which the stream sends only after this
  layer's rows of the step before have landed (and `send` runs after `cpu_rows` returned);
- `account` is called once per `cpu_rows`, before the step ends (the pace's step closes then), with
  events not recorded again since that layer's; with hot experts, `refresh_hot` after every layer's merge
  (the host's view of which pairs were hot is the map the step ran with).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

from wisp.core.kernels.cpu_expert_kernels import native_experts_mlp, rank_split_rows, whole_in_native
from wisp.core.kernels.expert_extras import extras_of
from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.experts.cpu_server import cpu_pair_rows
from wisp.core.learners.hybrid_costs import HybridCosts

LIVE_EMA = 0.05  # the weight of a layer-step in `RankSplit.live`, each rank's share of pairs that were not hot


class RankSplit:
    def __init__(self, store, max_batch: int, top_k: int, hidden: torch.Tensor):
        """`store`: an `ExpertStore` whose `rank_split` holds (its masters, kernels, CPU server, counters);
        `hidden`: a row like the experts' input (its width, dtype and device)."""
        self.store, self.top_k = store, top_k
        device, d = hidden.device, hidden.shape[-1]
        pinned = device.type == "cuda"
        n = store.num_experts
        self.cpu_share = torch.zeros((), dtype=torch.int64, device=device)  # n: ranks below it are the CPU's
        self._share = 0  # its value, as last set
        self._predicted_s: float | None = None  # a layer's predicted time at that share (the pace's reference)
        self.expert_map = torch.cat([store.residency.in_place_map, torch.full((1,), -1, dtype=torch.int32, device=device)])  # [N+1]
        self.placeholder = n  # the CPU's pairs' id on the GPU: no slot
        self.ranks = torch.arange(top_k, device=device)  # [K]
        self.hidden_host = torch.zeros((max_batch, d), dtype=hidden.dtype, pin_memory=pinned)
        self.ids_host = torch.zeros((max_batch, top_k), dtype=torch.int64, pin_memory=pinned)
        self.rows_host = torch.zeros((max_batch, top_k, d), dtype=torch.float32, pin_memory=pinned)
        self.rows = torch.zeros((max_batch, top_k, d), dtype=torch.float32, device=device)  # the CPU's, on the device
        self.hot = store.hot  # a `HotExperts` or None: those experts' pairs are the GPU's, from its bank
        # with hot experts the CPU gets the routing with their ids -1 (its kernels skip them); the raw ids still
        # come for the counts, and `live[r]` is the share of recent pairs of rank r that were not hot (the
        # prediction's: the most-routed experts are mostly the first ranks, the CPU's)
        self.cpu_ids_host = (torch.zeros((max_batch, top_k), dtype=torch.int64, pin_memory=pinned)
                             if self.hot is not None else self.ids_host)
        self.live = [1.0] * top_k
        self._refresh_due = False  # a refresh for `refresh_hot` at the step's end
        host = store.host
        self._native = (store.cpu.cpu_experts.kernel is native_experts_mlp and hidden.dtype == torch.bfloat16
                        and all(host[key].is_contiguous() for key in (GATE_UP, DOWN))
                        and whole_in_native(host[GATE_UP][0], host[DOWN][0], extras_of(host), store.kernels.activation))

    # -- captured (graph-safe) --------------------------------------------------------------------------
    def send(self, hidden: torch.Tensor, topk_ids: torch.Tensor) -> None:
        """The experts' input rows [B, D] and the routing [B, K] to the host buffers (no wait)."""
        b = hidden.shape[0]
        self.hidden_host[:b].copy_(hidden, non_blocking=True)
        self.ids_host[:b].copy_(topk_ids, non_blocking=True)
        if self.hot is not None:
            self.cpu_ids_host[:b].copy_(torch.where(self._hot_pairs(topk_ids), -1, topk_ids), non_blocking=True)

    def _hot_pairs(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """[B, K] bool: the pairs whose expert is hot (held in the device bank)."""
        return self.hot.slot_map[topk_ids] >= 0

    def gpu_pairs(self, hidden: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """The GPU's pairs: the hot experts' from the bank, the others of rank >= n read in place: [B*K, D]
        float32, the CPU's pairs left zero."""
        b, k = topk_ids.shape
        ids = torch.where(self.ranks < self.cpu_share, self.placeholder, topk_ids)  # [B, K]
        per_k = torch.zeros((b * k, hidden.shape[1]), dtype=torch.float32, device=hidden.device)  # [B*K, D]
        if self.hot is not None:
            bank = self.hot.bank
            self.store.kernels.pairs_by_map(per_k, hidden, bank[GATE_UP], bank[DOWN], topk_ids, self.hot.slot_map,
                                            extras=extras_of(bank))
            ids = torch.where(self._hot_pairs(topk_ids), self.placeholder, ids)
        host = self.store.host
        self.store.kernels.pairs_by_map(per_k, hidden, host[GATE_UP], host[DOWN], ids, self.expert_map,
                                        extras=extras_of(host))
        return per_k

    def merge(self, per_k: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              dtype: torch.dtype) -> torch.Tensor:
        """The CPU's rows in their pairs' places, then the sum over k in routing order: [B, D]."""
        b, k = topk_weights.shape
        on_cpu = (self.ranks < self.cpu_share).view(1, k, 1)
        if self.hot is not None:
            on_cpu = on_cpu & ~self._hot_pairs(topk_ids).unsqueeze(-1)  # [B, K, 1]
        per = torch.where(on_cpu, self.rows[:b], per_k.view(b, k, -1))  # [B, K, D]
        return self.store.kernels.combine(per, topk_weights, dtype)

    # -- the host's side --------------------------------------------------------------------------------
    def set_share(self, n: int, predicted_s: float | None = None) -> None:
        """Ranks below n go to the CPU from the next step on (one fill launch when it changes). The pace
        compares each layer's CPU step with `predicted_s`, the step's `predicted_s(b, n)` worked out once
        by the caller (the costs hold for a step); None: each layer works it out."""
        if not 0 <= n <= self.top_k:
            raise ValueError(f"cpu share must be within 0..{self.top_k}, got {n}")
        if n != self._share:
            self.cpu_share.fill_(n)
            self._share = n
        self._predicted_s = predicted_s

    def serve(self, b: int, routed: "torch.cuda.Event | None", gpu_done: "torch.cuda.Event | None",
              timed: bool = False) -> None:
        """`rows_to_device` then its `account`, at once (eager callers)."""
        self.account(self.rows_to_device(b, routed), routed, gpu_done, timed)

    def rows_to_device(self, b: int, routed: "torch.cuda.Event | None") -> "HostSide":
        """`cpu_rows`, then their copy to the device buffer `merge` reads (queued behind the GPU's pairs; no
        wait for them). Returns what `account` needs."""
        side = self.cpu_rows(b, routed)
        self.rows_in(b)
        return side

    def cpu_rows(self, b: int, routed: "torch.cuda.Event | None") -> "HostSide":
        """Between the graphs: wait for the routing (`routed`), compute the CPU's pairs into the host rows.
        Returns what `account` needs. (Lean on purpose: it runs once per MoE layer on the step's critical
        path; under the graphs the next piece's graph copies the rows in, `rows_in`.)"""
        waited = time.perf_counter()
        if routed is not None:
            routed.synchronize()
        start = time.perf_counter()
        computed, routed_experts = (self._native_rows(b) if self._native else self._rows(b))
        done = time.perf_counter()
        return HostSide(b, self._share, computed, routed_experts, start - waited, done - start)

    def rows_in(self, b: int) -> None:
        """The host rows to the device buffer `merge` reads (graph-safe: a copy from pinned memory, stream
        ordered). Rows of ranks the CPU did not compute are copied too; `merge` does not take them."""
        self.rows[:b].copy_(self.rows_host[:b], non_blocking=True)

    def account(self, side: "HostSide", routed: "torch.cuda.Event | None", gpu_done: "torch.cuda.Event | None",
                timed: bool = False) -> None:
        """Count the layer as the eager step would, and give the pace its CPU side against its prediction.
        gpu_done: waited for here. timed: the events time the GPU's pairs between them (enable_timing; both
        given), for the pace's link ratio, and the layer's wait for the GPU is its pairs past the CPU's side;
        untimed, it is the host's wait here (eager callers: right after `rows_to_device`)."""
        b, n = side.b, side.share
        store = self.store
        waiting = time.perf_counter()
        if gpu_done is not None:
            gpu_done.synchronize()
        host_wait_s = time.perf_counter() - waiting  # untimed (eager callers): the host's wait for the GPU's pairs
        cpu_pairs, gpu_pairs, hits = self._pairs_of(side)
        if side.computed:
            predicted = self.predicted_s(b, n) if self._predicted_s is None else self._predicted_s
            cpu_at_probe_s, gpu_at_probe_s = self.sides_s(cpu_pairs, gpu_pairs, store.cpu.costs)  # against the probe's costs
            timed_pairs = timed and routed is not None and gpu_done is not None and gpu_pairs > 0
            gpu_s = routed.elapsed_time(gpu_done) / 1e3 if timed_pairs else 0.0  # ms -> s
            # the GPU's side past the CPU's, both from the routing's arrival (the device's clock against the host's)
            gpu_wait_s = max(0.0, gpu_s - side.cpu_s) if timed_pairs else host_wait_s
            link = (gpu_s, gpu_at_probe_s) if timed_pairs else None
            store.cpu.pace.observe(side.cpu_s + gpu_wait_s, predicted, side.cpu_s, side.routing_wait_s, gpu_wait_s,
                               ratio=(side.cpu_s, cpu_at_probe_s), link=link, cpu_ranks=n, gpu_s=gpu_s)
        c = store.counters
        c.steps += 1
        c.hits += hits
        c.misses += side.routed_experts
        c.cpu_computed += side.computed
        c.bytes_h2d += gpu_pairs * store.expert_bytes

    def _pairs_of(self, side: "HostSide") -> tuple[int, int, int]:
        """(the CPU's pairs, the pairs the GPU read in place, distinct hot experts routed) of the layer's step;
        with hot experts, their scores take the step's routing. (Plain Python on a decode step's few ids: a
        handful of numpy calls cost more, and this runs once a layer.)"""
        b, n, k = side.b, side.share, self.top_k
        if self.hot is None:
            return b * n, b * (k - n), 0
        rows = self.ids_host[:b].tolist()
        is_hot = self.hot.is_hot
        hot_ids = [e for row in rows for e in row if is_hot[e]]
        cpu_pairs = sum(not is_hot[e] for row in rows for e in row[:n])
        gpu_pairs = b * k - len(hot_ids) - cpu_pairs
        self.hot.observe(rows)
        self._refresh_due = self._refresh_due or self.hot.refresh_due()
        for r in range(k):
            live = sum(not is_hot[row[r]] for row in rows) / b
            self.live[r] += LIVE_EMA * (live - self.live[r])
        return cpu_pairs, gpu_pairs, len(set(hot_ids))

    def refresh_hot(self) -> None:
        """After the step (every layer merged): the hot set refreshed when due, its copies on the stream before
        the next step's kernels and counted as loads and bytes. (Not in `account`: the merge must see the map
        the step's pairs were split by.)"""
        if not self._refresh_due:
            return
        self._refresh_due = False
        copied = self.hot.refresh()
        self.store.counters.loads += copied
        self.store.counters.bytes_h2d += copied * self.store.expert_bytes

    def _native_rows(self, b: int) -> tuple[int, int]:
        """The CPU's pairs into the host rows in one native call; (experts computed, experts routed)."""
        host = self.store.host
        return rank_split_rows(self.cpu_ids_host[:b], self._share, self.hidden_host[:b], host[GATE_UP], host[DOWN],
                               self.rows_host[:b])

    def _rows(self, b: int) -> tuple[int, int]:
        """The same with the store's CPU kernel (any kernel, any weights), grouped as the eager step groups."""
        n, store = self._share, self.store
        ids = self.cpu_ids_host[:b]  # a hot expert's pairs are -1 here: not the CPU's
        experts = sorted(e for e in set(ids[:, :n].reshape(-1).tolist()) if e >= 0)
        if experts:  # pairs index the CPU's ranks [B, n], token-major
            pairs, rows = cpu_pair_rows(self.hidden_host[:b], ids[:, :n], store.cpu.cpu_experts, experts, n,
                                        store.kernels.activation)
            self.rows_host[:b, :n][pairs // n, pairs % n] = rows
        return len(experts), len({e for e in ids.reshape(-1).tolist() if e >= 0})

    def predicted_s(self, b: int, n: int, live: list[float] | None = None, costs: HybridCosts | None = None) -> float:
        """A layer's predicted time with n ranks of b tokens on the CPU: at most b x n experts of one row each
        there, b x (K - n) pairs read in place (each a whole expert over the link); with hot experts, each rank's
        pairs scaled by the share of its recent pairs that were not hot (`live`, this layer's unless given).
        costs: the paced costs (worked out here unless given)."""
        live = self.live if live is None else live
        costs = self.store.cpu.pace.costs(self.store.cpu.costs) if costs is None else costs
        return max(self.sides_s(b * sum(live[:n]), b * sum(live[n:]), costs))

    @staticmethod
    def sides_s(cpu_pairs: float, gpu_pairs: float, costs: HybridCosts) -> tuple[float, float]:
        """Each side's time at `costs`: (the CPU's pairs as one-row experts and its overhead, the GPU's pairs
        read in place, each priced as one expert's copy)."""
        cpu = costs.cpu_overhead_s + cpu_pairs * costs.cpu_s(1) if cpu_pairs > 0 else 0.0
        return cpu, gpu_pairs * costs.copy_s

    def cpu_share_for(self, b: int, live: list[float] | None = None, costs: HybridCosts | None = None) -> int:
        """The n with the least predicted time for a b-token step (the smallest such); `live`, `costs` as in
        `predicted_s` (worked out once here unless given)."""
        live = self.live if live is None else live
        costs = self.store.cpu.pace.costs(self.store.cpu.costs) if costs is None else costs
        return min(range(self.top_k + 1), key=lambda n: (self.predicted_s(b, n, live, costs), n))


class HostSide(NamedTuple):
    """What `RankSplit.cpu_rows` did for one layer, for its `account`."""

    b: int  # sequences in the step
    share: int  # the CPU's ranks, n
    computed: int  # distinct experts the CPU computed
    routed_experts: int  # distinct experts routed
    routing_wait_s: float  # the host waiting for the routing
    cpu_s: float  # the CPU's side: from the routing's arrival until its pairs are computed
