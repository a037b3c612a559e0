"""One launch readies q, k and v from a fused projection: what `triton_rms_norm` + `triton_rope` (and a copy for v)
give on its column ranges, for each kind of q/k norm, from strided rows (their bits under the interpreter; compiled,
a reduction's order across threads may differ between the kernels, so within rounding); and batch-invariant."""

from __future__ import annotations

import pytest
import torch

from wisp.core.kernels.triton_norm import triton_rms_norm
from wisp.core.kernels.triton_qkv_heads import CacheSlots, triton_qkv_heads
from wisp.core.kernels.triton_rope import triton_rope

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def case(t, h, hkv, hd, norm, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(t, (h + 2 * hkv) * hd + 8, generator=g).to(dtype).to(DEVICE)
    qkv = wide[:, 4 : 4 + (h + 2 * hkv) * hd]  # strided rows, as a view of a wider tensor
    angles = torch.randn(t, 1, hd // 2, generator=g).repeat(1, 1, 2)
    cos, sin = angles.cos().to(dtype).to(DEVICE), angles.sin().to(dtype).to(DEVICE)
    width = {"per_head": (hd, hd), "full": (h * hd, hkv * hd)}.get(norm)
    q_norm, k_norm = (None, None) if width is None else (
        (1 + 0.1 * torch.randn(n, generator=g)).to(dtype).to(DEVICE) for n in width)
    return qkv, cos, sin, q_norm, k_norm


def unfused(qkv, h, hkv, hd, cos, sin, norm, q_norm, k_norm, eps):
    t = qkv.shape[0]
    q, k, v = qkv.split([h * hd, hkv * hd, hkv * hd], dim=1)
    if norm == "full":
        q, k = triton_rms_norm(q, q_norm, eps), triton_rms_norm(k, k_norm, eps)
    q, k, v = q.reshape(t, h, hd), k.reshape(t, hkv, hd), v.reshape(t, hkv, hd)
    if norm == "per_head":
        q, k = triton_rms_norm(q, q_norm, eps), triton_rms_norm(k, k_norm, eps)
    return triton_rope(q, cos, sin), triton_rope(k, cos, sin), v.contiguous()


@pytest.mark.parametrize("norm", ["none", "per_head", "full"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_norm_then_rope_bit_for_bit(norm, dtype):
    h, hkv, hd = 6, 2, 16  # full norm over 96 and 32 columns: not powers of two
    qkv, cos, sin, q_norm, k_norm = case(5, h, hkv, hd, norm, dtype, seed=len(norm))
    got = triton_qkv_heads(qkv, h, hkv, cos, sin, norm, q_norm, k_norm, eps=1e-6)
    want = unfused(qkv, h, hkv, hd, cos, sin, norm, q_norm, k_norm, 1e-6)
    for a, b in zip(got, want):
        assert a.is_contiguous()
        if DEVICE.type == "cpu":
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-5 if dtype == torch.float32 else 1.6e-2, atol=1e-5)


def test_a_token_gets_the_bits_it_gets_alone():
    qkv, cos, sin, q_norm, k_norm = case(7, 4, 2, 8, "full", torch.bfloat16, seed=3)
    whole = triton_qkv_heads(qkv, 4, 2, cos, sin, "full", q_norm, k_norm)
    for i in (0, 4, 6):
        alone = triton_qkv_heads(qkv[i : i + 1], 4, 2, cos[i : i + 1], sin[i : i + 1], "full", q_norm, k_norm)
        assert all(torch.equal(a[0], w[i]) for a, w in zip(alone, whole))


def test_a_head_width_that_is_no_power_of_two_is_refused():
    qkv, cos, sin, *_ = case(2, 2, 1, 12, "none", torch.float32)
    with pytest.raises(ValueError, match="power-of-two head width"):
        triton_qkv_heads(qkv, 2, 1, cos, sin)


@pytest.mark.parametrize("norm", ["none", "per_head"])
def test_the_cache_gets_the_k_and_v_it_returns(norm):
    t, h, hkv, hd, bs = 3, 4, 2, 16, 4
    qkv, cos, sin, q_norm, k_norm = case(t, h, hkv, hd, norm, torch.bfloat16, seed=5)
    k_cache, v_cache = (torch.randn(6, hkv, bs, hd).to(torch.bfloat16).to(DEVICE) for _ in range(2))
    want_k, want_v = k_cache.clone(), v_cache.clone()
    blocks, offsets = torch.tensor([5, 0, 2], device=DEVICE), torch.tensor([3, 0, 1], device=DEVICE)
    q, k, v = triton_qkv_heads(qkv, h, hkv, cos, sin, norm, q_norm, k_norm,
                               cache=CacheSlots(k_cache, v_cache, blocks, offsets))
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), triton_qkv_heads(qkv, h, hkv, cos, sin, norm, q_norm, k_norm)))
    want_k[blocks, :, offsets], want_v[blocks, :, offsets] = k, v  # every other slot untouched
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
