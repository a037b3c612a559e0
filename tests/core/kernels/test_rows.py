"""Row invariance of `wisp.core.kernels.rows`: a row's result never depends on the rows computed with it.

For random x of T rows (1..70) and any split of its rows into consecutive chunks,
`op(x) == cat([op(chunk) for chunk])` with torch.equal, for `linear` (with and without bias) and
`rms_norm` (2-D and 3-D inputs), in float32 and bfloat16. Also: `linear` is close to F.linear, and
`map_row_tiles` only ever hands `fn` tiles of exactly ROW_TILE rows.

Regression: on this CPU backend (MKL sgemm, AVX2) a float32 F.linear on a fixed [16, K] tile gives a
row a result that depends on its position within the tile when K is not a multiple of 4 (K > 4) and
out_features is 2..11; `tile_linear` pads K, and `test_linear_row_invariance_float32_odd_inner_dim`
pins the shapes that showed it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.core.kernels import rows
from wisp.core.kernels.rows import ROW_TILE, map_row_tiles

SETTINGS = settings(max_examples=60, deadline=None)
DTYPES = [torch.float32, torch.bfloat16]


@st.composite
def chunked_rows(draw, max_rows=70):
    """(T, sizes): T rows and the sizes of a cut of them into consecutive non-empty chunks."""
    t = draw(st.integers(1, max_rows))
    cuts = sorted(draw(st.sets(st.integers(1, t - 1), max_size=8))) if t > 1 else []
    bounds = [0, *cuts, t]
    return t, [b - a for a, b in zip(bounds, bounds[1:])]


def randn(shape, dtype, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


ANY_SHAPE = st.tuples(st.integers(1, 80), st.integers(1, 48))


@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(data=st.data(), case=chunked_rows(), use_bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_linear_is_row_invariant(dtype, data, case, use_bias, seed):
    t, sizes = case
    d_in, d_out = data.draw(ANY_SHAPE, label="d_in, d_out")
    x = randn((t, d_in), dtype, seed)
    w = randn((d_out, d_in), dtype, seed + 1)
    b = randn((d_out,), dtype, seed + 2) if use_bias else None
    whole = rows.linear(x, w, b)
    assert whole.shape == (t, d_out) and whole.dtype == dtype
    parts = torch.cat([rows.linear(chunk, w, b) for chunk in torch.split(x, sizes)])
    assert torch.equal(whole, parts)
    # each row alone, too (the extreme split)
    if t <= 20:
        singles = torch.cat([rows.linear(x[i : i + 1], w, b) for i in range(t)])
        assert torch.equal(whole, singles)


@pytest.mark.parametrize("d_in, d_out", [(5, 4), (6, 8), (13, 11)])
def test_linear_row_invariance_float32_odd_inner_dim(d_in, d_out):
    x = randn((2, d_in), torch.float32, 0)
    w = randn((d_out, d_in), torch.float32, 1)
    whole = rows.linear(x, w)
    singles = torch.cat([rows.linear(x[i : i + 1], w) for i in range(2)])
    assert torch.equal(whole, singles)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ndim", [2, 3])
@SETTINGS
@given(case=chunked_rows(), d=st.integers(1, 96), seq=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_rms_norm_is_row_invariant(dtype, ndim, case, d, seq, seed):
    t, sizes = case
    shape = (t, d) if ndim == 2 else (t, seq, d)
    x = randn(shape, dtype, seed) * 3.0
    w = randn((d,), dtype, seed + 1)
    whole = rows.rms_norm(x, w, 1e-6)
    assert whole.shape == shape and whole.dtype == dtype
    parts = torch.cat([rows.rms_norm(chunk, w, 1e-6) for chunk in torch.split(x, sizes)])
    assert torch.equal(whole, parts)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ndim", [2, 3])
def test_rms_norm_matches_formula(dtype, ndim):
    shape = (37, 24) if ndim == 2 else (37, 3, 24)
    x = randn(shape, dtype, 7) * 2.0
    w = randn((24,), dtype, 8)
    xf = x.double()
    ref = w.double() * (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(rows.rms_norm(x, w, 1e-5).double(), ref, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_casts_before_weight(dtype):
    """The HF order: normalise in float32, cast to x's dtype, then multiply by weight (exactly)."""
    x = randn((21, 40), dtype, 3) * 4.0
    w = randn((40,), dtype, 4)
    h = x.float()
    expected = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    assert torch.equal(rows.rms_norm(x, w, 1e-6), expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 15, 16, 17, 33, 70])
