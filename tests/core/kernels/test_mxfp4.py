"""MXFP4 (GPT-OSS experts): dequantization equals transformers' own conversion, bit for bit; quantization's
error is e2m1 rounding within each 32-value block's scale; malformed inputs are refused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from wisp.core.kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4


@settings(max_examples=30, deadline=None)
@given(experts=st.integers(1, 3), rows=st.integers(1, 6), groups=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_dequantization_is_transformers_gpt_oss_conversion(experts, rows, groups, seed):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (experts, rows, groups, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(110, 140, (experts, rows, groups), generator=g, dtype=torch.uint8)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)  # [E, K, rows]: transposed
    assert torch.equal(dequantize_mxfp4(blocks, scales, torch.bfloat16), theirs.transpose(1, 2))


@settings(max_examples=50, deadline=None)
@given(rows=st.integers(1, 5), groups=st.integers(1, 4), log_range=st.floats(-10, 10), seed=st.integers(0, 2**16))
def test_quantization_error_is_e2m1_rounding_within_each_block(rows, groups, log_range, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, groups * 32, generator=g) * 2.0**log_range
    blocks, scales = quantize_mxfp4(w)
    back = dequantize_mxfp4(blocks, scales, torch.float32)
    scale = torch.ldexp(torch.ones(rows, groups), scales.int() - 127).repeat_interleave(32, dim=-1)
    # e2m1 codes are 0.5 apart below 2, 1 apart to 4, 2 apart to 6: half a gap, relative or absolute
    assert ((back - w).abs() <= torch.maximum(w.abs() / 4, scale / 4) * 1.0001).all()
    assert (back.abs().unflatten(-1, (groups, 32)).amax(-1) <= 6 * scale[:, ::32]).all()
    exact = dequantize_mxfp4(blocks, scales, torch.float32)  # representable values come back unchanged
    assert torch.equal(dequantize_mxfp4(*quantize_mxfp4(exact), torch.float32), exact)


def test_malformed_inputs_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.zeros(2, 40))
    with pytest.raises(ValueError, match="do not match"):
        dequantize_mxfp4(torch.zeros(2, 3, 16, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        dequantize_mxfp4(torch.zeros(2, 16), torch.zeros(2, dtype=torch.uint8))
