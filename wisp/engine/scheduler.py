"""Continuous batching over the block pool with a per-step token budget (chunked prefill).

Each step computes at most `max_batched_tokens` tokens (vLLM's --max-num-batched-tokens), chosen in
this order: one token for every running request that is decoding (decodes never wait: they are taken
even past the budget), then the next chunk of each running request whose prompt is still being
prefilled, then new requests admitted FIFO while the running limit, the pool and the budget allow (each
reusing its longest cached prefix). A long prompt is therefore prefilled in chunks, and the requests
already decoding keep their pace while it is. When a request needs a block and the pool has none, the
most recently admitted request is preempted by recompute: its blocks are released (full ones stay
cached) and it goes back to the front of the queue, to be re-prefilled from prompt + output so far.
Nothing is ever dropped.

With a decode gate (`wisp.engine.load_control`: load control), the running requests ready to decode are first
filtered by it: only those it chooses decode this step, the others keep their blocks and wait their turn. The
step then lists its prefill chunks first and its decode tokens last, so that the decoding set's experts are the
step's most recent touches and stay in the expert slots when a chunk's experts pass through.

After the step, `postprocess` advances each sequence by the tokens it computed, hands its newly full
blocks to the pool (hashed, for the prefix cache), appends the token it sampled, and finishes it when
a stop condition holds (`wisp.engine.stopping`). A sequence whose sampling failed (the runner hands
a `RequestFailure` in place of its token) or whose stop check raises is finished alone with
finish_reason "error" (`wisp.engine.request_failure`); the others are processed as usual.

Invariants: a running sequence holds ceil(len(seq) / block_size) blocks after `schedule` (a prompt's
blocks are all taken at admission); a waiting one holds none; a step's tokens of one sequence are its
next `n` uncomputed tokens, and only a step that reaches its last token samples.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Collection

from wisp.engine.block_pool import BlockPool
from wisp.engine.request_failure import FINISH_REASON, STOP_CHECK, RequestFailure
from wisp.engine.sequence import Sequence, Status
from wisp.engine.stopping import stop_reason


@dataclass
class Batch:
    seqs: list[Sequence]
    num_tokens: list[int]  # tokens each sequence computes this step, from its num_computed on

    @property
    def is_decode(self) -> bool:
        """Every sequence decodes (a CUDA-graph decode step)."""
        return all(map(decodes, self.seqs, self.num_tokens))


def decodes(seq: Sequence, n: int) -> bool:
    """A step's n tokens of seq are one decode token: one token after its first was sampled."""
    return n == 1 and bool(seq.output_ids)


class Scheduler:
    def __init__(self, pool: BlockPool, max_running: int, max_batched_tokens: int, prefix_caching: bool = True):
        if max_batched_tokens < 1:
            raise ValueError(f"max_batched_tokens must be >= 1, got {max_batched_tokens}")
        self.pool = pool
        self.max_running = max_running
        self.max_batched_tokens = max_batched_tokens
        self.prefix_caching = prefix_caching
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # which of the requests ready to decode decode this step (None: all of them)
        self.decode_gate: Callable[[list[Sequence]], list[Sequence]] | None = None

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.pool.block_size)

    def schedule(self) -> Batch | None:
        running = self._grow_running()
        pending = {id(s): len(s) - s.num_computed for s in running}
        decodes = [s for s in running if pending[id(s)] == 1]
        if self.decode_gate is not None and (ready := [s for s in decodes if s.output_ids]):
            chosen = {id(s) for s in self.decode_gate(ready)}
            decodes = [s for s in decodes if not s.output_ids or id(s) in chosen]
        seqs, counts = [], []
        budget = self.max_batched_tokens - len(decodes)
        for seq in running:
            if pending[id(seq)] > 1 and budget > 0:
                n = min(pending[id(seq)], budget)
                seqs.append(seq)
                counts.append(n)
                budget -= n
        for seq in self._admit(budget):
            n = min(len(seq) - seq.num_computed, budget)
            seqs.append(seq)
            counts.append(n)
            budget -= n
        if self.decode_gate is None:  # decodes first, as always without load control
            seqs, counts = decodes + seqs, [1] * len(decodes) + counts
        else:  # decode tokens last (a prompt's last token goes with the chunks): their experts are the latest touches
            ends = [s for s in decodes if not s.output_ids]
            tokens = [s for s in decodes if s.output_ids]
            seqs, counts = ends + seqs + tokens, [1] * len(ends) + counts + [1] * len(tokens)
        return Batch(seqs, counts) if seqs else None

    def _admit(self, budget: int) -> list[Sequence]:
        admitted: list[Sequence] = []
        while self.waiting and len(self.running) < self.max_running and budget > 0:
            seq = self.waiting[0]
            ids = seq.token_ids
            hits, _ = self.pool.match_prefix(ids[:-1]) if self.prefix_caching else ([], None)
            need = self._blocks_for(len(ids)) - len(hits)
            new_tokens = len(ids) - len(hits) * self.pool.block_size
            free_hits = sum(1 for b in hits if self.pool.refcount[b] == 0)  # cached blocks we would pin
            if need > self.pool.available() - free_hits:
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
            budget -= new_tokens
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

    def fail(self, seq: Sequence, failure: RequestFailure) -> None:
        """Finish seq alone with finish_reason "error" (its blocks released as at any finish)."""
        seq.failure = failure
        seq.finish_time = time.perf_counter()
        self.finish(seq, FINISH_REASON)

    def postprocess(self, batch: Batch, sampled: list[int | RequestFailure | None],
                    eos_token_ids: Collection[int]) -> list[Sequence]:
        """After a step computed `batch`: per sequence the token it sampled, its RequestFailure (sampling
        raised), or None (a prefill chunk short of its prompt's end). Returns the sequences that sampled or
        failed, in batch order (some now finished, the failed ones with "error")."""
        steps = list(zip(batch.seqs, batch.num_tokens, sampled))
        for seq, n, token in steps:  # chunks first: their blocks are registered before any finished one's release
            if token is None:
                self._advance(seq, n)
        done = []
        for seq, n, token in steps:
            if token is not None:
                self._advance(seq, n)  # its KV was written either way
                if isinstance(token, RequestFailure):
                    self.fail(seq, token)
                else:
                    self._append(seq, token, eos_token_ids)
                done.append(seq)
        return done

    def _advance(self, seq: Sequence, n: int) -> None:
        """seq's next n tokens are in the KV cache: register its blocks that are now full."""
        seq.num_computed += n
        bs, ids = self.pool.block_size, seq.token_ids
        for i in range(len(seq.block_keys), seq.num_computed // bs):
            parent = seq.block_keys[-1] if seq.block_keys else None
            seq.block_keys.append(self.pool.register(seq.block_table[i], parent, ids[i * bs : (i + 1) * bs]))

    def _append(self, seq: Sequence, token: int, eos_token_ids: Collection[int]) -> None:
        seq.output_ids.append(token)
        try:
            reason = stop_reason(seq, token, eos_token_ids)
        except Exception as exc:
            seq.output_ids.pop()  # a failed request gains no token in the step that failed it
            self.fail(seq, RequestFailure.caught(seq.request_id, STOP_CHECK, exc))
            return
        now = time.perf_counter()
        seq.last_token_time = now
        if seq.first_token_time is None:
            seq.first_token_time = now
        if reason is not None:
            seq.finish_time = now
            self.finish(seq, reason)
