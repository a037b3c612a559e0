"""k-quant experts kept packed (`wisp.core.kernels.k_quants`): the bank's codes and heads are the file's bytes, they
dequantize to the `gguf` package's floats, every store pages them and equals a resident bank of the dequantized
weights (torch kernels: bit for bit), and the Triton kernels decode them in-kernel to the dequantized values (the
interpreter: the bits of the same launch on the dequantized twin; compiled: close), a row's output the same alone or
in a batch. gate_up and down may be in different types (a Q4_K_M file's Q6_K down). Run with --wisp-device cuda on the
GPU machine."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tests.core.experts.stores import every_mode, resident_store
from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.kernels.expert_extras import DOWN_SCALE, GATE_UP_SCALE, ExpertExtras
from wisp.core.kernels.gguf_blocks import BLOCKS, block_bytes, dequantize
from wisp.core.kernels.k_quants import K_QUANTS, dequantize_k_quant, format_of_codes, join_blocks, split_blocks
from wisp.core.kernels.quantized_weights import dequantize_weight, weight_format

try:
    import triton
    import triton.language as tl

    from wisp.core.kernels.triton_k_quants import k_quant_tile

    @triton.jit
    def _tiles(w, sc, out, R, COLS: tl.constexpr, FMT: tl.constexpr):
        """out [R, COLS] = the weight's tiles, 32 columns at a time (4 rows a program, those past R masked)."""
        rows = tl.arange(0, 4)
        for col0 in range(0, COLS, 32):
            tile = k_quant_tile(w, sc, rows, rows < R, col0, COLS, FMT, 0)
            tl.store(out + rows[:, None] * COLS + col0 + tl.arange(0, 32)[None, :], tile, mask=(rows < R)[:, None])
except ImportError:
    triton = None

D, I = 512, 256  # two super-blocks of the hidden size, one of the expert's width
ROLES = [("Q4_K", "Q6_K"), ("Q5_K", "Q5_K"), ("Q6_K", "Q4_K")]  # (gate_up, down): Q4_K_M's mix first
HALVES = {"Q4_K": [(0, 2), (2, 4)], "Q5_K": [(0, 2), (2, 4)], "Q6_K": [(208, 210)]}  # float16 fields of a block


def random_rows(qtype: str, shape: tuple[int, ...], depth: int, g: torch.Generator, d_scale: float = 1e-3):
    """Random file bytes of `shape` rows of `depth` values in `qtype`, uint8 [*shape, bytes a row]: every code and scale
    bit random, the float16 fields finite (d of about d_scale, either sign)."""
    values, nbytes = BLOCKS[qtype]
    rows = int(np.prod(shape))
    raw = torch.randint(0, 256, (rows, depth // values, nbytes), generator=g, dtype=torch.uint8)
    for lo, hi in HALVES[qtype]:
        raw[..., lo:hi] = (torch.randn(rows, depth // values, generator=g) * d_scale).half().unsqueeze(-1).view(torch.uint8)
    return raw.reshape(*shape, -1)


def k_quant_bank(n: int, roles: tuple[str, str], seed: int):
    """(a bank of k-quant experts, roles' types as given, and the bf16 bank of their dequantized weights)."""
    g = torch.Generator().manual_seed(seed)
    gate_up, gs = split_blocks(random_rows(roles[0], (n, 2 * I), D, g), roles[0])
    down, ds = split_blocks(random_rows(roles[1], (n, D), I, g), roles[1])
    bank = {GATE_UP: gate_up, DOWN: down, GATE_UP_SCALE: gs, DOWN_SCALE: ds}
    plain = {GATE_UP: dequantize_k_quant(gate_up, gs), DOWN: dequantize_k_quant(down, ds)}
    return bank, plain


@pytest.mark.parametrize("qtype", list(K_QUANTS))
def test_codes_and_heads_are_the_files_bytes_and_dequantize_to_the_gguf_packages_floats(qtype):
    gguf = pytest.importorskip("gguf")
    raw = random_rows(qtype, (3, 2), 512, torch.Generator().manual_seed(1))  # [3, 2, 2 blocks' bytes]
    codes, heads = split_blocks(raw, qtype)
    k = K_QUANTS[qtype]
    assert codes.shape == (3, 2, 2, k.code_bytes) and heads.shape == (3, 2, 2, k.head_bytes)
    assert codes.numel() + heads.numel() == raw.numel() == block_bytes(qtype, 6, 512)
    assert torch.equal(join_blocks(codes, heads), raw)
    want = torch.from_numpy(gguf.quants.dequantize(raw.reshape(6, -1).numpy(), gguf.GGMLQuantizationType[qtype]).copy())
    assert torch.equal(dequantize_k_quant(codes, heads, torch.float32).reshape(6, 512), want)
    assert torch.equal(dequantize_weight(codes[0], heads[0], torch.bfloat16), want[:2].to(torch.bfloat16))
    assert weight_format(codes, heads) == qtype.lower() and format_of_codes(codes, heads) == k


def test_codes_whose_heads_do_not_fit_are_no_format():
    codes, heads = split_blocks(random_rows("Q4_K", (2,), 256, torch.Generator().manual_seed(0)), "Q4_K")
    assert format_of_codes(codes, heads[..., :15]) is None and format_of_codes(codes, heads[:1]) is None
    with pytest.raises(ValueError, match="no quantized expert format stores a weight torch.uint8 .2, 1, 128. with a "
                                         "scale torch.uint8 .2, 1, 15."):
        weight_format(codes, heads[..., :15])
    with pytest.raises(ValueError, match="Q4_K rows must be a multiple of 256 long, got 384"):
        from wisp.core.kernels.k_quants import bank_shapes
        bank_shapes(2, 384, "Q4_K")


@pytest.mark.parametrize("roles", ROLES)
def test_every_mode_on_k_quant_experts_equals_resident_on_their_dequantized_weights(device, roles):
    dev, n, k, cap = torch.device(device), 8, 2, 3
    bank, plain = k_quant_bank(n, roles, 0)
    reference = resident_store({name: t.to(dev) for name, t in plain.items()})
    _, stores = every_mode(bank, cap, dev)
    g = torch.Generator().manual_seed(5)
    for step, t in enumerate([1, 9, 1, 14, 2]):
        hidden = (torch.randn(t, D, generator=g) * 0.1).to(torch.bfloat16).to(dev)
        ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)]).to(dev)
        weights = torch.softmax(torch.randn(t, k, generator=g), -1).to(torch.bfloat16).to(dev)
        ref = reference.forward(hidden, ids, weights)
        assert ref.abs().sum() > 0
        for mode, store in stores.items():
            out = store.forward(hidden, ids, weights)
            if dev.type == "cuda":  # compiled: another sum order than the dequantized twin's (and the CPU's GEMM)
                torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))
            else:
                assert torch.equal(out, ref), (mode, step)
    pager = stores["paged"].residency.pager
    pager.check_integrity()  # the slots hold the masters' bytes, heads included
    assert pager.expert_bytes == block_bytes(roles[0], 2 * I, D) + block_bytes(roles[1], D, I)  # the file's bytes
    assert stores["hybrid"].counters.cpu_computed > 0


