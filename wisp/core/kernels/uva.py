"""Pinned host memory as a kernel argument: unified virtual addressing (UVA).

On CUDA with UVA (every 64-bit platform), memory allocated by cudaHostAlloc (what torch's pin_memory
uses) is mapped into every device's address space at the same address, so a kernel can read it in
place over PCIe. Triton accepts any object with `data_ptr()` and `dtype` as a pointer argument;
`device_view` wraps a pinned CPU tensor that way for a kernel on a GPU (a tensor already on the kernel's
kind of device passes through unchanged).

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


def device_view(tensor: torch.Tensor, device: torch.device):
    """`tensor` as a kernel on `device` reads it: itself when it lives on that kind of device (a GPU tensor,
    or a CPU tensor for Triton's interpreter), else a HostPointer to its (pinned) host memory."""
    return tensor if tensor.device.type == device.type else HostPointer(tensor)
