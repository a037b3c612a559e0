"""The Triton kernels' logic on any machine: fused MoE, the routing-order combine and RMSNorm against
the torch references (on the GPU compiled; on the CPU under Triton's interpreter, see conftest)."""

from __future__ import annotations

import pytest
import torch

from wisp.core.kernels import rows
from wisp.core.kernels.moe import combine_in_routing_order, fused_moe

pytest.importorskip("triton")
from wisp.core.kernels.triton_moe import _combine, triton_fused_moe  # noqa: E402
from wisp.core.kernels.triton_norm import triton_add_rms_norm, triton_rms_norm  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("t,n,k", [(1, 8, 2), (3, 16, 4), (2, 6, 6)])
def test_fused_moe_matches_the_reference_with_a_sparse_map(t, n, k):
    g = torch.Generator().manual_seed(t * 100 + n)
    d, i = 72, 40  # not multiples of the blocks: masks matter
    hidden = torch.randn(t, d, generator=g).to(DEV)
    gu, dn = (torch.randn(n, 2 * i, d, generator=g) * 0.1).to(DEV), (torch.randn(n, d, i, generator=g) * 0.1).to(DEV)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)]).to(DEV)
    w = torch.softmax(torch.randn(t, k, generator=g), -1).to(DEV)
    emap = torch.arange(n, dtype=torch.int32, device=DEV)
    emap[ids[0, 0]] = -1  # skipped term
    got, want = triton_fused_moe(hidden, gu, dn, ids, w, emap), fused_moe(hidden, gu, dn, ids, w, emap)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert not torch.equal(got, triton_fused_moe(hidden, gu, dn, ids, w, None))  # the -1 really was skipped


def test_combine_sums_in_routing_order():
    g = torch.Generator().manual_seed(1)
    y, w = torch.randn(3 * 4, 1500, generator=g).to(DEV), torch.softmax(torch.randn(3, 4, generator=g), -1).to(DEV)
    out = torch.empty(3, 1500, device=DEV)
    _combine[(3, 2)](y, w, out, K=4, D=1500, BLOCK_D=1024)
    torch.testing.assert_close(out, combine_in_routing_order(y.view(3, 4, 1500), w, torch.float32), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(5, 40), (2, 3, 16), (1, 2048)])
def test_rms_norm_matches_the_reference_and_is_row_invariant(shape):
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(shape, generator=g).to(DEV), torch.randn(shape[-1], generator=g).to(DEV)
    got = triton_rms_norm(x, w, 1e-6)
    torch.testing.assert_close(got, rows.rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-5)
    flat = x.reshape(-1, shape[-1])
    assert torch.equal(triton_rms_norm(flat[:1], w, 1e-6), got.reshape(-1, shape[-1])[:1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 40), (1, 2048)])
def test_add_rms_norm_gives_the_bits_of_the_add_then_the_norm(shape, dtype):
    g = torch.Generator().manual_seed(4)
    x, d = (torch.randn(shape, generator=g).to(DEV, dtype) for _ in range(2))
    d[0, :7] = -x[0, :7]  # exact cancellations
    x[-1, -3:], d[-1, -3:] = 1.0, 2.0 ** -9  # ties: a 16-bit sum rounds to nearest even
    w = torch.randn(shape[-1], generator=g).to(DEV, dtype)
    total, normed = triton_add_rms_norm(x, d, w, 1e-6)
    assert torch.equal(total, x + d)
    assert torch.equal(normed, triton_rms_norm(x + d, w, 1e-6))
    assert torch.equal(triton_add_rms_norm(x[-1:], d[-1:], w, 1e-6)[1], normed[-1:])  # row-invariant


@pytest.mark.parametrize("shape", [(5, 40), (1, 2880)])
def test_a_float32_weight_multiplies_before_the_cast_as_gpt_oss_norms(shape):
    # GPT-OSS: bf16 rows, a float32 weight applied to the float32 normalised row, one cast (to nearest even) after
    g = torch.Generator().manual_seed(5)
    x, d = (torch.randn(shape, generator=g).to(DEV, torch.bfloat16) for _ in range(2))
    w = (1.0 + torch.randn(shape[-1], generator=g) / 3).to(DEV)  # float32, not representable in bf16
    got = triton_rms_norm(x, w, 1e-5, weight_in_float32=True)
    want = rows.rms_norm_float32_weight(x, w, 1e-5)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=8e-3, atol=1e-5)  # a 16-bit ulp where the sums' orders differ
    assert (got == want).float().mean() > 0.95
    assert (got != triton_rms_norm(x, w, 1e-5)[..., :].to(torch.bfloat16)).any()  # not the cast-first formula
    total, normed = triton_add_rms_norm(x, d, w, 1e-5, weight_in_float32=True)
    assert torch.equal(total, x + d) and torch.equal(normed, triton_rms_norm(x + d, w, 1e-5, weight_in_float32=True))


