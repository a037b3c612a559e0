"""Triton paged attention (GPU machine only): close to the torch path, and exact within itself across
whole prefills, chunked prefills and token-by-token decode, with GQA and MHA."""

from __future__ import annotations

import random

import pytest
import torch

from wisp.engine.kv_cache import BlockTableKV, KVCache, paged_attention

if not torch.cuda.is_available():
    pytest.skip("the Triton attention kernel needs a CUDA device (run on the GPU machine)", allow_module_level=True)
pytest.importorskip("wisp.engine.triton_attention")
CUDA = torch.device("cuda")


def run(q, k, v, cuts, hkv, hd, dtype, seed, attention="triton", bs=16):
    """Write k/v and attend q in the chunks given by `cuts`, through a random block table."""
    n = q.shape[0]
    cache = KVCache(1, hkv, hd, bs, 2 * (-(-n // bs)) + 3, dtype, CUDA, attention=attention)
    cache.k.fill_(float("nan"))  # stale garbage everywhere outside what is written
    cache.v.fill_(float("nan"))
    table = random.Random(seed).sample(range(cache.num_blocks), -(-n // bs))
    kv = BlockTableKV(cache, table)
    outs = []
    for a, b in zip(cuts, cuts[1:]):
        kv.write(0, k[a:b], v[a:b], a)
        outs.append(kv.attend(0, q[a:b], a, None))
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hkv", [1, 2, 4])
@pytest.mark.parametrize("hd", [16, 64, 128])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 70])
def test_close_to_torch_and_exact_across_chunking(dtype, hkv, hd, n):
    g = torch.Generator().manual_seed(n * 1000 + hd + hkv)
    q = torch.randn(n, 4, hd, generator=g).to(dtype).to(CUDA)
    k = torch.randn(n, hkv, hd, generator=g).to(dtype).to(CUDA)
    v = torch.randn(n, hkv, hd, generator=g).to(dtype).to(CUDA)
    whole = run(q, k, v, [0, n], hkv, hd, dtype, 1)
    assert torch.isfinite(whole).all()
    ref = run(q, k, v, [0, n], hkv, hd, dtype, 1, attention="torch")
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(whole.float(), ref.float(), **tol)
    if n > 1:
        a = n // 3 + 1
        assert torch.equal(run(q, k, v, [0, a, n], hkv, hd, dtype, 2), whole)
        assert torch.equal(run(q, k, v, list(range(n + 1)), hkv, hd, dtype, 3), whole)


def test_the_engine_uses_it_when_asked():
    cache = KVCache(1, 2, 32, 16, 4, torch.bfloat16, CUDA, attention="triton")
    assert cache.attend_fn is not paged_attention