@pytest.mark.parametrize("use_bias", [False, True])
def test_linear_close_to_f_linear(dtype, t, use_bias):
    x = randn((t, 40), dtype, t)
    w = randn((24, 40), dtype, t + 1)
    b = randn((24,), dtype, t + 2) if use_bias else None
    out = rows.linear(x, w, b)
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert out.shape == (t, 24) and out.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-1)
    assert torch.allclose(out.double(), ref, **tol)
    assert torch.allclose(out, F.linear(x, w, b), **tol)


@pytest.mark.parametrize("t", [1, 5, 16, 17, 32, 45])
def test_map_row_tiles_hands_fixed_tiles(t):
    seen = []

    def fn(tile):
        seen.append(tuple(tile.shape))
        return tile * 2

    x = torch.arange(t * 3, dtype=torch.float32).reshape(t, 3) + 1
    out = map_row_tiles(x, fn)
    assert torch.equal(out, x * 2)
    n_tiles = -(-t // ROW_TILE)
    assert seen == [(ROW_TILE, 3)] * n_tiles


# -- elementwise ops: the SIMD-tail effect (module docstring, third effect) -------------------------
# Each op the models apply elementwise, as they call it. On this project's CPUs a plain F.silu or
# torch.sigmoid / cos / rsqrt of a [1, W] row and of the same row inside [T, W] differ for W = 24, 40,
# 100 (AVX2) and 48 (AVX-512): the row lands in the vector body or the scalar tail by T.
POINTWISE_OPS = {
    "silu_mul": lambda a, b: rows.silu_mul(a, b),
    "sigmoid": lambda a, b: rows.pointwise(torch.sigmoid, a),
    "cos": lambda a, b: rows.pointwise(torch.cos, a),
    "sin": lambda a, b: rows.pointwise(torch.sin, a),
    "rsqrt": lambda a, b: rows.pointwise(torch.rsqrt, a.abs() + 1e-3),
    "softmax": lambda a, b: torch.softmax(a, dim=-1, dtype=torch.float32),  # the router: a per-row kernel
}


@pytest.mark.parametrize("op", sorted(POINTWISE_OPS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 24, 40, 48, 100])
@settings(max_examples=12, deadline=None)
@given(t=st.integers(1, 20), seed=st.integers(0, 2**31 - 1))
def test_elementwise_ops_are_row_invariant(op, dtype, width, t, seed):
    fn = POINTWISE_OPS[op]
    a, b = randn((t, width), dtype, seed) * 4.0, randn((t, width), dtype, seed + 1)
    whole = fn(a, b)
    assert whole.shape == (t, width)
    singles = torch.cat([fn(a[i : i + 1], b[i : i + 1]) for i in range(t)])
    assert torch.equal(whole, singles)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 2048, 2049, 5000])
def test_pointwise_equals_the_op_up_to_its_tail(dtype, n):
    """pointwise(fn, x) is fn(x) (close; bitwise where fn's own call has no tail), in x's shape."""
    x = randn((n,), dtype, n) * 3.0
    got = rows.pointwise(torch.sigmoid, x)
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got, torch.sigmoid(x))
    if n % 64 == 0 and 0 < n <= 2048:
        assert torch.equal(got, torch.sigmoid(x))
    y = randn((3, 5, 7), dtype, 1)
    assert torch.equal(rows.pointwise(torch.mul, y, y), y * y)
