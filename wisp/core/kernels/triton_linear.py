"""`triton_linear`: the dense projections (attention, router, dense MLPs, LM head) as one row-invariant
Triton GEMM launch, on the GPU, fast at one decode row and at a prefill's thousands.

`wisp.core.kernels.rows.linear` keeps a row's bits independent of its batch by cutting every input into 16-row
tiles and calling the GEMM library once per tile: one launch per 16 tokens and weight, which left a long
prefill launch-bound (docs/decisions/dense-projections-as-one-triton-launch.md). Here one launch covers every
row, and the invariance holds by construction instead:
- an output element (m, n) is a sum over `splits` consecutive spans of K, each span's partial sum a run of
  `tl.dot`s over BLOCK_K-wide blocks in order from zero, accumulated in float32; the partials are then added
  in span order (((p0 + p1) + p2) ...) and the bias after them, before the one rounding to the output dtype;
- the tile (`tile_for`: output block, K block, splits) depends on (N, K) and the weight's format only, never on M,
  and M is not specialised on, so a one-token decode step and a 2048-token prefill compute a row alike;
- a row of a tensor-core product is computed by the same instructions whatever the other rows of its tile
  hold (rows past M are masked to zeros and never stored).
So `linear(x)[rows] == linear(x[rows])` bit for bit for any consecutive rows (tested).

Two schedules give those same bits (tested equal), picked by the grid's size alone:
- "in one program": each program runs the spans one after another (a prefill has programs to spare);
- "spans in parallel": when the output tiles are too few to fill the GPU (decode, small N), each span is a
  program of its own; it stores its float32 partial in a workspace and counts itself in on its tile's counter
  (`_TileCounters`), and the tile's last program reads the partials back in span order, adds them as above,
  writes the output and leaves the counter at zero for the next launch.
The bits differ from cuBLAS's (another order of the sum). 16-bit operands multiply on tensor cores; float32
ones in IEEE (never TF32). FP8 block-scaled weights (`wisp.core.kernels.fp8_blocks`, 128 x 128 blocks) are
dequantized in-kernel as the torch path dequantizes them (the float32 product with the block's scale, rounded
to the activations' dtype) and so multiply exactly the values a dequantized copy holds. Under Triton's
interpreter (the CPU tests) 16-bit operands are widened to float32 first (`wisp.core.kernels.triton_interpreter`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from wisp.core.kernels.fp8_blocks import DEFAULT_BLOCK, FP8, Fp8BlockWeight
from wisp.core.kernels.quantized_weights import BlockWeight
from wisp.core.kernels.triton_weight_tiles import FORMAT_IDS, weight_tile
from wisp.core.kernels.triton_interpreter import ROUND_IDS, dot_rows, ieee_products, rounded


class Tile(NamedTuple):
    """A launch's geometry, fixed per weight shape: the output tile, the K step, Triton's knobs, and how many
    consecutive spans K is summed in (part of every row's arithmetic, like block_k)."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    splits: int = 1


TARGET_PROGRAMS = 256  # about two programs per multiprocessor of an H100 / H200 (132): decode's spans fill it


@functools.cache
def tile_for(n: int, k: int, dtype: torch.dtype) -> Tile:
    """The tile for a weight [n, k] of `dtype` (float8_e4m3fn: FP8 block-scaled): a function of the weight
    alone (never of the rows), since block_k and splits are part of every row's arithmetic (the pipeline depth,
    `stages`, is not: it fits the shared memory of consumer GPUs, about 100 KB a block). 64 rows feed the
    Hopper tensor cores' smallest product; the split of K is chosen so that one decode row's programs (output
    blocks x spans) reach about TARGET_PROGRAMS, each span keeping at least two K blocks. The constants come from
    `wisp bench sweep linear` on the H200 (docs/decisions/dense-projection-tiles-split-k-for-decode.md)."""
    if dtype == torch.float32:  # (DeepSeek's router: float32 logits of float32 activations, IEEE products)
        block_n, block_k, target, warps, stages = 32, 32, TARGET_PROGRAMS, 4, 2
    elif dtype == torch.uint8:  # a GGUF block weight (`BlockWeight`): a step is one 32-column block (not swept)
        block_n, block_k, warps, stages = 64 if n >= 4096 else 32, 32, 4, 3
        target = 2 * TARGET_PROGRAMS if n >= 4096 else TARGET_PROGRAMS
    elif n >= 8192:  # an LM head: its output blocks fill the GPU
        return Tile(64, 64, 128, 4, 3)
    else:  # fused q/k/v (4096-8191 outputs): wider blocks halve its prefill's re-reads of x; narrower ones below
        warps, stages = 4, 3
        block_n, block_k, target = (64, 64, 2 * TARGET_PROGRAMS) if n >= 4096 else (32, 128, TARGET_PROGRAMS)
    n_blocks, k_blocks = triton.cdiv(n, block_n), triton.cdiv(k, block_k)
    splits = 1
    while n_blocks * splits * 2 <= target and k_blocks >= splits * 4:
        splits *= 2
    return Tile(64, block_n, block_k, warps, stages, splits)  # 16-bit: 3 stages of (64 + block_n) x block_k x 2 B <= 96 KB


@triton.jit
def _span(x_rows, w_rows, s_rows, w_ptr, s_ptr, m_ok, n_ok, rn, k_lo, k_hi, K, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8_WEIGHT: tl.constexpr, FP8_BLOCK: tl.constexpr,
          ROUND: tl.constexpr, IEEE: tl.constexpr, FMT: tl.constexpr, COLS: tl.constexpr):
    """The float32 partial sum over K in [k_lo, k_hi) of x [BM, K] . w [BN, K], block by block from zero. FMT 3-6:
    a GGUF block weight [N, COLS] at w_ptr / s_ptr (`weight_tile`)."""
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_ok = (k0 + rk) < K
        a = tl.load(x_rows + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # [BM, BK]
        if FMT >= 3:  # Q8_0 or a k-quant: BLOCK_K = 32, one scale block (sub-block) a step
            w = weight_tile(w_ptr, s_ptr, rn, n_ok, k0, COLS, BLOCK_K, FMT, FP8_BLOCK, ROUND).to(a.dtype)
        else:
            w = tl.load(w_rows + (k0 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)  # [BN, BK]
            if FP8_WEIGHT:  # the block's scale, one per row of the tile (BLOCK_K divides FP8_BLOCK)
                scale = tl.load(s_rows + k0 // FP8_BLOCK, mask=n_ok, other=0.0)  # [BN]
                w = rounded(w.to(tl.float32) * scale[:, None], ROUND).to(a.dtype)
        acc = dot_rows(a, w, acc, IEEE)
    return acc


@triton.jit
def _store(total, b_ptr, out_ptr, rm, rn, n_ok, ok, s_om, HAS_BIAS: tl.constexpr):
    """The tile's float32 sum (+ the bias) rounded once to the output dtype and stored."""
    if HAS_BIAS:
        total += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm[:, None] * s_om + rn[None, :], total.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["M"])
def _linear(x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, ws_ptr, count_ptr, M, N, K, s_xm, s_wn, s_om, s_sn,
            HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            SPLITS: tl.constexpr, PARALLEL: tl.constexpr, FP8_WEIGHT: tl.constexpr, FP8_BLOCK: tl.constexpr,
            ROUND: tl.constexpr, IEEE: tl.constexpr, FMT: tl.constexpr, COLS: tl.constexpr):
    """out[m, n] = sum over spans of (sum_k x[m, k] w[n, k]) (+ b[n]) for one [BLOCK_M, BLOCK_N] tile; axis 2
    is the span when PARALLEL (see the module docstring)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok, n_ok = rm < M, rn < N
    x_rows = x_ptr + rm[:, None] * s_xm
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_wn
    s_rows = s_ptr + (rn // FP8_BLOCK) * s_sn  # FP8: each output row's scale row
    span = tl.cdiv(K, BLOCK_K * SPLITS) * BLOCK_K  # K per span: whole K blocks
    ok = m_ok[:, None] & n_ok[None, :]
    if PARALLEL:
        s = tl.program_id(2)
        part = _span(x_rows, w_rows, s_rows, w_ptr, s_ptr, m_ok, n_ok, rn, s * span, tl.minimum((s + 1) * span, K), K,
                     BLOCK_M, BLOCK_N, BLOCK_K, FP8_WEIGHT, FP8_BLOCK, ROUND, IEEE, FMT, COLS)
        ws_tile = ws_ptr + rm[:, None] * N + rn[None, :]  # ws [SPLITS, M, N] float32
        tl.store(ws_tile + s * M * N, part, mask=ok)
        tl.debug_barrier()  # every thread's partial is stored before the count below releases them
        counter = count_ptr + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:  # the tile's last span
            total = tl.load(ws_tile, mask=ok, other=0.0, cache_modifier=".cg")
            for j in range(1, SPLITS):
                total += tl.load(ws_tile + j * M * N, mask=ok, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # zero again for the next launch on this stream
            _store(total, b_ptr, out_ptr, rm, rn, n_ok, ok, s_om, HAS_BIAS)
    else:
        total = _span(x_rows, w_rows, s_rows, w_ptr, s_ptr, m_ok, n_ok, rn, 0, tl.minimum(span, K), K, BLOCK_M,
                      BLOCK_N, BLOCK_K, FP8_WEIGHT, FP8_BLOCK, ROUND, IEEE, FMT, COLS)
        for s in range(1, SPLITS):
            total += _span(x_rows, w_rows, s_rows, w_ptr, s_ptr, m_ok, n_ok, rn, s * span, tl.minimum((s + 1) * span, K),
                           K, BLOCK_M, BLOCK_N, BLOCK_K, FP8_WEIGHT, FP8_BLOCK, ROUND, IEEE, FMT, COLS)
        _store(total, b_ptr, out_ptr, rm, rn, n_ok, ok, s_om, HAS_BIAS)


class _TileCounters:
    """The spans-in-parallel schedule's per-tile counters: one zeroed int32 buffer per (device, stream), never
    freed (a captured CUDA graph keeps its address). Launches on one stream run one after another and each
    leaves the counters it used at zero, so the next launch finds them zeroed; launches on two streams never
    share a buffer."""

    SIZE = 1 << 14  # tiles: the parallel schedule is chosen only for grids far smaller

    def __init__(self):
        self.buffers: dict[tuple, torch.Tensor] = {}

    def of(self, device: torch.device) -> torch.Tensor:
        key = (device.type, device.index, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
        if key not in self.buffers:
            self.buffers[key] = torch.zeros(self.SIZE, dtype=torch.int32, device=device)
        return self.buffers[key]


_COUNTERS = _TileCounters()


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter: either schedule, the same bits
    return torch.cuda.get_device_properties(device).multi_processor_count


def triton_linear(x: torch.Tensor, weight: torch.Tensor | Fp8BlockWeight | BlockWeight, bias: torch.Tensor | None = None,
                  tile: Tile | None = None, parallel: bool | None = None) -> torch.Tensor:
    """x [T, in] @ weight[out, in]^T (+ bias) -> [T, out] in x's dtype, row-invariant (one launch). weight: a
    tensor of x's dtype, an `Fp8BlockWeight`, or a GGUF file's `BlockWeight` (Q8_0, k-quants: 32 columns a step).
    `tile` overrides `tile_for` (benchmarks: the same rows then get other bits); `parallel` forces a schedule
    (tests: both give the same bits)."""
    fp8, block = isinstance(weight, Fp8BlockWeight), isinstance(weight, BlockWeight)
    fmt = FORMAT_IDS[weight.format] if block else 0  # `weight_tile`'s FMT
    data = weight.weight if fp8 or block else weight
    if not (fp8 or block) and x.dtype != data.dtype:
        raise TypeError(f"triton_linear: x is {x.dtype}, weight {data.dtype}")
    n, k = weight.shape
    if x.dim() != 2 or x.shape[1] != k or (bias is not None and bias.shape != (n,)):
        bias_shape = None if bias is None else tuple(bias.shape)
        raise ValueError(f"triton_linear: x {tuple(x.shape)}, weight {(n, k)}, bias {bias_shape}: "
                         f"expected x [T, {k}] and bias [{n}]")
    t = x.shape[0]
    x = x if x.stride(-1) == 1 else x.contiguous()
    data = data if data.stride(-1) == 1 else data.contiguous()
    scale = weight.scale.contiguous() if fp8 or block else data  # unread unless quantized
    bias = None if bias is None else bias.contiguous()
    out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    tile = tile or tile_for(n, k, FP8 if fp8 else torch.uint8 if block else data.dtype)
    if fp8 and DEFAULT_BLOCK[1] % tile.block_k:
        raise ValueError(f"triton_linear: an FP8 weight needs block_k to divide {DEFAULT_BLOCK[1]}, not {tile.block_k}")
    n_blocks, m_blocks = triton.cdiv(n, tile.block_n), triton.cdiv(t, tile.block_m)
    if parallel is None:
        parallel = tile.splits > 1 and n_blocks * m_blocks < _multiprocessors(x.device)
    parallel = parallel and tile.splits > 1 and n_blocks * m_blocks <= _TileCounters.SIZE
    ws = torch.empty((tile.splits, t, n), dtype=torch.float32, device=x.device) if parallel else out
    counters = _COUNTERS.of(x.device) if parallel else out
    grid = (n_blocks, m_blocks, tile.splits if parallel else 1)
    _linear[grid](x, data, scale, x if bias is None else bias, out, ws, counters, t, n, k, x.stride(0),
                  data.stride(0), out.stride(0), scale.stride(0) if fp8 else 0, HAS_BIAS=bias is not None,
                  BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, SPLITS=tile.splits,
                  PARALLEL=parallel, FP8_WEIGHT=fp8, FP8_BLOCK=DEFAULT_BLOCK[0], ROUND=ROUND_IDS[x.dtype],
                  IEEE=ieee_products(x.dtype), FMT=fmt, COLS=k if block else 0, num_warps=tile.warps,
                  num_stages=tile.stages)
    return out
