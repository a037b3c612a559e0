"""A MoE step's (token, k) pairs sorted by slot into whole tiles of BLOCK_M rows, on the device with no host sync (so a
CUDA graph can capture it): the first launches of `wisp.core.kernels.triton_moe`.

1. `_count_pairs`: each pair whose expert has a slot takes a place among its slot's pairs (an atomic count; pairs of
   a -1 slot are never placed, so their rows are left as they are);
2. `_sort_pairs`: the places become one list, each slot's pairs in whole tiles, slot after slot (the grid is the most
   tiles T*K pairs can need);
up to FEW_PAIRS pairs (a decode step) one program does both (`_sort_few_pairs`), with no zeroing launch, and adds the
step to the store's device counts when given one (`wisp.core.kernels.step_count`; otherwise `count_step` is its own
launch). Where in a tile a pair lands never changes its row's arithmetic, so any order within a slot will do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wisp.core.kernels.step_count import StepCount
from wisp.core.kernels.triton_step_count import add_step, count_step, experts_block

BLOCK_M = 64  # pairs a tile: one fixed shape for every call, so no row's instructions depend on the batch
BLOCK_PAIRS = 128  # pairs a program of the sort
FEW_PAIRS = 64  # up to this many pairs (8 decode rows of top-8) are sorted by one program (`_sort_few_pairs`)


@triton.jit
def _pair_slots(ids_ptr, map_ptr, P, BLOCK: tl.constexpr):
    """This program's BLOCK pairs: their indices, their experts' slots (-1: none) and which are live."""
    pairs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = pairs < P
    slot = tl.load(map_ptr + tl.load(ids_ptr + pairs, mask=ok, other=0), mask=ok, other=-1)
    return pairs, slot, ok & (slot >= 0)


@triton.jit
def slot_tiles(counts_ptr, S, SP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Per slot (SP lanes, the first S real): its pair count and its tiles, ceil(count / BLOCK_M)."""
    s = tl.arange(0, SP)
    count = tl.load(counts_ptr + s, mask=s < S, other=0)
    return s, count, (count + BLOCK_M - 1) // BLOCK_M


@triton.jit
def _count_pairs(ids_ptr, map_ptr, counts_ptr, rank_ptr, P, BLOCK: tl.constexpr):
    """counts[slot] += 1 for every pair with a slot; rank[pair] = its place among its slot's pairs (any
    order: a row's arithmetic never depends on where in a tile it lands)."""
    pairs, slot, live = _pair_slots(ids_ptr, map_ptr, P, BLOCK)
    rank = tl.atomic_add(counts_ptr + slot, 1, mask=live)
    tl.store(rank_ptr + pairs, rank, mask=live)


@triton.jit
def _sort_pairs(ids_ptr, map_ptr, counts_ptr, rank_ptr, sorted_ptr, P, S, SP: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK: tl.constexpr):
    """sorted[first tile of its slot * BLOCK_M + rank] = pair: each slot's pairs in whole tiles, slot by slot."""
    pairs, slot, live = _pair_slots(ids_ptr, map_ptr, P, BLOCK)
    s, _, tiles = slot_tiles(counts_ptr, S, SP, BLOCK_M)
    first = tl.sum(tl.where(s[None, :] < slot[:, None], tiles[None, :], 0), axis=1)  # [BLOCK]
    rank = tl.load(rank_ptr + pairs, mask=live, other=0)
    tl.store(sorted_ptr + first * BLOCK_M + rank, pairs, mask=live)


@triton.jit
def _sort_few_pairs(ids_ptr, map_ptr, counts_ptr, sorted_ptr, P, S, step_ptr, N, loads, step_bytes,
                    SP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, COUNT: tl.constexpr,
                    HITS: tl.constexpr, BLOCK_E: tl.constexpr):
    """`_count_pairs` and `_sort_pairs` in one program, for at most BLOCK_P pairs (a decode step): counts[slot]
    written for every slot (no zeroing launch before), and each slot's pairs placed by pair index. COUNT: the
    step added to the count vector at step_ptr too (`add_step`)."""
    pairs = tl.arange(0, BLOCK_P)
    ok = pairs < P
    ids = tl.load(ids_ptr + pairs, mask=ok, other=0)
    if COUNT:
        add_step(tl.where(ok, ids.to(tl.int32), -1), step_ptr, N, loads, step_bytes, HITS, BLOCK_E)
    slot = tl.load(map_ptr + ids, mask=ok, other=-1)
    live = ok & (slot >= 0)
    earlier = (slot[:, None] == slot[None, :]) & live[None, :] & (pairs[None, :] < pairs[:, None])  # [P, P]
    rank = tl.sum(earlier.to(tl.int32), axis=1)
    s = tl.arange(0, SP)
    count = tl.sum(((slot[None, :] == s[:, None]) & live[None, :]).to(tl.int32), axis=1)  # [SP]
    tl.store(counts_ptr + s, count, mask=s < S)
    tiles = (count + BLOCK_M - 1) // BLOCK_M
    first = tl.sum(tl.where(s[None, :] < slot[:, None], tiles[None, :], 0), axis=1)  # [P]
    tl.store(sorted_ptr + first * BLOCK_M + rank, pairs, mask=live)


def sorted_by_slot(ids: torch.Tensor, emap: torch.Tensor, slots: int,
                    count: StepCount | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The pairs of every slot in whole tiles, on the device with no host sync: (counts [slots] int32, sorted
    pair indices, the most tiles any routing of these pairs can need). `count`: the step is added to it."""
    p = ids.numel()
    max_tiles = (p + min(p, slots) * (BLOCK_M - 1)) // BLOCK_M if slots else 0  # no slot: nothing to compute
    order = torch.empty(max_tiles * BLOCK_M, dtype=torch.int32, device=ids.device)
    if 0 < p <= FEW_PAIRS and max_tiles:  # a decode step: one launch, no zeroing, the count in it
        counts = torch.empty(slots, dtype=torch.int32, device=ids.device)
        step = (count.counts, count.num_experts, count.loads, count.step_bytes(p)) if count else (counts, 0, 0, 0)
        _sort_few_pairs[(1,)](ids, emap, counts, order, p, slots, *step, SP=triton.next_power_of_2(slots),
                              BLOCK_M=BLOCK_M, BLOCK_P=FEW_PAIRS, COUNT=count is not None,
                              HITS=bool(count and count.hits), BLOCK_E=experts_block(count) if count else 2,
                              num_warps=8)
        return counts, order, max_tiles
    if count is not None:
        count_step(count, ids)
    counts = torch.zeros(slots, dtype=torch.int32, device=ids.device)
    rank = torch.empty(p, dtype=torch.int32, device=ids.device)
    if max_tiles == 0:
        return counts, order, max_tiles  # nothing routed, or no slot: no launch
    grid = (triton.cdiv(p, BLOCK_PAIRS),)
    _count_pairs[grid](ids, emap, counts, rank, p, BLOCK=BLOCK_PAIRS)
    _sort_pairs[grid](ids, emap, counts, rank, order, p, slots, SP=triton.next_power_of_2(slots), BLOCK_M=BLOCK_M,
                      BLOCK=BLOCK_PAIRS)
    return counts, order, max_tiles
