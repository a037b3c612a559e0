"""A MoE step added to a device count vector with no host sync, by its own launch (`count_step`) or inside a launch
that already reads the step's routing (the Triton MoE's one-program decode sort takes a `StepCount`), so a decode
step's counting costs no launch of its own there.

The vector is int64 [6] in `wisp.core.experts.counters.COUNT_FIELDS` order (steps, hits, misses, evictions, loads,
bytes_h2d). A step adds: steps += 1; the distinct routed experts to hits (or to misses); loads += `loads`;
bytes_h2d += fixed_bytes + pairs * pair_bytes. One program owns the vector during a launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class StepCount:
    """Where and how a store counts a step: its vector, its expert count, and what the step adds."""

    counts: torch.Tensor  # int64 [6], COUNT_FIELDS order, on the device
    num_experts: int
    hits: bool  # the distinct routed experts count as hits (else as misses)
    loads: int = 0
    fixed_bytes: int = 0
    pair_bytes: int = 0

    def step_bytes(self, pairs: int) -> int:
        return self.fixed_bytes + pairs * self.pair_bytes  # in Python: past 2**31 it is passed as int64


@triton.jit
def bump(count_ptr, field, value):
    """counts[field] += value (one program owns the count vector during a launch)."""
    tl.store(count_ptr + field, tl.load(count_ptr + field) + value)


@triton.jit
def add_step(ids, count_ptr, N, loads, step_bytes, HITS: tl.constexpr, BLOCK_E: tl.constexpr):
    """Add one step whose routed ids are `ids` (a vector, -1 where no pair) to the vector at count_ptr: one load
    and one store of the whole vector (its fields are independent, so a launch pays one round trip, not six)."""
    f = tl.arange(0, 8)
    live = f < 6
    before = tl.load(count_ptr + f, mask=live, other=0)
    e = tl.arange(0, BLOCK_E)
    distinct = tl.sum(((tl.max((ids[None, :] == e[:, None]).to(tl.int32), axis=1) > 0) & (e < N)).to(tl.int64), axis=0)
    add = tl.where(f == 0, 1, 0).to(tl.int64) + tl.where(f == (1 if HITS else 2), distinct, 0)
    add += tl.where(f == 4, loads, 0).to(tl.int64) + tl.where(f == 5, step_bytes, 0).to(tl.int64)
    tl.store(count_ptr + f, before + add, mask=live)


@triton.jit
def _count_step(ids_ptr, n_pairs, count_ptr, N, loads, step_bytes, HITS: tl.constexpr, BLOCK_P: tl.constexpr,
                BLOCK_E: tl.constexpr):
    p = tl.arange(0, BLOCK_P)
    add_step(tl.load(ids_ptr + p, mask=p < n_pairs, other=-1).to(tl.int32), count_ptr, N, loads, step_bytes, HITS,
             BLOCK_E)


def experts_block(count: StepCount) -> int:
    return triton.next_power_of_2(max(count.num_experts, 2))


def count_step(count: StepCount, topk_ids: torch.Tensor) -> None:
    """Add the step routed as topk_ids [T, K] to `count`'s vector, in a launch of its own."""
    ids = topk_ids.reshape(-1)
    _count_step[(1,)](ids, ids.numel(), count.counts, count.num_experts, count.loads, count.step_bytes(ids.numel()),
                      HITS=count.hits, BLOCK_P=triton.next_power_of_2(max(ids.numel(), 2)), BLOCK_E=experts_block(count))