@pytest.mark.parametrize("roles", ROLES)
def test_the_triton_kernels_decode_k_quants_in_kernel_to_the_dequantized_values(roles):
    """Interpreted, with the plain weights' launch made the k-quants' (32 columns a step), the outputs equal the
    dequantized twin's bit for bit (the same values enter the same products in the same order); compiled, close. A
    token's row is the same alone as in the batch, and a slot's as one expert's."""
    pytest.importorskip("triton")
    import wisp.core.kernels.triton_moe as moe
    from wisp.core.kernels.moe import fused_moe

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: Triton's interpreter
    n, k, t = 4, 2, 3
    bank, plain = k_quant_bank(n, roles, 7)
    bank, plain = ({name: x.to(dev) for name, x in b.items()} for b in (bank, plain))
    g = torch.Generator().manual_seed(3)
    hidden = (torch.randn(t, D, generator=g) * 0.1).to(torch.bfloat16).to(dev)
    ids = torch.tensor([[0, 2], [3, 2], [1, 0]], device=dev)
    weights = torch.softmax(torch.randn(t, k, generator=g), -1).to(torch.bfloat16).to(dev)
    emap = torch.tensor([0, 3, 1, 2], dtype=torch.int32, device=dev)  # logical -> slot
    order = [0, 2, 3, 1]  # slot -> logical
    extras = ExpertExtras(bank[GATE_UP_SCALE][order], bank[DOWN_SCALE][order])
    got = moe.triton_fused_moe(hidden, bank[GATE_UP][order], bank[DOWN][order], ids, weights, emap, extras=extras)
    default = moe.TILES[0]
    moe.TILES[0] = (moe.TILES[moe.FORMAT_IDS[roles[0].lower()]][0], moe.TILES[moe.FORMAT_IDS[roles[1].lower()]][1])
    try:
        twin = moe.triton_fused_moe(hidden, plain[GATE_UP][order], plain[DOWN][order], ids, weights, emap)
    finally:
        moe.TILES[0] = default
    assert got.abs().sum() > 0
    if dev.type == "cpu":
        assert torch.equal(got, twin)
    else:
        torch.testing.assert_close(got, twin, rtol=1e-2, atol=1e-2 * float(twin.abs().max()))
    reference = fused_moe(hidden, bank[GATE_UP], bank[DOWN], ids, weights, extras=ExpertExtras(bank[GATE_UP_SCALE],
                                                                                                bank[DOWN_SCALE]))
    torch.testing.assert_close(got, reference, rtol=2e-2, atol=2e-2 * float(reference.abs().max()))
    alone = moe.triton_fused_moe(hidden[1:2], bank[GATE_UP][order], bank[DOWN][order], ids[1:2], weights[1:2], emap,
                                 extras=extras)
    assert torch.equal(alone[0], got[1])
    one, by_map = (torch.zeros((t * k, D), device=dev) for _ in range(2))
    pairs = torch.tensor([1, 3], device=dev)  # both routed to expert 2
    moe.triton_pairs_of_one_expert(one, hidden, bank[GATE_UP][2], bank[DOWN][2], pairs, k,
                                   extras=ExpertExtras(bank[GATE_UP_SCALE][2], bank[DOWN_SCALE][2]))
    moe.triton_pairs_by_map(by_map, hidden, bank[GATE_UP][order], bank[DOWN][order], ids, emap, extras=extras)
    assert torch.equal(one[pairs], by_map[pairs]) and one[1].abs().sum() > 0


