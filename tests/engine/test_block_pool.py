"""BlockPool: reference counts, the hash-chain prefix cache, LRU eviction, resize, and check_integrity.

A hypothesis state machine drives a real `BlockPool` and a plain model side by side through random
interleavings of:
- admit: a "sequence" whose tokens extend a prefix of one of a few base token lists (so prefixes are
  often shared), admitted as the scheduler does (`match_prefix(tokens[:-1])`, `acquire(hits)`,
  `allocate(need)` only when `need <= available() - hits with refcount 0`), then its full blocks
  registered with chained keys as `Scheduler.postprocess` does (`_advance`);
- extend: one more token for a live sequence (decode), a block allocated when it crosses a boundary;
- release: a random live sequence, with its full registered blocks expected in `cached` (tail block
  first) and the rest in `free`;
- resize while no block is used (and RuntimeError while one is); allocate beyond available() (raises,
  changes nothing).

The model keys a block by the whole token prefix it ends (no hashing), keeps the LRU order of cached
blocks, and a "KV content" map block -> tokens written at allocation/extension. After every step:
`check_integrity(live tables)` passes; free + cached + used == num_blocks; refcounts equal holders;
free/cached/used sets, the cached LRU order, and which blocks are keyed (by which prefix) equal the
model's; prefix hits equal the model's prediction and their stored tokens and content equal the
requested tokens block by block; allocation takes free blocks first, then evicts cached ones LRU-first.

Unit tests: shared prefixes share blocks (refcount 2); a duplicate full block stays unkeyed and goes to
free on release; released full blocks serve a later identical prefix and the partial block is free;
eviction order; resize/allocate errors; check_integrity raises AssertionError on a corrupted refcount,
tampered tokens, a cached block with a refcount, or an inconsistent used count.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from wisp.engine.block_pool import BlockPool, chain_hash


def blocks_for(n_tokens: int, bs: int) -> int:
    return -(-n_tokens // bs)


def chain_keys(tokens, bs: int) -> list[int]:
    """The pool's keys of the full blocks of `tokens` (the engine's chaining)."""
    keys, parent = [], None
    for i in range(len(tokens) // bs):
        parent = chain_hash(parent, tokens[i * bs : (i + 1) * bs])
        keys.append(parent)
    return keys


# -- the state machine ------------------------------------------------------------------------------


class Seq:
    def __init__(self, tokens: list[int], table: list[int], keys: list[int]):
        self.tokens, self.table, self.keys = tokens, table, keys


class PoolMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(1, 12),
        bs=st.sampled_from([1, 2, 3, 4]),
        bases=st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=14), min_size=1, max_size=3),
    )
    def setup(self, num_blocks, bs, bases):
        self.pool = BlockPool(num_blocks, bs)
        self.bs = bs
        self.bases = bases
        self.live: dict[int, Seq] = {}
        self.next_id = 0
        self._reset_model(num_blocks)

    def _reset_model(self, num_blocks: int) -> None:
        self.n = num_blocks
        self.refs = [0] * num_blocks
        self.prefix_of: list[tuple | None] = [None] * num_blocks  # the token prefix a keyed block ends
        self.block_of: dict[tuple, int] = {}  # prefix -> keyed block
        self.free: set[int] = set(range(num_blocks))
        self.lru: list[int] = []  # cached blocks, least recently released first
        self.content: dict[int, tuple] = {}  # simulated KV: the tokens written into each block

    # -- model helpers ------------------------------------------------------------------------------
    def _expected_hits(self, tokens) -> list[int]:
        hits = []
        for i in range(len(tokens) // self.bs):
            b = self.block_of.get(tuple(tokens[: (i + 1) * self.bs]))
            if b is None:
                break
            hits.append(b)
        return hits

    def _take(self, blocks) -> None:  # acquire in the model
        for b in blocks:
            if self.refs[b] == 0:
                self.lru.remove(b)
            self.refs[b] += 1

    def _allocate(self, n: int) -> list[int]:
        free_before, lru_before = set(self.free), list(self.lru)
        out = self.pool.allocate(n)
        assert len(out) == len(set(out)) == n
        k = min(n, len(free_before))
        took_free = [b for b in out if b in free_before]
        evicted = [b for b in out if b not in free_before]
        assert len(took_free) == k, "allocate must use free blocks before evicting cached ones"
        assert evicted == lru_before[: n - k], "cached blocks must be evicted least recently released first"
        for b in took_free:
            self.free.remove(b)
        for b in evicted:
            self.lru.remove(b)
            del self.block_of[self.prefix_of[b]]
            self.prefix_of[b] = None
        for b in out:
            self.refs[b] = 1
        return out

    def _write(self, seq: Seq, first: int) -> None:
        """Simulated KV write of positions first.. into their blocks (only into private, unkeyed ones)."""
        bs = self.bs
        for i in range(first // bs, blocks_for(len(seq.tokens), bs)):
            b = seq.table[i]
            chunk = tuple(seq.tokens[i * bs : (i + 1) * bs])
            if i * bs < first:  # partially written already: the old content must be its prefix
                assert self.content[b] == chunk[: first - i * bs]
            assert self.refs[b] == 1 and self.prefix_of[b] is None, f"write into shared/keyed block {b}"
            self.content[b] = chunk

    def _register(self, seq: Seq) -> None:
        """The scheduler's block registration (`Scheduler._advance`), checked against the model."""
        bs = self.bs
        for i in range(len(seq.keys), len(seq.tokens) // bs):
            chunk = seq.tokens[i * bs : (i + 1) * bs]
            b, prefix = seq.table[i], tuple(seq.tokens[: (i + 1) * bs])
            parent = seq.keys[-1] if seq.keys else None
            key = self.pool.register(b, parent, chunk)
            assert key == chain_hash(parent, chunk)
            seq.keys.append(key)
            if self.prefix_of[b] is None and prefix not in self.block_of:
                self.prefix_of[b], self.block_of[prefix] = prefix, b
            # else: b is the hit that already holds this key, or a duplicate that stays unkeyed
            assert (self.pool.key[b] is not None) == (self.prefix_of[b] is not None)

    # -- rules --------------------------------------------------------------------------------------
    @rule(data=st.data())
    def admit(self, data):
        base = data.draw(st.sampled_from(self.bases))
        cut = data.draw(st.integers(0, len(base)))
        ext = data.draw(st.lists(st.integers(0, 3), min_size=0 if cut else 1, max_size=6))
        tokens = base[:cut] + ext
        bs, pool = self.bs, self.pool
        hits, last_key = pool.match_prefix(tokens[:-1])
        assert hits == self._expected_hits(tokens[:-1])
        assert last_key == (chain_keys(tokens, bs)[len(hits) - 1] if hits else None)
        for i, b in enumerate(hits):  # a hit serves exactly the requested tokens, and their KV
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            assert pool.tokens[b] == chunk and self.content[b] == chunk
        need = blocks_for(len(tokens), bs) - len(hits)
        pinned = sum(1 for b in hits if pool.refcount[b] == 0)
        if need > pool.available() - pinned:
            return  # the scheduler would not admit it now
        pool.acquire(hits)
        self._take(hits)
        seq = Seq(tokens, hits + self._allocate(need), [])
        self._write(seq, len(hits) * bs)
        self._register(seq)
        self.live[self.next_id] = seq
        self.next_id += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(0, 3))
    def extend(self, data, token):
        sid = data.draw(st.sampled_from(sorted(self.live)))
        seq = self.live[sid]
        pos = len(seq.tokens)
        if pos == len(seq.table) * self.bs:  # crosses a block boundary
            if self.pool.available() == 0:
                with pytest.raises(RuntimeError):
                    self.pool.allocate(1)
                return
            seq.table += self._allocate(1)
        seq.tokens.append(token)
        self._write(seq, pos)
        self._register(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data):
        sid = data.draw(st.sampled_from(sorted(self.live)))
        seq = self.live.pop(sid)
        lru_before = list(self.lru)
        self.pool.release(seq.table)
        newly_cached = []
        for b in reversed(seq.table):  # tail blocks first
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if self.prefix_of[b] is not None:
                    self.lru.append(b)
                    newly_cached.append(b)
                else:
                    self.free.add(b)
        assert list(self.pool.cached) == lru_before + newly_cached
        full = len(seq.tokens) // self.bs
        for i, b in enumerate(seq.table):
            if self.refs[b] == 0:
                if i < full and self.prefix_of[b] == tuple(seq.tokens[: (i + 1) * self.bs]):
                    assert b in self.pool.cached  # its own registered full block: kept for reuse
                if i >= full:
                    assert b in self.pool.free  # the partial last block: nothing to reuse
        # an identical later prefix hits every full block whose key is still present
        hits, _ = self.pool.match_prefix(seq.tokens)
        assert hits == self._expected_hits(seq.tokens)
        for i, b in enumerate(hits):
            if self.prefix_of[seq.table[i]] is not None:
                assert b == seq.table[i]

    @precondition(lambda self: not self.live)
    @rule(num_blocks=st.integers(1, 12))
    def resize(self, num_blocks):
        self.pool.resize(num_blocks)
        self._reset_model(num_blocks)
        assert self.pool.match_prefix(self.bases[0]) == ([], None)  # the prefix cache is dropped

    @precondition(lambda self: self.live)
    @rule(num_blocks=st.integers(1, 12))
    def resize_while_used(self, num_blocks):
        before = (list(self.pool.free), list(self.pool.cached), list(self.pool.refcount), self.pool.num_blocks)
        with pytest.raises(RuntimeError):
            self.pool.resize(num_blocks)
        assert before == (list(self.pool.free), list(self.pool.cached), list(self.pool.refcount), self.pool.num_blocks)

    @rule(extra=st.integers(1, 3))
    def allocate_too_many(self, extra):
        before = (list(self.pool.free), list(self.pool.cached), list(self.pool.refcount))
        with pytest.raises(RuntimeError):
            self.pool.allocate(self.pool.available() + extra)
        assert before == (list(self.pool.free), list(self.pool.cached), list(self.pool.refcount))

    # -- checked after every step ---------------------------------------------------------------------
    @invariant()
    def matches_model(self):
        pool = self.pool
        tables = [s.table for s in self.live.values()]
        pool.check_integrity(tables)
        used = {b for b in range(self.n) if self.refs[b] > 0}
        assert pool.num_blocks == self.n
        assert pool.num_free + pool.num_cached + pool.num_used == self.n
        assert len(pool.free) == len(set(pool.free)) and set(pool.free) == self.free
        assert list(pool.cached) == self.lru
        assert pool.num_used == len(used) and not (used & self.free) and not (used & set(self.lru))
        assert self.free | set(self.lru) | used == set(range(self.n))
        holders = [0] * self.n
        for t in tables:
            for b in t:
                holders[b] += 1
        assert pool.refcount == holders == self.refs
        assert pool.available() == len(self.free) + len(self.lru)
        for b in range(self.n):
            prefix = self.prefix_of[b]
            if prefix is None:
                assert pool.key[b] is None
            else:  # keyed by the chain over the whole prefix; its tokens and KV content are its last block
                assert pool.key[b] == chain_keys(prefix, self.bs)[-1]
                assert pool.by_key[pool.key[b]] == b
                assert pool.tokens[b] == prefix[-self.bs :] == self.content[b]
        assert len(pool.by_key) == len(self.block_of)


