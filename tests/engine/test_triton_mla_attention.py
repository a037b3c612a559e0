"""Triton latent attention (MLA): close to the torch path (`paged_attention` over the same aliased cache, its first
value_dim columns), and exact within itself across whole prefills, chunked prefills, token-by-token prefill and
the batched decode launch (split across spans), whatever else is in the batch; entries of a latent and a rope key
that are not powers of two (48 = 32 + 16 wide on the CPU; DeepSeek-V2-Lite's 512 + 64 on the GPU), one or two
head groups. Through the tiny DeepSeek-V2 model: a decode step through the decode launch (what a CUDA graph
replays) has the bits of the same step through the prefill kernel, alone or batched. Compiled on the GPU; on the
CPU Triton's interpreter runs the same kernels on fewer shapes."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")
from wisp.engine.kv_cache import KVCache, paged_attention  # noqa: E402
from wisp.engine.triton_attention import span_keys  # noqa: E402
from wisp.engine.triton_mla_attention import latent_fits, mla_decode_attention, mla_paged_attention  # noqa: E402

GPU = torch.cuda.is_available()
DEV = torch.device("cuda" if GPU else "cpu")


def latent_cache(entries: torch.Tensor, bs: int, seed: int, spare: int = 3):
    """A one-layer keys-only cache [NB, 1, bs, W] holding entries [n, 1, W] in a random block table, NaN
    elsewhere (stale garbage, also past the sequence's end in its last block)."""
    n, _, width = entries.shape
    used = -(-n // bs)
    cache = torch.full((used + spare, 1, bs, width), float("nan"), dtype=entries.dtype, device=entries.device)
    table = random.Random(seed).sample(range(cache.shape[0]), used)
    pos = torch.arange(n, device=entries.device)
    cache[torch.tensor(table, device=entries.device)[pos // bs], :, pos % bs] = entries
    return cache, table


def query_and_entries(n: int, heads: int, width: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, h, width, generator=g).to(dtype).to(DEV) for h in (heads, 1)]


def by_chunks(q, cache, table, cuts, value_dim):
    return torch.cat([mla_paged_attention(q[a:b], cache, table, a, value_dim) for a, b in zip(cuts, cuts[1:])])


# (dtype, latent, rope, heads, n, block size): 20 heads are two head groups, the second one part empty
SHAPES = ([(dt, r, rope, h, n, bs) for dt in (torch.float32, torch.bfloat16)
           for r, rope in ((512, 64), (32, 16), (24, 8)) for h in (16, 20) for n in (1, 17, 70, 150) for bs in (16, 64)
           if dt == torch.bfloat16 or r < 512] if GPU else
          [(torch.float32, 32, 16, 4, 70, 16), (torch.float32, 24, 8, 20, 17, 16), (torch.bfloat16, 32, 16, 4, 40, 32)])


@pytest.mark.slow
@pytest.mark.parametrize("dtype,r,rope,heads,n,bs", SHAPES)
def test_close_to_torch_and_exact_across_chunking(dtype, r, rope, heads, n, bs):
    q, entries = query_and_entries(n, heads, r + rope, dtype, n * 100 + r + heads)
    cache, table = latent_cache(entries, bs, n)
    whole = mla_paged_attention(q, cache, table, 0, r)
    assert whole.shape == q.shape and torch.isfinite(whole).all()
    assert not whole[..., r:].any()  # the rope columns: zeros
    ref = paged_attention(q, cache, cache, table, 0)[..., :r]
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(whole[..., :r].float(), ref.float(), **tol)
    if n > 1:
        assert torch.equal(by_chunks(q, cache, table, [0, n // 3 + 1, n], r), whole)
    if n > 1 and (GPU or n < 32):  # one launch per token: slow in the interpreter
        assert torch.equal(by_chunks(q, cache, table, list(range(n + 1)), r), whole)


@pytest.mark.slow
@pytest.mark.parametrize("bs,r,rope,heads", [(16, 512, 64, 16), (64, 32, 16, 20)] if GPU else [(16, 32, 16, 4)])
def test_decode_launch_has_the_prefill_bits(bs, r, rope, heads):
    """Each token through the split decode launch (spans in parallel, then merged) == the same position in a
    whole-sequence prefill, at span boundaries, whatever the batch and the programs per row."""
    n = 700 if GPU else 140
    span = span_keys(bs)
    q, entries = query_and_entries(n, heads, r + rope, torch.bfloat16, bs)
    cache, table = latent_cache(entries, bs, bs)
    whole = mla_paged_attention(q, cache, table, 0, r)
    picks = [0, 1, span - 1, span, span + 1, 2 * span - 1, n - 1, 77]
    pos = torch.tensor(picks, device=DEV)
    tables = torch.tensor([table + [0] * 3] * len(picks), dtype=torch.int32, device=DEV)  # wider than needed
    for programs in (None, 1, 3):
        out = mla_decode_attention(q[pos], cache, tables, pos, r, programs=programs)
        assert torch.equal(out, whole[pos]), programs
    alone = mla_decode_attention(q[pos[-1:]], cache, tables[:1], pos[-1:], r)
    assert torch.equal(alone, whole[pos[-1:]])


def pool_of(sequences: list[torch.Tensor], bs: int, seed: int):
    """A NaN pool [NB, 1, bs, W] holding each sequence's entries [n, 1, W] from its own position 0, in its own
    random blocks; (the pool, the sequences' block tables)."""
    needs = [-(-e.shape[0] // bs) for e in sequences]
    width, dtype = sequences[0].shape[2], sequences[0].dtype
    pool = torch.full((sum(needs) + 2, 1, bs, width), float("nan"), dtype=dtype, device=DEV)
    free = random.Random(seed).sample(range(pool.shape[0]), sum(needs))
    tables = []
    for e, need in zip(sequences, needs):
        table, free = free[:need], free[need:]
        pos = torch.arange(e.shape[0], device=DEV)
        pool[torch.tensor(table, device=DEV)[pos // bs], :, pos % bs] = e
        tables.append(table)
    return pool, tables


@st.composite
def batches(draw):
    """A sequence (its length, a cut of its prefill) decoded among others of random lengths, at a random row."""
    n = draw(st.integers(2, 80))
    others = draw(st.lists(st.integers(1, 80), max_size=3))
    return n, draw(st.integers(1, n - 1)), others, draw(st.integers(0, len(others))), draw(st.integers(0, 2**16))


@pytest.mark.slow
@settings(max_examples=40 if GPU else 6, deadline=None)
@given(batches())
def test_a_sequence_does_not_depend_on_its_batch_or_its_chunks(case):
    """A sequence's last token: its prefill whole or in two chunks, its decode alone and its decode at any row of a
    batch of other sequences (their own tables in the same pool) are torch.equal."""
    n, cut, others, row, seed = case
    r, rope, heads, bs = 32, 16, 4, 16
    lengths = [n, *others]
    qs, entries = zip(*(query_and_entries(m, heads, r + rope, torch.float32, seed + i) for i, m in enumerate(lengths)))
    cache, tables = pool_of(list(entries), bs, seed)
    prefill = mla_paged_attention(qs[0], cache, tables[0], 0, r)
    assert torch.equal(by_chunks(qs[0], cache, tables[0], [0, cut, n], r), prefill)
    order = list(range(1, len(lengths)))
    order.insert(row, 0)  # sequence 0 at batch row `row`
    width = max(len(t) for t in tables)
    batch_tables = torch.tensor([tables[i] + [0] * (width - len(tables[i])) for i in order], dtype=torch.int32,
                                device=DEV)
    positions = torch.tensor([lengths[i] - 1 for i in order], device=DEV)
    batched = mla_decode_attention(torch.stack([qs[i][-1] for i in order]), cache, batch_tables, positions, r)
    alone = mla_decode_attention(qs[0][-1:], cache, batch_tables[row : row + 1], positions[row : row + 1], r)
    assert torch.equal(batched[row], prefill[-1]) and torch.equal(alone[0], prefill[-1])


def test_latent_fits_deepseek_v2_lite_in_16_bits_only():
    assert latent_fits(576, 512, torch.bfloat16) and latent_fits(48, 32, torch.float32)
    assert not latent_fits(576, 512, torch.float32)  # its float32 latent tile would not fit in shared memory
    assert not latent_fits(512, 512, torch.bfloat16) and not latent_fits(1024, 512, torch.bfloat16)


@pytest.mark.parametrize("width,value_dim,heads,triton", [(48, 32, 1, True), (24, 16, 1, True), (48, 32, 2, False)])
def test_a_latent_cache_takes_the_latent_kernels(width, value_dim, heads, triton):
    """A keys-only cache with a value_dim takes the latent kernels under attention="triton" (interpreted on the
    CPU); the torch path otherwise, and for a shape they do not take."""
    cache = KVCache(2, heads, width, 16, 3, torch.float32, DEV, attention="triton", keys_only=True, value_dim=value_dim)
    assert cache.uses_triton == triton and cache.v is cache.k
    assert (getattr(cache.attend_fn, "func", None) is not None) == triton
    assert not KVCache(2, 1, width, 16, 3, torch.float32, DEV, keys_only=True, value_dim=value_dim).uses_triton


@pytest.mark.slow
def test_a_model_decode_step_through_the_decode_launch_has_the_prefill_kernels_bits(hf_checkpoints, monkeypatch):
    """The tiny DeepSeek-V2 (a 24-wide entry), engine-built on the latent kernels: two sequences prefilled, then one
    decode step through `DecodeBatchKV` (the decode launch a CUDA graph replays; eager here) equals the same
    step through the chunked view (the prefill kernel), and a sequence's row is the same decoded alone."""
    from wisp import LLM
    from wisp.config import EngineConfig
    from wisp.engine.kv_cache import BlockTableKV, DecodeBatchKV
    from wisp.models.moe_decoder import Chunk

    if not GPU:  # the engine asks for the Triton kernels on CUDA only: here, interpreted
        real = EngineConfig.resolve_backend
        monkeypatch.setattr(EngineConfig, "resolve_backend",
                            lambda self, kind, dev: "triton" if kind == "attention" else real(self, kind, dev))
    eng = LLM(str(hf_checkpoints["deepseek_v2"]), device=DEV.type, mode="resident", attention_backend="triton"
              if GPU else "auto").engine
    model, bs = eng.model, eng.config.kv_block_size
    assert eng.kv.uses_triton and eng.kv.value_dim is not None
    prompts = [[(7 * i + 3) % 120 for i in range(20)], [5, 17, 99, 3]]
    tables = [eng.pool.allocate(-(-(len(p) + 1) // bs)) for p in prompts]
    tokens = torch.tensor([11, 42], device=DEV)
    positions = torch.tensor([len(p) for p in prompts], device=DEV)
    width = max(len(t) for t in tables)
    batch_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=DEV)
    with torch.inference_mode():
        for p, t in zip(prompts, tables):
            model.forward(torch.tensor(p, device=DEV), [Chunk(BlockTableKV(eng.kv, t), 0, len(p))])
        launched = model.logits(model.forward_batch(tokens, positions, DecodeBatchKV(eng.kv, batch_tables, positions)))
        chunked = model.logits(model.forward(tokens, [Chunk(BlockTableKV(eng.kv, t), len(p), 1)
                                                      for p, t in zip(prompts, tables)]))
        alone = model.logits(model.forward_batch(tokens[1:], positions[1:],
                                                 DecodeBatchKV(eng.kv, batch_tables[1:], positions[1:])))
    assert torch.equal(launched, chunked)
    assert torch.equal(alone[0], launched[1])
