"""Online expert predictors for prefetching: which experts a MoE layer will route to next, learned only from
what this session has routed so far (no training pass, nothing read from the future).

The protocol, shared by every predictor here: layers are positions 0..L-1 among the model's MoE layers;
for each token, layers in order, the caller asks `predict(layer, k)` and then calls `observe(layer, experts)`
with what that layer actually routed (an empty list for a cell that routed nothing / was not logged).
`predict_online` runs exactly that loop over a [T, L, K] id array.

Predictors (all rank only experts already seen at that layer, so early on they may return fewer than k):
- `RecencyPredictor`: the k most recently used experts. At k = top_k this is "the same experts as the last
  token", all of which an LRU cache of >= top_k slots already holds: it never names a miss of such a cache.
- `FrequencyPredictor`: the k most often used so far (counts optionally decayed).
- `TransitionPredictor`: same-layer co-activation across tokens: counts of (a at token t-1, b at token t);
  the next token's experts are scored by the summed counts from the last token's experts.
- `CrossLayerPredictor`: co-activation between consecutive layers of one token: counts of (a at layer l-1,
  b at layer l); layer l at token t is scored from layer l-1's experts at token t, so it can be asked
  while layer l-1 computes. Layer 0 has no source and falls back to frequency.

Ranking: by score, then frequency, then recency, then lower id; so a predictor with no evidence yet
(all scores 0) backs off to the frequency order. `predict` returns at most k distinct ids, best first,
and the top-k is always a prefix of the top-(k+1).

Invariants: counts change only in `observe`, so `predict` is a pure function of the observations before it
(no look-ahead); with decay = 1 every count is an exact integer count; decay d < 1 multiplies a layer's
counts by d before each observation at that layer (an observation n steps old weighs d**n).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ExpertPredictor:
    """Per-layer frequency and recency, the ranking, and the observe/predict protocol; subclasses add a score."""

    name = "base"

    def __init__(self, num_layers: int, num_experts: int, decay: float = 1.0):
        if num_layers < 1 or num_experts < 1:
            raise ValueError(f"need at least one layer and one expert, got {num_layers} x {num_experts}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.num_layers, self.num_experts, self.decay = num_layers, num_experts, float(decay)
        self._frequency = np.zeros((num_layers, num_experts))
        self._last_seen = np.full((num_layers, num_experts), -1, dtype=np.int64)  # observation clock, -1 = never
        self._clock = 0
        self._latest: list[list[int]] = [[] for _ in range(num_layers)]  # the last observation at each layer

    # -- the protocol -------------------------------------------------------------------------------------
    def observe(self, layer: int, experts: Sequence[int]) -> None:
        """What `layer` routed for the current token (negative ids ignored, duplicates counted once)."""
        routed = self._valid(layer, experts)
        self._learn(layer, routed)
        if self.decay < 1.0:
            self._frequency[layer] *= self.decay
        self._frequency[layer, routed] += 1.0
        self._clock += 1
        self._last_seen[layer, routed] = self._clock
        self._latest[layer] = routed

    def predict(self, layer: int, k: int) -> list[int]:
        """At most k distinct experts, best first, expected at `layer` for the next observation there."""
        self._check_layer(layer)
        if k <= 0:
            return []
        seen = np.flatnonzero(self._last_seen[layer] >= 0)
        if seen.size == 0:
            return []
        score = self._score(layer)[seen]
        # np.lexsort sorts by the LAST key first: score, then frequency, then recency (all descending), then id
        order = np.lexsort((seen, -self._last_seen[layer, seen], -self._frequency[layer, seen], -score))
        return seen[order[:k]].tolist()

    # -- what the tests and reports read ------------------------------------------------------------------
    def frequency(self, layer: int) -> np.ndarray:
        """[num_experts] (decayed) counts of observations at `layer` that routed to each expert."""
        return self._frequency[layer].copy()

    # -- for subclasses -----------------------------------------------------------------------------------
    def _score(self, layer: int) -> np.ndarray:
        return np.zeros(self.num_experts)

    def _learn(self, layer: int, routed: list[int]) -> None:
        """Update pair counts from the state BEFORE this observation (self._latest still holds the previous)."""

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside 0..{self.num_layers - 1}")

    def _valid(self, layer: int, experts: Sequence[int]) -> list[int]:
        self._check_layer(layer)
        routed = sorted({int(e) for e in experts if int(e) >= 0})
        if routed and routed[-1] >= self.num_experts:
            raise ValueError(f"expert {routed[-1]} >= num_experts {self.num_experts}")
        return routed


class RecencyPredictor(ExpertPredictor):
    """The k most recently used experts: at k = top_k, the last token's experts."""

    name = "last token"

    def _score(self, layer: int) -> np.ndarray:
        return self._last_seen[layer].astype(float)


