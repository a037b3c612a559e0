"""Expert traffic counters, per MoE layer; `sum_counters` folds layers into totals.

hits: routed experts already resident at the step; misses: routed experts that were not;
loads: experts copied host -> device (a miss in paged mode, every expert of the layer in offload
mode); evictions: resident experts displaced; bytes_h2d: expert bytes copied host -> device;
steps: MoE layer executions (one per token group); cpu_computed: misses computed on the CPU instead of
copied (hybrid mode; also counted in misses, never in loads or bytes_h2d); prefetched: experts copied on a
guess before any step asked for them (`--prefetch`; also counted in loads and bytes_h2d).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Iterable

import torch


@dataclass
class ExpertCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    loads: int = 0
    bytes_h2d: int = 0
    steps: int = 0
    cpu_computed: int = 0
    prefetched: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)

    def copy_from(self, other: "ExpertCounters") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(other, f.name))


def sum_counters(items: Iterable[ExpertCounters]) -> ExpertCounters:
    total = ExpertCounters()
    for c in items:
        for f in fields(c):
            setattr(total, f.name, getattr(total, f.name) + getattr(c, f.name))
    return total


COUNT_FIELDS = ("steps", "hits", "misses", "evictions", "loads", "bytes_h2d")  # order of a device count vector


def add_counts(counters: ExpertCounters, row) -> None:
    """Add one count vector already read to the host (COUNT_FIELDS order) into counters."""
    for name, value in zip(COUNT_FIELDS, row):
        setattr(counters, name, getattr(counters, name) + int(value))


def fold_counts(counts, counters: ExpertCounters) -> None:
    """Add a device count vector (int64 [6], COUNT_FIELDS order; one host read) into counters, zero it."""
    fold_many([(counts, counters)])


def fold_many(pairs) -> None:
    """`fold_counts` for many (vector, counters) pairs with one host read and one zeroing launch."""
    pairs = list(pairs)
    if not pairs:
        return
    vectors = [v for v, _ in pairs]
    rows = torch.stack(vectors).tolist()
    for (_, counters), row in zip(pairs, rows):
        add_counts(counters, row)
    with torch.inference_mode():  # the vectors may have been made inside inference mode (engine steps)
        torch._foreach_zero_(vectors)
