"""RoutingReplay: each request decodes with the recorded expert choices of its own trace sequence, in place of
the router's (benchmarks only, clearly labelled).

A trace holds S sequences (`RoutingTrace.sequences`: a Mixtral file's problems, FLAME's 32 sequences, one
uniform draw per request; a trace without marked sequences is one). Set the replay with
`engine.runner.set_routing_replay(replay)`; it does nothing until `active` is set. While active:
- the i-th request it sees (in the order requests first appear in a step) replays sequence i mod S, unless
  `assign(request_id, s)` chose its sequence first;
- a request's output tokens replay its sequence in order: the token at position p >= its prompt's length
  routes as the sequence's row (p - prompt length) mod T_s (wrapping), whether decoded or recomputed after a
  preemption; its prompt's tokens (prefill chunks) keep the router's choice, as does a trace row with a
  missing (-1) entry.
So a request's routing depends on its sequence and its own positions only, never on what shares its steps
(batch-invariant), and a single-sequence trace gives every request that sequence from its own start. While
inactive every token keeps the router's choice and no request is assigned.

Before each step the runner calls `advance(batch)`, which loads the step's rows, one per token in the
batch's token order, into the fixed-address device buffer of `ReplayBuffer` (`max_rows` >= the engine's
max_num_batched_tokens + max_concurrency is safe), without waiting for the device. While a step computes, before
its tokens are sampled, the runner calls `prefetch(seqs)`: the rows of the decode step that would follow are
queued then, and `advance` keeps them when that step comes (the same sequences, one token each, at the positions
prefetched), so a replayed step's host work overlaps the step before instead of delaying its own.

Replayed routing measures what a real model's expert reuse does to the pager with random weights; the
tokens it produces mean nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from wisp.trace.format import RoutingTrace
from wisp.trace.replay_buffer import ReplayBuffer


class RoutingReplay(ReplayBuffer):
    def __init__(self, trace: RoutingTrace, moe_layer_ids: list[int], num_experts: int, top_k: int,
                 device: torch.device, max_rows: int):
        super().__init__([s.ids for s in trace.sequences()], moe_layer_ids, num_experts, top_k, device, max_rows)
        self.sequence_of: dict[str, int] = {}  # request id -> its trace sequence, in the order first seen
        self.active = False
        self._ahead: tuple | None = None  # the step `prefetch` loaded: (active, ((request id, position), ...))

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    def assign(self, request_id: str, sequence: int) -> None:
        """Replay trace sequence `sequence` (mod S) for `request_id` (before it is first seen)."""
        self.sequence_of[request_id] = sequence % self.num_sequences

    def advance(self, batch) -> None:
        """A step begins (`batch`: its sequences and token counts): each token's row into the buffer, unless
        `prefetch` already queued exactly this step's."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and all(n == 1 for n in batch.num_tokens) and ahead == self._key(
                [(seq, seq.num_computed) for seq in batch.seqs]):
            return  # loaded while the last step computed: the same tokens at the same positions
        if not self.active:
            self.load(np.full(sum(batch.num_tokens), -1, dtype=np.int64))
            return
        self.load(self.token_rows(batch, self._rows_of))

    def prefetch(self, seqs) -> None:
        """While a step computes (before its tokens are sampled): queue the rows of the decode step that would
        follow, each of `seqs` decoding one token at position len(seq) (its sampled token's), behind the step's
        kernels on the stream (they have read the buffer by then). `advance` keeps them if that step comes (the
        scheduler may run another), so the next step's host work is off its critical path."""
        if not seqs:
            return
        places = [(seq, len(seq)) for seq in seqs]
        if self.active:
            index = np.concatenate([self._rows_of(seq, np.array([p])) for seq, p in places]).astype(np.int64)
        else:
            index = np.full(len(places), -1, dtype=np.int64)
        self.load(index)
        self._ahead = self._key(places)

    def _key(self, places) -> tuple:
        return self.active, tuple((seq.request_id, p) for seq, p in places)

    def _rows_of(self, seq, positions: np.ndarray) -> np.ndarray:
        s = self.sequence_of.setdefault(seq.request_id, len(self.sequence_of) % self.num_sequences)
        output = positions - len(seq.prompt_ids)  # an output token's index; < 0: a prompt token
        return np.where(output >= 0, self.starts[s] + output % self.lengths[s], -1)
