"""Hybrid's native CPU kernel on k-quant experts kept packed (Q4_K, Q5_K, Q6_K): its documented order bit for bit (per
sub-block, the codes' products with x summed in 16 lanes from zero, times d * scale, added to the lanes' running sum;
for Q4_K and Q5_K, beside it in 8 lanes, each super-block's dmin * min times its sub-blocks' sums of x, subtracted
once both are folded), every weight the `gguf` package's value, an expert whose gate_up and down are in two types (a
Q4_K_M file's), and bits that do not depend on the thread count."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_the_same_on_one_thread_and_more
from tests.core.kernels.test_k_quants import random_rows
from wisp.core.kernels.cpu_expert_kernels import LANES, applies, native_experts_mlp, native_kernel_error, one_at_a_time
from wisp.core.kernels.cpu_expert_kernels import plain_expert_mlp, rows_matmul
from wisp.core.kernels.expert_extras import ExpertExtras
from wisp.core.kernels.gguf_blocks import _scale_min
from wisp.core.kernels.k_quants import K_QUANTS, split_blocks
from wisp.core.kernels.quantized_weights import dequantize_weight


@pytest.fixture(scope="module", autouse=True)
def built():
    assert native_kernel_error() is None  # CI installs ninja and has a compiler: the kernel must build


def f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float().squeeze(-1)


def parts(raw: torch.Tensor, qtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """A k-quant's rows (the file's bytes [N, bytes]) as (codes' values [N, K], each group's d * scale [N, G], its
    dmin * min [N, G] or None, the group's columns), in float32 (every value exact)."""
    n = raw.shape[0]
    blocks = raw.view(n, -1, K_QUANTS[qtype].block_bytes).to(torch.int32)  # [N, B, bytes]
    if qtype == "Q6_K":
        low = (blocks[..., :128].view(n, -1, 2, 1, 64) >> torch.tensor([0, 4]).view(2, 1)) & 15  # [N, B, half, 2, 64]
        high = (blocks[..., 128:192].view(n, -1, 2, 1, 32) >> torch.tensor([0, 2, 4, 6]).view(4, 1)) & 3
        q = (low.reshape(n, -1, 2, 4, 32) | (high.reshape(n, -1, 2, 4, 32) << 4)) - 32
        scales = blocks[..., 192:208].to(torch.uint8).view(torch.int8).float() * f16(raw.view(n, -1, 210)[..., 208:210])[..., None]
        return q.reshape(n, -1).float(), scales.reshape(n, -1), None, 16
    heads = raw.view(n, -1, K_QUANTS[qtype].block_bytes)
    sc, mn = _scale_min(heads[..., 4:16].reshape(-1, 12))  # [N * B, 8]
    nibbles = blocks[..., -128:].view(n, -1, 4, 1, 32) >> torch.tensor([0, 4]).view(2, 1)  # [N, B, 4, 2, 32]
    q = (nibbles & 15).reshape(n, -1, 8, 32)
    if qtype == "Q5_K":
        q = q | (((blocks[..., 16:48].view(n, -1, 1, 32) >> torch.arange(8).view(8, 1)) & 1) << 4)
    scales = f16(heads[..., 0:2])[..., None] * sc.view(n, -1, 8).float()
    mins = f16(heads[..., 2:4])[..., None] * mn.view(n, -1, 8).float()
    return q.reshape(n, -1).float(), scales.reshape(n, -1), mins.reshape(n, -1), 32


def fold(lanes: torch.Tensor) -> torch.Tensor:
    """The last dimension's lanes summed pairwise: (l, l + half) for half = n / 2, ..., 1."""
    half = lanes.shape[-1] // 2
    while half:
        lanes = lanes[..., :half] + lanes[..., half : 2 * half]
        half //= 2
    return lanes[..., 0]


def in_order(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None, group: int):
    """The kernel's order, one IEEE float32 operation at a time (see the module docstring)."""
    m, k = x.shape
    products = x[:, None, :] * q[None, :, :]  # [M, N, K]
    acc = torch.zeros((m, q.shape[0], LANES))
    for g, start in enumerate(range(0, k, group)):
        part = torch.zeros_like(acc)
        for step in range(start, start + group, LANES):
            part = part + products[:, :, step : step + LANES]
        acc = acc + part * scales[None, :, g, None]
    if mins is None:
        return fold(acc)
    x_sums = fold(x.view(m, -1, 2, LANES)[:, :, 0] + x.view(m, -1, 2, LANES)[:, :, 1])  # [M, K / 32]
    min_acc = torch.zeros((m, q.shape[0], 8))
    for s in range(0, k // group, 8):  # lane j: sub-block j of each super-block
        min_acc = min_acc + mins[None, :, s : s + 8] * x_sums[:, None, s : s + 8]
    return fold(acc) - fold(min_acc)


# rows' codes shorter than a page (page-strided blocks) or longer, whole spans and remainders
# x in float32, or bfloat16's values (a model's hidden state: on an AVX512-BF16 CPU, Q4_K then sums each lane's two
# products in one vdpbf16ps, row_dots.h's bf16_pairs, to the same bits)
@pytest.mark.parametrize("x_values", ["float32", "bfloat16"])
@pytest.mark.parametrize("qtype", list(K_QUANTS))
@pytest.mark.parametrize("m, n, k", [(1, 64, 256), (3, 37, 512), (2, 130, 768), (1, 40, 4096)])
def test_a_k_quant_weight_computes_its_documented_order_bit_for_bit(qtype, m, n, k, x_values):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    raw = random_rows(qtype, (n,), k, g, d_scale=0.05)
    codes, heads = split_blocks(raw, qtype)
    x = torch.randn((m, k), generator=g)
    if x_values == "bfloat16":
        x = x.bfloat16().float()
    out = rows_matmul(x, codes, heads)
    assert torch.equal(out, in_order(x, *parts(raw, qtype)))
    exact = x.double() @ dequantize_weight(codes, heads, torch.float32).double().T
    torch.testing.assert_close(out.double(), exact, rtol=1e-4, atol=1e-4 * float(exact.abs().max()))


@pytest.mark.parametrize("qtype", list(K_QUANTS))
def test_each_weight_the_kernel_reads_is_the_gguf_packages_value(qtype):
    """x = the identity: out[m, n] = weight (n, m) alone (scale times code, less the min: the other products are
    zeros), compared with `dequantize_weight`'s float32 value, which is the gguf package's (test_k_quants)."""
    g = torch.Generator().manual_seed(7)
    codes, heads = split_blocks(random_rows(qtype, (24,), 512, g), qtype)
    assert torch.equal(rows_matmul(torch.eye(512), codes, heads), dequantize_weight(codes, heads, torch.float32).T)


def test_an_expert_with_q4_k_gate_up_and_q6_k_down_runs_whole_in_native_code():
    """A Q4_K_M file's layer: gate/up in Q4_K, down in Q6_K. The native kernel takes it (and Q8_0 beside a k-quant),
    gives each expert's bits alone in a layer's call, within float32 sums of torch on the dequantized weights."""
    g = torch.Generator().manual_seed(11)
    d, i, counts = 512, 256, [2, 0, 1]
    gate_ups = [split_blocks(random_rows("Q4_K", (2 * i,), d, g, d_scale=2e-3), "Q4_K") for _ in counts]
    downs = [split_blocks(random_rows("Q6_K", (d,), i, g, d_scale=2e-4), "Q6_K") for _ in counts]
    extras = [ExpertExtras(gu[1], dn[1]) for gu, dn in zip(gate_ups, downs)]
    assert all(applies(gu[0], dn[0], ex) for gu, dn, ex in zip(gate_ups, downs, extras))
    x = torch.randn((sum(counts), d), generator=g).bfloat16()
    out = native_experts_mlp(x, counts, [gu[0] for gu in gate_ups], [dn[0] for dn in downs], extras)
    alone = one_at_a_time(lambda *a: native_experts_mlp(a[0], [a[0].shape[0]], [a[1]], [a[2]], [a[3]], a[4]))
    assert torch.equal(out, alone(x, counts, [gu[0] for gu in gate_ups], [dn[0] for dn in downs], extras))
    start = 0
    for n, gu, dn in zip(counts, gate_ups, downs):
        if n == 0:
            continue
        ref = plain_expert_mlp(x[start : start + n].float(), dequantize_weight(*gu, torch.float32),
                               dequantize_weight(*dn, torch.float32), None)
        torch.testing.assert_close(out[start : start + n], ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
        start += n
    from wisp.core.kernels.q8_0 import quantize_q8_0

    q8 = quantize_q8_0(torch.randn(d, i, generator=g))
    assert applies(gate_ups[0][0], q8[0], ExpertExtras(gate_ups[0][1], q8[1]))  # Q8_0 down beside a k-quant


def test_k_quant_shapes_it_cannot_read_are_refused():
    codes, heads = split_blocks(random_rows("Q4_K", (8,), 256, torch.Generator().manual_seed(1)), "Q4_K")
    with pytest.raises(RuntimeError, match=r"Q4_K weight \[8, 256\]: contiguous codes \[8, 1, 128\] and heads "
                                           r"\[8, 1, 16\]; got \[8, 1, 128\] and \[4, 1, 16\]"):
        rows_matmul(torch.randn(1, 256), codes, heads[:4].contiguous())
    assert not applies(codes, codes, ExpertExtras(heads[..., :12], heads))  # no format: torch's kernel says why


@pytest.mark.parametrize("qtype", list(K_QUANTS))
def test_a_k_quant_weights_bits_do_not_depend_on_the_thread_count(qtype):
    g = torch.Generator().manual_seed(13)
    codes, heads = split_blocks(random_rows(qtype, (1000,), 512, g), qtype)
    x = torch.randn((2, 512), generator=g)
    assert_the_same_on_one_thread_and_more(lambda: rows_matmul(x, codes, heads))
