"""Time the decode kernels' block-size choices on the GPU, one call for the whole sweep.

    python benchmarks/kernel_sweep.py --out $OUT/kernel_sweep.json

Qwen3-30B-A3B's decode shapes (hidden 2048, moe_intermediate 768, top-8, 32 q / 4 kv heads of 128, 16-token
blocks) at batch 1: the fused-MoE gate/up and down kernels over block sizes, the combine, and paged attention
at several context lengths (decode by programs per row, and a whole prefill). Prints a table and writes the
figures (microseconds, triton.testing.do_bench).
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
from triton.testing import do_bench

from wisp.core.triton_moe import _down, _gate_up_act
from wisp.engine.triton_attention import decode_attention, decode_meta, triton_paged_attention

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="kernel_sweep.json")
args = ap.parse_args()
dev, bf16 = torch.device("cuda"), torch.bfloat16
d, inter, k, n = 2048, 768, 8, 128
x = torch.randn(1, d, device=dev, dtype=bf16)
w13 = torch.randn(n, 2 * inter, d, device=dev, dtype=bf16) * 0.02
w2 = torch.randn(n, d, inter, device=dev, dtype=bf16) * 0.02
ids = torch.randperm(n, device=dev)[:k].contiguous()
emap = torch.arange(n, dtype=torch.int32, device=dev)
h = torch.empty(k, inter, device=dev, dtype=torch.float32)
y = torch.empty(k, d, device=dev, dtype=torch.float32)
results: dict[str, float] = {}
same: dict[str, bool] = {}  # decode launches' bits against the default launch

for bi, bd in [(8, 256), (16, 128), (16, 256), (16, 512), (32, 128), (32, 256), (64, 128)]:
    for warps in (2, 4, 8):
        def run(bi=bi, bd=bd, warps=warps):
            _gate_up_act[(k, triton.cdiv(inter, bi))](x, w13, ids, emap, ids, h, w13.stride(0), K=k, D=d, I=inter,
                                                      BLOCK_I=bi, BLOCK_D=bd, ONE_EXPERT=False, num_warps=warps)
        results[f"gate_up BLOCK_I={bi} BLOCK_D={bd} warps={warps}"] = do_bench(run) * 1e3
for bd, bi in [(32, 128), (64, 128), (64, 256), (128, 128), (128, 256)]:
    for warps in (2, 4, 8):
        def run(bd=bd, bi=bi, warps=warps):
            _down[(k, triton.cdiv(d, bd))](h, w2, ids, emap, ids, y, w2.stride(0), D=d, I=inter, BLOCK_D=bd, BLOCK_I=bi,
                                           ONE_EXPERT=False, num_warps=warps)
        results[f"down BLOCK_D={bd} BLOCK_I={bi} warps={warps}"] = do_bench(run) * 1e3

hq, hkv, hd, bs = 32, 4, 128, 16
for ctx in (128, 512, 2048, 8192):
    nb = ctx // bs + 1
    kc = torch.randn(nb, hkv, bs, hd, device=dev, dtype=bf16)
    vc = torch.randn_like(kc)
    q = torch.randn(1, hq, hd, device=dev, dtype=bf16)
    tables = torch.randperm(nb, device=dev, dtype=torch.int32)[None]
    meta = decode_meta(torch.tensor([ctx - 1], device=dev))
    results[f"attention ctx={ctx}"] = do_bench(lambda: decode_attention(q, kc, vc, tables, meta)) * 1e3
    ref = decode_attention(q, kc, vc, tables, meta)
    for programs in (1, 2, 4, 8, 16, 32):
        out = decode_attention(q, kc, vc, tables, meta, programs=programs)
        results[f"attention ctx={ctx} programs/row={programs}"] = do_bench(
            lambda programs=programs: decode_attention(q, kc, vc, tables, meta, programs=programs)) * 1e3
        same[f"ctx={ctx} programs/row={programs}"] = bool(torch.equal(out, ref))
    chunk = torch.randn(ctx, hq, hd, device=dev, dtype=bf16)
    table = tables[0].tolist()
    results[f"prefill attention {ctx} tokens"] = do_bench(lambda: triton_paged_attention(chunk, kc, vc, table, 0)) * 1e3

width = max(map(len, results))
for name, us in results.items():
    print(f"{name:<{width}} {us:8.1f} us")
print("decode launches bitwise equal to the default launch:", all(same.values()), [k for k, v in same.items() if not v])
with open(args.out, "w") as f:
    json.dump({"gpu": torch.cuda.get_device_name(), "unit": "us", "results": results, "attention_bits_equal": same},
              f, indent=1)
