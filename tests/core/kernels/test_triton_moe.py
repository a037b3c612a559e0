"""The Triton fused-MoE kernel against the float64 oracle and the torch reference.

Parametrised over token counts, expert counts and top-k with random expert maps (vLLM's fused_moe test
pattern); bitwise slot invariance and batch invariance; -1 entries skipped; CUDA-graph replay with the
map and the scratch rewritten between replays. Compiled on the GPU; on the CPU Triton's interpreter runs
the same kernels on the smaller shapes (logic; the GPU run checks the compiled bits), and graph replay is
GPU-only.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.core.kernels.moe import fused_moe, reference_moe

triton_moe = pytest.importorskip("wisp.core.kernels.triton_moe")
GPU = torch.cuda.is_available()
CUDA = torch.device("cuda" if GPU else "cpu")  # where the kernel runs (the interpreter's CPU tensors off the GPU)
SHAPES = [(8, 2), (64, 8), (128, 8), (16, 1)] if GPU else [(8, 2), (16, 1)]  # interpreted: 1-11 s a case
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def problem(t, n, k, d=256, i=96, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = torch.randn(t, d, generator=g).to(dtype).to(CUDA)
    gu = (torch.randn(n, 2 * i, d, generator=g) * 0.1).to(dtype).to(CUDA)
    dn = (torch.randn(n, d, i, generator=g) * 0.1).to(dtype).to(CUDA)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)]).to(CUDA)
    w = torch.softmax(torch.randn(t, k, generator=g), -1).to(dtype).to(CUDA)
    return hidden, gu, dn, ids, w


def permuted(gu, dn, n, extra=3, seed=1):
    """The same experts placed in random slots of a larger scratch (unused slots NaN)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    slots = torch.randperm(n + extra, generator=g)[:n]
    sgu = torch.full((n + extra, *gu.shape[1:]), float("nan"), dtype=gu.dtype, device=CUDA)
    sdn = torch.full((n + extra, *dn.shape[1:]), float("nan"), dtype=dn.dtype, device=CUDA)
    sgu[slots.to(CUDA)] = gu
    sdn[slots.to(CUDA)] = dn
    return sgu, sdn, slots.to(torch.int32).to(CUDA)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 3, 17, 40] if GPU else [1, 3, 9])  # interpreted: a case costs about t
@pytest.mark.parametrize("n, k", SHAPES)
def test_matches_oracle_and_reference(t, n, k, dtype):
    hidden, gu, dn, ids, w = problem(t, n, k, dtype=dtype, seed=t * 100 + n)
    sgu, sdn, emap = permuted(gu, dn, n)
    out = triton_moe.triton_fused_moe(hidden, sgu, sdn, ids, w, emap)
    torch.testing.assert_close(out.double(), reference_moe(hidden, gu, dn, ids, w), **TOL[dtype])
    # the torch reference rounds gate/up and their product to the weight dtype; the kernel rounds only the
    # product, so against it the bound is a relative norm (bf16 operands: well under 1e-2)
    ref = fused_moe(hidden, gu, dn, ids, w).float()
    assert ((out.float() - ref).norm() / ref.norm()).item() < (1e-5 if dtype == torch.float32 else 1e-2)
    ident = triton_moe.triton_fused_moe(hidden, gu, dn, ids, w, torch.arange(n, dtype=torch.int32, device=CUDA))
    assert torch.equal(out, ident)  # slot placement never changes a bit
    alone = torch.cat([triton_moe.triton_fused_moe(hidden[j : j + 1], sgu, sdn, ids[j : j + 1], w[j : j + 1], emap)
                       for j in range(t)])
    assert torch.equal(out, alone)  # nor does the batch


@pytest.mark.slow
def test_minus_one_skips_the_term():
    hidden, gu, dn, ids, w = problem(5, 8, 2, dtype=torch.float32)
    emap = torch.arange(8, dtype=torch.int32, device=CUDA)
    dropped = int(ids[0, 0])
    emap[dropped] = -1
    out = triton_moe.triton_fused_moe(hidden, gu, dn, ids, w, emap)
    w0 = torch.where(ids == dropped, torch.zeros_like(w), w)
    ref = triton_moe.triton_fused_moe(hidden, gu, dn, ids, w0, torch.arange(8, dtype=torch.int32, device=CUDA))
    assert torch.equal(out, ref)


