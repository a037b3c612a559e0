"""paged_attention, BlockTableKV and KVCache.

- Reference: for random q/k/v, block sizes 1/4/16/32, sequence lengths 1..70 (queries any suffix
  [start, end) of it), H=4 query heads over Hkv in {1, 2, 4}, head_dim 16/32, and a block table that is
  a random choice and order of pool blocks (the other pool blocks hold random garbage),
  `BlockTableKV.write` then `attend` is allclose (float32, rtol 1e-4, atol 1e-5) to float64 causal
  softmax attention with each KV head repeated for its query group; also with a sliding window.
- Exactness across contexts: a position's output is torch.equal whether positions [0, n) are computed
  in one prefill call, in two chunks [0, a) + [a, n) (any a), in any split into consecutive chunks, or
  one token at a time (decode), each written through its own random block table, float32 and bfloat16,
  for GQA (Hkv < H) and Hkv == H at every block size (query tiles run one at a time, so every matmul has
  one fixed shape: a batched Q.K^T over a varying tile count was once not exact with Hkv == H).
- Sliding window: a row whose window no longer reaches block 0 (or any whole early block) is finite.
- Garbage: pool blocks outside the table, table blocks past the sequence end, and the masked slots past
  the end of the last block may hold large finite garbage (1e4) without changing the result by a bit;
  NaN is harmless anywhere outside the sequence: outside the table, in table blocks past the end, and
  in the masked K and V slots of the last block (values past the end are zeroed before P.V, since
  0 * NaN would poison every row).
- KVCache: resize drops the old tensors before allocating the new ones and reallocates zeroed tensors of
  the new block count; block_bytes == 2 * L * Hkv * bs * hd * element_size == bytes per block.
"""

from __future__ import annotations

import weakref
from itertools import pairwise

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.engine.kv_cache import BlockTableKV, KVCache

H = 4
LAYERS = 2
LAYER = 1  # write and read layer 1 of 2, so a layer mix-up shows
SETTINGS = settings(max_examples=50, deadline=None)
DTYPES = [torch.float32, torch.bfloat16]


def randn(shape, seed, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def reference(q, k, v, start, window=None, sinks=None):
    """float64 softmax attention. q [n, H, hd] at positions start.., k/v [end, Hkv, hd] positions 0..; sinks
    [H]: a per-head logit joined to each softmax and dropped after it (transformers' GPT-OSS)."""
    n, h, hd = q.shape
    end = start + n
    group = h // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)  # query head i uses kv head i // group
    v = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * hd**-0.5
    qpos = torch.arange(start, end)[:, None]
    kpos = torch.arange(end)[None, :]
    allowed = kpos <= qpos
    if window is not None:
        allowed &= kpos > qpos - window
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.double()[:, None, None].expand(h, n, 1)
        return torch.einsum("hqk,khd->qhd", torch.cat([s, sink], -1).softmax(-1)[..., :-1], v)
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


def make_cache(hkv, hd, bs, num_blocks, dtype, seed, fill="randn"):
    cache = KVCache(LAYERS, hkv, hd, bs, num_blocks, dtype, "cpu")
    if fill == "randn":  # garbage in every block: only what the sequence wrote may matter
        for layer in range(LAYERS):
            cache.k[layer].copy_(randn(cache.k[layer].shape, seed + 1 + 2 * layer, dtype))
            cache.v[layer].copy_(randn(cache.v[layer].shape, seed + 2 + 2 * layer, dtype))
    else:
        for t in (*cache.k, *cache.v):
            t.fill_(fill)
    return cache


def random_table(num_blocks, need, seed):
    return torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))[:need].tolist()


@st.composite
def attention_case(draw, max_len=70):
    bs = draw(st.sampled_from([1, 4, 16, 32]))
    end = draw(st.integers(1, max_len))
    start = draw(st.integers(0, end - 1))
    hkv = draw(st.sampled_from([1, 2, 4]))
    hd = draw(st.sampled_from([16, 32]))
    spare = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**20))
    return bs, start, end, hkv, hd, spare, seed


