"""How well an online expert predictor (`wisp.core.learners.coactivation`) names a routing trace's experts.

A trace is ids [T, L, K] (token, layer, the top-k; -1 where a cell routed nothing), and the predictor runs
online over it (`predict_online`: each cell predicted before it is observed, from the past alone). The scores:
- `precision_by_layer` / `online_precision`: |predicted & routed| / |predicted| over a layer's tokens that
  routed something;
- `lru_breakdown`: each prediction against an LRU cache of C experts a layer (the pager's policy, no prefetch,
  `lru_resident_before`): resident (no copy needed), useful (not resident and routed: a miss it would save) or
  wasted (not resident and not routed: a copy for nothing);
- `prefetch_replay`: the closed loop, each cell's top min(k, C) predictions copied in first (most recent,
  evicting LRU slots), then its experts looked up: demand misses and all copies a token.
Invariant: `lru_resident_before` replays exactly the pager's LRU (touched in `wisp.core.experts.recency`
order), so its misses equal `wisp.plan.miss_curves`' LRU curve (tests/bench/test_predictor_scores.py).
benchmarks/probes/prefetch_precision.py runs them on the real traces (docs/prefetch.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wisp.core.experts.recency import touch_order
from wisp.core.learners.coactivation import ExpertPredictor, predict_online

PredictorFactory = Callable[[int, int], ExpertPredictor]  # (num_layers, num_experts) -> a fresh predictor


def routed(ids: np.ndarray, t: int, layer: int) -> set[int]:
    """The experts cell (t, layer) of ids [T, L, K] routed to (-1 padding left out)."""
    return {int(e) for e in ids[t, layer] if e >= 0}


def precision_by_layer(predicted: np.ndarray, ids: np.ndarray, layers: list[int]) -> list[float]:
    """For each layer: sum |predicted & routed| / sum |predicted| over its tokens that routed something
    (predicted is [T, L, k], -1 padded; NaN for a layer with no prediction at all)."""
    out = []
    for layer in layers:
        hits = made = 0
        for t in range(ids.shape[0]):
            actual = routed(ids, t, layer)
            if actual:
                guess = {int(e) for e in predicted[t, layer] if e >= 0}
                hits, made = hits + len(guess & actual), made + len(guess)
        out.append(hits / made if made else float("nan"))
    return out


def online_precision(make: PredictorFactory, ids: np.ndarray, num_experts: int, k: int, layers: list[int]) -> list[float]:
    """precision_by_layer of a fresh predictor run online over ids [T, L, K]."""
    return precision_by_layer(predict_online(make(ids.shape[1], num_experts), ids, k), ids, layers)


def lru_resident_before(ids: np.ndarray, layer: int, cap: int) -> list[set[int]]:
    """The experts an LRU cache of `cap` holds before each token at `layer` (one token = one pager step,
    touched in `wisp.core.experts.recency` order; a missing cell touches nothing)."""
    order: list[int] = []  # least recent first
    out = []
    for t in range(ids.shape[0]):
        out.append(set(order[-cap:]))
        step = touch_order([ids[t, layer].tolist()])
        order = [e for e in order if e not in step] + step
    return out


def lru_breakdown(predicted: np.ndarray, ids: np.ndarray, layers: list[int], cap: int) -> dict:
    """Predictions against plain LRU (no prefetch): resident / useful / wasted, useful precision per layer."""
    useful_precision, totals = [], {"predicted": 0, "resident": 0, "useful": 0, "wasted": 0, "lru_misses": 0}
    for layer in layers:
        resident_sets = lru_resident_before(ids, layer, cap)
        made = useful = 0
        for t, resident in enumerate(resident_sets):
            actual = routed(ids, t, layer)
            if not actual:
                continue
            guess = {int(e) for e in predicted[t, layer] if e >= 0}
            made, useful = made + len(guess), useful + len(guess & actual - resident)
            totals["resident"] += len(guess & resident)
            totals["wasted"] += len(guess - actual - resident)
            totals["lru_misses"] += len(actual - resident)
        totals["predicted"] += made
        totals["useful"] += useful
        useful_precision.append(useful / made if made else float("nan"))
    made_any = [u for u in useful_precision if not np.isnan(u)]
    return {"useful_precision": float(np.mean(made_any)) if made_any else float("nan"),
            "misses_named": totals["useful"] / max(totals["lru_misses"], 1),
            "right_copies": totals["useful"] / max(totals["useful"] + totals["wasted"], 1), **totals}


def prefetch_replay(predicted: np.ndarray, ids: np.ndarray, layers: list[int], cap: int) -> dict:
    """Closed loop: each cell's top min(k, cap) predictions are copied in first (most recent = best), then
    the routed experts are looked up. Per token, summed over `layers`: demand misses and all copies."""
    demand = prefetched = plain = 0
    for layer in layers:
        order: list[int] = []  # with prefetch, least recent first
        plain_order: list[int] = []
        for t in range(ids.shape[0]):
            guess = [int(e) for e in predicted[t, layer][:cap] if e >= 0]
            prefetched += sum(e not in order[-cap:] for e in guess)
            order = [e for e in order if e not in guess] + guess[::-1]
            step = touch_order([ids[t, layer].tolist()])
            demand += sum(e not in order[-cap:] for e in step)
            plain += sum(e not in plain_order[-cap:] for e in step)
            order = [e for e in order if e not in step] + step
            plain_order = [e for e in plain_order if e not in step] + step
    T = ids.shape[0]
    return {"lru_misses_per_token": plain / T, "demand_misses_per_token": demand / T,
            "copies_per_token": (demand + prefetched) / T, "prefetch_copies_per_token": prefetched / T}
