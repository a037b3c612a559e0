"""Q8_0 experts kept packed (`wisp.core.kernels.q8_0`): llama.cpp's blocks split into codes and scales dequantize to
the `gguf` package's floats, and malformed tensors are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wisp.core.kernels.q8_0 import dequantize_q8_0, quantize_q8_0, split_blocks

gguf = pytest.importorskip("gguf")


@pytest.mark.parametrize("rows, blocks, seed", [(1, 1, 0), (3, 4, 1), (8, 7, 2)])
def test_split_blocks_dequantize_to_the_gguf_packages_floats(rows, blocks, seed):
    x = np.random.default_rng(seed).standard_normal((rows, 32 * blocks)).astype(np.float32) * 3
    x[0, :32] = 0.0  # an all-zero block: scale 0
    q8 = gguf.GGMLQuantizationType.Q8_0
    packed = gguf.quants.quantize(x, q8)  # uint8 [rows, blocks * 34]
    codes, scales = split_blocks(torch.from_numpy(packed))
    assert codes.dtype == torch.int8 and codes.shape == (rows, 32 * blocks) and scales.shape == (rows, blocks)
    want = torch.from_numpy(gguf.quants.dequantize(packed, q8))
    assert torch.equal(dequantize_q8_0(codes, scales, torch.float32), want)
    assert torch.equal(dequantize_q8_0(codes, scales, torch.bfloat16), want.to(torch.bfloat16))
    assert codes.numel() + 2 * scales.numel() == packed.size  # the file's bytes, split by role


def test_quantize_rounds_within_half_a_step_of_each_block():
    w = torch.randn(4, 96, generator=torch.Generator().manual_seed(3))
    codes, scales = quantize_q8_0(w)
    step = scales.float().repeat_interleave(32, dim=-1)
    assert ((dequantize_q8_0(codes, scales, torch.float32) - w).abs() <= step / 2 + 1e-6).all()


def test_malformed_q8_0_is_refused():
    with pytest.raises(ValueError, match="whole 34-byte blocks"):
        split_blocks(torch.zeros(2, 33, dtype=torch.uint8))
    with pytest.raises(ValueError, match="int8 and float16"):
        dequantize_q8_0(torch.zeros(2, 32, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.float16))
    with pytest.raises(ValueError, match="do not match"):
        dequantize_q8_0(torch.zeros(2, 64, dtype=torch.int8), torch.zeros(2, 1, dtype=torch.float16))