def run_paged(bs, start, end, hkv, hd, spare, seed, window=None, fill="randn", tail_fill=None, sinks=None):
    """Write k/v of positions [0, end) into a random table of the pool, attend q of [start, end)."""
    need = -(-end // bs)
    cache = make_cache(hkv, hd, bs, need + spare, torch.float32, seed, fill)
    table = random_table(need + spare, need, seed)
    q, k, v = randn((end - start, H, hd), seed), randn((end, hkv, hd), seed + 3), randn((end, hkv, hd), seed + 4)
    kv = BlockTableKV(cache, table)
    kv.write(LAYER, k, v, 0)
    if tail_fill is not None and end % bs:  # the masked slots past the end of the last block
        cache.k[LAYER][table[-1], :, end % bs :] = tail_fill
        cache.v[LAYER][table[-1], :, end % bs :] = tail_fill
    return kv.attend(LAYER, q, start, window, sinks), reference(q, k, v, start, window, sinks)


# -- (a) the reference -------------------------------------------------------------------------------


@SETTINGS
@given(attention_case())
def test_paged_attention_matches_reference(case):
    out, ref = run_paged(*case)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    torch.testing.assert_close(out, ref.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bs", [1, 4, 16, 32])
@pytest.mark.parametrize("hkv", [1, 2, 4])
def test_paged_attention_matches_reference_grid(bs, hkv):
    """Every block size x GQA ratio at a length that crosses tiles and blocks, one table permutation."""
    out, ref = run_paged(bs, 0, 70, hkv, 16, 2, seed=bs * 10 + hkv)
    torch.testing.assert_close(out, ref.float(), rtol=1e-4, atol=1e-5)


def test_write_places_position_p_at_table_p_div_bs_offset_p_mod_bs():
    bs, hkv, hd = 4, 2, 16
    cache = KVCache(LAYERS, hkv, hd, bs, 5, torch.float32, "cpu")
    table = [3, 0, 4]
    k, v = randn((10, hkv, hd), 0), randn((10, hkv, hd), 1)
    BlockTableKV(cache, table).write(LAYER, k[:7], v[:7], 0)
    BlockTableKV(cache, table).write(LAYER, k[7:], v[7:], 7)
    for p in range(10):
        assert torch.equal(cache.k[LAYER][table[p // bs], :, p % bs], k[p])
        assert torch.equal(cache.v[LAYER][table[p // bs], :, p % bs], v[p])
    assert not cache.k[0].any() and not cache.v[0].any()  # the other layer is untouched
    assert not cache.k[LAYER][1].any() and not cache.k[LAYER][4, :, 2:].any()


# -- (b) exactness across contexts -----------------------------------------------------------------


def chunked(q, k, v, bounds, cache_args, seed):
    """Write and attend positions chunk by chunk (bounds = cut points incl. 0 and n) in a fresh table."""
    hkv, hd, bs, dtype = cache_args
    n = q.shape[0]
    need = -(-n // bs)
    cache = make_cache(hkv, hd, bs, need + 2, dtype, seed)
    kv = BlockTableKV(cache, random_table(need + 2, need, seed))
    outs = []
    for a, b in pairwise(bounds):
        kv.write(LAYER, k[a:b], v[a:b], a)
        outs.append(kv.attend(LAYER, q[a:b], a, None))
    return torch.cat(outs)


@st.composite
def exactness_case(draw, hkvs=(1, 2), sizes=(1, 4, 16, 32)):
    bs = draw(st.sampled_from(sizes))
    n = draw(st.integers(2, 40 if bs == 1 else 70))
    a = draw(st.integers(1, n - 1))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=6)))
    hd = draw(st.sampled_from([16, 32]))
    dtype = draw(st.sampled_from(DTYPES))
    return bs, n, a, cuts, draw(st.sampled_from(hkvs)), hd, dtype, draw(st.integers(0, 2**20))


def check_exact(case):
    bs, n, a, cuts, hkv, hd, dtype, seed = case
    q, k, v = randn((n, H, hd), seed, dtype), randn((n, hkv, hd), seed + 1, dtype), randn((n, hkv, hd), seed + 2, dtype)
    args = (hkv, hd, bs, dtype)
    whole = chunked(q, k, v, [0, n], args, seed + 10)
    assert whole.dtype == dtype and torch.isfinite(whole).all()
    two = chunked(q, k, v, [0, a, n], args, seed + 11)
    assert torch.equal(two, whole), f"split at {a}: max diff {(two.float() - whole.float()).abs().max()}"
    many = chunked(q, k, v, [0, *cuts, n], args, seed + 12)
    assert torch.equal(many, whole), f"split at {cuts}"
    decode = chunked(q, k, v, list(range(n + 1)), args, seed + 13)
    assert torch.equal(decode, whole), "one token at a time"


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(exactness_case())
def test_output_is_identical_for_prefill_chunks_and_decode(case):
    """GQA (H=4 over Hkv 1 or 2), every block size, float32 and bfloat16."""
    check_exact(case)


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(exactness_case(hkvs=(H,), sizes=(1, 2, 4, 8, 16, 32)))
def test_output_is_identical_for_prefill_chunks_and_decode_without_gqa(case):
    """Hkv == H (one query head per KV head, as OLMoE / Qwen2-MoE), every block size."""
    check_exact(case)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_rows_equal_prefill_rows_at_every_tile_offset(dtype):
    """All 16 offsets within a query tile and both sides of block edges, bs 16, GQA 2."""
    n, hkv, hd, bs = 50, 2, 32, 16
    q, k, v = randn((n, H, hd), 7, dtype), randn((n, hkv, hd), 8, dtype), randn((n, hkv, hd), 9, dtype)
    whole = chunked(q, k, v, [0, n], (hkv, hd, bs, dtype), 1)
    for a in (1, 15, 16, 17, 31, 32, 33, 49):
        assert torch.equal(chunked(q, k, v, [0, a, n], (hkv, hd, bs, dtype), 2 + a), whole), a
    assert torch.equal(chunked(q, k, v, list(range(n + 1)), (hkv, hd, bs, dtype), 3), whole)


# -- (c) sliding window ----------------------------------------------------------------------------


@SETTINGS
@given(attention_case(), st.integers(1, 72))
def test_sliding_window_matches_reference(case, window):
    out, ref = run_paged(*case, window=window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bs,window", [(4, 3), (4, 4), (1, 1), (16, 5), (32, 16)])
def test_window_past_block_zero_gives_finite_rows(bs, window):
    end = 70
    out, ref = run_paged(bs, 0, end, 2, 16, 1, seed=bs + window, window=window)
    late = torch.arange(end) - window + 1 >= bs  # rows whose window starts after block 0
    assert late.any()
    assert torch.isfinite(out).all(), "a row with no key in the early blocks became NaN"
    torch.testing.assert_close(out, ref.float(), rtol=1e-4, atol=1e-5)
    # and it is a real window: differs from full causal attention on those rows
    full, _ = run_paged(bs, 0, end, 2, 16, 1, seed=bs + window)
    assert not torch.allclose(out[late], full[late])


# -- (d) garbage in unused and masked slots -----------------------------------------------------------


@SETTINGS
@given(attention_case(), st.sampled_from([None, 5]))
def test_garbage_outside_the_sequence_does_not_change_results(case, window):
    """NaN in every block outside the table, large finite garbage in the masked tail of the last
    block: the result is bit-identical to a zero-filled pool and finite."""
    clean, ref = run_paged(*case, window=window, fill=0.0)
    dirty, _ = run_paged(*case, window=window, fill=float("nan"), tail_fill=1e4)
    assert torch.isfinite(dirty).all()
    assert torch.equal(dirty, clean)
    torch.testing.assert_close(clean, ref.float(), rtol=1e-4, atol=1e-5)


def test_nan_in_blocks_after_the_end_and_in_masked_slots_is_harmless():
    bs, end, hkv, hd = 4, 10, 2, 16
    cache = make_cache(hkv, hd, bs, 6, torch.float32, 0, fill=float("nan"))
    table = [5, 1, 3, 0]  # a 4th block past the end (preallocated) stays NaN
    q, k, v = randn((end, H, hd), 1), randn((end, hkv, hd), 2), randn((end, hkv, hd), 3)
    kv = BlockTableKV(cache, table)
    kv.write(LAYER, k, v, 0)
    out = kv.attend(LAYER, q, 0, None)  # K and V tails of the last block are NaN
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference(q, k, v, 0).float(), rtol=1e-4, atol=1e-5)


# -- (e) KVCache ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,size", [(torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2), (torch.float64, 8)])
def test_block_bytes_formula(dtype, size):
    L, hkv, bs, hd = 3, 2, 16, 32
    assert KVCache.block_bytes(L, hkv, hd, bs, dtype) == 2 * L * hkv * bs * hd * size
    cache = KVCache(L, hkv, hd, bs, 5, dtype, "cpu")
    per_block = sum(t.numel() * t.element_size() for t in (*cache.k, *cache.v)) // 5
    assert per_block == KVCache.block_bytes(L, hkv, hd, bs, dtype)
    assert KVCache.block_bytes(1, 1, 1, 1, dtype) == 2 * size


def old_tensors_alive_at_each_allocation(monkeypatch, refs, action) -> list[int]:
    """Run `action`; for each torch.zeros call it makes, how many of the weakly referenced tensors were alive."""
    alive, real_zeros = [], torch.zeros

    def spy_zeros(*args, **kwargs):
        alive.append(sum(ref() is not None for ref in refs))
        return real_zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", spy_zeros)
    action()
    monkeypatch.setattr(torch, "zeros", real_zeros)
    return alive


def test_resize_frees_then_reallocates_with_the_new_block_count(monkeypatch):
    L, hkv, hd, bs = 2, 2, 16, 4
    cache = KVCache(L, hkv, hd, bs, 3, torch.float32, "cpu")
    assert len(cache.k) == len(cache.v) == L and cache.num_blocks == 3
    assert all(t.shape == (3, hkv, bs, hd) for t in (*cache.k, *cache.v))
    for t in (*cache.k, *cache.v):
        t.fill_(1.0)
    del t
    olds = [weakref.ref(t) for t in (*cache.k, *cache.v)]
    alive_at_alloc = old_tensors_alive_at_each_allocation(monkeypatch, olds, lambda: cache.resize(7))
    assert alive_at_alloc and not any(alive_at_alloc), "old tensors alive at allocation"
    assert all(ref() is None for ref in olds)
    new = (*cache.k, *cache.v)
    assert all(t.shape == (7, hkv, bs, hd) and t.dtype == torch.float32 and t.device.type == "cpu" for t in new)
    assert cache.num_blocks == 7 and not any(t.any() for t in new)
    assert len({t.data_ptr() for t in new}) == 2 * L
    cache.resize(2)
    assert cache.k[0].shape == (2, hkv, bs, hd) and cache.num_blocks == 2
    # the cache still works after a resize
    kv = BlockTableKV(cache, [1, 0])
    q, k, v = randn((6, H, hd), 0), randn((6, hkv, hd), 1), randn((6, hkv, hd), 2)
    kv.write(0, k, v, 0)
    torch.testing.assert_close(kv.attend(0, q, 0, None), reference(q, k, v, 0).float(), rtol=1e-4, atol=1e-5)


def test_triton_kv_write_puts_the_bytes_where_index_put_does():
    pytest.importorskip("triton")
    from wisp.engine.triton_attention import write_kv  # compiled on the GPU, interpreted on the CPU

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(2, 6, 2, 16, 32, generator=g).to(dev)  # [K/V, NB, Hkv, bs, hd]
    want = cache.clone()
    k, v = torch.randn(2, 3, 2, 32, generator=g).to(dev)
    blocks, offs = torch.tensor([4, 0, 2], device=dev), torch.tensor([15, 3, 0], device=dev)
    write_kv(k, v, cache[0], cache[1], blocks, offs)
    want[0][blocks, :, offs], want[1][blocks, :, offs] = k, v
    assert torch.equal(cache, want)


@pytest.mark.parametrize("old_blocks,new_blocks", [(8, 5), (5, 9), (6, 6)])
def test_resize_keeping_carries_kept_and_moved_blocks_one_tensor_at_a_time(monkeypatch, old_blocks, new_blocks):
    """Blocks 0..keep-1 keep their bytes, each moved block lands at its new id, the rest is zero; and each
    new tensor is allocated while at most one old tensor of the same kind is still alive beside it."""
    L, hkv, hd, bs = 3, 2, 16, 4
    cache = KVCache(L, hkv, hd, bs, old_blocks, torch.float32, "cpu")
    for i, t in enumerate((*cache.k, *cache.v)):
        t.copy_(randn(t.shape, 100 + i))
    del t
    before = [t.clone() for t in (*cache.k, *cache.v)]
    keep = 4
    moves = {old_blocks - 1: 1, old_blocks - 2: 3} if old_blocks > keep + 1 else {}
    old_refs = [weakref.ref(t) for t in (*cache.k, *cache.v)]
    alive_at_alloc = old_tensors_alive_at_each_allocation(monkeypatch, old_refs,
                                                           lambda: cache.resize_keeping(new_blocks, moves, keep))
    assert alive_at_alloc == [2 * L - i for i in range(2 * L)], "old tensors must be freed one by one"
    assert cache.num_blocks == new_blocks
    for old, new in zip(before, (*cache.k, *cache.v)):
        assert new.shape == (new_blocks, hkv, bs, hd)
        expect = torch.zeros_like(new)
        expect[:keep] = old[:keep]
        for src, dst in moves.items():
            expect[dst] = old[src]
        assert torch.equal(new, expect)


def test_resize_keeping_falls_back_to_host_for_a_tensor_the_device_cannot_hold_twice(monkeypatch):
    """A device out of memory for the transient: that tensor goes through host memory, with the same bytes."""
    L, hkv, hd, bs = 2, 2, 16, 4
    cache = KVCache(L, hkv, hd, bs, 8, torch.float32, "cpu")
    for i, t in enumerate((*cache.k, *cache.v)):
        t.copy_(randn(t.shape, 200 + i))
    del t
    before = [t.clone() for t in (*cache.k, *cache.v)]
    moves, keep = {7: 1}, 3
    real_zeros, calls = torch.zeros, []

    def full_device(*args, **kwargs):  # the first allocation of each tensor fails, the retry succeeds
        calls.append(1)
        if len(calls) % 2:
            raise torch.OutOfMemoryError("no room for the transient")
        return real_zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", full_device)
    cache.resize_keeping(5, moves, keep)
    monkeypatch.setattr(torch, "zeros", real_zeros)
    assert len(calls) == 4 * L  # every tensor took the host path
    for old, new in zip(before, (*cache.k, *cache.v)):
        expect = torch.zeros((5, hkv, bs, hd))
        expect[:keep] = old[:keep]
        expect[1] = old[7]
        assert torch.equal(new, expect)


@pytest.mark.parametrize("bs, start, end, hkv, window", [(4, 0, 23, 2, None), (16, 5, 40, 1, 6), (1, 0, 9, 4, 3)])
def test_attention_sinks_join_every_softmax_as_a_valueless_key(bs, start, end, hkv, window):
    sinks = torch.tensor([2.0, -1.0, 0.5, 30.0])  # one sink above every score: rows nearly all sink, still exact
    out, ref = run_paged(bs, start, end, hkv, 16, 1, 7, window, sinks=sinks)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    plain, _ = run_paged(bs, start, end, hkv, 16, 1, 7, window)
    assert not torch.allclose(out, plain, atol=1e-3)  # the sinks took their share
