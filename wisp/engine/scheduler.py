"""Continuous batching over the block pool: which sequences run this step, and with which blocks.

Each step is either a prefill batch (waiting requests admitted FIFO while the running limit and the
pool allow, each reusing its longest cached prefix) or, when none can be admitted, one decode token for
every running request. When a decode needs a block and the pool has none, the most recently admitted
request is preempted by recompute: its blocks are released (full ones stay cached) and it goes back to
the front of the queue, to be re-prefilled from prompt + output so far. Nothing is ever dropped.

Invariant: a running sequence holds ceil(num_tokens_to_compute_through / block_size) blocks after
`schedule`; a waiting one holds none.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from wisp.engine.block_pool import BlockPool
from wisp.engine.sequence import Sequence, Status


@dataclass
class Batch:
    seqs: list[Sequence]
    is_prefill: bool


class Scheduler:
    def __init__(self, pool: BlockPool, max_running: int, max_batched_tokens: int, prefix_caching: bool = True):
        self.pool = pool
        self.max_running = max_running
        self.max_batched_tokens = max_batched_tokens
        self.prefix_caching = prefix_caching
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.pool.block_size)

    def schedule(self) -> Batch | None:
        batch = self._admit()
        if batch:
            return Batch(batch, is_prefill=True)
        decodes = self._grow_running()
        return Batch(decodes, is_prefill=False) if decodes else None

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        tokens = 0
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting[0]
            ids = seq.token_ids
            hits, _ = self.pool.match_prefix(ids[:-1]) if self.prefix_caching else ([], None)
            need = self._blocks_for(len(ids)) - len(hits)
            new_tokens = len(ids) - len(hits) * self.pool.block_size
            free_hits = sum(1 for b in hits if self.pool.refcount[b] == 0)  # cached blocks we would pin
            if need > self.pool.available() - free_hits:
                break
            if admitted and tokens + new_tokens > self.max_batched_tokens:
                break
            self.waiting.popleft()
            self.pool.acquire(hits)
            seq.block_table = hits + self.pool.allocate(need)
            seq.block_keys = []
            seq.num_computed = len(hits) * self.pool.block_size
            self.pool.counters.prefix_hit_tokens += seq.num_computed
            self.pool.counters.prefix_miss_tokens += new_tokens
            seq.status = Status.RUNNING
            self.running.append(seq)
            admitted.append(seq)
            tokens += new_tokens
        return admitted

    def _grow_running(self) -> list[Sequence]:
        """Give every running sequence a slot for its next token, preempting from the back if needed."""
        scheduled: list[Sequence] = []
        queue = list(self.running)
        while queue:
            seq = queue.pop(0)
            while len(seq.block_table) < self._blocks_for(len(seq)) and self.pool.available() == 0:
                victim = queue.pop() if queue else seq
                self.preempt(victim)
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                if len(seq.block_table) < self._blocks_for(len(seq)):
                    seq.block_table += self.pool.allocate(1)
                scheduled.append(seq)
        return scheduled

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.pool.release(seq.block_table)
        seq.block_table, seq.block_keys, seq.num_computed = [], [], 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.pool.counters.preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self.pool.release(seq.block_table)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.block_table = []
        seq.status = Status.FINISHED
        seq.finish_reason = reason
