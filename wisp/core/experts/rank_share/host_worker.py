"""`RankShareWorker`: the rank share's host part (`wisp.core.experts.rank_share`): between the graphs it waits for
a layer's routing and computes the CPU's pairs into the pinned host rows (`cpu_rows`), later counts the layer and
feeds the pace (`account`), refreshes the hot experts after the step (`refresh_hot`), and chooses n from the paced
costs (`cpu_share_for`, `predicted_s`).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.experts.cpu_server import cpu_pair_rows
from wisp.core.experts.rank_share.captured import RankShareCaptured
from wisp.core.kernels.cpu_expert_kernels import applies, native_experts_mlp, rank_share_rows
from wisp.core.kernels.expert_extras import EXTRA_KEYS, extras_at, extras_of
from wisp.core.learners.hybrid_costs import HybridCosts

LIVE_EMA = 0.05  # the weight of a layer-step in `RankShareWorker.live`, each rank's share of pairs that were not hot


class RankShareWorker:
    def __init__(self, captured: RankShareCaptured, hidden: torch.Tensor):
        """`captured`: the layer's captured part (its buffers and store); `hidden`: a row like the experts' input."""
        self.captured = captured
        store, top_k = captured.store, captured.top_k
        self._predicted_s: float | None = None  # a layer's predicted time at the share (the pace's reference)
        self.live = [1.0] * top_k  # per rank, the share of recent pairs that were not hot
        self._refresh_due = False  # a refresh for `refresh_hot` at the step's end
        host = store.host
        self._extras = extras_of(host)  # the bank's scales and biases, for the native call
        self._native = (store.cpu.cpu_experts.kernel is native_experts_mlp and hidden.dtype == torch.bfloat16
                        and all(host[key].is_contiguous() for key in (GATE_UP, DOWN, *EXTRA_KEYS) if key in host)
                        and applies(host[GATE_UP][0], host[DOWN][0], extras_at(self._extras, 0)))

    def set_share(self, n: int, predicted_s: float | None = None) -> None:
        """Ranks below n go to the CPU from the next step on. The pace compares each layer's CPU step with
        `predicted_s`, the step's `predicted_s(b, n)` worked out once by the caller (the costs hold for a step);
        None: each layer works it out."""
        self.captured.set_share(n)
        self._predicted_s = predicted_s

    def serve(self, b: int, routed: "torch.cuda.Event | None", gpu_done: "torch.cuda.Event | None",
              timed: bool = False) -> None:
        """`rows_to_device` then its `account`, at once (eager callers)."""
        self.account(self.rows_to_device(b, routed), routed, gpu_done, timed)

    def rows_to_device(self, b: int, routed: "torch.cuda.Event | None") -> "CpuRowsDone":
        """`cpu_rows`, then their copy to the device buffer `merge` reads (queued behind the GPU's pairs; no
        wait for them). Returns what `account` needs."""
        done = self.cpu_rows(b, routed)
        self.captured.rows_in(b)
        return done

    def cpu_rows(self, b: int, routed: "torch.cuda.Event | None") -> "CpuRowsDone":
        """Between the graphs: wait for the routing (`routed`), compute the CPU's pairs into the host rows.
        Returns what `account` needs. (Lean on purpose: it runs once per MoE layer on the step's critical
        path; under the graphs the next piece's graph copies the rows in, `rows_in`.)"""
        waited = time.perf_counter()
        if routed is not None:
            routed.synchronize()
        start = time.perf_counter()
        computed, routed_experts = (self._native_rows(b) if self._native else self._rows(b))
        done = time.perf_counter()
        return CpuRowsDone(b, self.captured._share, computed, routed_experts, start - waited, done - start)

    def account(self, done: "CpuRowsDone", routed: "torch.cuda.Event | None", gpu_done: "torch.cuda.Event | None",
                timed: bool = False) -> None:
        """Count the layer as the eager step would, and give the pace its CPU side against its prediction.
        gpu_done: waited for here. timed: the events time the GPU's pairs between them (enable_timing; both
        given), for the pace's link ratio, and the layer's wait for the GPU is its pairs past the CPU's side;
        untimed, it is the host's wait here (eager callers: right after `rows_to_device`)."""
        b, n = done.b, done.share
        store = self.captured.store
        waiting = time.perf_counter()
        if gpu_done is not None:
            gpu_done.synchronize()
        host_wait_s = time.perf_counter() - waiting  # untimed (eager callers): the host's wait for the GPU's pairs
        cpu_pairs, gpu_pairs, hits = self._pairs_of(done)
        if done.computed:
            predicted = self.predicted_s(b, n) if self._predicted_s is None else self._predicted_s
            cpu_at_probe_s, gpu_at_probe_s = self.servers_s(cpu_pairs, gpu_pairs, store.cpu.costs)  # against the probe's costs
            timed_pairs = timed and routed is not None and gpu_done is not None and gpu_pairs > 0
            gpu_s = routed.elapsed_time(gpu_done) / 1e3 if timed_pairs else 0.0  # ms -> s
            # the GPU's side past the CPU's, both from the routing's arrival (the device's clock against the host's)
            gpu_wait_s = max(0.0, gpu_s - done.cpu_s) if timed_pairs else host_wait_s
            link = (gpu_s, gpu_at_probe_s) if timed_pairs else None
            store.cpu.pace.observe(done.cpu_s + gpu_wait_s, predicted, done.cpu_s, done.routing_wait_s, gpu_wait_s,
                               ratio=(done.cpu_s, cpu_at_probe_s), link=link, cpu_ranks=n, gpu_s=gpu_s)
        c = store.counters
        c.steps += 1
        c.hits += hits
        c.misses += done.routed_experts
        c.cpu_computed += done.computed
        c.bytes_h2d += gpu_pairs * store.expert_bytes

    def _pairs_of(self, done: "CpuRowsDone") -> tuple[int, int, int]:
        """(the CPU's pairs, the pairs the GPU read in place, distinct hot experts routed) of the layer's step;
        with hot experts, their scores take the step's routing. (Plain Python on a decode step's few ids: a
        handful of numpy calls cost more, and this runs once a layer.)"""
        b, n, k = done.b, done.share, self.captured.top_k
        if self.captured.hot is None:
            return b * n, b * (k - n), 0
        rows = self.captured.ids_host[:b].tolist()
        is_hot = self.captured.hot.is_hot
        hot_ids = [e for row in rows for e in row if is_hot[e]]
        cpu_pairs = sum(not is_hot[e] for row in rows for e in row[:n])
        gpu_pairs = b * k - len(hot_ids) - cpu_pairs
        self.captured.hot.observe(rows)
        self._refresh_due = self._refresh_due or self.captured.hot.refresh_due()
        for r in range(k):
            live = sum(not is_hot[row[r]] for row in rows) / b
            self.live[r] += LIVE_EMA * (live - self.live[r])
        return cpu_pairs, gpu_pairs, len(set(hot_ids))

    def refresh_hot(self) -> None:
        """After the step (every layer merged): the hot set refreshed when due, its copies on the stream before
        the next step's kernels and counted as loads and bytes. (Not in `account`: the merge must see the map
        the step's pairs were divided by.)"""
        if not self._refresh_due:
            return
        self._refresh_due = False
        copied = self.captured.hot.refresh()
        self.captured.store.counters.loads += copied
        self.captured.store.counters.bytes_h2d += copied * self.captured.store.expert_bytes

    def _native_rows(self, b: int) -> tuple[int, int]:
        """The CPU's pairs into the host rows in one native call; (experts computed, experts routed)."""
        host = self.captured.store.host
        return rank_share_rows(self.captured.cpu_ids_host[:b], self.captured._share, self.captured.hidden_host[:b],
                               host[GATE_UP], host[DOWN], self.captured.rows_host[:b], self._extras,
                               self.captured.store.kernels.activation)

    def _rows(self, b: int) -> tuple[int, int]:
        """The same with the store's CPU kernel (any kernel, any weights), grouped as the eager step groups."""
        n, store = self.captured._share, self.captured.store
        ids = self.captured.cpu_ids_host[:b]  # a hot expert's pairs are -1 here: not the CPU's
        experts = sorted(e for e in set(ids[:, :n].reshape(-1).tolist()) if e >= 0)
        if experts:  # pairs index the CPU's ranks [B, n], token-major
            pairs, rows = cpu_pair_rows(self.captured.hidden_host[:b], ids[:, :n], store.cpu.cpu_experts, experts, n,
                                        store.kernels.activation)
            self.captured.rows_host[:b, :n][pairs // n, pairs % n] = rows
        return len(experts), len({e for e in ids.reshape(-1).tolist() if e >= 0})

    def predicted_s(self, b: int, n: int, live: list[float] | None = None, costs: HybridCosts | None = None) -> float:
        """A layer's predicted time with n ranks of b tokens on the CPU: at most b x n experts of one row each
        there, b x (K - n) pairs read in place (each a whole expert over the link); with hot experts, each rank's
        pairs scaled by the share of its recent pairs that were not hot (`live`, this layer's unless given).
        costs: the paced costs (worked out here unless given)."""
        live = self.live if live is None else live
        costs = self.captured.store.cpu.pace.costs(self.captured.store.cpu.costs) if costs is None else costs
        return max(self.servers_s(b * sum(live[:n]), b * sum(live[n:]), costs))

    @staticmethod
    def servers_s(cpu_pairs: float, gpu_pairs: float, costs: HybridCosts) -> tuple[float, float]:
        """Each side's time at `costs`: (the CPU's pairs as one-row experts and its overhead, the GPU's pairs
        read in place, each priced as one expert's copy)."""
        cpu = costs.cpu_overhead_s + cpu_pairs * costs.cpu_s(1) if cpu_pairs > 0 else 0.0
        return cpu, gpu_pairs * costs.copy_s

    def cpu_share_for(self, b: int, live: list[float] | None = None, costs: HybridCosts | None = None) -> int:
        """The n with the least predicted time for a b-token step (the smallest such); `live`, `costs` as in
        `predicted_s` (worked out once here unless given)."""
        live = self.live if live is None else live
        costs = self.captured.store.cpu.pace.costs(self.captured.store.cpu.costs) if costs is None else costs
        return min(range(self.captured.top_k + 1), key=lambda n: (self.predicted_s(b, n, live, costs), n))


class CpuRowsDone(NamedTuple):
    """What `RankShareWorker.cpu_rows` did for one layer, for its `account`."""

    b: int  # sequences in the step
    share: int  # the CPU's ranks, n
    computed: int  # distinct experts the CPU computed
    routed_experts: int  # distinct experts routed
    routing_wait_s: float  # the host waiting for the routing
    cpu_s: float  # the CPU's side: from the routing's arrival until its pairs are computed
