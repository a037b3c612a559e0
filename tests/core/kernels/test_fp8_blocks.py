"""FP8 block-scaled weights: dequantization is exact per element and slicing-invariant; quantization's
error stays within e4m3's rounding of each block's range; bad shapes and dtypes are refused clearly."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from wisp.core.kernels.fp8_blocks import FP8, dequantize_blocks, quantize_blocks, scale_shape


def test_a_known_value_and_the_scale_shape():
    weight = torch.full((3, 5), 1.5).to(FP8)
    scale = torch.tensor([[2.0, 4.0], [8.0, 0.5]])
    out = dequantize_blocks(weight, scale, torch.float32, block=(2, 4))
    assert out[0, 0] == 3.0 and out[1, 4] == 6.0 and out[2, 0] == 12.0 and out[2, 4] == 0.75
    assert scale_shape((7, 300, 129)) == (7, 3, 2)


@settings(max_examples=60, deadline=None)
@given(experts=st.integers(1, 3), out=st.integers(1, 20), inp=st.integers(1, 20), bo=st.sampled_from([1, 4, 8]),
       bi=st.sampled_from([1, 4, 8]), log_range=st.floats(-8, 8), seed=st.integers(0, 2**16))
def test_quantization_error_is_e4m3_rounding_of_each_block(experts, out, inp, bo, bi, log_range, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn((experts, out, inp), generator=g) * 2.0**log_range
    weight, scale = quantize_blocks(w, (bo, bi))
    assert weight.dtype == FP8 and scale.shape == scale_shape(tuple(w.shape), (bo, bi))
    back = dequantize_blocks(weight, scale, torch.float32, (bo, bi))
    per_elem_scale = scale.repeat_interleave(bo, -2)[..., :out, :].repeat_interleave(bi, -1)[..., :inp]
    bound = torch.maximum(w.abs() * 2.0**-4, per_elem_scale * 2.0**-9) * 1.0001  # half an ulp, normal or subnormal
    assert ((back - w).abs() <= bound).all()
    for e in range(experts):  # an expert's slice (a slot, a host master) dequantizes to the same bits
        assert torch.equal(dequantize_blocks(weight[e], scale[e], torch.bfloat16, (bo, bi)),
                           dequantize_blocks(weight, scale, torch.bfloat16, (bo, bi))[e])


def test_bad_inputs_are_refused_with_the_expected_shape():
    weight = torch.zeros((256, 130)).to(FP8)
    with pytest.raises(ValueError, match=r"needs \(2, 2\)"):
        dequantize_blocks(weight, torch.ones((2, 1)))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        dequantize_blocks(torch.zeros((4, 4)), torch.ones((1, 1)))
