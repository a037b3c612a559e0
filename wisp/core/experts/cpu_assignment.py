"""How a hybrid step assigns one layer's missing experts to the link or the CPU.

A miss can be served two ways: copied host -> device into a slot (then cached, as in paged mode), or
computed on the CPU straight from the pinned host master (not cached). The two run at the same time, so a
layer's misses cost the longer of the two paths, not their sum:

    step time = max(copies x copy_s,  cpu_overhead_s + sum over CPU experts of cpu_s(rows routed to it))

(the overhead is paid once, if any expert goes to the CPU: the hidden rows' trip to the host and back). The
GPU's own compute of the hits and the copied experts overlaps the copies and is left out.

`assign_misses` minimises that time exactly, under one rule: a step with misses copies at least one of them
(its heaviest), because the CPU caches nothing and an expert it serves would miss again at every later step
(docs/decisions/cpu-assignment-copies-at-least-one-miss.md). Every copy costs the same, so for a given number
of CPU experts the best choice is the ones with the fewest routed rows (the CPU's cost grows with rows); the
function tries every count and keeps the cheapest. Ties go to fewer CPU experts, so with a free link the
result is exactly paged mode's. (Copies need no free slot: in a wide step the pager streams the misses it
does not keep through a staging buffer, as paged mode does.)

Invariants: every miss is assigned once, to `to_copy` or `to_cpu`; a step with misses copies at least one;
`predicted_s` is `assignment_time` of the result and no assignment with a copy has a lower one (tested against
a brute force over every subset). `HybridCosts` holds the calibrated costs
(`wisp.core.learners.hybrid_probe` measures them); `cpu_s` must not fall as rows grow, which the exactness
argument needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from wisp.core.learners.hybrid_costs import HybridCosts


@dataclass(frozen=True)
class CpuAssignment:
    """One layer step's misses, each copied or computed on the CPU."""

    to_copy: tuple[int, ...]  # experts copied into slots (cached)
    to_cpu: tuple[int, ...]  # experts computed on the CPU (not cached)
    predicted_s: float  # the step's predicted miss time under this assignment
    cpu_rows: tuple[int, ...]  # the rows routed to each of to_cpu, in its order


def assignment_time(copies: int, cpu_rows: Sequence[int], costs: HybridCosts) -> float:
    """The predicted time of `copies` copies alongside CPU experts with these routed row counts."""
    cpu = costs.cpu_overhead_s + sum(costs.cpu_s(r) for r in cpu_rows) if cpu_rows else 0.0
    return max(copies * costs.copy_s, cpu)


def assign_misses(misses: Sequence[tuple[int, int]], costs: HybridCosts) -> CpuAssignment:
    """The assignment of `misses` [(expert, rows routed to it)] with the least predicted time among those that copy
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
    return CpuAssignment(to_copy, to_cpu, best_s, tuple(rows[e] for e in to_cpu))
