"""BlockPool: KV block bookkeeping with reference counts and an automatic prefix cache.

Blocks hold `block_size` tokens. A block is in exactly one state:
- used: refcount > 0 (held by one or more sequences' block tables);
- cached: refcount == 0 and keyed by its hash: a finished request's full block, kept for reuse and
  evicted least-recently-used only when an allocation needs room;
- free: refcount == 0 and not keyed.

Full blocks are keyed by a hash chain over token ids (a block's key covers every token before it),
and a hit is confirmed by comparing the block's tokens and its parent key, so a key collision would
have to span the whole chain to serve wrong KV (and the keys are 128-bit BLAKE2b).

Invariants (`check_integrity`): free + cached + used == num_blocks; a block's refcount equals the
number of block tables holding it; a cached block's tokens are the tokens its key claims.

The pool is pure bookkeeping (no tensors). `resize` (nothing in use) starts it afresh; `resize_live`
resizes while requests run: it keeps every used block and as many cached ones as fit, packed into the
lowest ids, and returns the moves for the engine to apply to the KV tensors and the block tables.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """A 128-bit BLAKE2b key of (parent key, tokens): collisions are not a practical concern, and a hit
    is still confirmed against the block's stored tokens and parent."""
    h = hashlib.blake2b(digest_size=16)
    h.update(b"root" if parent is None else parent.to_bytes(16, "little"))
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")


@dataclass
class KVCounters:
    prefix_hit_tokens: int = 0
    prefix_miss_tokens: int = 0
    preemptions: int = 0
    peak_blocks_used: int = 0  # since the last reset_peak()


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.counters = KVCounters()
        self._reset(num_blocks)

    def _reset(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.refcount = [0] * num_blocks
        self.key: list[int | None] = [None] * num_blocks
        self.tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.parent: list[int | None] = [None] * num_blocks
        self.by_key: dict[int, int] = {}
        self.free: deque[int] = deque(range(num_blocks))
        self.cached: OrderedDict[int, None] = OrderedDict()  # evictable, least recently used first
        self.num_used = 0

    # -- queries ------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_cached(self) -> int:
        return len(self.cached)

    def available(self) -> int:
        """Blocks an allocation can take now (free, plus cached ones it may evict)."""
        return len(self.free) + len(self.cached)

    def match_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], int | None]:
        """Cached full blocks covering a prefix of token_ids: (block ids, key of the last one)."""
        bs, parent, hits = self.block_size, None, []
        for i in range(len(token_ids) // bs):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            key = chain_hash(parent, chunk)
            block = self.by_key.get(key)
            if block is None or self.tokens[block] != chunk or self.parent[block] != parent:
                break
            hits.append(block)
            parent = key
        return hits, parent

    # -- mutations ----------------------------------------------------------------------------------
    def acquire(self, blocks: Sequence[int]) -> None:
        """Take a reference on already-cached/used blocks (a prefix hit)."""
        for b in blocks:
            if self.refcount[b] == 0:
                self.cached.pop(b)
                self.num_used += 1
            self.refcount[b] += 1
        self._track_peak()

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks (refcount 1), evicting cached blocks LRU-first if needed."""
        if n > self.available():
            raise RuntimeError(f"allocate({n}) with only {self.available()} blocks available")
        out = []
        for _ in range(n):
            if self.free:
                b = self.free.popleft()
            else:
                b, _ = self.cached.popitem(last=False)
                del self.by_key[self.key[b]]
                self.key[b] = self.tokens[b] = None
            self.refcount[b] = 1
            self.num_used += 1
            out.append(b)
        self._track_peak()
        return out

    def register(self, block: int, parent: int | None, tokens: Sequence[int]) -> int:
        """Key a now-full block by its chain hash (unless an identical block already holds the key)."""
        chunk = tuple(tokens)
        assert len(chunk) == self.block_size
        key = chain_hash(parent, chunk)
        if self.key[block] is None and key not in self.by_key:
            self.key[block], self.tokens[block], self.parent[block] = key, chunk, parent
            self.by_key[key] = block
        return key

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each block; tail blocks first, so prefixes are evicted last."""
        for b in reversed(blocks):
            self.refcount[b] -= 1
            assert self.refcount[b] >= 0, f"block {b} released too often"
            if self.refcount[b] == 0:
                self.num_used -= 1
                if self.key[b] is not None:
                    self.cached[b] = None
                else:
                    self.free.append(b)

    def resize(self, num_blocks: int) -> None:
        """Change the pool size; only while no block is used. The prefix cache is dropped."""
        if self.num_used:
            raise RuntimeError(f"cannot resize the KV pool while {self.num_used} blocks are in use")
        self._reset(num_blocks)

    def resize_live(self, num_blocks: int) -> dict[int, int]:
        """Resize while blocks are in use. Afterwards the used and the kept cached blocks occupy ids
        0..k-1 (so the KV tensors need keep only their first k blocks); cached blocks are kept most
        recently used first while room lasts, the rest evicted. Returns {old id: new id} for every block
        that moved (the caller copies their KV and rewrites the block tables). RuntimeError if the used
        blocks alone exceed num_blocks."""
        if self.num_used > num_blocks:
            raise RuntimeError(f"cannot shrink the KV pool to {num_blocks} blocks: {self.num_used} are in use")
        used = [b for b in range(self.num_blocks) if self.refcount[b] > 0]
        cached = list(self.cached)[::-1][: num_blocks - len(used)]  # most recently used first
        keep = sorted(used + cached)
        state = [(self.refcount[b], self.key[b], self.tokens[b], self.parent[b]) for b in keep]
        kept, kept_cached = set(keep), set(cached)
        recency = [b for b in self.cached if b in kept_cached]  # least recently used first
        holes = iter(i for i in range(len(keep)) if i not in kept)
        moves = {b: next(holes) for b in keep if b >= len(keep)}
        new_id = {b: moves.get(b, b) for b in keep}
        counters = self.counters
        self._reset(num_blocks)
        self.counters = counters
        self.free = deque(range(len(keep), num_blocks))
        for b, (ref, key, tokens, parent) in zip(keep, state):
            i = new_id[b]
            self.refcount[i], self.key[i], self.tokens[i], self.parent[i] = ref, key, tokens, parent
            if key is not None:
                self.by_key[key] = i
        self.cached = OrderedDict((new_id[b], None) for b in recency)
        self.num_used = len(used)
        return moves

    def reset_peak(self) -> None:
        self.counters.peak_blocks_used = self.num_used

    def _track_peak(self) -> None:
        self.counters.peak_blocks_used = max(self.counters.peak_blocks_used, self.num_used)

    def check_integrity(self, tables: Sequence[Sequence[int]] = ()) -> None:
        """Assert the module invariants; `tables` are all live block tables (for refcounts)."""
        assert len(self.free) + len(self.cached) + self.num_used == self.num_blocks
        assert self.num_used == sum(1 for r in self.refcount if r > 0)
        holders = [0] * self.num_blocks
        for table in tables:
            for b in table:
                holders[b] += 1
        if tables or self.num_used == 0:
            assert holders == self.refcount, "refcounts differ from the block tables holding them"
        for b in self.free:
            assert self.refcount[b] == 0 and self.key[b] is None
        for b in self.cached:
            assert self.refcount[b] == 0 and self.key[b] is not None
        for key, b in self.by_key.items():
            assert self.key[b] == key and self.tokens[b] is not None and len(self.tokens[b]) == self.block_size
            assert chain_hash(self.parent[b], self.tokens[b]) == key, f"block {b}'s tokens do not match its key"
