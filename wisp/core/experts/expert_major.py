"""Expert-major execution of a wide MoE step: more distinct routed experts than the layer has slots.

A prefill chunk (or a large decode batch) may route to far more experts than the C slots hold. Cutting
its tokens into groups that fit would evict and reload the same experts group after group; instead the
step runs expert by expert, and each missing expert crosses PCIe exactly once. The executor
(`wisp.core.experts.store.ExpertStore`) runs such a serve plan with the pieces here (`StagingBuffers`,
`compute_from_copies`):
1. `ExpertPager.decide` takes the step's LRU decision: hits, misses loaded into a slot and kept (the
   step's C most recently touched, i.e. those its last tokens route to: `wisp.core.experts.recency`), and misses streamed through a staging buffer;
2. the hits run from their slots in one `pairs_by_map` launch through the expert_map as it was;
3. each streamed miss is copied into one of two staging buffers, then its pairs are computed; each kept
   miss is copied into its slot, then its pairs are computed from there;
4. the new expert_map is published, and the [T*K, D] pair outputs are summed over k in routing order.

On CUDA the copies run on a copy stream in that order, streamed misses first: a copy waits only for the
last reader of its destination (a staging buffer's previous expert, or, for a slot, the hits launch),
and each expert's compute waits for its own copy, so the next copy overlaps the current compute
(double buffering with events, no host sync). On the CPU the same steps run one after another.

Zero-copy mode, which has no slots, runs its prefill chunks the same way with every routed expert not held
staged: each crosses PCIe once instead of once per routed pair.

Invariant: the output is torch.equal to `fused` over a resident bank (the same per-pair arithmetic,
the same combine), so resident, narrow paged, expert-major paged and any prefill chunking agree.
Bytes copied per layer and step = distinct missing experts x expert bytes, never more.
"""

from __future__ import annotations

import torch

from wisp.core.bank_keys import DOWN, GATE_UP, layout_key
from wisp.core.kernels.expert_extras import extras_of
from wisp.core.kernels.registry import MoEKernels


class StagingBuffers:
    """Two expert-sized device buffers shared by every paged (or zero-copy) layer of a model (layers run one
    after another), the copy stream, and per buffer the event after which its last reader is done. The two
    are the rows of one [2, ...] bank (`bank_for`), which a wide graph step fills and reads a wave at a time
    (`wisp.core.experts.expert_major_on_device`). A model whose layers' experts differ in layout (a GGUF file's
    block formats, layer by layer) has one such bank per layout, each allocated on its first use; the two
    buffers' events are shared (a layer's copy still waits for the last reader of that buffer in any layout)."""

    rows = 2

    def __init__(self, like: dict[str, torch.Tensor], device: torch.device):
        self.device = torch.device(device)
        self._banks: dict[tuple, tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]] = {}  # bank, buffers
        self.bank_for(like)  # the first layout's, allocated now
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.free_after: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0

    def bank_for(self, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The [2, ...] tensors for experts laid out as `like`'s (a bank or a layer's masters, [N, ...] per tensor)."""
        return self._layout(like)[0]

    def buffers_for(self, like: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """`bank_for(like)` as its two buffers, each a dict of one expert's tensors."""
        return self._layout(like)[1]

    def _layout(self, like: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
        key = layout_key(like)
        if key not in self._banks:
            bank = {name: torch.empty((self.rows, *shape), dtype=dtype, device=self.device) for name, shape, dtype in key}
            self._banks[key] = bank, [{name: t[i] for name, t in bank.items()} for i in range(self.rows)]
        return self._banks[key]

    @property
    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for bank, _ in self._banks.values() for t in bank.values())

    def take(self) -> int:
        """The index of the buffer to fill next (they alternate)."""
        index, self.turn = self.turn, 1 - self.turn
        return index


def offsets_of(counts: list[int]) -> list[int]:
    """[N + 1] where each expert's pairs start in the pairs sorted by expert."""
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    return offsets


def compute_from_copies(host: dict[str, torch.Tensor], staging: StagingBuffers, kernels: MoEKernels, per_k: torch.Tensor,
                        hidden: torch.Tensor, topk_ids: torch.Tensor, plan: list[tuple[int, int | None]],
                        offsets: list[int], scratch: dict[str, torch.Tensor] | None = None) -> None:
    """Copy each (expert, slot) of `plan` into its slot of `scratch` (slot None: the next staging buffer)
    and compute its pairs into `per_k`; on CUDA copies run on the copy stream, each waiting only for the
    last reader of its destination (a slot: the kernels queued before this call), compute for its copy."""
    k = topk_ids.shape[1]
    order = torch.argsort(topk_ids.reshape(-1), stable=True)  # [T*K] pairs grouped by expert, token order inside
    copy_stream = staging.stream
    main = torch.cuda.current_stream(hidden.device) if copy_stream is not None else None
    hits_done = main.record_event() if copy_stream is not None else None
    buffers = staging.buffers_for(host) if any(slot is None for _, slot in plan) else None
    for expert, slot in plan:
        if slot is None:
            index = staging.take()
            dest, wait = buffers[index], staging.free_after[index]
        else:
            dest, wait = {name: w[slot] for name, w in scratch.items()}, hits_done
        if copy_stream is None:
            _copy_expert(host, expert, dest)
        else:
            with torch.cuda.stream(copy_stream):
                if wait is not None:
                    copy_stream.wait_event(wait)
                _copy_expert(host, expert, dest)
                copied = copy_stream.record_event()
            main.wait_event(copied)
        pairs = order[offsets[expert] : offsets[expert + 1]]
        kernels.pairs_of_one_expert(per_k, hidden, dest[GATE_UP], dest[DOWN], pairs, k, extras=extras_of(dest))
        if slot is None and copy_stream is not None:
            staging.free_after[index] = main.record_event()


def _copy_expert(host: dict[str, torch.Tensor], expert: int, dest: dict[str, torch.Tensor]) -> None:
    for name, master in host.items():
        dest[name].copy_(master[expert], non_blocking=True)
