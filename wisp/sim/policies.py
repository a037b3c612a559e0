"""Trace-driven simulation of one MoE layer's expert cache under other replacement policies.

Owns `simulate(steps, capacity, policy)` and `miss_table(...)`, the baselines the exact LRU curve
(`wisp.plan.miss_curves.expert_miss_curve`) is compared against. A step is a SET of experts; all the demand
policies below use the pager's set semantics: the step's experts must be resident together, a miss
loads the expert, and the victims are chosen among resident experts the step does NOT need (empty
slots first). Within a step experts are referenced in the step's touch order, as listed (a repeated id
at its last place: `wisp.core.experts.recency`; this fixes LRU/LFU clocks).

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
- "lrfu":   LRFU (Lee et al., 2001): an expert's combined recency and frequency CRF is the sum over its
            past references of (1/2)^(lambda * age), age in steps; evict the non-needed resident with
            the smallest CRF, ties by least recent use. lambda = LRFU_DECAY_PER_STEP = 0.03 (a reference's
            weight halves every 33 steps; why this value: docs/decisions/lrfu-decay-per-step.md).
            lambda = 0 is LFU exactly; a lambda so large that older references vanish below a double's
            precision (>= 53) is LRU exactly (both tested). History is kept for evicted experts too;
            like LFU it needs a step counter and a float per expert ever seen;
- "arc":    ARC adapted to set steps (recency/frequency lists, ghost lists adapting the target, victims
            only among non-needed residents): `wisp.sim.adaptive_replacement`;
- "static": the C experts most referenced over the whole trace (ties: lowest id) are pinned and never
            change; every reference to another expert is a miss (served without caching). Not a demand
            policy: it is defined for every C >= 0, may hold fewer experts than a step needs, and can
            beat OPT (a pinned expert is never displaced by a one-off miss).

Exact or simulated: every count here is an exact replay at its capacity; what differs is whether a
policy is a stack algorithm (a cache of C slots always holds a subset of the C + 1 one, so one pass gives
the whole curve). LRU is, and `miss_table` takes its row from the one-pass stack-distance curve.
OPT, LFU and LRFU are too (priority algorithms in Mattson et al.'s sense: a C-independent priority,
and two experts a step does not touch keep their relative order; for LRFU every CRF decays at the
same rate), but no one-pass curve is coded for them: they are simulated one capacity at a time
(tested: LRFU's inclusion property on random set traces, and OPT's, LFU's and LRFU's counts never
rising with C). ARC is not a stack algorithm (its target p depends on C; a larger cache can miss more,
tested): it can only be simulated per capacity.

Demand policies need capacity >= the largest step set (as the pager does) and raise ValueError otherwise.
Invariants: misses >= cold misses (distinct experts referenced) for every demand policy;
OPT <= every other demand policy (LRU, LFU, LRFU, ARC) at every capacity; every count is non-increasing
in C for LRU, OPT, LFU, LRFU and static (not for ARC).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from wisp.options import CACHE_POLICIES as POLICIES
from wisp.plan.miss_curves import expert_miss_curve, expert_sets
from wisp.sim.adaptive_replacement import arc_misses

OUT_OF_DOMAIN = -1  # miss_table's entry where a demand policy cannot run (C < largest step set)
LRFU_DECAY_PER_STEP = 0.03  # LRFU's lambda: a reference's weight halves every 1 / 0.03 = 33 steps


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


def lrfu_misses(steps: Sequence[Sequence[int]], capacity: int, decay_per_step: float = LRFU_DECAY_PER_STEP) -> int:
    """LRFU's misses with lambda = `decay_per_step` (`simulate(..., "lrfu")` uses LRFU_DECAY_PER_STEP)."""
    if decay_per_step < 0:
        raise ValueError("decay_per_step must be >= 0")
    sets = _sets(steps)
    _check_capacity(sets, capacity)
    return _lrfu(sets, capacity, decay_per_step)


def _lrfu(sets: list[list[int]], capacity: int, decay_per_step: float = LRFU_DECAY_PER_STEP) -> int:
    """The eviction key is log2 of the CRF at the current step up to a constant shared by all experts:
    log2(CRF at its last step) + lambda * last step, so it needs no update between references and never
    underflows; ties (equal keys) go to the least recently used."""
    crf: dict[int, float] = {}  # CRF at the expert's last referenced step
    last_step: dict[int, int] = {}
    last: dict[int, int] = {}  # touch clock, for ties (as LRU)
    clock = itertools.count()

    def touch(need: list[int], t: int) -> None:
        for e in need:
            kept = 0.0 if e not in crf else crf[e] * 2.0 ** (-decay_per_step * (t - last_step[e]))
            crf[e], last_step[e], last[e] = 1.0 + kept, t, next(clock)

    return _demand(sets, capacity, lambda e: (math.log2(crf[e]) + decay_per_step * last_step[e], last[e]), touch)


def pinned_set(steps: Sequence[Sequence[int]], capacity: int) -> list[int]:
    """The static policy's pinned experts: the `capacity` most referenced ones (ties: lowest id)."""
    freq = Counter(e for s in _sets(steps) for e in s)
    return sorted(sorted(freq, key=lambda e: (-freq[e], e))[:capacity])


def _static(sets: list[list[int]], capacity: int) -> int:
    pinned = set(pinned_set(sets, capacity))
    return sum(1 for s in sets for e in s if e not in pinned)


_SIMULATORS = {"lru": _lru, "opt": _opt, "lfu": _lfu, "lrfu": _lrfu, "arc": arc_misses, "static": _static}


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
            n = max([e + 1 for s in sets for e in s] + caps + [0])
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
