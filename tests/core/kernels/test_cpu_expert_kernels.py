"""Hybrid mode's CPU expert kernels: the native kernel's bits on bf16 weights (fixed by its order of operations, so the
same on every CPU and thread count), its closeness to torch's, its fallback, and its one OpenMP runtime (quantized
weights: test_cpu_quantized_experts.py, test_cpu_k_quants.py).
The kernel is built on first use (about 20 s on a 2-core CPU)."""

from __future__ import annotations

import pytest
import torch

from wisp.core.kernels.cpu_expert_kernels import (CPU_EXPERT_KERNELS, LANES, applies, gate_mul, gated_experts_mlp,
                                                  grouped_rows_matmul, native_experts_mlp, native_kernel_error,
                                                  one_at_a_time, plain_expert_mlp, rows_matmul)
from wisp.core.kernels.expert_extras import Activation, ExpertExtras


@pytest.fixture(scope="module", autouse=True)
def built():
    assert native_kernel_error() is None  # CI installs ninja and has a compiler: the kernel must build


def lanes_in_order(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic spelled out in float32, one IEEE operation at a time: products, 16 lane sums
    over k in order, then the lanes folded 8, 4, 2, 1."""
    m, k = x.shape
    products = x[:, None, :] * w.float()[None, :, :]  # [M, N, K], each rounded to float32
    lanes = products.view(m, w.shape[0], k // LANES, LANES)
    acc = torch.zeros_like(lanes[:, :, 0, :])  # [M, N, 16]
    for step in range(k // LANES):
        acc = acc + lanes[:, :, step, :]
    half = LANES // 2
    while half:
        acc = acc[..., :half] + acc[..., half : 2 * half]
        half //= 2
    return acc[..., 0]


# rows shorter than a page (one block's rows strided P apart), exactly a page (P = 1), 1.5 KB (P = 2 with a
# remainder); matrices of whole spans, a remainder, or only a remainder
@pytest.mark.parametrize("m, n, k", [(1, 64, 32), (3, 37, 48), (5, 130, 256), (2, 40, 2048), (1, 35, 1024),
                                     (2, 24, 768)])
def test_the_native_kernel_computes_its_documented_order_bit_for_bit(m, n, k):
    g = torch.Generator().manual_seed(m * 1000 + n)
    x = torch.randn((m, k), generator=g)
    w = torch.randn((n, k), generator=g).to(torch.bfloat16)
    out = rows_matmul(x, w)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert torch.equal(out, lanes_in_order(x, w))
    exact = (x.double() @ w.double().T)
    bound = (x.double().abs() @ w.double().abs().T) * k * 2 ** -23  # float32 summation's error bound
    assert ((out.double() - exact).abs() <= bound).all()


def f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def exp_in_order(x: torch.Tensor) -> torch.Tensor:
    """The native exp spelled out one float32 operation at a time: exp(x) = 2^k p(r), k = round(x log2 e),
    r = (x - k ln2_hi) - k ln2_lo, p Taylor's of degree 7 by Horner; inf above 88, 0 below -87."""
    y = x.clamp(-87.0, 88.0)
    k = torch.round(y * f32(1.44269504))
    r = (y - k * f32(0.693145752)) - k * f32(1.42860677e-6)
    p = torch.full_like(r, 1.98412698e-4)
    for c in (1.38888889e-3, 8.33333333e-3, 4.16666667e-2, 1.66666667e-1, 0.5, 1.0, 1.0):
        p = p * r + f32(c)
    scale = ((k.to(torch.int32) + 127) << 23).view(torch.float32)
    return torch.where(x > 88.0, torch.inf, torch.where(x < -87.0, 0.0, p * scale))


def gate_mul_in_order(h: torch.Tensor, activation: Activation = Activation()) -> torch.Tensor:
    """The native activations spelled out: silu(g) * u = g / (1 + exp(-g)) * u; GPT-OSS's clamped SwiGLU
    (u + 1) * (g / (1 + exp(-(g alpha)))) with g = min(g, limit), u = clamp(u, -limit, limit)."""
    g, u = h.chunk(2, dim=-1)
    if activation.kind == "silu":
        return g / (f32(1.0) + exp_in_order(-g)) * u
    limit, alpha = f32(activation.limit), f32(activation.alpha)
    g, u = torch.minimum(g, limit), torch.maximum(torch.minimum(u, limit), -limit)
    return (u + f32(1.0)) * (g / (f32(1.0) + exp_in_order(-(g * alpha))))


@pytest.mark.parametrize("activation", [Activation(), Activation("clamped_swiglu")])
def test_the_native_activations_are_their_documented_order_and_within_a_few_ulp_of_torchs(activation):
    g = torch.Generator().manual_seed(3)
    h = torch.randn((5, 2 * 160), generator=g) * 6
    h[0, :10] = torch.tensor([0.0, -0.0, 100.0, -100.0, 88.5, -88.5, 1e-30, -1e-30, 3e38, -3e38])  # beyond e^88, tiny
    h[0, 160:170] = 0.5  # their up halves: no product past float32's range
    h[1, :3], h[1, 160:163] = float("nan"), torch.tensor([float("nan"), 1.0, 1.0])  # NaN through the clamps
    a = gate_mul(h, activation)
    assert torch.equal(a.isnan(), gate_mul_in_order(h, activation).isnan()) and a[1, :3].isnan().all()
    finite = ~a.isnan()
    assert torch.equal(a[finite], gate_mul_in_order(h, activation)[finite])
    # against torch's float32 (the product g * alpha rounds alike in both: in float64 it alone moves e^(g alpha) by
    # up to 20 x 2^-24 where g alpha nears -20)
    ref = activation(h[:, :160], h[:, 160:]).double()
    assert ((a.double() - ref).abs()[finite] <= (4 * 2 ** -23 * ref.abs() + 1e-30)[finite]).all()  # |silu(g)| < 1e-30 where e^-g is taken as inf


# (48, 32): matrices of remainders only; (1024, 32): page-strided spans in both GEMVs
@pytest.mark.parametrize("d, i", [(48, 32), (1024, 32)])
@pytest.mark.parametrize("counts", [[1], [2, 1], [1, 1, 1, 1]])
@pytest.mark.parametrize("activation, biased", [(Activation(), False), (Activation("clamped_swiglu"), True)])
def test_a_native_expert_is_its_documented_order_bit_for_bit(counts, d, i, activation, biased):
    """Both GEMVs in the lanes' order, the biases (float32 adds after each sum) and the activation between, in one
    native call per layer's experts."""
    g = torch.Generator().manual_seed(len(counts))
    x = torch.randn((sum(counts), d), generator=g) * 3
    gate_ups = [torch.randn((2 * i, d), generator=g).bfloat16() for _ in counts]
    downs = [torch.randn((d, i), generator=g).bfloat16() for _ in counts]
    biases = [(torch.randn(2 * i, generator=g).bfloat16(), torch.randn(d, generator=g)) if biased else (None, None)
              for _ in counts]
    out = gated_experts_mlp(x, gate_ups, downs, counts, gate_up_biases=[b[0] for b in biases] if biased else None,
                            down_biases=[b[1] for b in biases] if biased else None, activation=activation)
    start = 0
    for n, gate_up, down, (b_gate_up, b_down) in zip(counts, gate_ups, downs, biases):
        h = lanes_in_order(x[start : start + n], gate_up)
        h = h if b_gate_up is None else h + b_gate_up.float()
        o = lanes_in_order(gate_mul_in_order(h, activation), down)
        assert torch.equal(out[start : start + n], o if b_down is None else o + b_down)
        start += n
    extras = [ExpertExtras(gate_up_bias=b[0], down_bias=b[1]) if biased else None for b in biases]
    assert torch.equal(native_experts_mlp(x, counts, gate_ups, downs, extras, activation), out)
    transposed = [w.T.contiguous().T for w in downs]  # the same values, not contiguous: copied, not refused
    assert torch.equal(native_experts_mlp(x, counts, gate_ups, transposed, extras, activation), out)


def test_the_native_kernels_bits_do_not_depend_on_the_thread_count():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn((2, 512), generator=g), torch.randn((1000, 512), generator=g).to(torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = rows_matmul(x, w)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(rows_matmul(x, w), one)
    finally:
        torch.set_num_threads(threads)


def test_the_native_kernel_refuses_what_it_cannot_read():
    x, w = torch.randn(1, 32), torch.randn(8, 32).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="float32 x"):
        rows_matmul(x.to(torch.bfloat16), w)
    with pytest.raises(RuntimeError, match="got Float without scales"):  # float32 weights: no format it reads
        rows_matmul(x, w.float())
    with pytest.raises(RuntimeError, match="multiple of 16"):
        rows_matmul(torch.randn(1, 24), torch.randn(8, 24).to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="positive multiple of 16"):  # (a division by its depth, not a crash)
        rows_matmul(torch.randn(1, 0), torch.randn(8, 0).to(torch.bfloat16))


@pytest.mark.parametrize("activation", [Activation(), Activation("clamped_swiglu")])
@pytest.mark.parametrize("biased", [False, True])
def test_a_native_expert_is_close_to_torchs_plain_one(activation, biased):
    g = torch.Generator().manual_seed(3)
    d, i = 64, 32
    w_gate_up = (torch.randn((2 * i, d), generator=g) / d ** 0.5).to(torch.bfloat16)
    w_down = (torch.randn((d, i), generator=g) / i ** 0.5).to(torch.bfloat16)
    extras = None
    if biased:
        extras = ExpertExtras(gate_up_bias=torch.randn(2 * i, generator=g).to(torch.bfloat16),
                              down_bias=torch.randn(d, generator=g).to(torch.bfloat16))
    x = torch.randn((3, d), generator=g).to(torch.bfloat16)
    out = native_experts_mlp(x, [3], [w_gate_up], [w_down], [extras], activation)
    assert out.dtype == torch.float32  # the activation and both sums in float32
    ref = plain_expert_mlp(x.float(), w_gate_up.float(), w_down.float(),
                           None if extras is None else ExpertExtras(gate_up_bias=extras.gate_up_bias.float(),
                                                                    down_bias=extras.down_bias.float()), activation)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_weights_it_does_not_read_go_to_torchs_kernel():
    x, w_gate_up, w_down = torch.randn(2, 32), torch.randn(64, 32), torch.randn(32, 32)
    assert not applies(w_gate_up, w_down, None)  # float32 weights
    assert torch.equal(native_experts_mlp(x, [2], [w_gate_up], [w_down], [None]), plain_expert_mlp(x, w_gate_up, w_down))
    assert not applies(w_gate_up.to(torch.bfloat16)[:, :24], w_down.to(torch.bfloat16), None)  # K = 24


def test_a_layers_experts_at_once_give_each_experts_bits_alone():
    g = torch.Generator().manual_seed(4)
    d, i, counts = 64, 32, [2, 0, 1, 3]
    gate_ups = [torch.randn((2 * i, d), generator=g).to(torch.bfloat16) for _ in counts]
    downs = [torch.randn((d, i), generator=g).to(torch.bfloat16) for _ in counts]
    extras = [ExpertExtras(gate_up_bias=torch.randn(2 * i, generator=g), down_bias=torch.randn(d, generator=g))
              for _ in counts]
    x = torch.randn((sum(counts), d), generator=g)
    together = native_experts_mlp(x, counts, gate_ups, downs, extras)
    alone = one_at_a_time(lambda *a: native_experts_mlp(a[0], [a[0].shape[0]], [a[1]], [a[2]], [a[3]], a[4]))
    assert torch.equal(together, alone(x, counts, gate_ups, downs, extras))
    h = grouped_rows_matmul(x, gate_ups, counts)
    assert torch.equal(h[2:3], rows_matmul(x[2:3], gate_ups[2]))  # row 2: the third expert's one row
    with pytest.raises(RuntimeError, match="offsets"):
        grouped_rows_matmul(x, gate_ups, [1, 1, 1, 1])  # rows left over


def test_every_kernel_takes_a_layers_experts_and_agrees_with_the_reference():
    g = torch.Generator().manual_seed(5)
    d, i, counts = 32, 16, [1, 3]
    gate_ups = [(torch.randn((2 * i, d), generator=g) / d ** 0.5).to(torch.bfloat16) for _ in counts]
    downs = [(torch.randn((d, i), generator=g) / i ** 0.5).to(torch.bfloat16) for _ in counts]
    x = torch.randn((4, d), generator=g).to(torch.bfloat16)
    ref = CPU_EXPERT_KERNELS["reference"](x, counts, gate_ups, downs, [None, None])
    for name, kernel in CPU_EXPERT_KERNELS.items():
        out = kernel(x, counts, gate_ups, downs, [None, None])
        assert out.shape == (4, d) and out.dtype == torch.float32
        torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2, msg=name)


SHARED_RUNTIME = """
import torch
from wisp.core.kernels.cpu_expert_kernels import rows_matmul

def runtimes():
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if "gomp" in line or "libiomp" in line}

torch.randn(64, 64) @ torch.randn(64, 64)  # torch's own OpenMP team, up
before = runtimes()
rows_matmul(torch.randn(1, 32), torch.randn(8, 32).to(torch.bfloat16))
assert before and runtimes() == before, (before, runtimes())
"""


def test_the_kernel_brings_no_openmp_runtime_beside_torchs():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SHARED_RUNTIME], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
