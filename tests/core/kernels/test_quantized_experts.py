"""Quantized experts (FP8 block-scaled, MXFP4, Q8_0) in every store: the scales travel with the weights (one bank,
paged together), the torch kernels dequantize right before the GEMMs, so every mode gives torch.equal
outputs, and equal to a plain bank holding the dequantized weights; the Triton kernels dequantize in-kernel, FP8 to
the same bits, MXFP4 and Q8_0 to close ones (they sum their steps in another order). Run with --wisp-device cuda on
the GPU machine."""

from __future__ import annotations

import pytest
import torch

from wisp.core.bank_keys import DOWN, GATE_UP
from tests.core.experts.stores import every_mode, resident_store
from wisp.core.kernels.fp8_blocks import dequantize_blocks, quantize_blocks
from wisp.core.kernels.expert_extras import DOWN_SCALE, GATE_UP_SCALE, ExpertExtras
from wisp.core.kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from wisp.core.kernels.q8_0 import dequantize_q8_0, quantize_q8_0

D, I = 256, 128  # two 128-blocks of the hidden size, one of the expert's width
STEPS = [1, 1, 9, 1, 2, 1, 14, 1]  # decode-like and wide steps


FORMATS = {"fp8": (quantize_blocks, dequantize_blocks), "mxfp4": (quantize_mxfp4, dequantize_mxfp4),
           "q8_0": (quantize_q8_0, dequantize_q8_0)}


