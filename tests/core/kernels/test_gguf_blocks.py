"""llama.cpp's block formats in torch give the `gguf` package's dequantized floats, bit for bit, on random blocks
(every code and scale bit pattern; the float16 scales finite)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wisp.core.kernels.gguf_blocks import BLOCKS, dequantize

gguf = pytest.importorskip("gguf")
SCALES = {"Q8_0": [(0, 2)], "Q4_K": [(0, 2), (2, 4)], "Q5_K": [(0, 2), (2, 4)], "Q6_K": [(208, 210)]}  # float16 fields


def random_blocks(qtype: str, rows: int, blocks_a_row: int, seed: int) -> np.ndarray:
    values, nbytes = BLOCKS[qtype]
    g = np.random.default_rng(seed)
    raw = g.integers(0, 256, size=(rows, blocks_a_row, nbytes), dtype=np.uint8)
    for lo, hi in SCALES[qtype]:  # finite float16 scales of either sign
        raw[..., lo:hi] = (g.standard_normal((rows, blocks_a_row)) * 0.01).astype(np.float16).view(np.uint8).reshape(
            rows, blocks_a_row, 2)
    return raw.reshape(rows, blocks_a_row * nbytes)


@pytest.mark.parametrize("qtype", list(BLOCKS))
@pytest.mark.parametrize("rows, blocks_a_row", [(1, 1), (3, 4)])
def test_the_gguf_packages_floats_bit_for_bit(qtype, rows, blocks_a_row):
    raw = random_blocks(qtype, rows, blocks_a_row, seed=rows * 10 + blocks_a_row)
    want = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).copy())
    got = dequantize(torch.from_numpy(raw), qtype)
    assert got.shape == (rows, blocks_a_row * BLOCKS[qtype][0]) and torch.equal(got, want)


def test_stacked_experts_keep_their_leading_dims():
    raw = random_blocks("Q4_K", 6, 2, seed=3)
    got = dequantize(torch.from_numpy(raw).view(2, 3, -1), "Q4_K")
    assert got.shape == (2, 3, 512) and torch.equal(got.view(6, 512), dequantize(torch.from_numpy(raw), "Q4_K"))


def test_other_formats_and_partial_blocks_are_refused():
    with pytest.raises(ValueError, match="unsupported block format 'IQ2_XXS'; supported: Q8_0, Q4_K, Q5_K, Q6_K"):
        dequantize(torch.zeros(1, 66, dtype=torch.uint8), "IQ2_XXS")
    with pytest.raises(ValueError, match="whole 144-byte blocks"):
        dequantize(torch.zeros(1, 100, dtype=torch.uint8), "Q4_K")


@pytest.mark.parametrize("qtype", sorted(BLOCKS))
def test_the_blocks_are_decoded_on_their_own_device(qtype):
    """Every constant the decoding makes lives on the codes' device: codes on another device than the CPU (here
    "meta", on a GPU "cuda") decode there, where a CPU constant beside them is an error."""
    values, nbytes = BLOCKS[qtype]
    got = dequantize(torch.zeros(3, 2 * nbytes, dtype=torch.uint8, device="meta"), qtype)
    assert got.device.type == "meta" and got.shape == (3, 2 * values) and got.dtype == torch.float32
