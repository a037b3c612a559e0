"""`HotExperts`: one MoE layer's most-routed experts, held on the device for hybrid mode with no slots.

Hybrid with no slots (`--mode hybrid --expert-cap 0`) reads every routed expert from host memory: the GPU
in place over the link, the CPU from the same pinned masters. Whatever VRAM is left over can hold the
experts routing uses most, so their pairs cost neither the CPU nor the link any host bytes (`--hot-experts H`).
Unlike paged mode's LRU slots the set is held by frequency (a decayed count) and changes only at a refresh
(after a decode step, before a prefill chunk): a miss is never copied for the step that routes it
(why frequency: docs/decisions/hot-experts-held-by-decayed-count.md).

The layer owns:
- `bank[key]` [H, ...] on the device, one slot per hot expert, every tensor the host masters hold;
- `slot_map` (int32, [N + 1], on the device) expert -> its slot or -1; entry N is -1 too (the rank share's
  placeholder id for pairs another server computes); updated in place, so graphs captured over it stay valid;
- `expert_in_slot` (list, H) its inverse on the host, slot -> expert or -1 (empty), and `is_hot` (bool,
  [N + 1], host) slot_map >= 0;
- `scores` (float64, [N], host) each expert's routed pairs, decayed by DECAY a step.

`observe(ids)` adds a step's routing to the scores, `observe_counts` a prefill chunk's, weighed as one token's
(`refresh_due()` after steps 1, 4 and 16, then every 64th);
`refresh()` fills empty slots with the highest-scoring experts, then lets an outsider displace a held expert only
where its lead pays for the copy and is more than noise (`worth_swapping`), keeping those already held in their
slots and copying each newcomer once into a slot an outgoing expert leaves, all on the current stream (ordered
before the next step's kernels).

Invariants (`check_integrity`): slot_map[e] == s >= 0 <=> expert_in_slot[s] == e; slot_map[N] == -1; a held
slot holds exactly the bytes of its expert's master. Right after `refresh` (the tests check it): no slot is empty
while a routed expert is not held, and no outsider is worth swapping for the weakest held expert.
"""

from __future__ import annotations

import numpy as np
import torch

DECAY = 0.99  # per observed step: an expert's score halves in about 70 steps unless routed again
REFRESH_AT = (1, 4, 16)  # observed steps after which the set is chosen, then every REFRESH_EVERY
REFRESH_EVERY = 64
SWAP_Z = 2.0  # a newcomer's lead over the expert it displaces, in standard deviations of their scores' difference