def quantized_bank(n: int, seed: int, fmt: str = "fp8") -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(a quantized bank with its scales, the plain bf16 bank of its dequantized weights)."""
    quantize, dequantize = FORMATS[fmt]
    g = torch.Generator().manual_seed(seed)
    gate_up, gate_up_scale = quantize(torch.randn(n, 2 * I, D, generator=g) * 0.05)
    down, down_scale = quantize(torch.randn(n, D, I, generator=g) * 0.05)
    bank = {GATE_UP: gate_up, DOWN: down, GATE_UP_SCALE: gate_up_scale, DOWN_SCALE: down_scale}
    plain = {GATE_UP: dequantize(gate_up, gate_up_scale, torch.bfloat16), DOWN: dequantize(down, down_scale, torch.bfloat16)}
    return bank, plain


def batch(n: int, t: int, k: int, seed: int, device):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(t, D, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)])
    weights = torch.softmax(torch.randn(t, k, generator=g), -1).to(torch.bfloat16)
    return hidden.to(device), ids.to(device), weights.to(device)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("n, k, cap", [(8, 2, 2), (8, 2, 5), (16, 4, 4)])
def test_every_mode_on_quantized_experts_equals_resident_on_their_dequantized_weights(device, fmt, n, k, cap):
    dev = torch.device(device)
    bank, plain = quantized_bank(n, 0, fmt)
    reference = resident_store({name: t.to(dev) for name, t in plain.items()})
    _, stores = every_mode(bank, cap, dev)
    for step, t in enumerate(STEPS):
        hidden, ids, weights = batch(n, t, k, 100 + step, dev)
        ref = reference.forward(hidden, ids, weights)
        for mode, store in stores.items():
            out = store.forward(hidden, ids, weights)
            if mode == "hybrid" and dev.type == "cuda":  # the CPU's GEMM rounds its pairs
                torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
            else:
                assert torch.equal(out, ref), (mode, step)
    pager = stores["paged"].residency.pager
    pager.check_integrity()  # the slots hold the masters' bytes, scales included
    packed = {"fp8": 3 * I * D + 4 * (2 * 2 + 2 * 1), "mxfp4": 3 * I * D // 2 + 3 * I * D // 32,
              "q8_0": 3 * I * D + 2 * 3 * I * D // 32}
    assert pager.expert_bytes == packed[fmt]  # quantized bytes plus scales: what crosses the link
    assert stores["hybrid"].counters.cpu_computed > 0


@pytest.mark.slow
@pytest.mark.parametrize("fmt, d, inter", [("fp8", 256, I), ("fp8", 200, I), ("fp8", 256, 200), ("mxfp4", 256, I),
                                           ("q8_0", 256, I), ("q8_0", 224, 96)])
def test_the_triton_kernels_dequantize_in_kernel_to_the_bits_of_the_dequantized_weights(fmt, d, inter):
    # d = 200: a partial last FP8 block of columns; inter = 200: the up rows (after the gate's 200) start inside
    # a 128-row block, so one tile's rows take scales from two blocks, and the down's last block is partial
    pytest.importorskip("triton")
    from wisp.core.kernels.moe import fused_moe
    from wisp.core.kernels.triton_moe import triton_fused_moe, triton_pairs_by_map, triton_pairs_of_one_expert

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: Triton's interpreter
    quantize, dequantize = FORMATS[fmt]
    g = torch.Generator().manual_seed(d)
    n, k, t = 4, 2, 2
    gate_up, gs = quantize(torch.randn(n, 2 * inter, d, generator=g) * 0.05)
    down, ds = quantize(torch.randn(n, d, inter, generator=g) * 0.05)
    plain_gate_up, plain_down = dequantize(gate_up, gs, torch.bfloat16).to(dev), dequantize(down, ds, torch.bfloat16).to(dev)
    gate_up, gs, down, ds = (x.to(dev) for x in (gate_up, gs, down, ds))
    hidden = torch.randn(t, d, generator=g).to(torch.bfloat16).to(dev)
    ids = torch.tensor([[0, 2], [3, 2]], device=dev)
    weights = torch.softmax(torch.randn(t, k, generator=g), -1).to(torch.bfloat16).to(dev)
    emap = torch.tensor([0, -1, 1, 2], dtype=torch.int32, device=dev)  # expert 1 absent; slots 0..2 hold 0, 2, 3
    slots = [0, 2, 3]
    extras = ExpertExtras(gs[slots], ds[slots])
    got = triton_fused_moe(hidden, gate_up[slots], down[slots], ids, weights, emap, extras=extras)
    twin = triton_fused_moe(hidden, plain_gate_up[slots], plain_down[slots], ids, weights, emap)
    # MXFP4 sums a step's even columns, then its odd ones; Q8_0 steps 32 columns at a time, plain weights 128
    exact = dev.type == "cpu" and fmt == "fp8"
    assert torch.equal(got, twin) if exact else torch.allclose(got, twin, rtol=1e-2, atol=1e-2)
    reference = fused_moe(hidden, gate_up[slots], down[slots], ids, weights, emap, extras=extras)
    torch.testing.assert_close(got, reference, rtol=2e-2, atol=2e-2)
    one, plain = (torch.zeros((t * k, d), device=dev) for _ in range(2))
    pairs = torch.tensor([1, 3], device=dev)  # both pairs routed to expert 2
    triton_pairs_of_one_expert(one, hidden, gate_up[2], down[2], pairs, k, extras=ExpertExtras(gs[2], ds[2]))
    triton_pairs_of_one_expert(plain, hidden, plain_gate_up[2], plain_down[2], pairs, k)
    by_map = torch.zeros_like(one)
    triton_pairs_by_map(by_map, hidden, gate_up[slots], down[slots], ids, emap, extras=extras)
    assert torch.equal(one[pairs], by_map[pairs]) and one[1].abs().sum() > 0  # within a format: paged == resident
    if exact:  # the interpreter sums in one order whatever the weights' dtype
        assert torch.equal(one, plain)
    else:  # compiled: the dequantized tiles enter the same tensor-core products, but a layout that follows the
        torch.testing.assert_close(one, plain, rtol=1e-4, atol=1e-5)  # load's dtype may order them otherwise


def test_unknown_quantized_weights_and_unscaled_ones_are_refused_naming_the_formats():
    from wisp.core.kernels.quantized_weights import dequantize_weight

    with pytest.raises(ValueError, match=r"float32 \(FP8 block-scaled\), .* \(MXFP4\), int8 with float16 \(Q8_0\), "
                                         r"uint8 codes with uint8 heads .* \(Q4_K, Q5_K, Q6_K\)"):
        dequantize_weight(torch.zeros(4, 4, dtype=torch.int16), torch.ones(1, 1), torch.bfloat16)
    pytest.importorskip("triton")
    from wisp.core.kernels.triton_moe import triton_pairs_of_one_expert

    bank, _ = quantized_bank(2, 1, "mxfp4")
    with pytest.raises(ValueError, match="must be torch.bfloat16 like hidden, or quantized with their scales .none given."):
        triton_pairs_of_one_expert(torch.zeros((2, D)), torch.zeros((1, D), dtype=torch.bfloat16), bank[GATE_UP][0],
                                   bank[DOWN][0], torch.tensor([0, 1]), 2)


@pytest.mark.slow
def test_the_triton_mxfp4_tiles_decode_every_byte_and_scale_to_the_dequantized_bits():
    # every byte value in both nibble orders, and scales from tiny to large (the bit-built e2m1 codes, the sign of
    # code 8, which nibble is the even column): the kernel's output is the plain twin's up to the order of its sums
    pytest.importorskip("triton")
    from wisp.core.kernels.triton_moe import triton_pairs_of_one_expert

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(7)
    d, inter = 256, 64  # a gate_up row holds 128 bytes: all 256 byte values over two rows
    gate_up = torch.randperm(256, generator=g).to(torch.uint8).reshape(2, 128).repeat(inter, 1)  # [2I, D/2]
    gate_up = gate_up.reshape(2 * inter, d // 32, 16)
    gate_up_scale = torch.randint(100, 140, (2 * inter, d // 32), generator=g, dtype=torch.uint8)
    down = torch.randint(0, 256, (d, inter // 32, 16), generator=g, dtype=torch.uint8)
    down_scale = torch.randint(110, 130, (d, inter // 32), generator=g, dtype=torch.uint8)
    plain = [dequantize_mxfp4(w, s, torch.bfloat16) for w, s in ((gate_up, gate_up_scale), (down, down_scale))]
    hidden = (torch.randn(3, d, generator=g) * 2.0 ** -12).to(torch.bfloat16)
    pairs = torch.tensor([0, 2, 5])
    got, want = torch.zeros((6, d), device=dev), torch.zeros((6, d), device=dev)
    on = (lambda *ts: [t.to(dev) for t in ts])
    triton_pairs_of_one_expert(got, *on(hidden, gate_up, down, pairs), 2, extras=ExpertExtras(*on(gate_up_scale, down_scale)))
    triton_pairs_of_one_expert(want, *on(hidden, *plain, pairs), 2)
    assert torch.isfinite(want).all() and want[pairs].abs().sum() > 0
    # the same products, summed even columns first (MXFP4) where the twin sums in column order
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


@pytest.mark.parametrize("loads", [2, 4])
def test_mxfp4_steps_read_in_one_wide_load_keep_the_bits(loads):
    """`Blocks.loads` steps' bytes read in one load a row (for the link where the bank is read in place from host
    memory), each step then computed as alone: the outputs equal one load a step, bit for bit, also where the last
    load runs past the row (D = 192: three 64-column steps; I = 96: two). With CUDA the bank is pinned host memory
    read in place; without, Triton's interpreter reads it on the CPU."""
    pytest.importorskip("triton")
    from dataclasses import replace

    import wisp.core.kernels.triton_moe as moe

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: Triton's interpreter
    g = torch.Generator().manual_seed(loads)
    d, inter, n, t, k = 192, 96, 3, 2, 2
    gate_up, gs = quantize_mxfp4(torch.randn(n, 2 * inter, d, generator=g) * 0.05)
    down, ds = quantize_mxfp4(torch.randn(n, d, inter, generator=g) * 0.05)
    gate_up, gs, down, ds = (x.pin_memory() if dev.type == "cuda" else x for x in (gate_up, gs, down, ds))
    hidden = torch.randn(t, d, generator=g).to(torch.bfloat16).to(dev)
    ids, weights = torch.tensor([[0, 2], [1, 2]], device=dev), torch.full((t, k), 0.5, dtype=torch.bfloat16, device=dev)
    emap = torch.arange(n, dtype=torch.int32, device=dev)
    default = moe.TILES[2]
    outs = []
    try:
        for tiles in ((replace(default[0], loads=1), replace(default[1], loads=1)),
                      (replace(default[0], loads=loads), replace(default[1], loads=loads))):
            moe.TILES[2] = tiles
            outs.append(moe.triton_fused_moe(hidden, gate_up, down, ids, weights, emap, extras=ExpertExtras(gs, ds)))
    finally:
        moe.TILES[2] = default
    assert outs[0].abs().sum() > 0 and torch.equal(outs[0], outs[1])
