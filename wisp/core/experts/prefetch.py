"""Speculative prefetch (`--prefetch`, opt-in, eager paged decode): while one MoE layer's step runs, copy the
experts the next layer is predicted to route to into that layer's slots, on the copy stream.

`CrossLayerPrefetch` hangs on every paged store of a model (`ExpertStore.after_step`). After layer l's eager
step it tells a `wisp.core.learners.coactivation.CrossLayerPredictor` what layer l routed, asks it for layer l+1's
top_k, and `prefetch_into` gives each predicted expert not resident a slot of layer l+1 (`ExpertPager.prefetch`:
the least recently used, a prefetched slot left least recent so a wrong guess goes first) and copies it there
on the staging buffers' copy stream. The copy into a slot waits only for the last kernel that read that
layer's slots; layer l+1's step waits for the copies before it reads a slot (`ExpertStore.slots_ready`).

Invariants: outputs are unchanged (a token's MoE result never depends on which slots hold its experts); the
pager's state stays consistent (`check_integrity`); every prefetched expert counts as a load (bytes cross the
link whether or not the guess was right) and in `prefetched`; a right guess then counts as a hit. CUDA graphs
do not call `forward` and so never prefetch: the engine runs eagerly when prefetch is on.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch

from wisp.core.learners.coactivation import CrossLayerPredictor
from wisp.core.experts.store import ExpertStore


def prefetch_into(store: ExpertStore, experts: Sequence[int]) -> int:
    """Copy the non-resident ones of `experts` into `store`'s slots (see the module docstring); how many."""
    pager = store.residency.pager
    placed = pager.prefetch(experts)
    if not placed:
        return 0
    copy_stream = store.staging.stream if store.staging is not None else None
    if copy_stream is None:  # the CPU (or no staging yet): copy now
        for expert, slot in placed:
            pager.copy_into_slot(expert, slot)
    else:
        with torch.cuda.stream(copy_stream):
            if store.slots_read is not None:
                copy_stream.wait_event(store.slots_read)
            for expert, slot in placed:
                pager.copy_into_slot(expert, slot)
            store.slots_ready = copy_stream.record_event()
    pager.publish_map()  # the step that reads it waits for slots_ready first
    return len(placed)


class CrossLayerPrefetch:
    """Prefetch for a model's paged stores, in MoE-layer order (one predictor, learned online per engine)."""

    def __init__(self, stores: Sequence[ExpertStore], num_experts: int, top_k: int, decay: float = 1.0):
        self.stores, self.top_k = list(stores), top_k
        self.predictor = CrossLayerPredictor(len(self.stores), num_experts, decay)
        for position, store in enumerate(self.stores):
            store.after_step = partial(self._after, position)

    def _after(self, position: int, experts: Sequence[int]) -> None:
        self.predictor.observe(position, experts)
        if position + 1 < len(self.stores):
            prefetch_into(self.stores[position + 1], self.predictor.predict(position + 1, self.top_k))

    def detach(self) -> None:
        for store in self.stores:
            store.after_step = None
