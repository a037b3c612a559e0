"""Tests of `fused_moe` against the float64 `reference_moe` oracle, and of its layout/batch invariances.

Parametrised over token counts, expert counts N and top_k, with random routing and random expert_maps:
- allclose to reference_moe (float32: rtol 1e-4, atol 1e-5);
- torch.equal between the identity layout and a permuted slot layout (S >= N slots, unused slots NaN,
  so reading a wrong slot cannot go unnoticed), and a compact layout holding only the routed experts
  (S < N, expert_map -1 for the others);
- torch.equal between the whole batch and the same tokens computed in consecutive groups;
- an expert mapped to -1 contributes zero: torch.equal with the same call whose routing weights for
  that expert are zero, and allclose to the oracle without that term;
- bfloat16: slot-layout identity and batch invariance.

Shapes use D=16, I=8; `test_batch_invariance_float32_odd_intermediate` covers an odd inner dim (I=6),
where the CPU float32 GEMM's row-position dependence (see test_rows.py) once broke batch invariance.
"""

from __future__ import annotations

import pytest
import torch

from wisp.core.kernels.moe import expert_mlp, fused_moe, reference_moe

D, I = 16, 8
F32_TOL = dict(rtol=1e-4, atol=1e-5)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_problem(t, n, k, seed, dtype=torch.float32, d=D, i=I):
    g = gen(seed)
    hidden = torch.randn(t, d, generator=g).to(dtype)
    w_gate_up = (torch.randn(n, 2 * i, d, generator=g) * 0.5).to(dtype)
    w_down = (torch.randn(n, d, i, generator=g) * 0.5).to(dtype)
    topk_ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)])  # distinct per token
    topk_weights = torch.softmax(torch.randn(t, k, generator=g), dim=-1).to(dtype)
    return hidden, w_gate_up, w_down, topk_ids, topk_weights


def slot_layout(w_gate_up, w_down, experts, num_slots, seed):
    """Place `experts` at random distinct slots of a NaN-filled [S, ...] bank; return bank and expert_map."""
    n = w_gate_up.shape[0]
    slots = torch.randperm(num_slots, generator=gen(seed))[: len(experts)]
    gu = torch.full((num_slots, *w_gate_up.shape[1:]), float("nan"), dtype=w_gate_up.dtype)
    dn = torch.full((num_slots, *w_down.shape[1:]), float("nan"), dtype=w_down.dtype)
    expert_map = torch.full((n,), -1, dtype=torch.int32)
    for e, s in zip(experts, slots.tolist()):
        gu[s], dn[s] = w_gate_up[e], w_down[e]
        expert_map[e] = s
    return gu, dn, expert_map


def random_groups(t, seed):
    g = gen(seed)
    n_cuts = int(torch.randint(0, min(t, 6), (1,), generator=g))
    cuts = sorted(set(torch.randint(1, t, (n_cuts,), generator=g).tolist())) if t > 1 else []
    bounds = [0, *cuts, t]
    return list(zip(bounds, bounds[1:]))


CASES = [(t, n, k) for t in (1, 3, 17, 40) for n in (4, 8, 16) for k in (1, 2, 4)]


@pytest.mark.parametrize("t, n, k", CASES)
def test_fused_moe_matches_reference(t, n, k):
    seed = 1000 * t + 10 * n + k
    h, gu, dn, ids, w = make_problem(t, n, k, seed)
    out = fused_moe(h, gu, dn, ids, w)
    assert out.shape == (t, D) and out.dtype == torch.float32
    ref = reference_moe(h, gu, dn, ids, w)
    torch.testing.assert_close(out.double(), ref, **F32_TOL)
    # an explicit identity map is the same as None
    ident = torch.arange(n, dtype=torch.int32)
    assert torch.equal(fused_moe(h, gu, dn, ids, w, ident), out)


@pytest.mark.parametrize("t, n, k", CASES)
def test_slot_layout_invariance(t, n, k):
    seed = 2000 * t + 10 * n + k
    h, gu, dn, ids, w = make_problem(t, n, k, seed)
    ref = fused_moe(h, gu, dn, ids, w)
    # permuted layout over S >= N slots, unused slots NaN
    for extra in (0, 3):
        pgu, pdn, emap = slot_layout(gu, dn, list(range(n)), n + extra, seed + extra)
        assert torch.equal(fused_moe(h, pgu, pdn, ids, w, emap), ref), extra
    # compact layout: only the routed experts present (S < N whenever some expert is unrouted)
    routed = torch.unique(ids).tolist()
    cgu, cdn, emap = slot_layout(gu, dn, routed, len(routed), seed + 7)
    assert (emap >= 0).sum().item() == len(routed)
    out = fused_moe(h, cgu, cdn, ids, w, emap)
    assert not out.isnan().any()
    assert torch.equal(out, ref)


