"""A wide step (more distinct routed experts than the C slots) run expert-major with no host sync, so a decode
batch of any width can be one CUDA graph.

The eager wide step (`wisp.core.experts.expert_major`) reads the step's routing on the host, decides there and
queues one copy per missing expert; every layer waits for that round trip with the link idle. Here the same
decision is taken on the device (`DeviceLRU.decide_wide`: `ExpertPager.decide`'s rule, counted on the device)
and every launch has a fixed shape:
1. the hits run from their slots as they were, through `hit_map`, in one `pairs_by_map` launch;
2. the streamed misses (those the step does not keep) cross PCIe in waves of the staging bank's rows: each
   wave is copied from the pinned masters in place (UVA) into the rows, then computed through its
   `wave_map`; a wave past the step's streamed count copies nothing and computes nothing;
3. the kept misses are copied into their slots (after step 1 read any slot they take), then computed
   through `load_map`;
4. the [T*K, D] pair outputs are summed over k in routing order.
Everything runs on the current stream, so each copy follows the reads of what it overwrites.

Invariants: the output is torch.equal to `fused` over a resident bank (each pair is computed once, by the
same per-pair kernel, and combined in the same order); the slots, map, LRU state and counters after the
step equal the host pager's after `decide` of the same routing (tests/core/experts/test_expert_major_on_device.py);
each miss crosses PCIe once.
"""

from __future__ import annotations

import torch

from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.experts.expert_major import StagingBuffers
from wisp.core.experts.pager import ExpertPager
from wisp.core.kernels.expert_extras import extras_of
from wisp.core.kernels.registry import MoEKernels


def wide_step_on_device(pager: ExpertPager, staging: StagingBuffers, kernels: MoEKernels, hidden: torch.Tensor,
                        topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """hidden [T, D], topk_ids / topk_weights [T, K] -> [T, D], paged through `pager`'s slots and `staging`."""
    pager.use_device()
    lru, scratch, host = pager.device_lru, pager.scratch, pager.host
    t, k = topk_ids.shape
    wide = lru.decide_wide(pager.expert_map, topk_ids, staging.rows)
    per_k = torch.zeros((t * k, hidden.shape[1]), dtype=torch.float32, device=hidden.device)  # [T*K, D]

    def pairs(bank: dict[str, torch.Tensor], expert_map: torch.Tensor) -> None:
        kernels.pairs_by_map(per_k, hidden, bank[GATE_UP], bank[DOWN], topk_ids, expert_map, extras=extras_of(bank))

    pairs(scratch, wide.hit_map)
    staged = staging.bank_for(host)
    for wave in range(wide.waves):
        lru.copy_wave(host, staged, wide, wave)
        pairs(staged, wide.wave_map[wave])
    lru.copy_loads(host, scratch, min(pager.capacity, t * k))
    pairs(scratch, wide.load_map)
    return kernels.combine(per_k.view(t, k, -1), topk_weights, hidden.dtype)
