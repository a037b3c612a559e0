"""Expert-major execution of a wide MoE step: more distinct routed experts than the layer has slots.

A prefill chunk (or a large decode batch) may route to far more experts than the C slots hold. Cutting
its tokens into groups that fit would evict and reload the same experts group after group; instead the
step runs expert by expert, and each missing expert crosses PCIe exactly once. The executor
(`wisp.core.experts.store.ExpertStore`) runs such a serve plan with the pieces here (`StagingBuffers`,
`compute_from_copies`):
1. `ExpertPager.decide` takes the step's LRU decision: hits, misses loaded into a slot and kept (the
   step's C most recently touched, i.e. those its last tokens route to: `wisp.core.experts.recency`), and
   misses streamed through staging;
2. the hits run from their slots in one `pairs_by_map` launch through the expert_map as it was;
3. the kept misses are copied into their slots, then computed in one launch through a map of just them;
4. the streamed misses go in waves: each wave's experts are copied into one half of the staging rows (two
   halves, each holding `staging_rows` experts, about 64 MiB), then computed in one launch through a map of
   that wave;
5. the new expert_map is published, and the [T*K, D] pair outputs are summed over k in routing order.

On CUDA the copies run on a copy stream: a copy waits only for the last reader of its destination (for a slot,
the hits launch; for a half, its wave before last), and each launch waits for its own copies, so the next
wave's copies overlap the current wave's compute (double buffering with events, no host sync). A wave costs a
few launches whatever its size, so small experts (Qwen3's 4.7 MB) run at the link's rate rather than at the
host's pace of launching one expert at a time. On the CPU the same steps run one after another.

Zero-copy mode, which has no slots, runs its prefill chunks the same way with every routed expert not held
staged: each crosses PCIe once instead of once per routed pair.

Invariant: the output is torch.equal to `fused` over a resident bank (the same per-pair arithmetic,
the same combine), so resident, narrow paged, expert-major paged and any prefill chunking agree.
Bytes copied per layer and step = distinct missing experts x expert bytes, never more.
"""

from __future__ import annotations

import torch

from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.kernels.expert_extras import extras_of
from wisp.core.kernels.registry import MoEKernels


STAGING_HALF_BYTES = 64 << 20  # one half's copies take about 1.2 ms at 55 GB/s, far longer than its launches


def staging_rows(expert_bytes: int, num_experts: int) -> int:
    """Experts one staging half holds: as many as fit in `STAGING_HALF_BYTES` (at least one, at most every
    expert), so that a wave's copies, not its host work, set its time."""
    return max(1, min(num_experts, STAGING_HALF_BYTES // max(1, expert_bytes)))


def staging_bytes(expert_bytes: int, num_experts: int) -> int:
    """Device bytes of a model's staging halves (shared by its layers)."""
    return 2 * staging_rows(expert_bytes, num_experts) * expert_bytes


class StagingBuffers:
    """Two halves of `rows` expert-sized rows each, shared by every paged (or zero-copy) layer of a model (layers
    run one after another), the copy stream, and per half the event after which its last reader is done."""

    def __init__(self, like: dict[str, torch.Tensor], device: torch.device, rows: int | None = None):
        self.device = torch.device(device)
        first = next(iter(like.values()))
        expert_bytes = sum(t[0].numel() * t.element_size() for t in like.values())
        self.rows = rows if rows is not None else staging_rows(expert_bytes, first.shape[0])
        self.halves = [
            {name: torch.empty((self.rows, *t.shape[1:]), dtype=t.dtype, device=self.device) for name, t in like.items()}
            for _ in range(2)
        ]
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.free_after: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0

    @property
    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for b in self.halves for t in b.values())

    def take(self) -> int:
        """The index of the half to fill next (they alternate)."""
        index, self.turn = self.turn, 1 - self.turn
        return index


def compute_from_copies(host: dict[str, torch.Tensor], staging: StagingBuffers, kernels: MoEKernels, per_k: torch.Tensor,
                        hidden: torch.Tensor, topk_ids: torch.Tensor, staged: list[int], loads: list[tuple[int, int]],
                        scratch: dict[str, torch.Tensor] | None = None) -> None:
    """Copy each (expert, slot) of `loads` into its slot of `scratch` and each expert of `staged` into a staging
    row, and compute their pairs into `per_k`: the loads in one `pairs_by_map` launch over the slots, the staged
    experts in waves of `staging.rows`, one launch per wave over its half. On CUDA copies run on the copy stream,
    each waiting only for the last reader of its destination (a slot: the kernels queued before this call; a
    half: its wave before last), each launch for its copies."""
    n = next(iter(host.values())).shape[0]
    waves = [staged[i : i + staging.rows] for i in range(0, len(staged), staging.rows)]
    maps = torch.full((len(waves) + 1, n), -1, dtype=torch.int32)  # [waves + loads, N] expert -> row or slot
    for w, experts in enumerate(waves):
        maps[w, experts] = torch.arange(len(experts), dtype=torch.int32)
    for expert, slot in loads:
        maps[-1, expert] = slot
    maps = maps.to(hidden.device)  # one small copy for the step
    copy_stream = staging.stream
    main = torch.cuda.current_stream(hidden.device) if copy_stream is not None else None
    if loads:
        _copy_then_wait(host, copy_stream, main, main.record_event() if main is not None else None,
                        [(expert, {name: w[slot] for name, w in scratch.items()}) for expert, slot in loads])
        kernels.pairs_by_map(per_k, hidden, scratch[GATE_UP], scratch[DOWN], topk_ids, maps[-1], extras=extras_of(scratch))
    for w, experts in enumerate(waves):
        index = staging.take()
        half = staging.halves[index]
        _copy_then_wait(host, copy_stream, main, staging.free_after[index],
                        [(expert, {name: t[row] for name, t in half.items()}) for row, expert in enumerate(experts)])
        kernels.pairs_by_map(per_k, hidden, half[GATE_UP], half[DOWN], topk_ids, maps[w], extras=extras_of(half))
        if copy_stream is not None:
            staging.free_after[index] = main.record_event()


def _copy_then_wait(host: dict[str, torch.Tensor], copy_stream, main, wait,
                    copies: list[tuple[int, dict[str, torch.Tensor]]]) -> None:
    """Copy each (expert, destination) on the copy stream after `wait`, and make `main` wait for them (on the
    CPU: one after another, now)."""
    if copy_stream is None:
        for expert, dest in copies:
            _copy_expert(host, expert, dest)
        return
    with torch.cuda.stream(copy_stream):
        if wait is not None:
            copy_stream.wait_event(wait)
        for expert, dest in copies:
            _copy_expert(host, expert, dest)
        copied = copy_stream.record_event()
    main.wait_event(copied)


def _copy_expert(host: dict[str, torch.Tensor], expert: int, dest: dict[str, torch.Tensor]) -> None:
    for name, master in host.items():
        dest[name].copy_(master[expert], non_blocking=True)