@pytest.mark.parametrize("t, n, k", CASES)
def test_batch_invariance(t, n, k):
    seed = 3000 * t + 10 * n + k
    h, gu, dn, ids, w = make_problem(t, n, k, seed)
    pgu, pdn, emap = slot_layout(gu, dn, list(range(n)), n + 2, seed)
    whole = fused_moe(h, pgu, pdn, ids, w, emap)
    for trial in range(3):
        groups = random_groups(t, seed + trial) if trial < 2 else [(i, i + 1) for i in range(t)]
        parts = torch.cat([fused_moe(h[a:b], pgu, pdn, ids[a:b], w[a:b], emap) for a, b in groups])
        assert torch.equal(whole, parts), groups


@pytest.mark.parametrize("t, n, k", CASES)
def test_unmapped_expert_contributes_zero(t, n, k):
    seed = 4000 * t + 10 * n + k
    h, gu, dn, ids, w = make_problem(t, n, k, seed)
    dropped = int(ids[t // 2, k - 1])  # a routed expert
    pgu, pdn, emap = slot_layout(gu, dn, list(range(n)), n + 1, seed)
    full = fused_moe(h, pgu, pdn, ids, w, emap)
    slot = int(emap[dropped])
    emap[dropped] = -1
    pgu[slot], pdn[slot] = float("nan"), float("nan")  # its old slot must not be read either
    out = fused_moe(h, pgu, pdn, ids, w, emap)
    w0 = torch.where(ids == dropped, torch.zeros_like(w), w)
    assert torch.equal(out, fused_moe(h, pgu, pdn, ids, w0, emap))
    torch.testing.assert_close(out.double(), reference_moe(h, gu, dn, ids, w0), **F32_TOL)
    hit = (ids == dropped).any(dim=1)
    assert torch.equal(out[~hit], full[~hit])  # tokens not routed to it are untouched
    assert not torch.equal(out[hit], full[hit])  # the dropped term really was nonzero


@pytest.mark.parametrize("t, n, k", [(1, 4, 1), (3, 8, 2), (17, 16, 4), (40, 8, 4), (40, 16, 2)])
def test_bfloat16_layout_and_batch_invariance(t, n, k):
    seed = 5000 * t + 10 * n + k
    h, gu, dn, ids, w = make_problem(t, n, k, seed, dtype=torch.bfloat16)
    ref = fused_moe(h, gu, dn, ids, w)
    assert ref.dtype == torch.bfloat16
    pgu, pdn, emap = slot_layout(gu, dn, list(range(n)), n + 3, seed)
    assert torch.equal(fused_moe(h, pgu, pdn, ids, w, emap), ref)
    routed = torch.unique(ids).tolist()
    cgu, cdn, cmap = slot_layout(gu, dn, routed, len(routed), seed + 1)
    assert torch.equal(fused_moe(h, cgu, cdn, ids, w, cmap), ref)
    groups = random_groups(t, seed)
    parts = torch.cat([fused_moe(h[a:b], pgu, pdn, ids[a:b], w[a:b], emap) for a, b in groups])
    assert torch.equal(parts, ref)
    torch.testing.assert_close(ref.double(), reference_moe(h, gu, dn, ids, w), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sum_over_k_in_routing_order_float32(dtype):
    """The k terms are accumulated in float32 in routing order, then cast to hidden's dtype."""
    t, k = 24, 4
    h, gu, dn, ids, w = make_problem(t, 8, k, 77, dtype=dtype)
    out = fused_moe(h, gu, dn, ids, w)
    expected = torch.zeros(t, D, dtype=torch.float32)
    for j in range(k):
        y = torch.stack([expert_mlp(h[i : i + 1], gu[ids[i, j]], dn[ids[i, j]])[0] for i in range(t)])
        expected = expected + y.float() * w[:, j : j + 1].float()
    assert torch.equal(out, expected.to(dtype))


def test_duplicate_expert_in_a_token():
    """A token routed twice to one expert gets both terms."""
    h, gu, dn, _, _ = make_problem(2, 4, 2, 9)
    ids = torch.tensor([[1, 1], [2, 3]])
    w = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    torch.testing.assert_close(fused_moe(h, gu, dn, ids, w).double(), reference_moe(h, gu, dn, ids, w), **F32_TOL)


def test_batch_invariance_float32_odd_intermediate():
    h, gu, dn, ids, w = make_problem(17, 4, 2, 3, d=8, i=6)
    whole = fused_moe(h, gu, dn, ids, w)
    parts = torch.cat([fused_moe(h[a : a + 1], gu, dn, ids[a : a + 1], w[a : a + 1]) for a in range(17)])
    assert torch.equal(whole, parts)
