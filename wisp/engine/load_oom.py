"""A device out-of-memory while the engine starts, explained as one WispError: the bytes this
configuration puts on the device and, when the device's usable memory is known, a configuration that fits.

`DeviceBytes.of` counts what the engine places on the device, by part: the non-expert weights (attention,
dense and shared MLPs, norms, routers, embeddings, LM head), the experts there (resident: every expert;
paged: cap slots per MoE layer plus the two expert-sized staging buffers; offload: one layer's bank;
zero-copy: the two staging buffers its prefill chunks stream through) and the KV pool, next to its admission floor (max_concurrency x ceil(max_model_len /
block_size) blocks). Activations, workspace and CUDA graphs come on top; `RESERVE` stands for them when a
fitting configuration is searched (`wisp.plan.sizes.DEFAULT_RESERVE_BYTES`, what the planner keeps free).

`usable_bytes` is the device's free memory once the failed load is released (None off CUDA): the budget the
suggestion fits into.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from wisp.config import EngineConfig, ModelConfig
from wisp.options import SCRATCH_MODES
from wisp.plan.sizes import DEFAULT_RESERVE_BYTES, non_expert_params

RESERVE = DEFAULT_RESERVE_BYTES
FLAGS = "a smaller --expert-cap, --kv-bytes, --max-concurrency or --max-model-len"


@dataclass(frozen=True)
class DeviceBytes:
    weights: int  # non-expert weights
    experts: int  # expert bytes on the device (scratch, staging, a bank or a layer buffer, by mode)
    kv: int  # the KV pool as configured
    kv_floor: int  # the admission floor's KV bytes
    slot: int  # one paged slot in every MoE layer (0 outside paged mode)

    @property
    def total(self) -> int:
        return self.weights + self.experts + self.kv

    @classmethod
    def of(cls, cfg: ModelConfig, config: EngineConfig, num_blocks: int, floor_blocks: int, block_bytes: int,
           embedding_on_host: bool = False) -> "DeviceBytes":
        element = torch.empty((), dtype=cfg.dtype).element_size()
        layers, e = len(cfg.moe_layer_ids), cfg.expert_bytes
        slot = 0
        if config.mode == "resident":
            experts = cfg.num_experts * cfg.slot_bytes
        elif config.mode in SCRATCH_MODES:  # hybrid with no slots: its hot experts (0 unless asked)
            experts, slot = (sum(config.resolve_layer_caps(cfg)) + layers * config.hot_experts) * e + 2 * e, cfg.slot_bytes
        elif config.mode == "offload":
            experts = cfg.num_experts * e
        else:  # zero-copy reads the host masters in place; a prefill chunk streams through two staging buffers
            experts = 2 * e
        return cls(non_expert_params(cfg, embedding_on_host) * element, experts, num_blocks * block_bytes,
                   floor_blocks * block_bytes, slot)


def usable_bytes(device: torch.device) -> int | None:
    """Free device memory now that the failed load's tensors are gone (None when not on CUDA)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def oom_message(cfg: ModelConfig, config: EngineConfig, need: DeviceBytes, usable: int | None, stage: str,
                cause: str) -> str:
    """One line: what ran out, the bytes by part, and which budget would fit."""
    mode = config.mode + (f", cap {max(config.resolve_layer_caps(cfg))}" if config.mode in SCRATCH_MODES else "")
    parts = (f"about {need.total} bytes: non-expert weights {need.weights} + experts on the device {need.experts} "
             f"({mode}) + KV pool {need.kv} (its floor for --max-concurrency {config.max_concurrency}: "
             f"{need.kv_floor}), plus activations and CUDA graphs")
    head = f"out of device memory while {stage} ({cause}); this configuration needs {parts}"
    if usable is None:
        return f"{head}; try {FLAGS}"
    return f"{head}; {usable} bytes are free on the device: {_what_fits(cfg, config, need, usable)}"


def _what_fits(cfg: ModelConfig, config: EngineConfig, need: DeviceBytes, usable: int) -> str:
    """The first that fits `usable` less the reserve: a smaller expert cap (paged, or resident -> paged) with
    the KV pool as configured, then with the KV pool at its floor; a smaller KV pool; fewer requests at once."""
    budget = usable - RESERVE
    keep = f" would fit (keeping {RESERVE} bytes for activations)"
    scratch = config.mode in ("resident", *SCRATCH_MODES)
    staging, slot = 2 * cfg.expert_bytes, cfg.slot_bytes
    if scratch:
        paged = " --mode paged" if config.mode == "resident" else ""
        largest = cfg.num_experts if config.mode == "resident" else max(config.resolve_layer_caps(cfg)) - 1
        for kv, kv_flag in ((need.kv, ""), (need.kv_floor, f" --kv-bytes {need.kv_floor} (the KV floor)")):
            cap = min((budget - need.weights - kv - staging) // slot, largest)
            if cap >= cfg.top_k:
                return f"--expert-cap {cap}{paged}{kv_flag}{keep}"
    least_experts = staging + cfg.top_k * slot if scratch else need.experts
    cap_flag = f" --expert-cap {cfg.top_k}{' --mode paged' if config.mode == 'resident' else ''}" if scratch else ""
    room = budget - need.weights - least_experts
    per_request = need.kv_floor // config.max_concurrency
    if need.kv > need.kv_floor and room >= need.kv_floor:
        return f"--kv-bytes {room}{cap_flag}{keep}"
    if per_request and 1 <= room // per_request < config.max_concurrency:
        return f"--max-concurrency {room // per_request}{cap_flag}{keep}"
    return (f"even the non-expert weights, the fewest experts and one request's KV need "
            f"{need.weights + least_experts + per_request} bytes besides that reserve: try a smaller --max-model-len, "
            "--mode zero-copy, or a larger device")
