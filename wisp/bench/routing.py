"""The routing a benchmark replays in place of the router: a recorded trace, or i.i.d. uniform choices.

`--routing-trace FILE` (any format `wisp.trace.readers.load_any` reads; a one-layer trace is spread over every
MoE layer, an approximation, labelled `approx-layer<its layer>:<file>`) or `--routing-trace uniform` (each token's top_k drawn uniformly at random in
every layer: no reuse beyond chance, a pessimistic bound on a trained model's locality). The label says
which, and goes into every record.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wisp.config import ModelConfig
from wisp.trace.format import RoutingTrace
from wisp.trace.readers import load_any


def uniform_trace(cfg: ModelConfig, tokens: int) -> RoutingTrace:
    """`tokens` rows of top_k experts drawn uniformly at random in every MoE layer, independently (seed 0)."""
    rng, layers = np.random.default_rng(0), len(cfg.moe_layer_ids)
    ids = np.concatenate([np.argsort(rng.random((min(1024, tokens - t), layers, cfg.num_experts)), axis=2)[:, :, : cfg.top_k]
                          for t in range(0, tokens, 1024)]).astype(np.int16)
    return RoutingTrace(ids, layers=list(range(layers)), num_experts=cfg.num_experts)


def routing_for(path: str | None, cfg: ModelConfig | None, tokens: int = 8192) -> tuple[RoutingTrace | None, str]:
    """The routing to replay and its label (None, "random-router" without one; `cfg` is needed only with one);
    `tokens`: the uniform trace's length."""
    if path is None:
        return None, "random-router"
    if path == "uniform":
        return uniform_trace(cfg, tokens), "uniform-iid"
    trace = load_any(path)
    layers = len(cfg.moe_layer_ids)
    if len(trace.layers) == 1 and layers > 1:
        return trace.replayed_over(list(range(layers))), f"approx-layer{int(trace.layers[0])}:{Path(path).name}"
    return trace, f"replay:{Path(path).name}"
