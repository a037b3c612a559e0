"""`wisp sim`'s table: replacement policies replayed over every layer of a routing trace.

`policy_table` sums each policy's misses (`wisp.sim.policies`) over the trace's layers at every
capacity (LRU is the exact miss curve; OPT is the offline bound); `references` is the number of
(step, expert) references those misses are out of. Invariant: a cell is OUT_OF_DOMAIN when any layer's
cell is (a demand policy with a capacity below that layer's largest step).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wisp.sim.policies import OUT_OF_DOMAIN, miss_table
from wisp.trace.format import RoutingTrace


def policy_table(trace: RoutingTrace, caps: Sequence[int], policies: Sequence[str]) -> dict[str, list[int]]:
    """policy -> total misses over all layers at each cap (OUT_OF_DOMAIN where a layer can't run)."""
    totals = {p: np.zeros(len(caps), dtype=np.int64) for p in policies}
    for layer in trace.layers:
        table = miss_table(trace.steps(layer), caps, policies)
        for p in policies:
            col = np.asarray(table[p])
            totals[p] = np.where((totals[p] == OUT_OF_DOMAIN) | (col == OUT_OF_DOMAIN), OUT_OF_DOMAIN, totals[p] + col)
    return {p: v.tolist() for p, v in totals.items()}


def references(trace: RoutingTrace) -> int:
    return sum(len(s) for layer in trace.layers for s in trace.steps(layer))
