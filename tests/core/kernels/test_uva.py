"""HostPointer / device_view: only pinned host memory may be handed to a kernel as a device pointer."""

from __future__ import annotations

import pytest
import torch

from wisp.core.kernels.uva import HostPointer, device_view


def test_pageable_memory_is_refused():
    with pytest.raises(ValueError, match="pinned"):
        device_view(torch.zeros(4), torch.device("cuda"))


def test_a_tensor_on_the_kernels_kind_of_device_passes_through():
    t = torch.zeros(4)
    assert device_view(t, torch.device("cpu")) is t  # Triton's interpreter reads CPU tensors as they are


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pinned_memory_is_wrapped_and_device_tensors_pass_through():
    host = torch.arange(6, dtype=torch.float32).pin_memory()
    dev = host.cuda()
    view = device_view(host, dev.device)
    assert isinstance(view, HostPointer) and view.data_ptr() == host.data_ptr() and view.dtype == torch.float32
    assert device_view(dev, dev.device) is dev
