"""An exponentially decayed histogram of stack distances: the online version of an LRU miss curve.

Fed the stack distances of `wisp.plan.miss_curves` one reference at a time, it answers the miss curve
of the recent past (misses per reference at every capacity up to `max_distance`) without keeping the
references. See the class for how weights are forgotten.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from wisp.plan.miss_curves import COLD


class DecayedHistogram:
    """Exponentially decayed histogram of stack distances, for an online miss curve.

    Bucket d in 1..max_distance counts references at distance d; one more bucket counts COLD and
    d > max_distance (a miss at every capacity the histogram can answer). Weights are forgotten either
    explicitly, `decay(factor)` (multiply every weight by factor in (0, 1]), or per reference with
    `half_life` (each `add` first multiplies the existing weights by 2**(-1/half_life), so a reference
    counts half as much `half_life` references later). With neither (or decay(1.0)) it is an exact count,
    and miss_curve(C) * n_references equals the exact curve.

    Invariants: all weights >= 0; miss_curve is non-increasing in C, in [0, 1].
    """

    _RESCALE = 1e100  # renormalise the growing per-add scale before it can overflow

    def __init__(self, max_distance: int, half_life: float | None = None):
        if max_distance < 1:
            raise ValueError("max_distance must be >= 1")
        if half_life is not None and not half_life > 0:
            raise ValueError("half_life must be > 0")
        self.max_distance = max_distance
        self.half_life = half_life
        self._growth = 1.0 if half_life is None else 2.0 ** (1.0 / half_life)
        self._scale = 1.0  # stored weights are true weights times _scale
        self._w = np.zeros(max_distance + 2, dtype=np.float64)  # [0] unused, [max_distance + 1] cold/far

    def add(self, distance: int) -> None:
        """Record one reference at `distance` (COLD for a first reference)."""
        d = int(distance)
        if d != COLD and d < 1:
            raise ValueError(f"a stack distance is >= 1 or COLD, got {d}")
        self._scale *= self._growth
        if self._scale > self._RESCALE:
            self._w /= self._scale
            self._scale = 1.0
        idx = self.max_distance + 1 if d == COLD or d > self.max_distance else d
        self._w[idx] += self._scale

    def add_many(self, distances: Sequence[int] | np.ndarray) -> None:
        """`add` each distance in order, vectorised: the same weights to the last bit (the scales are the
        same running products, each added to its bucket in order)."""
        d = np.asarray(distances, dtype=np.int64).reshape(-1)
        if len(d) and (d.min() < COLD or not d.all()):
            raise ValueError(f"a stack distance is >= 1 or COLD, got {int(d[(d < COLD) | (d == 0)][0])}")
        buckets = np.minimum(d.view(np.uint64), self.max_distance + 1)  # COLD, read unsigned, is the largest
        # at most `window` scales at a time: enough to cross _RESCALE from 1, too few to overflow
        window = len(buckets) if self._growth == 1.0 else int(math.log(self._RESCALE) / math.log(self._growth)) + 2
        while len(buckets):
            scales = np.full(min(len(buckets), window) + 1, self._growth)
            scales[0] = self._scale
            np.cumprod(scales, out=scales)  # the running products `add` makes, one multiply at a time
            scales = scales[1:]
            n = len(scales) if scales[-1] <= self._RESCALE else int(np.searchsorted(scales, self._RESCALE, "right"))
            np.add.at(self._w, buckets[:n], scales[:n])
            if n == len(scales):
                self._scale = float(scales[-1])
            else:  # the add that crosses renormalises first, as in `add`
                self._w /= scales[n]
                self._scale = 1.0
                self._w[buckets[n]] += self._scale
                n += 1
            buckets = buckets[n:]

    def decay(self, factor: float) -> None:
        if not 0.0 < factor <= 1.0:
            raise ValueError(f"decay factor must be in (0, 1], got {factor}")
        self._w *= factor

    @property
    def total(self) -> float:
        """The decayed number of references recorded."""
        return float(self._w.sum() / self._scale)

    def weights(self) -> np.ndarray:
        """Decayed counts: [d] for d = 1..max_distance at index d, index max_distance+1 = cold/far."""
        return self._w / self._scale

    def miss_curve(self, max_c: int | None = None) -> np.ndarray:
        """Expected misses per reference for C = 0..max_c (float64 [max_c + 1]); all ones when empty."""
        max_c = self.max_distance if max_c is None else max_c
        if not 0 <= max_c <= self.max_distance:
            raise ValueError(f"max_c must be in [0, {self.max_distance}]")
        w = self._w
        total = w.sum()
        if total <= 0.0 or not math.isfinite(total):
            return np.ones(max_c + 1)
        beyond = np.cumsum(w[::-1])[::-1]  # beyond[k] = sum of w[k:], so misses at C = beyond[C + 1]
        return np.clip(beyond[1 : max_c + 2] / total, 0.0, 1.0)
