"""The modes: named presets of a residency and a miss policy (`wisp.core.experts.store.ExpertStore`).

| mode | residency | miss policy |
|---|---|---|
| resident | full-bank | copy (nothing misses) |
| paged | lru-slots (C) | copy |
| offload | layer-buffer | copy (the buffer refills the whole layer) |
| zero-copy | none | in-place |
| hybrid | lru-slots (C) | copy-or-cpu |
| hybrid-zero-copy | none, or hot-bank (H) with hot experts | in-place-or-cpu |

`build_store` makes one layer's store from its bank (on the device for a full bank, pinned host masters
otherwise), its capacity (slots C, or hot experts H) and the parts a model's layers share. A new combination is
one more row here; a new residency or policy is one registered class in its module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wisp.core.experts.cpu_server import CpuServer
from wisp.core.experts.expert_major import StagingBuffers
from wisp.core.experts.miss_policies import MISS_POLICIES
from wisp.core.experts.residency import RESIDENCIES, SharedParts
from wisp.core.experts.store import ExpertStore
from wisp.core.kernels.registry import TORCH_KERNELS, MoEKernels
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.core.learners.hybrid_pace import CpuPace


@dataclass(frozen=True)
class Preset:
    residency: str  # a RESIDENCIES name
    policy: str  # a MISS_POLICIES name
    stages: bool = True  # wide steps stage misses through the shared staging buffers
    hot_residency: str | None = None  # the residency it takes instead when hot experts are asked for

    @property
    def needs_cpu(self) -> bool:
        """Whether its policy serves misses on the CPU (a store of it needs the probed costs)."""
        return MISS_POLICIES[self.policy].needs_cpu


PRESETS: dict[str, Preset] = {
    "resident": Preset("full-bank", "copy", stages=False),
    "paged": Preset("lru-slots", "copy"),
    "offload": Preset("layer-buffer", "copy", stages=False),
    "zero-copy": Preset("none", "in-place"),
    "hybrid": Preset("lru-slots", "copy-or-cpu"),
    "hybrid-zero-copy": Preset("none", "in-place-or-cpu", hot_residency="hot-bank"),
}


@dataclass
class ModelParts(SharedParts):
    """What a model's layers share: the residencies' buffers, and the CPU's probed costs and their pace."""

    costs: HybridCosts | None = None  # the costs every CPU-serving layer assigns its misses by
    pace: CpuPace | None = None  # their correction, learned while serving (one per model)
    dtype: torch.dtype | None = None  # the model's compute dtype (the CPU's re-timing computes in it)


def build_store(mode: str, bank: dict[str, torch.Tensor], device: torch.device, capacity: int, parts: ModelParts,
                hot: int = 0, cpu_kernel: str | None = None, kernels: MoEKernels = TORCH_KERNELS) -> ExpertStore:
    """One layer's store for `mode` (a PRESETS name). capacity: slots for lru-slots; hot: experts held by a
    hot bank (presets that have one). A CPU-serving policy needs `parts.costs`."""
    preset = PRESETS[mode]
    residency_name = preset.hot_residency if hot and preset.hot_residency else preset.residency
    residency = RESIDENCIES[residency_name].create(bank, device, hot or capacity, parts)
    policy = MISS_POLICIES[preset.policy]()
    if preset.stages:
        parts.staging = parts.staging or StagingBuffers(bank, device)
    cpu = None
    if policy.needs_cpu:
        if parts.costs is None:
            raise ValueError(f"mode {mode!r} serves misses on the CPU: probe its costs first")
        parts.pace = parts.pace or CpuPace()
        cpu = CpuServer(bank, device, parts.costs, cpu_kernel, parts.pace, parts.dtype)
    return ExpertStore(residency, policy, parts.staging if preset.stages else None, cpu, kernels, mode)
