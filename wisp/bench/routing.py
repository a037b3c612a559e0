"""The routing a benchmark replays in place of the router: a recorded trace, or i.i.d. uniform choices.

`--routing-trace FILE` (any format `wisp.trace.readers.load_any` reads; a one-layer trace is spread over every
MoE layer, an approximation, labelled `approx-layer<its layer>:<file>`) or `--routing-trace uniform` (each token's top_k drawn uniformly at random in
every layer: no reuse beyond chance, a pessimistic bound on a trained model's locality). The label says
which, and goes into every record. For the per-request replay (`wisp.trace.replay.RoutingReplay`, `requests` > 0)
the label says `-per-request` and the uniform trace holds `requests` independent sequences (sequence s drawn
with seed s), one for each request decoding at once; the session replay reads one stream (`requests` = 0).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wisp.config import ModelConfig
from wisp.trace.format import RoutingTrace
from wisp.trace.readers import load_any


def uniform_trace(cfg: ModelConfig, tokens: int, sequences: int = 1) -> RoutingTrace:
    """`sequences` sequences of `tokens` rows of top_k experts drawn uniformly at random in every MoE layer,
    independently (sequence s: seed s)."""
    layers = len(cfg.moe_layer_ids)
    return RoutingTrace.concat([RoutingTrace(_uniform_ids(cfg, tokens, seed), layers=list(range(layers)),
                                             num_experts=cfg.num_experts) for seed in range(sequences)])


def _uniform_ids(cfg: ModelConfig, tokens: int, seed: int) -> np.ndarray:
    rng, layers = np.random.default_rng(seed), len(cfg.moe_layer_ids)
    return np.concatenate([np.argsort(rng.random((min(1024, tokens - t), layers, cfg.num_experts)), axis=2)[:, :, : cfg.top_k]
                           for t in range(0, tokens, 1024)]).astype(np.int16)


def routing_for(path: str | None, cfg: ModelConfig | None, tokens: int = 8192,
                requests: int = 0) -> tuple[RoutingTrace | None, str]:
    """The routing to replay and its label (None, "random-router" without one; `cfg` is needed only with one);
    `tokens`: the uniform trace's length (per sequence); `requests` > 0: for the per-request replay of that
    many requests at once."""
    if path is None:
        return None, "random-router"
    per_request = "-per-request" if requests else ""
    if path == "uniform":
        return uniform_trace(cfg, tokens, max(1, requests)), f"uniform-iid{per_request}"
    trace = load_any(path)
    layers = len(cfg.moe_layer_ids)
    if len(trace.layers) == 1 and layers > 1:
        return (trace.replayed_over(list(range(layers))),
                f"approx-layer{int(trace.layers[0])}{per_request}:{Path(path).name}")
    return trace, f"replay{per_request}:{Path(path).name}"
