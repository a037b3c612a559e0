"""`WholeGraph`: a decode step captured whole, one CUDA graph per batch size, replayed with no host sync inside.

The graph holds the embedding, every layer's attention (KV writes and the Triton kernel reading the block tables
from a device buffer), router, top-k, each MoE store's `forward_graph_safe` (for slots the LRU decision and the
miss copies run on the device, `wisp.core.experts.device_pager`), the final norm and the logits. Around it: the
input copies into the static buffers and reading the sampled tokens back; expert counters stay on the device
until stats are asked for.

Invariant: a replay computes exactly what the eager engine would (same kernels, same order: torch.equal).
"""

from __future__ import annotations

import torch

from wisp.engine.decode.graphs import GraphCapture, GraphInputs
from wisp.engine.decode.strategy import DecodeRunner, DecodeStrategy
from wisp.engine.kv_cache import DecodeBatchKV, KVCache
from wisp.models.moe_decoder import MoEDecoder


class WholeGraph(DecodeStrategy):
    name = "whole graph"

    def __init__(self, model: MoEDecoder, cache: KVCache, inputs: GraphInputs):
        self.model, self.cache, self.inputs = model, cache, inputs
        self.max_batch = inputs.max_batch
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    def _body(self, b: int) -> torch.Tensor:
        i = self.inputs
        kv = DecodeBatchKV(self.cache, i.tables[:b], i.positions[:b])
        hidden = self.model.forward_batch(i.tokens[:b], i.positions[:b], kv, graph_safe=True)
        return self.model.logits(hidden)

    def capture(self, b: int, capture: GraphCapture) -> None:
        self.graphs[b], self.logits[b] = capture.graph_of(lambda: self._body(b))

    def replay(self, runner: DecodeRunner, seqs) -> torch.Tensor:
        """Replay the graph of len(seqs) sequences; returns its logits [B, V] (valid until the next run)."""
        b = self.inputs.stage(*runner.graph_inputs(seqs))
        with torch.cuda.device(self.model.device):
            self.model.lru_state_on("device")
            self.graphs[b].replay()
        runner.count("graph", b)
        return self.logits[b]

    def run(self, batch, runner):
        return runner.sample(batch.seqs, self.replay(runner, batch.seqs))
