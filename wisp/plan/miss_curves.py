"""Reuse (stack) distances -> exact LRU miss curves for both working sets, in one pass each.

This module owns the miss curves m(C) that size the expert scratch and the KV pool: the expert stream
(`expert_miss_curve`, one MoE layer's routed-expert sets, replayed by `ExpertPager`) and the KV stream
(`kv_miss_curve`, requests' full-block chain keys, replayed by `BlockPool`'s prefix cache). Here C is
a capacity (expert slots, or KV blocks) and m[C] the misses at that capacity; the online, exponentially
forgotten version of the same curve is `wisp.engine.split_controller.decayed_histogram`.

Why one pass suffices (LRU with set semantics is a stack algorithm)
------------------------------------------------------------------
A step references a SET S of items that must be resident together; the cache evicts the least recently
used residents NOT in S. Define the recency order after step t: S_t on top, touched in the step's order
(experts: `wisp.core.experts.recency`'s order, by last token then id; KV: see `kv_stack_distances`), then every other
item in its previous order. Claim: after every step, a cache of capacity C >= max|S| holds exactly the
top-C items of this order (or every item seen so far, if fewer). Induction: let R = top-C of the old
order, H = S & R (hits), M = S - R (misses). R - S is a prefix of (old order - S), because R is a prefix
of the old order. The cache drops the |M| - (C - |R|) least recent of R - S (empty slots are used first),
keeping its C - |S| most recent ones, i.e. the (C - |S|)-prefix of (old order - S); together with S that
is the top-C of the new order. ExpertPager's ticks are exactly this order (every step re-ticks its
experts in its touch order), so its resident set is the top-C set at every capacity at once. The
touch order must not depend on C, and `wisp.core.experts.recency`'s does not.
Hence an item e referenced at step t hits iff its position in the order BEFORE step t's updates is <= C.
That position is its stack distance:
    d(e, t) = 1 + #{distinct items whose recency is newer than e's}, counted before step t's updates,
so items of the same step never count against each other. A first reference has infinite distance
(a cold miss, stored as COLD = -1). Therefore, for every C >= 1,
    m[C] = #cold references + #{references with d > C}.
The claim needs no C >= |S|: a wide step (|S| > C) hits exactly its resident members (d <= C), and
afterwards the cache holds S's C most recent, which is what `ExpertPager.decide` keeps (those the
step's last tokens route to; the rest are streamed through staging, `wisp.core.experts.expert_major`). So the
curve is the pager's at every C, including prefill chunks wider than the scratch.

Computation: each reference gets a fresh clock value; a Fenwick tree over clock values marks the latest
clock of every item, so d = 1 + (#marks newer than the item's last clock), one O(log n) query; a step
queries all its references first and then moves their marks. O(n log n) time, O(n) memory for n
references.

Invariants: m is non-increasing in C; m[0] = number of references; m[C] = #cold for C >= #distinct
items; every distance is COLD or in [1, #distinct items].
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from wisp.core.experts.recency import distinct_in_order

COLD = -1  # the stack distance of a first reference (infinite: a miss at every capacity)


class Fenwick:
    """Binary indexed tree over positions 0..n-1: point add, prefix sum, both O(log n)."""

    def __init__(self, n: int):
        self.n = n
        self.tree = [0] * (n + 1)
        self.total = 0

    def add(self, i: int, delta: int) -> None:
        self.total += delta
        i += 1
        tree, n = self.tree, self.n
        while i <= n:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of positions 0..i-1."""
        s, tree = 0, self.tree
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s


def _ordered_distances(steps: Sequence[Sequence[Hashable]]) -> np.ndarray:
    """Stack distances of every reference; each step is a list of DISTINCT keys in touch order
    (later in the list = more recent after the step). Returns int64 [n], COLD for first references."""
    n = sum(len(s) for s in steps)
    fen = Fenwick(n)
    last: dict[Hashable, int] = {}  # key -> clock of its latest reference
    out = np.empty(n, dtype=np.int64)
    clock = 0
    for step in steps:
        base = clock
        for j, key in enumerate(step):
            t = last.get(key)
            # marks newer than t: total - prefix(t + 1); none of this step's marks are placed yet
            out[base + j] = COLD if t is None else 1 + fen.total - fen.prefix(t + 1)
        for key in step:
            t = last.get(key)
            if t is not None:
                fen.add(t, -1)
            fen.add(clock, 1)
            last[key] = clock
            clock += 1
    return out