def test_rope_matches_the_reference():
    from wisp.core.kernels.triton_rope import triton_rope
    from wisp.models.moe_decoder import apply_rope

    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 16, generator=g).to(DEV)
    ang = torch.arange(3).float()[:, None] * torch.rand(8, generator=g)[None]
    emb = torch.cat([ang, ang], -1).to(DEV)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    torch.testing.assert_close(triton_rope(x, cos, sin), apply_rope(x, cos, sin), rtol=1e-6, atol=1e-6)


def test_device_counts_do_not_overflow_on_mixtral_sized_experts():
    from wisp.core.kernels.step_count import StepCount
    from wisp.core.kernels.triton_step_count import count_step

    ids = torch.tensor([[0, 1]] * 8, device=DEV)  # 16 routed pairs of 352 MB experts: 5.6 GB, past int32
    counts = torch.zeros(6, dtype=torch.int64, device=DEV)
    count_step(StepCount(counts, 8, hits=False, pair_bytes=352_321_536), ids)
    count_step(StepCount(counts, 8, hits=True, loads=8, fixed_bytes=3 * 2**31), ids)
    assert counts.tolist() == [2, 2, 2, 0, 8, 16 * 352_321_536 + 3 * 2**31]


@pytest.mark.parametrize("t,hits", [(1, True), (3, False), (40, True)])  # 40 x 2 pairs: past the one-program sort
def test_moe_counts_a_step_as_its_own_launch_would(t, hits):
    from wisp.core.experts.counters import COUNT_FIELDS
    from wisp.core.kernels.step_count import StepCount
    from wisp.core.kernels.triton_step_count import count_step

    assert COUNT_FIELDS[:3] == ("steps", "hits", "misses") and COUNT_FIELDS[4:] == ("loads", "bytes_h2d")
    g = torch.Generator().manual_seed(t)
    n, k, d, i = 6, 2, 16, 8
    hidden = torch.randn(t, d, generator=g).to(DEV)
    gu, dn = torch.randn(n, 2 * i, d, generator=g).to(DEV), torch.randn(n, d, i, generator=g).to(DEV)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)]).to(DEV)
    w = torch.softmax(torch.randn(t, k, generator=g), -1).to(DEV)
    folded, apart = (torch.zeros(6, dtype=torch.int64, device=DEV) for _ in range(2))
    make = lambda counts: StepCount(counts, n, hits=hits, loads=3, fixed_bytes=10, pair_bytes=7)  # noqa: E731
    got = triton_fused_moe(hidden, gu, dn, ids, w, count=make(folded))
    count_step(make(apart), ids)
    assert torch.equal(got, triton_fused_moe(hidden, gu, dn, ids, w))  # counting changes no bit
    assert torch.equal(folded, apart) and folded[1 if hits else 2] == ids.unique().numel()


@pytest.mark.parametrize("n,k,normalize,dtype", [(8, 2, True, torch.float32), (60, 4, False, torch.bfloat16),
                                                 (128, 8, True, torch.bfloat16)])
def test_router_matches_softmax_topk(n, k, normalize, dtype):
    from wisp.core.kernels.triton_router import triton_route

    logits = torch.randn(5, n, generator=torch.Generator().manual_seed(n)).to(DEV)
    probs = torch.softmax(logits, -1, dtype=torch.float32)
    want_w, want_ids = torch.topk(probs, k, -1)
    if normalize:
        want_w = want_w / want_w.sum(-1, keepdim=True)
    got_w, got_ids = triton_route(logits, k, normalize, dtype)
    assert torch.equal(got_ids, want_ids) and got_w.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}  # bf16: its own (one-ulp) defaults
    torch.testing.assert_close(got_w, want_w.to(dtype), **tol)


