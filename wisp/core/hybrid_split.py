"""How a hybrid step divides one layer's missing experts between the link and the CPU.

A miss can be served two ways: copied host -> device into a slot (then cached, as in paged mode), or
computed on the CPU straight from the pinned host master (not cached). The two run at the same time, so a
layer's misses cost the longer of the two paths, not their sum:

    step time = max(copies x copy_s,  cpu_overhead_s + sum over CPU experts of cpu_s(rows routed to it))

(the overhead is paid once, if any expert goes to the CPU: the hidden rows' trip to the host and back). The
GPU's own compute of the hits and the copied experts overlaps the copies and is left out.

`split_misses` minimises that time exactly. Every copy costs the same, so for a given number of CPU experts
the best choice is the ones with the fewest routed rows (the CPU's cost grows with rows); the function tries
every count and keeps the cheapest. Ties go to fewer CPU experts, so with a free link the result is exactly
paged mode's.

One rule on top, because the CPU caches nothing: a step with misses copies at least one of them (its
heaviest). Minimising each step alone would serve a lone miss from the CPU whenever the CPU beats one copy,
and serve it so again at every later step, since it never enters a slot: on the real Mixtral trace at C = 8
(every expert fits) that made hybrid 12x slower than paged (`wisp.plan.hybrid_cost`'s replay). The CPU is
for shortening the link's queue, not for replacing it. `split_misses` is exact under that rule (tested
against a brute force over every subset with at least one copy). (Copies need no free slot: in a wide step the pager streams the misses it does not keep
through a staging buffer, as paged mode does.)

`HybridCosts` holds the calibrated costs (`wisp.core.hybrid_probe` measures them); `cpu_s` interpolates the
measured rows linearly (non-decreasing, which the exactness argument needs) and extrapolates from the
last two points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


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


@dataclass(frozen=True)
class MissSplit:
    to_copy: tuple[int, ...]  # experts copied into slots (cached)
    to_cpu: tuple[int, ...]  # experts computed on the CPU (not cached)
    predicted_s: float  # the step's predicted miss time under the split
    cpu_rows: tuple[int, ...]  # the rows routed to each of to_cpu, in its order


def split_time(copies: int, cpu_rows: Sequence[int], costs: HybridCosts) -> float:
    """The predicted time of `copies` copies alongside CPU experts with these routed row counts."""
    cpu = costs.cpu_overhead_s + sum(costs.cpu_s(r) for r in cpu_rows) if cpu_rows else 0.0
    return max(copies * costs.copy_s, cpu)


def split_misses(misses: Sequence[tuple[int, int]], costs: HybridCosts) -> MissSplit:
    """The split of `misses` [(expert, rows routed to it)] with the least predicted time among those that copy
    at least one miss. The CPU gets the experts with the fewest rows (ties: the higher id)."""
    by_cpu_cost = sorted(misses, key=lambda m: (m[1], -m[0]))  # cheapest on the CPU first
    best_n, best_s = 0, len(misses) * costs.copy_s
    cpu = costs.cpu_overhead_s  # the CPU's time for the first n_cpu experts, a running sum
    for n_cpu, (_, rows) in enumerate(by_cpu_cost[:-1], start=1):  # at least one copy: the heaviest
        cpu += costs.cpu_s(rows)
        s = max((len(misses) - n_cpu) * costs.copy_s, cpu)
        if s < best_s:
            best_n, best_s = n_cpu, s
    to_cpu = tuple(sorted(e for e, _ in by_cpu_cost[:best_n]))
    to_copy = tuple(sorted(e for e, _ in by_cpu_cost[best_n:]))
    rows = dict(misses)
    return MissSplit(to_copy, to_cpu, best_s, tuple(rows[e] for e in to_cpu))