def expert_sets(steps: Sequence[Sequence[int]], num_experts: int | None) -> list[list[int]]:
    """Each step's distinct expert ids in touch order (`ExpertPager.decide`'s input: a repeated id counts
    at its last place), checked against [0, num_experts) when it is given."""
    sets = [distinct_in_order(step) for step in steps]
    if num_experts is not None:
        for t, s in enumerate(sets):
            if s and not (0 <= min(s) and max(s) < num_experts):
                raise ValueError(f"step {t}: expert ids must be in [0, {num_experts}), got {sorted(s)}")
    return sets


def stack_distances(steps: Sequence[Sequence[int]], num_experts: int | None = None) -> np.ndarray:
    """Per-reference stack distances of an expert step sequence (ExpertPager semantics).

    Each step lists its experts in touch order (`wisp.core.experts.recency.touch_order` of its tokens; one
    token's step is its ids in ascending order); repeats within a step are one reference, at the last
    place, as in `ExpertPager.decide`. int64 [n]; COLD (-1) marks a first
    reference. With `num_experts`, ids outside [0, num_experts) raise ValueError.
    """
    return _ordered_distances(expert_sets(steps, num_experts))


def miss_curve_from_distances(distances: np.ndarray, max_c: int) -> np.ndarray:
    """m[C] = #COLD + #{d > C} for C = 0..max_c (int64 [max_c + 1])."""
    if max_c < 0:
        raise ValueError("max_c must be >= 0")
    d = np.asarray(distances, dtype=np.int64)
    cold = int(np.count_nonzero(d == COLD))
    finite = d[d != COLD]
    hist = np.bincount(np.minimum(finite, max_c + 1), minlength=max_c + 2)  # hist[max_c+1]: d > max_c
    tail = np.cumsum(hist[::-1])[::-1]  # tail[k] = #{d >= k} (capped at max_c + 1)
    return (cold + tail[1:]).astype(np.int64)  # misses at C: cold + #{d >= C + 1}


def expert_miss_curve(steps: Sequence[Sequence[int]], num_experts: int) -> np.ndarray:
    """Exact LRU misses of one MoE layer's step sequence at every capacity: int64 [num_experts + 1].

    m[C] equals `ExpertPager(host, C, ...).counters.misses` after `decide(step)` for every step, for
    every 1 <= C <= num_experts, wide steps included; m[0] is the total number of references.
    """
    return miss_curve_from_distances(stack_distances(steps, num_experts), num_experts)


def kv_stack_distances(requests: Sequence[Sequence[int]], evict_tail_first: bool = True) -> np.ndarray:
    """Per-block stack distances of a KV request stream, one request = one step (set semantics).

    Each request lists its full blocks' chain keys in position order; a key repeated within a request is
    one block (its first position counts). Returns int64 [n] in request order, block position order;
    COLD for a block never seen before.

    Recency within a request: with `evict_tail_first` (default, as `BlockPool.release`, which frees tail
    blocks first) EARLIER blocks are more recent, so a chain's prefix outlives its tail, the resident set
    stays prefix-closed and every LRU miss is a block the prefix cache must recompute. With
    evict_tail_first=False later blocks are more recent: a cache can then keep a tail whose head was
    evicted, and its block misses under-count the blocks a prefix cache recomputes.
    """
    steps = []
    for req in requests:
        blocks = list(dict.fromkeys(int(k) for k in req))
        steps.append(blocks[::-1] if evict_tail_first else blocks)
    d = _ordered_distances(steps)
    if evict_tail_first:  # back to position order within each request
        pos = 0
        for s in steps:
            d[pos : pos + len(s)] = d[pos : pos + len(s)][::-1]
            pos += len(s)
    return d


def kv_miss_curve(requests: Sequence[Sequence[int]], max_blocks: int, evict_tail_first: bool = True) -> np.ndarray:
    """Exact LRU block misses of a KV request stream at every pool size 0..max_blocks (in blocks).

    m[C] = blocks missed (each costs block_size tokens of recompute) by a prefix-caching pool of C
    blocks that serves the requests one at a time, a request pinning its own blocks and evicting the
    least recently used others. Valid for C >= the largest request's block count; below that it
    is the formula's value, outside the pool's domain. See `kv_stack_distances` for the recency order.
    """
    return miss_curve_from_distances(kv_stack_distances(requests, evict_tail_first), max_blocks)