@pytest.mark.parametrize("normalize", [True, False])
def test_router_takes_replayed_ids_in_the_same_launch(normalize):
    """A token whose K replayed ids are all given gets them, weighted by the probabilities there (as the torch
    path's gather); a token with a gap (-1) keeps the router's top-k; a shared row (stride 0) serves all."""
    from wisp.core.kernels.triton_router import triton_route
    from wisp.trace.replay_buffer import replayed_or_routed

    n, k = 16, 3  # K below its power of two: the padded lane must not count
    logits = torch.randn(3, n, generator=torch.Generator().manual_seed(7)).to(DEV)
    probs = torch.softmax(logits, -1, dtype=torch.float32)
    routed_w, routed_ids = torch.topk(probs, k, -1)
    override = torch.tensor([[5, 0, 15], [-1, 3, 2], [7, 6, 1]], device=DEV)  # past row 0's K: a -1 (masked)
    want_ids = replayed_or_routed(override, routed_ids)
    want_w = probs.gather(1, want_ids)
    if normalize:
        want_w = want_w / want_w.sum(-1, keepdim=True)
    got_w, got_ids = triton_route(logits, k, normalize, torch.float32, override)
    assert torch.equal(got_ids, want_ids) and torch.equal(got_ids[1], routed_ids[1])
    torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-6)
    shared = override[2].expand(3, k)
    got_w, got_ids = triton_route(logits, k, normalize, torch.float32, shared)
    assert torch.equal(got_ids, shared)
    with pytest.raises(ValueError):
        triton_route(logits, k, normalize, torch.float32, override[:, :2])


@pytest.mark.parametrize("replayed", [False, True])
def test_router_takes_the_top_k_logits_then_their_softmax_as_gpt_oss(replayed):
    from wisp.core.kernels.triton_router import triton_route

    n, k = 32, 4
    logits = torch.randn(5, n, generator=torch.Generator().manual_seed(11)).to(DEV)
    top, want_ids = torch.topk(logits, k, -1)
    override = None
    if replayed:  # a replay's ids, weighted by the softmax of the logits there
        override = torch.stack([torch.randperm(n, generator=torch.Generator().manual_seed(r))[:k] for r in range(5)]).to(DEV)
        want_ids, top = override, logits.gather(1, override)
    got_w, got_ids = triton_route(logits, k, False, torch.float32, override, topk_first=True)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, torch.softmax(top.float(), -1), rtol=1e-5, atol=1e-6)
    probs_first = triton_route(logits, k, False, torch.float32, override)[0]  # softmax over all N first: < 1 a row
    assert torch.allclose(got_w.sum(-1), torch.ones(5, device=DEV)) and (probs_first.sum(-1) < 0.99).all()


def test_router_breaks_ties_toward_the_lower_id():
    from wisp.core.kernels.triton_router import triton_route

    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0]], device=DEV)
    assert triton_route(logits, 3, False, torch.float32)[1].tolist() == [[1, 3, 2]]


@pytest.mark.slow
@pytest.mark.parametrize("cap", [2, 5])
def test_expert_major_wide_step_equals_the_resident_kernel(cap):
    """The wide path with the Triton family (hits by map, one launch pair per streamed or loaded expert,
    combine) gives the resident Triton kernel's bits, on the GPU with the side copy stream."""
    from wisp.core.bank_keys import DOWN, GATE_UP
    from tests.core.experts.stores import paged_store
    from wisp.core.kernels.registry import moe_kernels

    g = torch.Generator().manual_seed(cap)
    n, k, t, d, i = 8, 2, 9, 72, 40
    host = {GATE_UP: torch.randn(n, 2 * i, d, generator=g) * 0.1, DOWN: torch.randn(n, d, i, generator=g) * 0.1}
    if DEV.type == "cuda":
        host = {name: w.pin_memory() for name, w in host.items()}
    store = paged_store(host, cap, DEV)
    store.kernels = moe_kernels("triton")
    bank = {name: w.to(DEV) for name, w in host.items()}
    for step in range(2):
        hidden = torch.randn(t, d, generator=g).to(DEV)
        ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)]).to(DEV)
        w = torch.softmax(torch.randn(t, k, generator=g), -1).to(DEV)
        want = triton_fused_moe(hidden, bank[GATE_UP], bank[DOWN], ids, w)
        assert len(torch.unique(ids)) > cap
        assert torch.equal(store.forward(hidden, ids, w), want), step
    store.residency.pager.check_integrity()
