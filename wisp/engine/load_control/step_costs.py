"""DecodeStepCosts: how long a decode step of b requests takes, predicted from its misses and learned compute.

A decode step's seconds = compute(b) + misses x copy_s, where
- copy_s is one expert's bytes over the pinned host-to-device bandwidth, probed once at load (on a CPU device
  there is no link: a nominal figure keeps the arithmetic meaningful for tests);
- compute(b) is learned from the steps that ran: each observed step's seconds less its predicted misses'
  copy seconds, averaged (exponentially, newest weighing `rate`) per width b. A width never observed takes the
  nearest observed one's figure plus `row_fraction` of compute(1) per row of difference; with nothing observed,
  `prior_compute_s`.

Invariants: every prediction is positive and grows with misses; observing a step changes only its own width's
figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DecodeStepCosts:
    copy_s: float  # seconds to copy one expert host -> device
    prior_compute_s: float = 5e-3  # a decode step's compute before any was observed
    row_fraction: float = 0.05  # extra compute per extra row, as a fraction of one row's step
    rate: float = 0.2  # weight of the newest observation in the running average
    _compute: dict[int, float] = field(default_factory=dict)  # width -> learned compute seconds

    def compute_s(self, width: int) -> float:
        """Predicted compute seconds of a decode step of `width` rows (no misses)."""
        if width in self._compute:
            return self._compute[width]
        if not self._compute:
            return self.prior_compute_s * (1 + self.row_fraction * (width - 1))
        nearest = min(self._compute, key=lambda b: (abs(b - width), b))
        per_row = self.row_fraction * self._compute[nearest] / (1 + self.row_fraction * (nearest - 1))
        return max(self._compute[nearest] + per_row * (width - nearest), per_row)

    def step_s(self, width: int, misses: float) -> float:
        """Predicted seconds of a decode step of `width` rows that copies `misses` experts."""
        return self.compute_s(width) + max(misses, 0.0) * self.copy_s

    def observe(self, width: int, seconds: float, predicted_misses: float) -> None:
        """A decode step of `width` rows took `seconds`, with `predicted_misses` predicted for it."""
        compute = max(seconds - max(predicted_misses, 0.0) * self.copy_s, 0.1 * seconds)
        old = self._compute.get(width)
        self._compute[width] = compute if old is None else (1 - self.rate) * old + self.rate * compute
