"""The two measured costs of the plan's cost model, probed on the device the plan is for.

`probe_seconds_per_byte`: host->device copy time per byte (pinned memory on CUDA), best of 5 timed
copies after one warm-up. `estimate_recompute_cost`: seconds to prefill one token, the model's active
FLOPs per token at this device's measured GEMM rate. Both are only as good as the device is quiet;
give `--seconds-per-byte` and `--recompute-cost` to make a plan deterministic.
"""

from __future__ import annotations

import time

import torch

from wisp.config import ModelConfig


def probe_seconds_per_byte(device: torch.device, nbytes: int = 256 << 20) -> float:
    """Seconds per byte of a host->device copy (pinned on CUDA), best of 5."""
    cuda = device.type == "cuda"
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best = float("inf")
    for _ in range(6):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best / nbytes


def active_flops_per_token(cfg: ModelConfig) -> int:
    """Multiply-adds x 2 of one token through every layer's attention projections and top_k experts, and the LM head."""
    d = cfg.hidden_size
    attention = d * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    active = 2 * (attention + 3 * d * cfg.moe_intermediate_size * cfg.top_k)
    return active * cfg.num_layers + 2 * cfg.vocab_size * d


def estimate_recompute_cost(cfg: ModelConfig, device: torch.device) -> float:
    """Seconds per prefill token: the model's active FLOPs per token at this device's measured GEMM rate."""
    d = cfg.hidden_size
    a = torch.randn(512, d, device=device).to(cfg.dtype)
    b = torch.randn(d, 4 * d, device=device).to(cfg.dtype)
    best = float("inf")
    for _ in range(4):
        t0 = time.perf_counter()
        (a @ b).sum().item()
        best = min(best, time.perf_counter() - t0)
    rate = 2 * 512 * d * 4 * d / best
    return active_flops_per_token(cfg) / rate
