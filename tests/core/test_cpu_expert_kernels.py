"""Hybrid mode's CPU expert kernels: the native bf16 kernel's bits (fixed by its order of operations, so the
same on every CPU and thread count), its closeness to torch's, its fallback, and its one OpenMP runtime.
The kernel is built on first use (about 20 s on a 2-core CPU)."""

from __future__ import annotations

import pytest
import torch

from wisp.core.cpu_expert_kernels import (LANES, applies, bf16_rows_matmul, native_expert_mlp, native_kernel_error,
                                          plain_expert_mlp)
from wisp.core.expert_extras import Activation, ExpertExtras


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


@pytest.mark.parametrize("m, n, k", [(1, 64, 32), (3, 37, 48), (5, 130, 256)])
def test_the_native_kernel_computes_its_documented_order_bit_for_bit(m, n, k):
    g = torch.Generator().manual_seed(m * 1000 + n)
    x = torch.randn((m, k), generator=g)
    w = torch.randn((n, k), generator=g).to(torch.bfloat16)
    out = bf16_rows_matmul(x, w)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert torch.equal(out, lanes_in_order(x, w))
    exact = (x.double() @ w.double().T)
    bound = (x.double().abs() @ w.double().abs().T) * k * 2 ** -23  # float32 summation's error bound
    assert ((out.double() - exact).abs() <= bound).all()


def test_the_native_kernels_bits_do_not_depend_on_the_thread_count():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn((2, 512), generator=g), torch.randn((1000, 512), generator=g).to(torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = bf16_rows_matmul(x, w)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(bf16_rows_matmul(x, w), one)
    finally:
        torch.set_num_threads(threads)


def test_the_native_kernel_refuses_what_it_cannot_read():
    x, w = torch.randn(1, 32), torch.randn(8, 32).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="float32 x, bfloat16 w"):
        bf16_rows_matmul(x.to(torch.bfloat16), w)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        bf16_rows_matmul(torch.randn(1, 24), torch.randn(8, 24).to(torch.bfloat16))


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
    out = native_expert_mlp(x, w_gate_up, w_down, extras, activation)
    assert out.dtype == torch.float32  # the activation and both sums in float32
    ref = plain_expert_mlp(x.float(), w_gate_up.float(), w_down.float(),
                           None if extras is None else ExpertExtras(gate_up_bias=extras.gate_up_bias.float(),
                                                                    down_bias=extras.down_bias.float()), activation)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_weights_it_does_not_read_go_to_torchs_kernel():
    x, w_gate_up, w_down = torch.randn(2, 32), torch.randn(64, 32), torch.randn(32, 32)
    assert not applies(w_gate_up, w_down, None)  # float32 weights
    assert torch.equal(native_expert_mlp(x, w_gate_up, w_down), plain_expert_mlp(x, w_gate_up, w_down))
    assert not applies(w_gate_up.to(torch.bfloat16)[:, :24], w_down.to(torch.bfloat16), None)  # K = 24


SHARED_RUNTIME = """
import torch
from wisp.core.cpu_expert_kernels import bf16_rows_matmul

def runtimes():
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if "gomp" in line or "libiomp" in line}

torch.randn(64, 64) @ torch.randn(64, 64)  # torch's own OpenMP team, up
before = runtimes()
bf16_rows_matmul(torch.randn(1, 32), torch.randn(8, 32).to(torch.bfloat16))
assert before and runtimes() == before, (before, runtimes())
"""


def test_the_kernel_brings_no_openmp_runtime_beside_torchs():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SHARED_RUNTIME], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
