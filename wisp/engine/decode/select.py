"""Which decode strategy a model runs, chosen when its graphs are captured, from what its stores can do.

- no graphs: `EagerDecode`;
- no store with a CPU server: `WholeGraph`;
- CPU servers: the faster of the whole graph and the pieces, with the CPU's ranks where every store shares by rank
  (hybrid-zero-copy), with eager experts otherwise (hybrid).
"""

from __future__ import annotations

from wisp.engine.decode.cpu_ranks import PiecesWithCpuRanks
from wisp.engine.decode.faster_of_two import FasterOfTwo
from wisp.engine.decode.graphs import GraphInputs
from wisp.engine.decode.pieces import PiecesWithEagerExperts
from wisp.engine.decode.strategy import DecodeStrategy
from wisp.engine.decode.whole_graph import WholeGraph
from wisp.engine.kv_cache import KVCache
from wisp.models.moe_decoder import MoEDecoder


def graph_strategy(model: MoEDecoder, cache: KVCache, inputs: GraphInputs) -> DecodeStrategy:
    """The strategy to capture for `model`'s stores (graphs enabled)."""
    stores = list(model.experts.values())
    whole = WholeGraph(model, cache, inputs)
    if not any(s.cpu is not None for s in stores):
        return whole
    helped = (PiecesWithCpuRanks if all(s.rank_share for s in stores) else PiecesWithEagerExperts)(model, cache, inputs)
    return FasterOfTwo(helped, whole, model)
