"""Hybrid's native CPU kernel on quantized weights read packed (FP8 blocks, MXFP4, Q8_0): codes widened to their exact
values, each group of columns sharing a scale summed apart in the lanes, then scaled: a fixed order (so the same bits on
every CPU and thread count), close to the dequantized weights' product; NaN codes found at load and left to torch.
(The k-quants: test_cpu_k_quants.py.)"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_the_same_on_one_thread_and_more
from wisp.core.kernels.cpu_expert_kernels import (CPU_EXPERT_KERNELS, LANES, CpuExperts, applies, fp8_nan_codes,
                                                  native_experts_mlp, native_kernel_error, one_at_a_time,
                                                  plain_expert_mlp, rows_matmul)
from wisp.core.kernels.expert_extras import Activation, ExpertExtras
from wisp.core.kernels.fp8_blocks import quantize_blocks
from wisp.core.kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from wisp.core.kernels.q8_0 import quantize_q8_0
from wisp.core.kernels.quantized_weights import dequantize_weight


@pytest.fixture(scope="module", autouse=True)
def built():
    assert native_kernel_error() is None  # CI installs ninja and has a compiler: the kernel must build


def fp8_codes(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Every e4m3fn code but the two NaNs (subnormals, both zeros, the largest), and block scales of both signs
    whose products stay finite, with some at float32's extremes (subnormal products)."""
    codes = torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8)
    codes[0, : min(k, 256)] = torch.arange(min(k, 256), dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E
    scale = torch.randn((-(-n // 128), -(-k // 128)), generator=g) * 2.0 ** torch.randint(-8, 9, (1,), generator=g)
    scale.view(-1)[0] = 1.0
    if scale.numel() > 1:
        scale.view(-1)[1] = 2.0 ** -130  # products below float32's normals: rounded as torch rounds them
    return codes.view(torch.float8_e4m3fn), scale


def mxfp4_codes(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Every byte (both nibbles' codes), and e8m0 scales from 0 (2^-127, subnormal) to 200."""
    blocks = torch.randint(0, 256, (n, k // 32, 16), generator=g, dtype=torch.uint8)
    blocks.view(-1)[: min(blocks.numel(), 256)] = torch.arange(min(blocks.numel(), 256), dtype=torch.uint8)
    scales = torch.randint(100, 150, (n, k // 32), generator=g, dtype=torch.uint8)
    scales.view(-1)[:4] = torch.tensor([0, 1, 2, 200], dtype=torch.uint8)[: scales.numel()]
    return blocks, scales


def q8_0_codes(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Every int8 code, and float16 scales of both signs with a subnormal one and the largest."""
    codes = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    codes.view(-1)[: min(codes.numel(), 256)] = torch.arange(-128, 128, dtype=torch.int8)[: min(codes.numel(), 256)]
    scales = (torch.randn((n, k // 32), generator=g) * 0.01).half()
    scales.view(-1)[:2] = torch.tensor([2.0 ** -20, -65504.0], dtype=torch.float16)[: scales.numel()]
    return codes, scales


QUANTIZED = {"fp8": fp8_codes, "mxfp4": mxfp4_codes, "q8_0": q8_0_codes}


def code_values_and_scales(fmt: str, w: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(the codes' exact values [N, K] float32, each row's group scales [N, G] float32, the group's columns)."""
    if fmt == "fp8":
        n, k = w.shape
        return w.float(), scale.repeat_interleave(128, dim=0)[:n], 128
    if fmt == "mxfp4":
        return dequantize_mxfp4(w, torch.full_like(scale, 127), torch.float32), torch.ldexp(torch.ones(scale.shape), scale.int() - 127), 32
    return w.float(), scale.float(), 32


def grouped_lanes_in_order(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, group: int,
                           paired: bool = False) -> torch.Tensor:
    """The kernel's order for quantized weights, one IEEE float32 operation at a time: per group of columns, the
    products x * code summed in 16 lanes from zero, times the group's scale, added to the running lanes; then the
    lanes folded 8, 4, 2, 1. Lane l takes columns l, l + 16, ... of a group, or where `paired` (MXFP4, whose byte
    holds two codes) its columns 2l, then 2l + 1."""
    if paired:  # a group's even columns, then its odd ones
        order = torch.arange(x.shape[1]).view(-1, LANES, 2).transpose(1, 2).reshape(-1)
        x, codes = x[:, order], codes[:, order]
    m, k = x.shape
    products = x[:, None, :] * codes[None, :, :]  # [M, N, K]
    acc = torch.zeros((m, codes.shape[0], LANES))
    for g, start in enumerate(range(0, k, group)):
        part = torch.zeros_like(acc)
        for step in range(start, min(start + group, k), LANES):
            part = part + products[:, :, step : step + LANES]
        acc = acc + part * scales[None, :, g, None]
    half = LANES // 2
    while half:
        acc = acc[..., :half] + acc[..., half : 2 * half]
        half //= 2
    return acc[..., 0]


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_each_code_times_its_scale_is_its_dequantized_value(fmt):
    """x = the identity: out[m, n] = code(n, m) * scale alone (the other products are zeros), so every weight the
    kernel reads is compared with `dequantize_weight`'s float32 value, code by code."""
    g = torch.Generator().manual_seed(7)
    w, scale = QUANTIZED[fmt](40, 256, g)
    dense = dequantize_weight(w, scale, torch.float32)  # [40, 256]
    out = rows_matmul(torch.eye(256), w, scale)  # [256, 40]
    assert torch.equal(out, dense.T)


@pytest.mark.parametrize("at", [0, 5, 1 << 22, (2 << 22) + 3, (9 << 20) - 1])
@pytest.mark.parametrize("nan", [0x7F, 0xFF])
def test_the_scan_finds_a_nan_code_anywhere(at, nan):
    """Each of e4m3fn's two NaNs, at the start, inside, at a chunk's edge of the team's split and at the end."""
    codes = torch.randint(0, 256, (9 << 20,), dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E
    assert not fp8_nan_codes(codes.view(torch.float8_e4m3fn))
    codes[at] = nan
    assert fp8_nan_codes(codes.view(torch.float8_e4m3fn))


def test_a_bank_with_a_nan_code_goes_to_torchs_kernel_and_stays_nan():
    """The native kernel reads NaN codes as finite (it spares each weight the check): such a bank is scanned at
    load and computed by torch's plain kernel, whose NaN weights give NaN outputs; a clean bank stays native."""
    g = torch.Generator().manual_seed(3)
    gate_up, gu_scale = fp8_codes(2 * 64, 128, g)
    down, dn_scale = fp8_codes(128, 64, g)
    bank = {"gate_up": torch.stack([gate_up, gate_up]), "down": torch.stack([down, down]),
            "gate_up_scale": torch.stack([gu_scale, gu_scale]), "down_scale": torch.stack([dn_scale, dn_scale])}
    assert CpuExperts(bank, native_experts_mlp).kernel is native_experts_mlp
    bank["down"].view(torch.uint8)[1, 3, 7] = 0xFF
    experts = CpuExperts(bank, native_experts_mlp)
    assert experts.kernel is CPU_EXPERT_KERNELS["plain"]
    out = experts.rows(torch.randn(1, 128, generator=g).bfloat16(), torch.tensor([0, 1]), [1, 1], [0, 1], top_k=2)
    assert out[0].isfinite().all() and out[1, 3].isnan()


# rows' codes shorter than a page (page-strided blocks), a page or more, matrices of whole spans and remainders;
# FP8 groups cut short at the row's end (K = 96, 2080)
@pytest.mark.parametrize("fmt", QUANTIZED)
@pytest.mark.parametrize("m, n, k", [(1, 64, 32), (3, 37, 96), (2, 130, 256), (2, 40, 2048), (1, 35, 4096),
                                     (5, 300, 768), (1, 20, 2080)])
def test_a_quantized_weight_computes_its_documented_order_bit_for_bit(fmt, m, n, k):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    w, scale = QUANTIZED[fmt](n, k, g)
    x = torch.randn((m, k), generator=g)
    out = rows_matmul(x, w, scale)
    assert torch.equal(out, grouped_lanes_in_order(x, *code_values_and_scales(fmt, w, scale), paired=fmt == "mxfp4"))
    exact = x.double() @ dequantize_weight(w, scale, torch.float64 if fmt != "fp8" else torch.float32).double().T
    bound = (x.double().abs() @ dequantize_weight(w, scale, torch.float32).double().abs().T) * (k + 2) * 2 ** -23
    assert ((out.double() - exact).abs() <= bound).all()


def quantize(fmt: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A plain weight [..., N, K] in `fmt` (the formats' own writers)."""
    return {"fp8": quantize_blocks, "mxfp4": quantize_mxfp4, "q8_0": quantize_q8_0}[fmt](w)


@pytest.mark.parametrize("fmt", QUANTIZED)
@pytest.mark.parametrize("activation, biased", [(Activation(), False), (Activation("clamped_swiglu"), True)])
def test_a_layers_quantized_experts_are_close_to_their_dequantized_copies(fmt, activation, biased):
    """Whole in native code (SiLU, no biases) or with torch's activation and biases between the native GEMVs: a
    layer's quantized experts give each expert's bits alone, within float32 sums of torch on the float32
    dequantized weights."""
    g = torch.Generator().manual_seed(11)
    d, i, counts = 64, 32, [2, 0, 1]
    gate_ups = [quantize(fmt, torch.randn((2 * i, d), generator=g) / d ** 0.5) for _ in counts]
    downs = [quantize(fmt, torch.randn((d, i), generator=g) / i ** 0.5) for _ in counts]
    biases = [(torch.randn(2 * i, generator=g), torch.randn(d, generator=g)) if biased else (None, None) for _ in counts]
    extras = [ExpertExtras(gu[1], dn[1], *b) for gu, dn, b in zip(gate_ups, downs, biases)]
    x = torch.randn((sum(counts), d), generator=g).bfloat16()
    assert all(applies(gu[0], dn[0], ex) for gu, dn, ex in zip(gate_ups, downs, extras))
    out = native_experts_mlp(x, counts, [gu[0] for gu in gate_ups], [dn[0] for dn in downs], extras, activation)
    alone = one_at_a_time(lambda *a: native_experts_mlp(a[0], [a[0].shape[0]], [a[1]], [a[2]], [a[3]], a[4]))
    assert torch.equal(out, alone(x, counts, [gu[0] for gu in gate_ups], [dn[0] for dn in downs], extras, activation))
    start = 0
    for n, gu, dn, b in zip(counts, gate_ups, downs, biases):
        ref = plain_expert_mlp(x[start : start + n].float(), dequantize_weight(*gu, torch.float32),
                               dequantize_weight(*dn, torch.float32), ExpertExtras(None, None, *b), activation)
        torch.testing.assert_close(out[start : start + n], ref, rtol=1e-4, atol=1e-5)
        start += n


def test_quantized_weights_it_cannot_read_are_refused_or_go_to_torch():
    w, scale = quantize_q8_0(torch.randn(64, 32))
    with pytest.raises(RuntimeError, match=r"scales of a Q8_0 weight \[64, 32\] are contiguous Half \[64, 1\]; got Float"):
        rows_matmul(torch.randn(1, 32), w, scale.float())
    with pytest.raises(RuntimeError, match="got Float with scales"):  # float32 weights have no quantized format
        rows_matmul(torch.randn(1, 32), w.float(), scale)
    with pytest.raises(RuntimeError, match=r"scales of a Q8_0 weight \[64, 32\] .*got Half \[64, 0\]"):
        rows_matmul(torch.randn(1, 32), w, scale[:, :0])
    with pytest.raises(RuntimeError, match="whole groups of 32 values; got K = 48"):  # past its rows' scales
        rows_matmul(torch.ones(1, 48), torch.ones(4, 48, dtype=torch.int8), torch.ones(4, 1, dtype=torch.float16))
    assert not applies(w[:, :16], w[:, :16], ExpertExtras(scale[:, :0], scale[:, :0]))  # K = 16: torch's instead
    assert not applies(w, w, ExpertExtras(scale.float(), scale.float()))
    fp8, fp8_scale = quantize_blocks(torch.randn(64, 32))
    assert not applies(fp8, w, ExpertExtras(fp8_scale, scale))  # two formats in one expert


def test_experts_in_different_formats_go_to_torchs_kernel():
    g = torch.Generator().manual_seed(12)
    x = torch.randn((2, 32), generator=g).bfloat16()
    (gu8, su8), (dn8, sd8) = quantize_blocks(torch.randn(64, 32, generator=g)), quantize_blocks(torch.randn(32, 32, generator=g))
    gu, dn = torch.randn(64, 32, generator=g).bfloat16(), torch.randn(32, 32, generator=g).bfloat16()
    for order in ((0, 1), (1, 0)):  # an FP8 expert and a bf16 one, either first
        experts = [([gu8, gu][i], [dn8, dn][i], [ExpertExtras(su8, sd8), None][i]) for i in order]
        out = native_experts_mlp(x, [1, 1], *map(list, zip(*experts)))
        assert torch.equal(out, one_at_a_time(plain_expert_mlp)(x, [1, 1], *map(list, zip(*experts))).float())


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_a_quantized_weights_bits_do_not_depend_on_the_thread_count(fmt):
    g = torch.Generator().manual_seed(13)
    w, scale = QUANTIZED[fmt](1000, 512, g)
    x = torch.randn((2, 512), generator=g)
    assert_the_same_on_one_thread_and_more(lambda: rows_matmul(x, w, scale))