def test_a_k_quant_tile_decodes_every_sub_block_of_every_format_to_the_reference():
    """The Triton tile (`k_quant_tile`), 32 columns at a time over whole rows: each format's values equal
    `gguf_blocks.dequantize`'s (float32, interpreted or compiled), masked rows left alone."""
    if triton is None:
        pytest.skip("no triton")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for fmt, qtype in enumerate(K_QUANTS, start=4):
        raw = random_rows(qtype, (3,), 512, torch.Generator().manual_seed(fmt))
        codes, heads = split_blocks(raw, qtype)
        out = torch.full((3, 512), 7.0, device=dev)
        _tiles[(1,)](codes.to(dev), heads.to(dev), out, 3, COLS=512, FMT=fmt)
        assert torch.equal(out.cpu(), dequantize(raw, qtype)), qtype



@pytest.mark.parametrize("roles", ROLES)
def test_a_super_blocks_codes_read_in_one_load_keep_the_bits(roles):
    """`Blocks.loads` = 8: a bank read in place loads a super-block's codes a row at once (for the link's sake), each
    of its 8 steps then computed as alone: the outputs equal one load a step, bit for bit (the k-quants' launch with
    loads 1). With CUDA the bank is pinned host memory read in place; without, Triton's interpreter reads it."""
    pytest.importorskip("triton")
    import wisp.core.kernels.triton_moe as moe

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n, k, t = 3, 2, 2
    bank, _ = k_quant_bank(n, roles, 9)
    bank = {name: x.pin_memory() if dev.type == "cuda" else x for name, x in bank.items()}
    g = torch.Generator().manual_seed(4)
    hidden = (torch.randn(t, D, generator=g) * 0.1).to(torch.bfloat16).to(dev)
    ids, weights = torch.tensor([[0, 2], [1, 2]], device=dev), torch.full((t, k), 0.5, dtype=torch.bfloat16, device=dev)
    emap = torch.arange(n, dtype=torch.int32, device=dev)
    formats = [moe.FORMAT_IDS[r.lower()] for r in roles]
    defaults = {f: moe.TILES[f] for f in formats}
    outs = []
    try:
        for loads in (1, 8):
            for f in formats:
                moe.TILES[f] = tuple(replace(b, loads=loads) for b in defaults[f])
            outs.append(moe.triton_fused_moe(hidden, bank[GATE_UP], bank[DOWN], ids, weights, emap,
                                             extras=ExpertExtras(bank[GATE_UP_SCALE], bank[DOWN_SCALE])))
    finally:
        moe.TILES.update(defaults)
    assert outs[0].abs().sum() > 0 and torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("qtype", [*K_QUANTS, "Q8_0"])
def test_a_dense_projection_in_a_gguf_block_format_gives_its_dequantized_bits(qtype):
    """`triton_linear` on a `BlockWeight`: interpreted, the bits of the dequantized weight under the same tile (32
    columns a step), in either schedule; compiled, close; a row's output the same alone as in the batch."""
    pytest.importorskip("triton")
    from wisp.core.kernels.q8_0 import quantize_q8_0
    from wisp.core.kernels.quantized_weights import BlockWeight
    from wisp.core.kernels.triton_linear import tile_for, triton_linear

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(21)
    n, k = 96, 512
    if qtype == "Q8_0":
        weight = BlockWeight(*quantize_q8_0(torch.randn(n, k, generator=g)))
    else:
        weight = BlockWeight(*split_blocks(random_rows(qtype, (n,), k, g), qtype))
    weight = weight.to(dev)
    assert weight.shape == (n, k) and weight.format == qtype.lower()
    x = torch.randn(3, k, generator=g).to(torch.bfloat16).to(dev)
    twin = weight.dequantized(torch.bfloat16)
    for parallel in (False, True):
        got = triton_linear(x, weight, parallel=parallel)
        want = triton_linear(x, twin, tile=tile_for(n, k, torch.uint8), parallel=parallel)
        if dev.type == "cpu":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2 * float(want.abs().max()))
        assert torch.equal(triton_linear(x[1:2], weight, parallel=parallel)[0], got[1])
