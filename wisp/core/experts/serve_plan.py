"""`ServePlan`: how one MoE layer step reaches each of its routed experts, and the counters it implies.

A miss policy (`wisp.core.experts.miss_policies`) turns a step's routing into a serve plan, the executor
(`wisp.core.experts.layer.ExpertLayer`) runs it, and `tally` derives the layer's counters from it: the one
place host-side steps are counted (graph steps count on the device, `wisp.core.experts.device_pager`).

Each routed expert is served one way (`Serve`):
- HELD: from the residency's device bank (a full bank, an LRU slot it already held, a hot bank);
- COPY: copied host -> device into the LRU slot it keeps (`loads` names the slot);
- STAGE: copied through one of the two staging buffers for this step only, not kept;
- IN_PLACE: read by the GPU's kernel from the pinned host master (UVA), once per routed pair;
- CPU: computed on the host from the pinned master, never crossing the link.
`filled` are the experts the residency copied into its bank for this step before serving it (a layer
buffer's whole layer, a hot bank's refresh): loads and bytes, and misses where routed.

Invariants: every routed expert has exactly one way; `tally` counts a step as
  hits = HELD not filled; misses = everything else routed; loads = COPY + STAGE + filled;
  bytes = (COPY + STAGE + filled) x expert bytes + IN_PLACE pairs x expert bytes; cpu_computed = CPU;
so the paged modes' counters equal an LRU model's fed the same routing (`wisp.plan.miss_curves`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from wisp.core.experts.counters import ExpertCounters


class Serve(Enum):
    HELD = "held"
    COPY = "copy"
    STAGE = "stage"
    IN_PLACE = "in-place"
    CPU = "cpu"


@dataclass(frozen=True)
class ServePlan:
    order: tuple[int, ...]  # the step's distinct routed experts in touch order (`wisp.core.experts.recency`)
    counts: tuple[int, ...]  # [N] pairs routed to each expert
    serve: dict[int, Serve]  # each routed expert's way
    loads: tuple[tuple[int, int], ...] = ()  # COPY: (expert, slot) in the order the copies run
    staged: tuple[int, ...] = ()  # STAGE, in the order the copies run
    on_cpu: tuple[int, ...] = ()  # CPU, ascending
    filled: frozenset[int] = frozenset()  # copied into the bank for this step by the residency
    evictions: int = 0  # slots taken from other experts
    cpu_predicted_s: float = 0.0  # the CPU side's predicted time (the pace's reference), when CPU is used
    single_launch: bool = False  # one fused launch reaches every routed expert (through the bank's map, or in place)

    def of(self, way: Serve) -> list[int]:
        """The routed experts served `way`, in touch order."""
        return [e for e in self.order if self.serve[e] is way]

    def uses(self, way: Serve) -> bool:
        return any(w is way for w in self.serve.values())

    def check_integrity(self) -> None:
        assert set(self.serve) == set(self.order), "every routed expert has exactly one way"
        assert sorted(e for e, _ in self.loads) == sorted(self.of(Serve.COPY)), "the COPY experts are the loads"
        assert sorted(self.staged) == sorted(self.of(Serve.STAGE)), "the STAGE experts are the staged"
        assert list(self.on_cpu) == sorted(self.of(Serve.CPU)), "the CPU experts, ascending"


def tally(counters: ExpertCounters, plan: ServePlan, expert_bytes: int) -> None:
    """Add one host-side step's counts, derived from its plan (see the module docstring)."""
    ways = plan.serve
    held = [e for e, w in ways.items() if w is Serve.HELD]
    fresh = sum(e in plan.filled for e in held)
    moved = sum(w in (Serve.COPY, Serve.STAGE) for w in ways.values()) + len(plan.filled)
    in_place_pairs = sum(plan.counts[e] for e, w in ways.items() if w is Serve.IN_PLACE)
    counters.steps += 1
    counters.hits += len(held) - fresh
    counters.misses += len(ways) - len(held) + fresh
    counters.loads += moved
    counters.evictions += plan.evictions
    counters.bytes_h2d += (moved + in_place_pairs) * expert_bytes
    counters.cpu_computed += sum(w is Serve.CPU for w in ways.values())