TestBlockPoolStateMachine = PoolMachine.TestCase
TestBlockPoolStateMachine.pytestmark = [pytest.mark.slow]
TestBlockPoolStateMachine.settings = settings(
    max_examples=80, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# -- unit tests -------------------------------------------------------------------------------------


def admit(pool: BlockPool, tokens: list[int]) -> tuple[list[int], list[int]]:
    """Scheduler admission + engine registration; returns (hits, block table)."""
    bs = pool.block_size
    hits, _ = pool.match_prefix(tokens[:-1])
    pool.acquire(hits)
    table = hits + pool.allocate(blocks_for(len(tokens), bs) - len(hits))
    parent = None
    for i in range(len(tokens) // bs):
        parent = pool.register(table[i], parent, tokens[i * bs : (i + 1) * bs])
    return hits, table


def test_sequences_with_a_common_prefix_share_its_blocks():
    pool = BlockPool(10, 4)
    prefix = [1, 2, 3, 4, 5, 6, 7, 8]
    hits_a, a = admit(pool, prefix + [9, 10])
    hits_b, b = admit(pool, prefix + [11])
    assert hits_a == [] and hits_b == a[:2] and b[:2] == a[:2] and b[2] != a[2]
    assert [pool.refcount[x] for x in a] == [2, 2, 1] and pool.refcount[b[2]] == 1
    assert pool.num_used == 4 and pool.num_free == 6
    pool.check_integrity([a, b])
    pool.release(a)
    assert [pool.refcount[x] for x in b] == [1, 1, 1] and a[2] in pool.free and pool.num_cached == 0
    pool.release(b)
    assert list(pool.cached) == [b[1], b[0]]  # tail first: the prefix is evicted last
    pool.check_integrity([])


def test_a_duplicate_full_block_stays_unkeyed_and_goes_to_free():
    pool = BlockPool(6, 2)
    tokens = [1, 2, 3, 4]  # two full blocks; match_prefix(tokens[:-1]) can only reuse the first
    _, a = admit(pool, tokens)
    hits, b = admit(pool, tokens)
    assert hits == [a[0]] and b[1] != a[1]
    assert pool.key[b[1]] is None and pool.by_key[pool.key[a[1]]] == a[1]  # duplicate: not keyed
    pool.check_integrity([a, b])
    pool.release(b)
    assert b[1] in pool.free and b[1] not in pool.cached and pool.refcount[a[0]] == 1
    pool.release(a)
    assert list(pool.cached) == [a[1], a[0]] and b[1] in pool.free
    pool.check_integrity([])


def test_released_full_blocks_serve_a_later_identical_prefix_and_the_partial_block_is_free():
    pool = BlockPool(8, 4)
    tokens = list(range(10))  # blocks: [0..3] [4..7] [8, 9]
    _, a = admit(pool, tokens)
    pool.release(a)
    assert list(pool.cached) == [a[1], a[0]] and a[2] in pool.free
    assert pool.match_prefix(tokens) == (a[:2], chain_keys(tokens, 4)[1])
    hits, b = admit(pool, tokens + [10, 11])
    assert hits == a[:2] and b[:2] == a[:2] and pool.num_cached == 0
    assert pool.counters.peak_blocks_used == 3
    pool.check_integrity([b])


def test_eviction_is_least_recently_released_first():
    pool = BlockPool(5, 1)
    _, a = admit(pool, [1, 2, 3])  # block size 1: every block full and keyed
    _, b = admit(pool, [7, 8])
    assert pool.available() == 0
    pool.release(a)  # tail first: 3, 2, 1
    pool.release(b)  # then 8, 7
    assert list(pool.cached) == [a[2], a[1], a[0], b[1], b[0]] and pool.num_free == 0
    hits, c = admit(pool, [1, 5])  # reuses [1] (a[0]), needs one block: evicts [1,2,3]'s tail a[2]
    assert hits == [a[0]] and c == [a[0], a[2]]
    assert list(pool.cached) == [a[1], b[1], b[0]]
    assert pool.match_prefix([1, 2, 3]) == ([a[0], a[1]], chain_keys([1, 2], 1)[-1])  # [1,2,3] was evicted
    assert pool.key[a[2]] == chain_keys([1, 5], 1)[-1]  # the evicted block now holds c's [1, 5]
    pool.check_integrity([c])


def test_resize_only_when_nothing_is_used_and_allocate_beyond_available_raises():
    pool = BlockPool(4, 2)
    _, a = admit(pool, [1, 2, 3])
    with pytest.raises(RuntimeError):
        pool.resize(8)
    with pytest.raises(RuntimeError):
        pool.allocate(pool.available() + 1)
    assert pool.num_blocks == 4 and pool.num_used == 2 and pool.num_free == 2
    pool.release(a)
    assert pool.num_cached == 1
    pool.resize(8)
    assert pool.num_blocks == 8 and pool.num_free == 8 and pool.num_cached == 0 and pool.by_key == {}
    assert pool.match_prefix([1, 2, 3]) == ([], None)
    assert sorted(pool.allocate(8)) == list(range(8))
    pool.check_integrity([list(range(8))])


def test_check_integrity_detects_a_corrupted_refcount():
    pool = BlockPool(6, 2)
    _, a = admit(pool, [1, 2, 3, 4, 5])
    _, b = admit(pool, [1, 2, 9])
    pool.check_integrity([a, b])
    pool.refcount[a[0]] = 1  # really held by two tables
    with pytest.raises(AssertionError):
        pool.check_integrity([a, b])
    pool.refcount[a[0]] = 2
    pool.check_integrity([a, b])
    with pytest.raises(AssertionError):  # a table the pool does not know about
        pool.check_integrity([a, b, [a[2]]])
    pool.num_used += 1
    with pytest.raises(AssertionError):
        pool.check_integrity([a, b])


def test_check_integrity_detects_tampered_tokens():
    pool = BlockPool(6, 2)
    _, a = admit(pool, [1, 2, 3, 4, 5])
    pool.release(a)
    pool.check_integrity([])
    b = a[1]
    assert pool.tokens[b] == (3, 4)
    pool.tokens[b] = (3, 5)  # a cached block whose tokens no longer match its key
    with pytest.raises(AssertionError):
        pool.check_integrity([])
    assert pool.match_prefix([1, 2, 3, 4]) == ([a[0]], chain_hash(None, [1, 2]))  # and it is not served


def test_check_integrity_detects_a_cached_block_with_a_reference():
    pool = BlockPool(4, 2)
    _, a = admit(pool, [1, 2, 3])
    pool.release(a)
    pool.refcount[a[0]] = 1
    pool.num_used = 1
    pool.free.pop()  # keep the block count adding up
    with pytest.raises(AssertionError):
        pool.check_integrity([[a[0]]])


def test_a_hit_needs_the_same_parent_not_only_the_same_key():
    """A block registered under a key is not served to a chain whose previous block differs."""
    pool = BlockPool(4, 2)
    a = pool.allocate(2)
    k0 = pool.register(a[0], None, [1, 2])
    pool.register(a[1], k0, [3, 4])
    pool.release(a)
    hits, _ = pool.match_prefix([1, 2, 3, 4])
    assert hits == a
    pool.parent[a[1]] = 12345  # as if its key had been reached from another chain
    hits, _ = pool.match_prefix([1, 2, 3, 4])
    assert hits == [a[0]]
