"""CUDA graphs of the decode step: one graph per batch size, replayed with no host sync inside.

A decode step of B sequences (one token each) is captured whole: embedding, every layer's attention
(KV writes and the Triton kernel reading the block tables from a device buffer), router, top-k, the
MoE store's `forward_graph_safe` (for paged layers the LRU decision and the miss copies run on the device,
`wisp.core.device_pager`), the final norm and the logits. Inputs live in static buffers (tokens,
positions, block tables) rewritten before each replay; the logits buffer is the output. Capture runs the
step on dummy inputs whose every block table entry is `scratch_block`, a block the caller holds for the
duration, so capturing never touches another request's KV.

Host syncs per decode step: none inside the graph. Around it: the input copies into the static buffers
(host -> device) and reading the sampled tokens back. Expert counters stay on the device until stats
are asked for.

Invariants: a replay computes exactly what the eager engine would (same kernels, same order: tested
with torch.equal); graphs are captured only while the KV pool holds no data (the warm-up writes block 0)
and are re-captured whenever the KV tensors or a scratch is reallocated (resize / apply_plan) and
whenever a routing replay is set or cleared (a graph reads what was there at capture): the
`ModelRunner` owns them and does both.
"""

from __future__ import annotations

import torch

from wisp.engine.kv_cache import DecodeBatchKV, KVCache
from wisp.models.moe_decoder import MoEDecoder


class DecodeGraphs:
    def __init__(self, model: MoEDecoder, cache: KVCache, max_batch: int, max_blocks: int, scratch_block: int,
                 warm_up_stream: torch.cuda.Stream):
        """`warm_up_stream`: the stream capture warm-ups run on; the caller keeps one for every re-capture (torch
        keeps a cuBLAS workspace per stream used, so a new stream per capture would leak one each time)."""
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
        pool = None
        model.use_paging_side("device")
        with torch.cuda.device(model.device):  # Triton launches on the current device
            for b in range(max_batch, 0, -1):  # largest first: smaller graphs reuse its memory pool
                pool = self._capture(b, pool)

    def _body(self, b: int) -> torch.Tensor:
        kv = DecodeBatchKV(self.cache, self.tables[:b], self.positions[:b])
        hidden = self.model.forward_batch(self.tokens[:b], self.positions[:b], kv, graph_safe=True)
        return self.model.logits(hidden)

    def _capture(self, b: int, pool):
        side = self._side
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: compiles kernels, creates cuBLAS handles, device state
            for _ in range(2):
                self._body(b)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.logits[b] = self._body(b)
        self.graphs[b] = graph
        return graph.pool()

    def run(self, tokens: list[int], positions: list[int], tables: list[list[int]]) -> torch.Tensor:
        """Replay the graph of len(tokens) sequences; returns its logits [B, V] (valid until the next run)."""
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
            self.model.use_paging_side("device")
            self.graphs[b].replay()
        return self.logits[b]
