"""CUDA graphs of the decode step: one graph per batch size, replayed with no host sync inside.

A decode step of B sequences (one token each) is captured whole: embedding, every layer's attention
(KV writes and the Triton kernel reading the block tables from a device buffer), router, top-k, the
MoE store's `forward_graph_safe` (for paged layers the LRU decision and the miss copies run on the device,
`wisp.core.experts.device_pager`), the final norm and the logits. Inputs live in static buffers (tokens,
positions, block tables) rewritten before each replay; the logits buffer is the output. Capture runs the
step on dummy inputs whose every block table entry is `scratch_block`, a block the caller holds for the
duration, so capturing never touches another request's KV.

Host syncs per decode step: none inside the graph. Around it: the input copies into the static buffers
(host -> device) and reading the sampled tokens back. Expert counters stay on the device until stats
are asked for.

Piecewise graphs (`piecewise=True`, hybrid mode): besides the whole step, each batch size gets one graph per
piece of the step between MoE layers' experts (`MoEDecoder.forward_piece`: attention, norms, dense layers,
the next MoE layer's routing), and `run_pieces` replays them with each MoE layer's experts run eagerly
between (a hybrid split reads the routing on the host and computes some experts on the CPU). An eager
step's launches cost an OLMoE-1B-7B token about 12 ms on the H200 (48.1 against 35.9 ms); the pieces
keep that saving for the steps the CPU helps. The experts' output goes into a static buffer the next piece
reads; a piece's outputs (the residual stream, the rotation, the routing) stay where the next piece's
graph was captured to read them.

Hybrid with no slots (every store a `ZeroCopyHybridExperts`) also captures its CPU's share
(`wisp.core.experts.rank_split`): each piece ends by sending its MoE layer's rows and routing to pinned host
buffers, one more graph per MoE layer holds the GPU's in-place pairs, and the next piece's graph begins with
the merge (the CPU's rows copied in from the host, summed with the GPU's pairs); `run_split` replays them
with only the CPU's experts and two waits on the host between (its pieces are not `run_pieces`' then).

Invariants: a replay computes exactly what the eager engine would (same kernels, same order: tested
with torch.equal; pieces too, with the same experts between; a split replay what the same split run
eagerly computes, though not what the eager hybrid store does, which picks the CPU's experts by cost, not
by rank); graphs are captured only while the KV pool holds no data (the warm-up writes block 0)
and are re-captured whenever the KV tensors or a scratch is reallocated (resize / apply_plan) and
whenever a routing replay is set or cleared (a graph reads what was there at capture): the
`ModelRunner` owns them and does both.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from wisp.core.experts.rank_split import RankSplit
from wisp.engine.kv_cache import DecodeBatchKV, KVCache
from wisp.models.moe_decoder import MoEDecoder, Piece


class DecodeGraphs:
    def __init__(self, model: MoEDecoder, cache: KVCache, max_batch: int, max_blocks: int, scratch_block: int,
                 warm_up_stream: torch.cuda.Stream, piecewise: bool = False, split: bool = True):
        """`warm_up_stream`: the stream capture warm-ups run on; the caller keeps one for every re-capture (torch
        keeps a cuBLAS workspace per stream used, so a new stream per capture would leak one each time).
        piecewise: capture the pieces between MoE layers' experts too (`run_pieces`); split: with pieces, capture
        the rank split where every store is hybrid with no slots (`run_split`; False: plain pieces)."""
        self.model, self.cache, self.max_batch = model, cache, max_batch
        self._side = warm_up_stream
        dev = model.device
        self.tokens = torch.zeros((max_batch,), dtype=torch.int64, device=dev)
        self.positions = torch.zeros((max_batch,), dtype=torch.int64, device=dev)
        self.tables = torch.full((max_batch, max_blocks), scratch_block, dtype=torch.int32, device=dev)
        self._staging = torch.zeros((max_batch * (2 + max_blocks),), dtype=torch.int64, pin_memory=True)
        self._staged = torch.cuda.Event()  # the last copy out of the staging buffer
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.pieces: dict[int, list[tuple[torch.cuda.CUDAGraph, Piece, torch.Tensor | None]]] = {}
        self._piece_kv: dict[int, DecodeBatchKV] = {}
        self.routed = torch.zeros((max_batch, model.config.hidden_size), dtype=model.dtype, device=dev)  # experts' out
        stores = model.experts
        split = (split and piecewise and bool(stores)
                 and all(s.rank_split for s in stores.values()))
        self.splits: dict[int, RankSplit] = {li: RankSplit(s, max_batch, model.config.top_k, self.routed)
                                             for li, s in stores.items()} if split else {}
        self._holds_hot = any(rank_split.hot is not None for rank_split in self.splits.values())
        self.split_graphs: dict[int, dict[int, torch.cuda.CUDAGraph]] = {}  # per b, per split layer: its GPU pairs
        # per split layer, alternating (a layer is accounted for after the next one's are recorded): its routing
        # sent, its GPU pairs done; between them the GPU's side (the link's pace)
        self._events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(2)]
        pool = None
        model.lru_state_on("device")
        with torch.cuda.device(model.device):  # Triton launches on the current device
            for b in range(max_batch, 0, -1):  # largest first: smaller graphs reuse its memory pool
                pool = self._capture(b, pool)
                if piecewise:
                    pool = self._capture_pieces(b, pool)

    def _body(self, b: int) -> torch.Tensor:
        kv = DecodeBatchKV(self.cache, self.tables[:b], self.positions[:b])
        hidden = self.model.forward_batch(self.tokens[:b], self.positions[:b], kv, graph_safe=True)
        return self.model.logits(hidden)

    def _graph_of(self, body: Callable, pool):
        """(graph, its outputs): `body` warmed up on the side stream, then captured into `pool`."""
        side = self._side
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: compiles kernels, creates cuBLAS handles, device state
            for _ in range(2):
                body()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = body()
        return graph, out

    def _capture(self, b: int, pool):
        self.graphs[b], self.logits[b] = self._graph_of(lambda: self._body(b), pool)
        return self.graphs[b].pool()

    def _capture_pieces(self, b: int, pool):
        """One graph per piece of a b-sequence step; each replayed once after capture, so that the next
        piece's warm-up reads real values (the experts' buffer between them stays zero, or with splits holds
        what the merge's warm-up wrote). The first piece
        also computes the step's KV indices (`DecodeBatchKV`), which the later pieces read. With splits,
        each piece also sends its layer's rows and routing to the host, its layer's GPU pairs get a graph,
        and the next piece's graph begins with that layer's merge (the CPU's rows copied in from the host
        buffer, then summed with the GPU's pairs): once the CPU's rows are done, one launch runs everything
        up to the next layer's routing."""
        tokens, positions, routed = self.tokens[:b], self.positions[:b], self.routed[:b]
        pieces, before, kv, merge = [], None, None, None
        self.split_graphs[b] = {}
        while before is None or before.layer is not None:
            def body(before=before, kv=kv, merge=merge):
                if merge is not None:  # the layer before's split: its rows in, its merge
                    merge()
                kv = kv or DecodeBatchKV(self.cache, self.tables[:b], positions)
                piece = self.model.forward_piece(tokens, positions, kv, before, None if before is None else routed)
                if piece.layer is not None and self.splits:
                    self.splits[piece.layer].send(piece.hidden, piece.topk_ids)
                return piece, (self.model.logits(piece.x) if piece.layer is None else None), kv

            graph, (piece, logits, kv) = self._graph_of(body, pool)
            pool = graph.pool()
            graph.replay()
            pieces.append((graph, piece, logits))
            merge = None
            if piece.layer is not None and self.splits:
                pool, merge = self._capture_split(b, piece, self.splits[piece.layer], pool)
            before = piece
        self.pieces[b] = pieces
        self._piece_kv[b] = kv  # its index tensors live in the pool, written by the first piece
        return pool

    def _capture_split(self, b: int, piece: Piece, split: RankSplit, pool):
        """The layer's GPU pairs as a graph (replayed once); returns the pool and its merge, for the next
        piece's graph to begin with."""
        gpu, per_k = self._graph_of(lambda: split.gpu_pairs(piece.hidden, piece.topk_ids), pool)
        gpu.replay()
        self.split_graphs[b][piece.layer] = gpu

        def merge():
            split.rows_in(b)
            self.routed[:b].copy_(split.merge(per_k, piece.topk_ids, piece.topk_weights, self.model.dtype))
        return gpu.pool(), merge

    def set_cpu_share(self, b: int) -> int:
        """Choose the CPU's share of ranks for a b-sequence split step from the paced costs (one pace per
        model: one share for every layer, the first layer's choice; with hot experts, at the layers' mean share
        of pairs of each rank that were not hot, since theirs differ); returns it. (Once a split step: cheap.)"""
        splits = list(self.splits.values())
        first = splits[0]
        costs = first.store.cpu.pace.costs(first.store.cpu.costs)
        live = [sum(col) / len(splits) for col in zip(*(split.live for split in splits))] if self._holds_hot else first.live
        n = first.cpu_share_for(b, live, costs)
        predicted = first.predicted_s(b, n, live, costs)
        for split in splits:
            split.set_share(n, predicted)
        return n

    @property
    def holds_hot(self) -> bool:
        """Whether the split layers hold hot experts (then a step with no CPU share is still a split step)."""
        return self._holds_hot

    def run_split(self, tokens: list[int], positions: list[int], tables: list[list[int]]) -> torch.Tensor:
        """Replay a len(tokens)-sequence step's pieces with each MoE layer's share split by rank between the
        GPU's graph and the CPU (`RankSplit.cpu_rows` between; the next piece's graph takes its rows in and
        merges); returns the logits [B, V] (valid until the next run). A layer's accounting waits until the
        next layer's graphs are queued (off the critical path)."""
        b = self._stage(tokens, positions, tables)
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
                self.split_graphs[b][piece.layer].replay()
                gpu_done.record()
                if pending is not None:
                    pending()
                split = self.splits[piece.layer]
                side = split.cpu_rows(b, routed)
                pending = functools.partial(split.account, side, routed, gpu_done, timed=True)
            if pending is not None:
                pending()
            for split in self.splits.values():
                split.refresh_hot()
        return logits

    def run(self, tokens: list[int], positions: list[int], tables: list[list[int]]) -> torch.Tensor:
        """Replay the graph of len(tokens) sequences; returns its logits [B, V] (valid until the next run)."""
        b = self._stage(tokens, positions, tables)
        with torch.cuda.device(self.model.device):
            self.model.lru_state_on("device")
            self.graphs[b].replay()
        return self.logits[b]

    def run_pieces(self, tokens: list[int], positions: list[int], tables: list[list[int]],
                   routed_experts: Callable[[Piece], torch.Tensor]) -> torch.Tensor:
        """Replay the pieces of a len(tokens)-sequence step, `routed_experts(piece)` computing each MoE layer's
        experts (eagerly) between them; returns the logits [B, V] (valid until the next run). Not with splits
        (their pieces begin with the split's merge: `run_split`)."""
        if self.splits:
            raise RuntimeError("split pieces merge the CPU's rows themselves: run_split, not run_pieces")
        b = self._stage(tokens, positions, tables)
        with torch.cuda.device(self.model.device):
            for graph, piece, logits in self.pieces[b]:
                graph.replay()
                if piece.layer is not None:
                    self.routed[:b].copy_(routed_experts(piece))
        return logits

    def _stage(self, tokens: list[int], positions: list[int], tables: list[list[int]]) -> int:
        """Copy a step's inputs into the static buffers (through pinned staging, no sync); returns B."""
        b, width = len(tokens), self.tables.shape[1]
        flat = list(tokens) + list(positions)
        for table in tables:
            flat += table + [0] * (width - len(table))
        self._staged.synchronize()  # the previous step's copy has left the staging buffer
        staged = self._staging[: len(flat)]
        staged.copy_(torch.tensor(flat, dtype=torch.int64))
        with torch.cuda.device(self.model.device):
            dev = staged.to(self.model.device, non_blocking=True)
            self._staged.record()
            self.tokens[:b].copy_(dev[:b])
            self.positions[:b].copy_(dev[b : 2 * b])
            self.tables[:b].copy_(dev[2 * b :].view(b, width))
        return b
