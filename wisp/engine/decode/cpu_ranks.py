"""`PiecesWithCpuRanks`: hybrid-zero-copy's decode step with the CPU's share of ranks inside the graphs
(`wisp.core.experts.rank_share`).

Each piece's graph ends by sending its MoE layer's rows and routing to pinned host buffers; one more graph per
MoE layer holds the GPU's pairs (the hot experts' from their bank, the others of rank >= n read in place); the
next piece's graph begins with the merge (the CPU's rows copied in from the host, summed with the GPU's pairs),
so once the CPU's rows are done one launch runs everything up to the next layer's routing. `run` replays them
with only the CPU's experts and two waits on the host between; a layer's accounting waits until the next layer's
graphs are queued (off the critical path). `set_cpu_share` picks one n for every layer per step.

Invariant: a replay computes what the same share run eagerly between eager pieces computes (torch.equal), and for
a fixed n a token's logits do not depend on its batch.
"""

from __future__ import annotations

import functools

import torch

from wisp.core.experts.rank_share import RankShare
from wisp.engine.decode.graphs import GraphCapture, GraphInputs
from wisp.engine.decode.pieces import PieceStrategy, capture_pieces
from wisp.engine.decode.strategy import DecodeRunner
from wisp.engine.kv_cache import KVCache
from wisp.models.moe_decoder import MoEDecoder, Piece


class PiecesWithCpuRanks(PieceStrategy):
    name = "pieces with CPU ranks"

    def __init__(self, model: MoEDecoder, cache: KVCache, inputs: GraphInputs):
        super().__init__(model, cache, inputs)
        self.shares = {li: RankShare(s, inputs.max_batch, model.config.top_k, self.routed)
                       for li, s in model.experts.items()}
        self.holds_hot = any(share.hot is not None for share in self.shares.values())
        self.gpu_graphs: dict[int, dict[int, torch.cuda.CUDAGraph]] = {}  # per b, per MoE layer: its GPU pairs
        # per layer, alternating (a layer is accounted for after the next one's are recorded): its routing sent,
        # its GPU pairs done; between them the GPU's pairs (the link's pace)
        self._events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(2)]

    def capture(self, b: int, capture: GraphCapture) -> None:
        self.gpu_graphs[b] = {}
        send = lambda piece: self.shares[piece.layer].captured.send(piece.hidden, piece.topk_ids)  # noqa: E731
        self.pieces[b], self._kv[b] = capture_pieces(self.model, self.cache, self.inputs, self.routed, b, capture,
                                                     send=send, between=lambda piece: self._capture_gpu_pairs(b, piece, capture))

    def _capture_gpu_pairs(self, b: int, piece: Piece, capture: GraphCapture):
        """The layer's GPU pairs as a graph (replayed once); returns its merge, for the next piece's graph to
        begin with."""
        captured = self.shares[piece.layer].captured
        gpu, per_k = capture.graph_of(lambda: captured.gpu_pairs(piece.hidden, piece.topk_ids))
        gpu.replay()
        self.gpu_graphs[b][piece.layer] = gpu

        def merge():
            captured.rows_in(b)
            self.routed[:b].copy_(captured.merge(per_k, piece.topk_ids, piece.topk_weights, self.model.dtype))
        return merge

    def set_cpu_share(self, b: int) -> int:
        """Choose the CPU's share of ranks for a b-sequence step from the paced costs (one pace per model: one share
        for every layer, the first layer's choice; with hot experts, at the layers' mean share of pairs of each rank
        that were not hot, since theirs differ); returns it."""
        workers = [share.worker for share in self.shares.values()]
        first = workers[0]
        cpu = first.captured.store.cpu
        costs = cpu.pace.costs(cpu.costs)
        live = [sum(col) / len(workers) for col in zip(*(w.live for w in workers))] if self.holds_hot else first.live
        n = first.cpu_share_for(b, live, costs)
        predicted = first.predicted_s(b, n, live, costs)
        for worker in workers:
            worker.set_share(n, predicted)
        return n

    def prefers_whole_graph(self, b: int) -> bool:
        """No rank is worth the CPU's while for a b-sequence step (set as the step's share) and no expert is held
        hot (the rank-share step reads those from their bank, the whole graph would not)."""
        return self.set_cpu_share(b) == 0 and not self.holds_hot

    def replay(self, runner: DecodeRunner, seqs) -> torch.Tensor:
        """Replay a len(seqs)-sequence step's pieces with each MoE layer's share computed on the host between the
        GPU's graphs; returns the logits [B, V] (valid until the next run)."""
        b = self.inputs.stage(*runner.graph_inputs(seqs))
        pending = None  # the previous MoE layer's accounting, not yet done
        layers = 0
        with torch.cuda.device(self.model.device):
            for graph, piece, logits in self.pieces[b]:
                graph.replay()
                if piece.layer is None:
                    continue
                routed, gpu_done = self._events[layers % 2]
                layers += 1
                routed.record()
                self.gpu_graphs[b][piece.layer].replay()
                gpu_done.record()
                if pending is not None:
                    pending()
                worker = self.shares[piece.layer].worker
                done = worker.cpu_rows(b, routed)
                pending = functools.partial(worker.account, done, routed, gpu_done, timed=True)
            if pending is not None:
                pending()
            for share in self.shares.values():
                share.worker.refresh_hot()
        return logits

    def run(self, batch, runner):
        logits = self.replay(runner, batch.seqs)
        runner.count("pieces", len(batch.seqs))
        return runner.sample(batch.seqs, logits)
