"""`wisp bench sweep`: kernels timed over their launch parameters (block sizes, tiles, threads, experts a call):
the Triton MoE and attention kernels (`moe_attention`), the dense projections (`linear`), and hybrid's CPU
expert kernels (`cpu_experts`)."""

from __future__ import annotations

from wisp.errors import WispError


def require_cuda(what: str) -> None:
    """A sweep that only means something on a GPU: one WispError line on a machine without CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise WispError(f"{what} times GPU kernels: it needs a CUDA device, and this machine has none")
