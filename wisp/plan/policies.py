"""Trace-driven simulation of one MoE layer's expert cache under other replacement policies.

Owns `simulate(steps, capacity, policy)` and `miss_table(...)`, the baselines the exact LRU curve
(`wisp.plan.miss_curves.expert_miss_curve`) is compared against. A step is a SET of experts; all the demand
policies below use the pager's set semantics: the step's experts must be resident together, a miss
loads the expert, and the victims are chosen among resident experts the step does NOT need (empty
slots first). Within a step experts are referenced in the step's touch order, as listed (a repeated id
at its last place: `wisp.core.recency`; this fixes LRU/LFU clocks).

Policies (misses counted per distinct expert per step, as `ExpertCounters.misses`):
- "lru":    evict the least recently used non-needed resident (exactly `ExpertPager`; a direct
            simulation, independent of the stack-distance code, and equal to its curve);
- "opt":    Belady: evict the non-needed resident whose next use is farthest in the future (never used
            again = infinitely far; ties: lowest id). Optimal among demand policies for set requests by
            the usual exchange argument: the step's own experts are used "now", so they are never the
            farthest, and swapping any other victim for the farthest cannot add a miss (tested against
            an exhaustive search on small traces);
- "lfu":    evict the non-needed resident with the fewest references so far (counted over the whole
            past, resident or not), ties broken by least recent use;
- "static": the C experts most referenced over the whole trace (ties: lowest id) are pinned and never
            change; every reference to another expert is a miss (served without caching). Not a demand
            policy: it is defined for every C >= 0, may hold fewer experts than a step needs, and can
            beat OPT (a pinned expert is never displaced by a one-off miss).

Demand policies need capacity >= the largest step set (as the pager does) and raise ValueError otherwise.
Invariants: misses >= cold misses (distinct experts referenced) for every demand policy;
OPT <= LRU and OPT <= LFU at every capacity; every count is non-increasing in C for LRU, OPT and static.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from wisp.options import CACHE_POLICIES as POLICIES
from wisp.plan.miss_curves import expert_miss_curve, expert_sets

OUT_OF_DOMAIN = -1  # miss_table's entry where a demand policy cannot run (C < largest step set)


def _sets(steps: Sequence[Sequence[int]]) -> list[list[int]]:
    sets = expert_sets(steps, None)
    if any(s and min(s) < 0 for s in sets):
        raise ValueError("expert ids must be >= 0")
    return sets


def _check_capacity(sets: list[list[int]], capacity: int) -> None:
    widest = max((len(s) for s in sets), default=0)
    if capacity < widest:
        raise ValueError(f"capacity {capacity} is below the largest step set ({widest} experts)")


def _demand(sets: list[list[int]], capacity: int, key: Callable[[int], object], touch: Callable[[list[int], int], None]) -> int:
    """Demand paging with the pager's set semantics: a step's missing experts are loaded, evicting the
    non-needed residents that `key` orders first; `touch(need, t)` then updates the policy's state."""
    resident: set[int] = set()
    misses = 0
    for t, need in enumerate(sets):
        missing = [e for e in need if e not in resident]
        misses += len(missing)
        evict = len(resident) + len(missing) - capacity
        if evict > 0:
            needed = set(need)
            resident.difference_update(heapq.nsmallest(evict, (e for e in resident if e not in needed), key=key))
        resident.update(need)
        touch(need, t)
    return misses


def _lru(sets: list[list[int]], capacity: int) -> int:
    last: dict[int, int] = {}
    clock = itertools.count()

    def touch(need: list[int], t: int) -> None:
        for e in need:  # touch order: later = more recent, as in ExpertPager
            last[e] = next(clock)

    return _demand(sets, capacity, lambda e: last[e], touch)


def _opt(sets: list[list[int]], capacity: int) -> int:
    inf = len(sets)
    nxt: list[dict[int, int]] = [{} for _ in sets]  # nxt[t][e]: next step after t that uses e
    upcoming: dict[int, int] = {}
    for t in range(len(sets) - 1, -1, -1):
        for e in sets[t]:
            nxt[t][e] = upcoming.get(e, inf)
            upcoming[e] = t
    next_use: dict[int, int] = {}

    def touch(need: list[int], t: int) -> None:
        for e in need:
            next_use[e] = nxt[t][e]

    return _demand(sets, capacity, lambda e: (-next_use[e], e), touch)  # farthest next use first


def _lfu(sets: list[list[int]], capacity: int) -> int:
    freq: Counter[int] = Counter()
    last: dict[int, int] = {}
    clock = itertools.count()

    def touch(need: list[int], t: int) -> None:
        for e in need:
            freq[e] += 1
            last[e] = next(clock)

    return _demand(sets, capacity, lambda e: (freq[e], last[e]), touch)


def pinned_set(steps: Sequence[Sequence[int]], capacity: int) -> list[int]:
    """The static policy's pinned experts: the `capacity` most referenced ones (ties: lowest id)."""
    freq = Counter(e for s in _sets(steps) for e in s)
    return sorted(sorted(freq, key=lambda e: (-freq[e], e))[:capacity])


def _static(sets: list[list[int]], capacity: int) -> int:
    pinned = set(pinned_set(sets, capacity))
    return sum(1 for s in sets for e in s if e not in pinned)


_SIMULATORS = {"lru": _lru, "opt": _opt, "lfu": _lfu, "static": _static}


def simulate(steps: Sequence[Sequence[int]], capacity: int, policy: str) -> int:
    """Misses of `policy` on one layer's step sequence with `capacity` expert slots."""
    if policy not in _SIMULATORS:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if capacity < 0:
        raise ValueError("capacity must be >= 0")
    sets = _sets(steps)
    if policy != "static":
        _check_capacity(sets, capacity)
    return _SIMULATORS[policy](sets, capacity)


def miss_table(
    steps: Sequence[Sequence[int]], capacities: Iterable[int], policies: Iterable[str] = POLICIES
) -> dict[str, np.ndarray]:
    """{policy: int64 misses per capacity, aligned with `capacities`}; OUT_OF_DOMAIN (-1) where a demand
    policy's capacity is below the largest step set. "lru" comes from the exact one-pass curve."""
    caps = [int(c) for c in capacities]
    sets = _sets(steps)
    widest = max((len(s) for s in sets), default=0)
    out: dict[str, np.ndarray] = {}
    for policy in policies:
        if policy not in _SIMULATORS:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
        row = np.full(len(caps), OUT_OF_DOMAIN, dtype=np.int64)
        if policy == "lru":
            n = max([e + 1 for s in sets for e in s[-1:]] + caps + [0])
            curve = expert_miss_curve(sets, n)
            for i, c in enumerate(caps):
                if c >= widest:
                    row[i] = curve[c]
        else:
            for i, c in enumerate(caps):
                if policy == "static" or c >= widest:
                    row[i] = simulate(sets, c, policy)
        out[policy] = row
    return out
