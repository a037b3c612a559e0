"""Pinned host memory as a kernel argument: unified virtual addressing (UVA).

On CUDA with UVA (every 64-bit platform), memory allocated by cudaHostAlloc (what torch's pin_memory
uses) is mapped into every device's address space at the same address, so a kernel can read it in
place over PCIe. Triton accepts any object with `data_ptr()` and `dtype` as a pointer argument;
`device_view` wraps a pinned CPU tensor that way (a device tensor passes through unchanged).

Invariant: only pinned tensors are wrapped (pageable memory is not mapped: reading it would fault).
Assumption: torch pins with cudaHostAlloc (its default). Pinning through cudaHostRegister
(PYTORCH_CUDA_ALLOC_CONF pinned_use_cuda_host_register) gives the same address only on GPUs with
CanUseHostPointerForRegisteredMem; wisp does not set it.
"""

from __future__ import annotations

import torch


class HostPointer:
    """A pinned CPU tensor presented to Triton as a device pointer (same address under UVA)."""

    def __init__(self, tensor: torch.Tensor):
        if not tensor.is_pinned():
            raise ValueError("only pinned host memory is mapped into the GPU's address space")
        self.tensor = tensor  # keeps the memory alive while the pointer is in use
        self.dtype = tensor.dtype
        self.shape = tensor.shape

    def data_ptr(self) -> int:
        return self.tensor.data_ptr()

    def stride(self, dim: int) -> int:
        return self.tensor.stride(dim)


def device_view(tensor: torch.Tensor):
    """`tensor` itself when it is on a CUDA device, else a HostPointer to its (pinned) host memory."""
    return tensor if tensor.is_cuda else HostPointer(tensor)