class HotExperts:
    def __init__(self, host: dict[str, torch.Tensor], capacity: int, device: torch.device, decay: float = DECAY):
        """`host`: the layer's masters, every tensor [N, ...] (pinned on CUDA); capacity: H slots (>= 1)."""
        n = next(iter(host.values())).shape[0]
        if not 1 <= capacity <= n:
            raise ValueError(f"hot experts must be within 1..{n}, got {capacity}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.host, self.capacity, self.num_experts, self.decay = host, capacity, n, decay
        self.bank = {key: torch.zeros((capacity, *t.shape[1:]), dtype=t.dtype, device=device) for key, t in host.items()}
        self.slot_map = torch.full((n + 1,), -1, dtype=torch.int32, device=device)  # [N + 1]
        self.expert_in_slot = [-1] * capacity
        self.is_hot = np.zeros(n + 1, dtype=bool)  # [N + 1] on the host: slot_map >= 0 (the placeholder N never)
        self.scores = np.zeros(n, dtype=np.float64)
        self.copies = 0  # experts copied into the bank so far
        self.steps = 0  # steps observed
        pinned = self.slot_map.is_cuda
        self._map_staging = torch.full((n + 1,), -1, dtype=torch.int32, pin_memory=pinned)
        self._map_sent = torch.cuda.Event() if pinned else None  # the last map copy out of the staging buffer

    @property
    def held(self) -> set[int]:
        return {e for e in self.expert_in_slot if e >= 0}

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.bank.values())

    def observe(self, ids) -> None:
        """One step's routing (expert ids, any nesting of lists or an array; negative ids are ignored) into
        the decayed scores, every pair counted."""
        flat = np.asarray(ids, dtype=np.int64).reshape(-1)
        self.observe_counts(np.bincount(flat[flat >= 0], minlength=self.num_experts), tokens=1)

    def observe_counts(self, counts, tokens: int) -> None:
        """A step's routing as its per-expert pair counts [N] divided by `tokens` (a prefill chunk's weighed as one
        token's: it counts as much as a decode step of one sequence)."""
        self.scores *= self.decay
        self.scores += np.asarray(counts, dtype=np.float64) / max(1, tokens)
        self.steps += 1

    def refresh_due(self) -> bool:
        return self.steps in REFRESH_AT or (self.steps > 0 and self.steps % REFRESH_EVERY == 0)

    def ranked(self) -> list[int]:
        """The experts ever routed, by score descending (ties: the lower id)."""
        order = np.lexsort((np.arange(self.num_experts), -self.scores))
        return [int(e) for e in order if self.scores[e] > 0]

    def worth_swapping(self, newcomer: int, held: int) -> bool:
        """Whether `newcomer` should displace the held expert `held`. Its lead in routed pairs a step (the scores
        over the decay's window of steps), kept until the next refresh, must pay for its copy (one expert's
        bytes, about what one pair read from the host costs); and the lead must be more than noise: SWAP_Z
        standard deviations of the difference of two decayed counts of independent arrivals (a count's variance
        is about its rate times the sum of the squared decay weights). So routing with no locality, where every
        expert is as likely as any other, leaves the set nearly still instead of trading a third of it for noise
        at every refresh."""
        d, n = self.decay, max(1, self.steps)
        window = n if d == 1.0 else (1 - d ** n) / (1 - d)  # sum of the weights d^i over the observed steps
        window_sq = n if d == 1.0 else (1 - d ** (2 * n)) / (1 - d * d)  # sum of their squares
        a, b = self.scores[newcomer], self.scores[held]
        lead = a - b
        return (lead / window * REFRESH_EVERY > 1.0
                and lead > SWAP_Z * float(np.sqrt((a + b) * window_sq / window)))

    def refresh(self) -> int:
        """Fill the empty slots with the highest-scoring experts not held, then let the best outsider displace
        the weakest held expert while it is `worth_swapping`; returns how many experts were copied in."""
        ranked = [e for e in self.ranked() if e not in self.held]  # outsiders, best first
        free = [s for s, e in enumerate(self.expert_in_slot) if e < 0]
        moves = list(zip(ranked, free))  # (expert, slot)
        outsiders = ranked[len(moves):]
        weakest = sorted((s for s, e in enumerate(self.expert_in_slot) if e >= 0),
                         key=lambda s: (self.scores[self.expert_in_slot[s]], -self.expert_in_slot[s]))
        for expert, slot in zip(outsiders, weakest):
            if not self.worth_swapping(expert, self.expert_in_slot[slot]):
                break
            moves.append((expert, slot))
        if not moves:
            return 0
        for expert, slot in moves:
            for key, master in self.host.items():
                self.bank[key][slot].copy_(master[expert], non_blocking=True)
            self.expert_in_slot[slot] = expert
        if self._map_sent is not None:
            self._map_sent.synchronize()  # the previous map has left the staging buffer (long since, in practice)
        slot_of = self._map_staging
        slot_of.fill_(-1)
        for slot, expert in enumerate(self.expert_in_slot):
            if expert >= 0:
                slot_of[expert] = slot
        self.slot_map.copy_(slot_of, non_blocking=True)  # stream-ordered after the kernels already queued
        if self._map_sent is not None:
            self._map_sent.record(torch.cuda.current_stream(self.slot_map.device))
        self.is_hot = (slot_of >= 0).numpy().copy()
        self.copies += len(moves)
        return len(moves)

    def check_integrity(self) -> None:
        slot_of = self.slot_map.tolist()
        assert slot_of[self.num_experts] == -1, "the placeholder id must map nowhere"
        assert self.is_hot.tolist() == [s >= 0 for s in slot_of], "the host's mirror of the map"
        for e, s in enumerate(slot_of[: self.num_experts]):
            assert (s >= 0) == (e in self.held), (e, s)
            if s >= 0:
                assert self.expert_in_slot[s] == e, (e, s)
                for key, master in self.host.items():
                    assert torch.equal(self.bank[key][s].cpu(), master[e].cpu()), (key, e, s)
