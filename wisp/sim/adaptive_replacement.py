"""ARC (adaptive replacement cache) for one MoE layer's expert cache, adapted to set-valued steps.

Owns `arc_misses(sets, capacity)`, the "arc" policy of `wisp.sim.policies.simulate`. It follows
Megiddo and Modha's ARC (FAST 2003) with capacity c:
- T1 holds residents referenced once since they were last loaded (recency), T2 residents referenced at
  least twice (frequency), each ordered least recently used first;
- B1 and B2 are ghost lists: ids recently evicted from T1 and T2 (no slot, history only);
- the target p (`target_recent`, 0 <= p <= c) is how many slots T1 should get. A miss on a B1 ghost
  says T1 was too small and raises p by max(|B2| / |B1|, 1); a miss on a B2 ghost lowers it by
  max(|B1| / |B2|, 1);
- REPLACE evicts T1's LRU into B1 when |T1| > p (or |T1| == p and the miss is a B2 ghost), else T2's LRU
  into B2; a new id enters T1, a hit or a ghost hit moves the id to T2's most recent end.
Ghost housekeeping is ARC's: |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c.

The set adaptation (the pager's semantics, as every demand policy in `wisp.sim.policies`): a step's
experts, distinct and in touch order, are processed one by one as ARC requests, but a victim is never an
expert of the current step (already processed or not). REPLACE takes the least recently used
NON-NEEDED entry of the list ARC picks, and of the other list when that one holds only needed experts;
when T1 is full and B1 empty, ARC's direct drop from T1 likewise takes T1's LRU non-needed entry.
Evictions happen only when all c slots are in use (empty slots first). Since capacity >= the step's
width, a full cache always holds a non-needed expert when a needed one is missing, so a victim exists.

Misses are counted per distinct expert per step (an expert not resident when the step starts); an
expert of the step is never evicted during it, so that equals ARC's per-request misses here.
ARC is not a stack algorithm (its resident set at capacity c is not contained in the one at c + 1 in
general), so its miss curve is simulated one capacity at a time, never derived from stack distances.
Invariants (tested): misses >= cold misses and >= OPT's; the resident count never exceeds c; the ghost
bounds above hold after every request.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class ArcLists:
    """ARC's state: two resident lists, two ghost lists (each least recently used first) and the target
    size of the recency list. Mutable working state of one simulation, not a result."""

    capacity: int
    recent: OrderedDict[int, None] = field(default_factory=OrderedDict)  # T1
    frequent: OrderedDict[int, None] = field(default_factory=OrderedDict)  # T2
    recent_ghosts: OrderedDict[int, None] = field(default_factory=OrderedDict)  # B1
    frequent_ghosts: OrderedDict[int, None] = field(default_factory=OrderedDict)  # B2
    target_recent: float = 0.0  # p

    def resident(self, expert: int) -> bool:
        return expert in self.recent or expert in self.frequent

    def full(self) -> bool:
        return len(self.recent) + len(self.frequent) >= self.capacity

    def request(self, expert: int, needed: set[int]) -> bool:
        """One ARC request for `expert` while the step's `needed` experts must stay; True on a miss."""
        if expert in self.recent or expert in self.frequent:
            (self.recent if expert in self.recent else self.frequent).pop(expert)
            self.frequent[expert] = None
            return False
        if expert in self.recent_ghosts:
            step = max(len(self.frequent_ghosts) / len(self.recent_ghosts), 1.0)
            self.target_recent = min(float(self.capacity), self.target_recent + step)
            self._replace(expert, needed)
            self.recent_ghosts.pop(expert)
            self.frequent[expert] = None
            return True
        if expert in self.frequent_ghosts:
            step = max(len(self.recent_ghosts) / len(self.frequent_ghosts), 1.0)
            self.target_recent = max(0.0, self.target_recent - step)
            self._replace(expert, needed)  # before leaving B2: REPLACE's tie rule asks whether it is there
            self.frequent_ghosts.pop(expert)
            self.frequent[expert] = None
            return True
        self._make_room_for_new(expert, needed)
        self.recent[expert] = None
        return True

    def _make_room_for_new(self, expert: int, needed: set[int]) -> None:
        """ARC's case IV (an id in no list): trim the ghosts to their bounds, then REPLACE if full."""
        recent_with_ghosts = len(self.recent) + len(self.recent_ghosts)
        if recent_with_ghosts >= self.capacity:
            if len(self.recent) < self.capacity:
                self.recent_ghosts.popitem(last=False)
                self._replace(expert, needed)
            else:  # T1 fills the cache and B1 is empty: drop T1's LRU outright (no ghost)
                self.recent.pop(_least_recent_unneeded(self.recent, needed))
            return
        total = recent_with_ghosts + len(self.frequent) + len(self.frequent_ghosts)
        if total >= 2 * self.capacity and self.frequent_ghosts:
            self.frequent_ghosts.popitem(last=False)
        self._replace(expert, needed)

    def _replace(self, expert: int, needed: set[int]) -> None:
        """REPLACE: if every slot is in use, move one non-needed resident to its ghost list."""
        if not self.full():
            return
        prefer_recent = len(self.recent) > self.target_recent or (
            expert in self.frequent_ghosts and len(self.recent) == self.target_recent
        )
        victim = _least_recent_unneeded(self.recent, needed) if prefer_recent else None
        if victim is None:
            victim = _least_recent_unneeded(self.frequent, needed)
            if victim is not None:
                self.frequent.pop(victim)
                self.frequent_ghosts[victim] = None
                return
            victim = _least_recent_unneeded(self.recent, needed)
        if victim is None:
            raise AssertionError("a full cache holds only needed experts (capacity below the step's width)")
        self.recent.pop(victim)
        self.recent_ghosts[victim] = None


def _least_recent_unneeded(entries: OrderedDict[int, None], needed: set[int]) -> int | None:
    """The least recently used entry not in `needed` (skips at most len(needed) entries), or None."""
    for expert in entries:
        if expert not in needed:
            return expert
    return None


def arc_misses(sets: list[list[int]], capacity: int) -> int:
    """ARC's misses on distinct-expert steps in touch order (capacity >= the widest step: the caller checks)."""
    lists = ArcLists(capacity)
    misses = 0
    for need in sets:
        needed = set(need)
        for expert in need:
            misses += lists.request(expert, needed)
    return misses
