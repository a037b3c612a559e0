"""`HybridCosts`: what one hybrid layer's two servers cost, as probed at load (`wisp.core.learners.hybrid_probe`)
and corrected while serving (`wisp.core.learners.hybrid_pace`): one expert's copy over the link, and one
expert's rows on the CPU at a few row counts (`cpu_s` interpolates them, non-decreasing in rows).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HybridCosts:
    copy_s: float  # seconds to copy one expert host -> device
    cpu_rows: tuple[int, ...]  # row counts the CPU was timed at, ascending
    cpu_s_at_rows: tuple[float, ...]  # seconds for one expert on the CPU at each of cpu_rows
    cpu_overhead_s: float = 0.0  # paid once per step that sends anything to the CPU

    def __post_init__(self):
        if not self.cpu_rows or len(self.cpu_rows) != len(self.cpu_s_at_rows):
            raise ValueError("cpu_rows and cpu_s_at_rows must be non-empty and of one length")
        if list(self.cpu_rows) != sorted(set(self.cpu_rows)) or self.cpu_rows[0] < 1:
            raise ValueError(f"cpu_rows must be ascending distinct positive counts, got {self.cpu_rows}")
        if self.copy_s < 0 or self.cpu_overhead_s < 0 or min(self.cpu_s_at_rows) < 0:
            raise ValueError("costs must be non-negative")
        if any(b < a for a, b in zip(self.cpu_s_at_rows, self.cpu_s_at_rows[1:])):
            raise ValueError("cpu_s_at_rows must not decrease with rows (take a running maximum of timings)")

    def cpu_s(self, rows: int) -> float:
        """Seconds for one expert over `rows` routed rows on the CPU (0 rows: 0)."""
        if rows <= 0:
            return 0.0
        xs, ys = self.cpu_rows, self.cpu_s_at_rows
        if rows <= xs[0]:
            return ys[0]  # fewer rows than the least timed: reading the weights dominates
        if len(xs) == 1:
            return ys[0] * rows / xs[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if rows <= x1:
                return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)
        (x0, y0), (x1, y1) = (xs[-2], ys[-2]), (xs[-1], ys[-1])
        return max(y1, y1 + (y1 - y0) * (rows - x1) / (x1 - x0))
