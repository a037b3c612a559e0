"""The row-invariant Triton GEMM against a float64 oracle, and its promise: a row's bits do not depend on
the rows it is computed with (any consecutive split of the rows gives the same output, torch.equal).
Compiled on the GPU; on the CPU Triton's interpreter runs the same kernel on small shapes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.core.kernels.fp8_blocks import Fp8BlockWeight, quantize_blocks
from wisp.core.kernels.triton_linear import Tile, tile_for, triton_linear

GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def problem(t, n, k, dtype, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, w, b


def oracle(x, w, b):
    out = x.double() @ w.double().T
    return out if b is None else out + b.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t, n, k", [(1, 48, 40), (5, 96, 256), (70, 33, 130), (130, 64, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_oracle(t, n, k, dtype, bias):
    x, w, b = problem(t, n, k, dtype, seed=t + n + k, bias=bias)
    out = triton_linear(x, w, b)
    assert out.shape == (t, n) and out.dtype == dtype
    torch.testing.assert_close(out.double(), oracle(x, w, b), **TOL[dtype])


@settings(max_examples=12 if GPU else 6, deadline=None)
@given(t=st.integers(1, 140), cuts=st.lists(st.integers(1, 139), max_size=4), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_rows_do_not_depend_on_their_batch(t, cuts, seed, dtype):
    """linear(x) == cat(linear(chunk) for consecutive chunks): the same bits whatever shares a launch."""
    x, w, b = problem(t, 40, 72, dtype, seed=seed, bias=seed % 2 == 1)
    whole = triton_linear(x, w, b)
    bounds = sorted({0, t, *(c for c in cuts if c < t)})
    parts = [triton_linear(x[lo:hi], w, b) for lo, hi in zip(bounds, bounds[1:])]
    assert torch.equal(torch.cat(parts), whole)


def test_strided_rows_equal_contiguous_and_empty_input():
    x, w, _ = problem(9, 32, 64, torch.bfloat16)
    wide = torch.zeros(9, 96, dtype=x.dtype, device=DEVICE)
    wide[:, 16:80] = x
    assert torch.equal(triton_linear(wide[:, 16:80], w), triton_linear(x, w))
    assert triton_linear(x[:0], w).shape == (0, 32)


def test_mismatched_dtypes_and_shapes_are_refused():
    x, w, b = problem(2, 32, 64, torch.bfloat16, bias=True)
    with pytest.raises(TypeError, match="bfloat16"):
        triton_linear(x.float(), w)
    with pytest.raises(ValueError, match=r"expected x \[T, 64\]"):
        triton_linear(x[:, :48], w)
    with pytest.raises(ValueError, match=r"bias \[32\]"):
        triton_linear(x, w, b[:16])


def test_strided_bias_equals_contiguous():
    x, w, _ = problem(3, 40, 64, torch.float32)
    wide = torch.randn(80, device=DEVICE)
    assert torch.equal(triton_linear(x, w, wide[::2]), triton_linear(x, w, wide[::2].contiguous()))



@settings(max_examples=8 if GPU else 4, deadline=None)
@given(t=st.integers(1, 140), cuts=st.lists(st.integers(1, 139), max_size=3), seed=st.integers(0, 2**16),
       splits=st.sampled_from([2, 3, 4]), parallel=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_split_k_rows_do_not_depend_on_their_batch_or_schedule(t, cuts, seed, splits, parallel, dtype):
    """With K summed in spans, both schedules (spans in one program, spans in parallel with the ordered fix-up)
    give the same bits, and a row's bits still do not depend on what shares its launch."""
    x, w, b = problem(t, 40, 300, dtype, seed=seed, bias=seed % 2 == 1)
    tile = Tile(64, 32, 64, 4, 2, splits)
    whole = triton_linear(x, w, b, tile=tile, parallel=not parallel)
    bounds = sorted({0, t, *(c for c in cuts if c < t)})
    parts = [triton_linear(x[lo:hi], w, b, tile=tile, parallel=parallel) for lo, hi in zip(bounds, bounds[1:])]
    assert torch.equal(torch.cat(parts), whole)
    torch.testing.assert_close(whole.double(), oracle(x, w, b), **TOL[dtype])


def test_parallel_spans_leave_their_counters_zeroed_for_the_next_launch():
    """Launch after launch on one stream, the parallel schedule keeps giving the in-one-program bits (a counter
    left non-zero would make the next launch's tile finish early or never)."""
    x, w, _ = problem(3, 96, 512, torch.bfloat16, seed=5)
    tile = Tile(64, 32, 64, 4, 2, 4)
    want = triton_linear(x, w, tile=tile, parallel=False)
    for _ in range(3):
        assert torch.equal(triton_linear(x, w, tile=tile, parallel=True), want)


def test_tile_splits_k_for_few_output_blocks_and_never_for_many():
    assert tile_for(512, 2048, torch.bfloat16).splits > 1  # a decode row's 16 output blocks: K is split
    assert tile_for(151936, 2048, torch.bfloat16).splits == 1  # an LM head fills the GPU alone
    assert tile_for(64, 2048, torch.float32).splits > 1  # a float32 router (DeepSeek): 2 output blocks
    for n, k in [(128, 2048), (2048, 4096), (512, 512), (64, 256)]:
        tile = tile_for(n, k, torch.bfloat16)
        assert -(-k // tile.block_k) >= 2 * tile.splits or tile.splits == 1  # each span keeps >= 2 K blocks


@pytest.mark.parametrize("t", [1, 9])
def test_fp8_block_weight_equals_its_dequantized_copy(t):
    """An FP8 block-scaled weight read in-kernel gives the bits its dequantized bfloat16 copy gives, with the
    same tile (each weight element dequantized as the torch path does)."""
    g = torch.Generator().manual_seed(t)
    packed = Fp8BlockWeight(*quantize_blocks(torch.randn(200, 384, generator=g)))
    packed = Fp8BlockWeight(packed.weight.to(DEVICE), packed.scale.to(DEVICE))
    x = torch.randn(t, 384, generator=g).to(torch.bfloat16).to(DEVICE)
    tile = Tile(64, 32, 64, 4, 2, 3)
    got = triton_linear(x, packed, tile=tile)
    assert torch.equal(got, triton_linear(x, packed.dequantized(torch.bfloat16), tile=tile))
    with pytest.raises(ValueError, match="block_k"):
        triton_linear(x, packed, tile=Tile(64, 32, 256, 4, 2))
