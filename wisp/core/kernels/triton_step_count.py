"""`StepCount`s added on the device by Triton (CUDA, or the interpreter): `add_step` inside a launch that reads the
step's routing, `count_step` as a launch of its own. One program owns the count vector during a launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wisp.core.kernels.step_count import StepCount


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
