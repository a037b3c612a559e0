"""`wisp bench sweep linear`: a preset's dense projections timed both ways on the GPU: `rows.linear` (cuBLAS on
16-row tiles, one launch a tile) against `triton_linear` (one launch), at one-token decode and prefill row
counts, for the default tile and a sweep of tiles (one tile serves every row count of a weight: a row's bits
depend on it); `triton_linear` also on the weight packed in FP8 blocks and in a GGUF file's Q4_K (its default tile).
Prints a table per weight and saves every timing as JSON.

    wisp bench sweep linear --models olmoe-1b-7b,qwen3-30b-a3b --out linear_sweep.json
"""

from __future__ import annotations

import itertools
import json

import torch

from wisp.bench.sweeps import require_cuda
from wisp.models.presets import preset

L2_FLUSH_BYTES = 128 << 20  # more than an H200's 50 MB of L2


def tiles():
    """The tiles swept: 64-row blocks, column blocks 16-128 and reduction depths 64-256 within a Hopper block's shared
    memory at 3 stages, 4 warps, K summed in 1-16 spans."""
    from wisp.core.kernels.triton_linear import Tile

    shapes = [(16, 128), (16, 256), (32, 128), (32, 256), (64, 64), (64, 128), (128, 64), (128, 128)]
    return [Tile(64, bn, bk, 4, 3, sp) for (bn, bk), sp in itertools.product(shapes, (1, 2, 4, 8, 16))]


def weights_of(model: str) -> dict[str, tuple[int, int]]:
    """name -> (out, in) of the preset's dense projections."""
    c = preset(model)
    d, h, hkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or d // h
    return {"qkv": ((h + 2 * hkv) * hd, d), "o": (d, h * hd), "router": (c["num_experts"], d),
            "lm_head": (c["vocab_size"], d)}


def time_weight(model: str, name: str, n: int, k: int, args) -> list[dict]:
    """One record per row count of one [n, k] weight: cuBLAS tiles, triton_linear, and each swept tile (ms)."""
    from triton.testing import do_bench, do_bench_cudagraph

    from wisp.core.kernels import rows
    from wisp.core.kernels.fp8_blocks import FP8, Fp8BlockWeight, quantize_blocks
    from wisp.core.kernels.triton_linear import tile_for, triton_linear

    def ms(fn, t: int) -> float:
        return do_bench_cudagraph(fn, rep=10) if t <= args.graph_rows else do_bench(fn, warmup=5, rep=10)

    copies = -(-L2_FLUSH_BYTES // (2 * n * k))  # a call reads a weight no earlier call left in L2
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
    w = itertools.cycle(ws).__next__  # each call the next copy (graph captures too: one copy per replayed call)
    packed = [Fp8BlockWeight(*quantize_blocks(wi.float())) for wi in ws] if name != "lm_head" else []  # copies too
    p = itertools.cycle(packed).__next__
    q4 = q4_k_copies(n, k, copies)  # a GGUF file's Q4_K (random codes: times, not values)
    q = itertools.cycle(q4).__next__
    default = tile_for(n, k, torch.bfloat16)
    print(f"\n{model} {name} [{n}, {k}]  default tile {tuple(default)}  FP8 {tuple(tile_for(n, k, FP8))}")
    print(f"{'rows':>6} {'cuBLAS tiles ms':>16} {'triton ms':>10} {'GB/s':>6} {'FP8 ms':>7} {'GB/s':>6} "
          f"{'Q4_K ms':>7} {'GB/s':>6} {'best tile':>24} {'best ms':>8}")
    records = []
    for t in args.rows:
        x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
        r = dict(model=model, weight=name, n=n, k=k, rows=t, cublas_tiles_ms=ms(lambda: rows.linear(x, w()), t),
                 triton_ms=ms(lambda: triton_linear(x, w()), t), default_tile=list(default), tiles={},
                 fp8_ms=ms(lambda: triton_linear(x, p()), t) if packed else None,
                 timing="cuda-graph" if t <= args.graph_rows else "launched")
        r["triton_weight_gb_s"] = 2 * n * k / r["triton_ms"] / 1e6  # the weight's bytes over the time: decode's floor
        r["fp8_weight_gb_s"] = n * k * (1 + 4 / 128**2) / r["fp8_ms"] / 1e6 if packed else None
        r["q4_k_ms"] = ms(lambda: triton_linear(x, q()), t) if q4 else None
        r["q4_k_weight_gb_s"] = n * k * 144 / 256 / r["q4_k_ms"] / 1e6 if q4 else None
        if not args.no_sweep:
            for tile in tiles():
                key = ",".join(map(str, tile))
                try:
                    r["tiles"][key] = ms(lambda: triton_linear(x, w(), tile=tile), t)
                except Exception as e:  # a tile the compiler refuses (shared memory): skipped, said
                    r["tiles"][key] = f"{type(e).__name__}"
        timed = {key: v for key, v in r["tiles"].items() if isinstance(v, float)}
        best = min(timed, key=timed.get) if timed else "-"
        fp8 = f"{r['fp8_ms']:>7.4f} {r['fp8_weight_gb_s']:>6.0f}" if packed else f"{'-':>7} {'-':>6}"
        fp8 += f" {r['q4_k_ms']:>7.4f} {r['q4_k_weight_gb_s']:>6.0f}" if q4 else f" {'-':>7} {'-':>6}"
        print(f"{t:>6} {r['cublas_tiles_ms']:>16.4f} {r['triton_ms']:>10.4f} {r['triton_weight_gb_s']:>6.0f} {fp8} "
              f"{best:>24} {timed.get(best, float('nan')):>8.4f}", flush=True)
        records.append(r)
    return records


def q4_k_copies(n: int, k: int, copies: int) -> list:
    """`copies` random Q4_K `BlockWeight`s [n, k] on the GPU (k a multiple of 256, else none): random codes, heads
    with finite scales."""
    from wisp.core.kernels.k_quants import bank_shapes
    from wisp.core.kernels.quantized_weights import BlockWeight
    from wisp.models.random_checkpoint import random_k_quant_heads

    if k % 256:
        return []
    codes, heads = bank_shapes(n, k, "Q4_K")
    g = torch.Generator(device="cuda").manual_seed(0)
    return [BlockWeight(torch.randint(0, 256, codes, generator=g, device="cuda", dtype=torch.uint8),
                        random_k_quant_heads(heads, 0.05, g, "cuda")) for _ in range(copies)]


def print_closest_tiles(records: list[dict]) -> None:
    """Per weight, the tiles with the least summed slowdown against each row count's best."""
    print("\nper weight: the tile closest to every row count's best (sum of time / best)")
    for (model, name), group in itertools.groupby(records, key=lambda r: (r["model"], r["weight"])):
        group = list(group)
        keys = [key for key in group[0]["tiles"] if all(isinstance(g["tiles"].get(key), float) for g in group)]
        score = {key: sum(g["tiles"][key] / min(v for v in g["tiles"].values() if isinstance(v, float))
                          for g in group) for key in keys}
        top = sorted(score, key=score.get)[:3]
        print(f"{model} {name}: " + "; ".join(f"{key} ({score[key]:.2f})" for key in top))


def sweep_linear(args) -> list[dict]:
    """`wisp bench sweep linear`: every weight of every model, printed, and written to `--out` when given."""
    require_cuda("wisp bench sweep linear")
    records = [r for model in args.models.split(",") for name, (n, k) in weights_of(model).items()
               for r in time_weight(model, name, n, k, args)]
    if not args.no_sweep:
        print_closest_tiles(records)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), records=records), f, indent=1)
    return records