class FrequencyPredictor(ExpertPredictor):
    """The k experts used most often so far at this layer (decayed counts if decay < 1)."""

    name = "frequency"

    def _score(self, layer: int) -> np.ndarray:
        return self._frequency[layer]


class _PairCounts(ExpertPredictor):
    """Pair counts pairs[l][a, b], decayed like the frequencies, and the score sum_a pairs[l][a, :] over a source set."""

    def __init__(self, num_layers: int, num_experts: int, decay: float = 1.0):
        super().__init__(num_layers, num_experts, decay)
        self._pairs = np.zeros((num_layers, num_experts, num_experts))

    def pairs(self, layer: int) -> np.ndarray:
        """[num_experts, num_experts] (decayed) counts: row a = source expert, column b = expert that followed."""
        return self._pairs[layer].copy()

    def _count(self, layer: int, source: list[int], routed: list[int]) -> None:
        if self.decay < 1.0:
            self._pairs[layer] *= self.decay
        if source and routed:
            self._pairs[layer][np.ix_(source, routed)] += 1.0

    def _score_from(self, layer: int, source: list[int]) -> np.ndarray:
        if not source:
            return np.zeros(self.num_experts)
        return self._pairs[layer][source].sum(axis=0)


class TransitionPredictor(_PairCounts):
    """Same-layer co-activation over time: pairs[l][a, b] counts a at token t-1 followed by b at token t."""

    name = "transition"

    def _learn(self, layer: int, routed: list[int]) -> None:
        self._count(layer, self._latest[layer], routed)

    def _score(self, layer: int) -> np.ndarray:
        return self._score_from(layer, self._latest[layer])


class CrossLayerPredictor(_PairCounts):
    """Consecutive-layer co-activation within a token: pairs[l][a, b] counts a at layer l-1 with b at layer l.

    Needs the protocol's order (layers 0..L-1 per token): when layer l is observed or predicted, the latest
    observation at layer l-1 is the same token's. pairs[0] stays zero (layer 0 backs off to frequency)."""

    name = "cross-layer"

    def _learn(self, layer: int, routed: list[int]) -> None:
        if layer > 0:
            self._count(layer, self._latest[layer - 1], routed)

    def _score(self, layer: int) -> np.ndarray:
        return self._score_from(layer, self._latest[layer - 1]) if layer > 0 else np.zeros(self.num_experts)


def predict_online(predictor: ExpertPredictor, ids: np.ndarray, k: int) -> np.ndarray:
    """[T, L, k] int16 predictions (-1 padded): for each token t and layer l in order, predict(l, k) BEFORE
    observe(l, ids[t, l]). ids is [T, L, K] with -1 for missing."""
    ids = np.asarray(ids)
    if ids.ndim != 3 or ids.shape[1] != predictor.num_layers:
        raise ValueError(f"ids must be [T, {predictor.num_layers}, K], got {ids.shape}")
    T, L, _ = ids.shape
    out = np.full((T, L, max(k, 0)), -1, dtype=np.int16)
    for t in range(T):
        for layer in range(L):
            guess = predictor.predict(layer, k)
            out[t, layer, : len(guess)] = guess
            predictor.observe(layer, ids[t, layer].tolist())
    return out
