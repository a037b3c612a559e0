"""Expert stores for tests, built from their parts as the modes' presets build them (`wisp.core.experts.presets`),
with the arguments tests give: a bank or host masters, a capacity, a device, and the shared parts."""

from __future__ import annotations

import torch

from wisp.core.experts.cpu_server import CpuServer
from wisp.core.experts.expert_major import StagingBuffers
from wisp.core.experts.miss_policies import MISS_POLICIES
from wisp.core.experts.residency import FullBank, HotBank, LayerBuffer, LruSlots, NoBank, SharedLayerBuffer
from wisp.core.experts.store import ExpertStore
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.core.learners.hybrid_pace import CpuPace

__all__ = ["SharedLayerBuffer", "StagingBuffers", "hybrid_store", "hybrid_zero_copy_store", "offload_store",
           "paged_store", "resident_store", "zero_copy_store"]


def resident_store(bank: dict[str, torch.Tensor]) -> ExpertStore:
    return ExpertStore(FullBank(bank, next(iter(bank.values())).device), MISS_POLICIES["copy"](), mode="resident")


def paged_store(host, capacity: int, device, staging: StagingBuffers | None = None) -> ExpertStore:
    return ExpertStore(LruSlots(host, torch.device(device), capacity), MISS_POLICIES["copy"](), staging, mode="paged")


def offload_store(host, buffer: SharedLayerBuffer, owns_buffer: bool) -> ExpertStore:
    device = next(iter(buffer.tensors.values())).device
    return ExpertStore(LayerBuffer(host, device, buffer, owns_buffer), MISS_POLICIES["copy"](), mode="offload")


def zero_copy_store(host, device, staging: StagingBuffers | None = None) -> ExpertStore:
    return ExpertStore(NoBank(host, torch.device(device)), MISS_POLICIES["in-place"](), staging, mode="zero-copy")


def hybrid_store(host, capacity: int, device, costs: HybridCosts, staging: StagingBuffers | None = None,
                 cpu_kernel: str | None = None, pace: CpuPace | None = None) -> ExpertStore:
    device = torch.device(device)
    return ExpertStore(LruSlots(host, device, capacity), MISS_POLICIES["copy-or-cpu"](), staging,
                       CpuServer(host, device, costs, cpu_kernel, pace), mode="hybrid")


def hybrid_zero_copy_store(host, device, costs: HybridCosts, staging: StagingBuffers | None = None,
                           cpu_kernel: str | None = None, pace: CpuPace | None = None, hot: int = 0) -> ExpertStore:
    device = torch.device(device)
    residency = HotBank(host, device, hot) if hot else NoBank(host, device)
    return ExpertStore(residency, MISS_POLICIES["in-place-or-cpu"](), staging, CpuServer(host, device, costs, cpu_kernel, pace),
                       mode="hybrid-zero-copy")


def every_mode(bank: dict[str, torch.Tensor], cap: int, device) -> tuple[dict[str, torch.Tensor], dict[str, ExpertStore]]:
    """(the host masters, pinned on CUDA, and a store per mode over `bank`): resident, paged and hybrid with `cap`
    slots, offload, and on the CPU zero-copy (on CUDA it needs the Triton kernel). Hybrid's costs send misses to the
    CPU."""
    dev = torch.device(device)
    host = {name: t.pin_memory() if dev.type == "cuda" else t for name, t in bank.items()}
    stores = {
        "resident": resident_store({name: t.to(dev) for name, t in bank.items()}),
        "paged": paged_store(host, cap, dev),
        "offload": offload_store(host, SharedLayerBuffer(host, dev), owns_buffer=True),
        "hybrid": hybrid_store(host, cap, dev, HybridCosts(copy_s=1.0, cpu_rows=(1, 64), cpu_s_at_rows=(0.1, 6.4))),
    }
    if dev.type == "cpu":
        stores["zero-copy"] = zero_copy_store(host, dev)
    return host, stores