@given(slots=st.integers(1, 9), pairs=st.integers(0, 200), seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_the_sort_places_every_pair_with_a_slot_once_in_its_slots_tiles(slots, pairs, seed):
    g = torch.Generator().manual_seed(seed)
    n = slots + 2  # two experts without a slot (-1)
    emap = torch.cat([torch.randperm(slots, generator=g), torch.full((2,), -1)]).to(torch.int32)
    emap = emap[torch.randperm(n, generator=g)].to(CUDA)
    ids = torch.randint(0, n, (pairs,), generator=g).to(CUDA)
    counts, order, max_tiles = triton_moe.sorted_by_slot(ids, emap, slots)
    slot_of = emap[ids].cpu()
    assert counts.cpu().tolist() == [int((slot_of == s).sum()) for s in range(slots)]
    tiles = (counts.cpu() + triton_moe.BLOCK_M - 1) // triton_moe.BLOCK_M
    assert int(tiles.sum()) <= max_tiles  # the grid always covers the routing
    first, order = 0, order.cpu()
    for s in range(slots):  # slot s's pairs fill the front of its tiles, in any order
        placed = order[first * triton_moe.BLOCK_M:][: int(counts[s])]
        assert sorted(placed.tolist()) == torch.nonzero(slot_of == s).flatten().tolist()
        first += int(tiles[s])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # IEEE products, and tensor cores on the GPU
def test_a_slot_with_more_pairs_than_a_tile(dtype):
    t = 2 * triton_moe.BLOCK_M + 2  # every token routes to both experts: three tiles a slot
    hidden, gu, dn, ids, w = problem(t, 2, 2, d=128, i=32, dtype=dtype)
    sgu, sdn, emap = permuted(gu, dn, 2)
    out = triton_moe.triton_fused_moe(hidden, sgu, sdn, ids, w, emap)
    torch.testing.assert_close(out.double(), reference_moe(hidden, gu, dn, ids, w), **TOL[dtype])
    for j in (0, triton_moe.BLOCK_M, t - 1):  # first, second and last tile: each row's bits as alone
        assert torch.equal(out[j : j + 1], triton_moe.triton_fused_moe(hidden[j : j + 1], sgu, sdn, ids[j : j + 1],
                                                                       w[j : j + 1], emap))


@pytest.mark.skipif(not GPU, reason="CUDA graphs need the GPU machine")
def test_cuda_graph_replay_follows_the_map_and_the_scratch():
    n, c, k = 16, 6, 2
    hidden, gu, dn, ids, w = problem(1, n, k)
    scratch_gu = torch.zeros((c, *gu.shape[1:]), dtype=gu.dtype, device=CUDA)
    scratch_dn = torch.zeros((c, *dn.shape[1:]), dtype=dn.dtype, device=CUDA)
    emap = torch.full((n,), -1, dtype=torch.int32, device=CUDA)
    static_ids = ids.clone()

    def place(experts):
        emap.fill_(-1)
        for s, e in enumerate(experts):
            scratch_gu[s].copy_(gu[e])
            scratch_dn[s].copy_(dn[e])
            emap[e] = s

    place(ids[0].tolist())
    triton_moe.triton_fused_moe(hidden, scratch_gu, scratch_dn, static_ids, w, emap)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_moe.triton_fused_moe(hidden, scratch_gu, scratch_dn, static_ids, w, emap)
    for trial in range(3):
        new = torch.randperm(n)[:k].tolist()
        static_ids.copy_(torch.tensor([new], device=CUDA))
        place(list(reversed(new)) + [e for e in range(n) if e not in new][: c - k])
        graph.replay()
        eager = triton_moe.triton_fused_moe(hidden, gu, dn, static_ids, w, torch.arange(n, dtype=torch.int32, device=CUDA))
        assert torch.equal(out, eager), trial
