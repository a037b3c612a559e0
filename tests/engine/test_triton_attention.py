"""Triton paged attention: close to the torch path, and exact within itself across whole prefills, chunked
prefills, token-by-token prefill and the batched decode launch (split across spans), with GQA and MHA,
sliding windows, and keys crossing span boundaries. Compiled on the GPU; on the CPU Triton's interpreter
runs the same kernels on fewer shapes (it checks the logic; the GPU run checks the compiled bits)."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")
from wisp.engine.kv_cache import paged_attention  # noqa: E402
from wisp.engine.triton_attention import (  # noqa: E402
    decode_attention,
    decode_meta,
    span_keys,
    span_programs,
    triton_paged_attention,
)

GPU = torch.cuda.is_available()
DEV = torch.device("cuda" if GPU else "cpu")
if not GPU:  # loop bounds read from memory: Triton's interpreter before 3.9 passes numpy >= 2.4 a 1-element array
    import numpy
    import triton

    def _version(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split(".")[:2])

    if _version(numpy.__version__) >= (2, 4) and _version(triton.__version__) < (3, 9):
        pytest.skip("the interpreted attention kernel needs triton >= 3.9 with numpy >= 2.4 "
                    "(pip install 'triton>=3.9')", allow_module_level=True)


def cache_with(k, v, bs, seed):
    """A one-layer cache [NB, Hkv, bs, hd] holding k/v [n, Hkv, hd] in a random block table, NaN elsewhere
    (stale garbage, also past the sequence's end in its last block)."""
    n, hkv, hd = k.shape
    used = -(-n // bs)
    kc = torch.full((2 * used + 3, hkv, bs, hd), float("nan"), dtype=k.dtype, device=k.device)
    vc = torch.full_like(kc, float("nan"))
    table = random.Random(seed).sample(range(kc.shape[0]), used)
    pos = torch.arange(n, device=k.device)
    blocks = torch.tensor(table, device=k.device)[pos // bs]
    kc[blocks, :, pos % bs], vc[blocks, :, pos % bs] = k, v
    return kc, vc, table


def qkv(n, h, hkv, hd, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, heads, hd, generator=g).to(dtype).to(DEV) for heads in (h, hkv, hkv)]


def by_chunks(q, kc, vc, table, cuts, window=None):
    return torch.cat([triton_paged_attention(q[a:b], kc, vc, table, a, window) for a, b in zip(cuts, cuts[1:])])


SHAPES = ([(dt, hkv, hd, n) for dt in (torch.float32, torch.bfloat16) for hkv in (1, 2, 4) for hd in (16, 64, 128, 24)
           for n in (1, 15, 16, 17, 70, 150)] if GPU else  # 24: a padded head (MLA's tiny test entries)
          [(torch.float32, 2, 32, 17), (torch.bfloat16, 1, 16, 70), (torch.float32, 4, 16, 150), (torch.float32, 1, 24, 17)])


@pytest.mark.slow
@pytest.mark.parametrize("dtype,hkv,hd,n", SHAPES)
def test_close_to_torch_and_exact_across_chunking(dtype, hkv, hd, n):
    q, k, v = qkv(n, 4, hkv, hd, dtype, n * 1000 + hd + hkv)
    kc, vc, table = cache_with(k, v, 16, n)
    whole = triton_paged_attention(q, kc, vc, table, 0)
    assert torch.isfinite(whole).all()
    ref = paged_attention(q, kc, vc, table, 0)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(whole.float(), ref.float(), **tol)
    if n > 1:
        assert torch.equal(by_chunks(q, kc, vc, table, [0, n // 3 + 1, n]), whole)
    if n > 1 and (GPU or n < 32):  # one launch per token: slow in the interpreter
        assert torch.equal(by_chunks(q, kc, vc, table, list(range(n + 1))), whole)


@pytest.mark.slow
@pytest.mark.parametrize("bs, window, hd", [(16, 20, 32), (32, None, 24)] if GPU else [(32, 20, 24)])  # interpreted: 20 s a case
def test_decode_launch_has_the_prefill_bits(window, bs, hd):
    """Each sequence's token through the split decode launch (spans in parallel, then merged) == the same
    position in a whole-sequence prefill, at span boundaries, whatever the batch and the programs per row."""
    n = 700 if GPU else 140
    span = span_keys(bs)
    q, k, v = qkv(n, 8, 2, hd, torch.bfloat16, bs)
    kc, vc, table = cache_with(k, v, bs, bs)
    whole = triton_paged_attention(q, kc, vc, table, 0, window)
    ref = paged_attention(q, kc, vc, table, 0, window)
    torch.testing.assert_close(whole.float(), ref.float(), rtol=3e-2, atol=3e-2)
    picks = [0, 1, span - 1, span, span + 1, 2 * span - 1, n - 1, 77]
    pos = torch.tensor(picks, device=DEV)
    tables = torch.tensor([table + [0] * 3] * len(picks), dtype=torch.int32, device=DEV)  # wider than needed
    for programs in (None, 1, 3):
        out = decode_attention(q[pos], kc, vc, tables, decode_meta(pos), window, programs=programs)
        assert torch.equal(out, whole[pos]), programs
    alone = decode_attention(q[pos[-1:]], kc, vc, tables[:1], decode_meta(pos[-1:]), window)
    assert torch.equal(alone, whole[pos[-1:]])


@pytest.mark.slow
def test_sinks_in_prefill_and_decode_launches():
    """Attention sinks (GPT-OSS): the Triton prefill close to the torch path, its decode launch the prefill's bits."""
    n = 300 if GPU else 40
    q, k, v = qkv(n, 4, 2, 32, torch.float32, 5)
    sinks = torch.tensor([1.0, -2.0, 0.3, 4.0], device=DEV)
    kc, vc, table = cache_with(k, v, 16, 3)
    whole = triton_paged_attention(q, kc, vc, table, 0, 8, sinks)
    torch.testing.assert_close(whole, paged_attention(q, kc, vc, table, 0, 8, sinks), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(whole, triton_paged_attention(q, kc, vc, table, 0, 8), atol=1e-3)
    pos = torch.tensor([0, 17, n - 1], device=DEV)
    tables = torch.tensor([table] * 3, dtype=torch.int32, device=DEV)
    assert torch.equal(decode_attention(q[pos], kc, vc, tables, decode_meta(pos), 8, sinks=sinks), whole[pos])


def test_span_programs_fill_the_device_but_never_exceed_the_spans():
    assert span_programs(1, 1, 3, DEV) == 3
    assert span_programs(64, 64, 100, DEV) == 1
    if GPU:
        sms = torch.cuda.get_device_properties(DEV).multi_processor_count
        assert span_programs(1, 32, 1000, DEV) * 32 >= 4 * sms


@pytest.mark.skipif(not GPU, reason="the engine picks the Triton attention on CUDA only")
def test_the_engine_uses_it_when_asked():
    from wisp.engine.kv_cache import KVCache

    cache = KVCache(1, 2, 32, 16, 4, torch.bfloat16, DEV, attention="triton")
    assert cache.attend_fn is not paged_attention
