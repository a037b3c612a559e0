"""`wisp bench sweep moe-attention`: the MoE and attention kernels on the GPU over their block sizes, one call
for the whole sweep.

    wisp bench sweep moe-attention --out $OUT/kernel_sweep.json [--compare-with OLD_triton_moe.py]

MoE: `triton_fused_moe` on OLMoE-1B-7B's and Qwen3-30B-A3B's expert shapes (bf16, top-8) at 1, 8, 512 and
2048 tokens with the bank on the device, and at 1 token read in place from pinned host memory (zero-copy and
hybrid's GPU pairs); the default blocks, then each block constant of `wisp.core.kernels.triton_moe` varied alone
(with whether the output keeps the default's bits), and `--compare-with` another version of the module (a
file) on the same inputs. Attention: Qwen3's decode shapes (32 q / 4 kv heads of 128, 16-token blocks) at
several context lengths (decode by programs per row, and a whole prefill). Prints a table and writes the
figures (microseconds, triton.testing.do_bench).
"""

from __future__ import annotations

import importlib.util
import json

import torch

from wisp.bench.sweeps import require_cuda

SHAPES = {"olmoe": (2048, 1024, 64, 8), "qwen3": (2048, 768, 128, 8)}  # hidden, moe_intermediate, experts, top-k
CASES = [(t, "device") for t in (1, 8, 512, 2048)] + [(1, "host")]
VARIANTS = {"BLOCK_M": (32, 128), "BLOCK_I_GATE_UP": (16, 64), "BLOCK_D_GATE_UP": (64, 256), "BLOCK_D_DOWN": (32, 128),
            "BLOCK_I_DOWN": (64, 256)}
BF16 = torch.bfloat16


def problem(shape: str, t: int, where: str, dev: torch.device):
    """One MoE call's inputs: `t` tokens of a shape's top-k routing, the bank on the device or pinned in host memory."""
    d, inter, n, k = SHAPES[shape]
    g = torch.Generator(device="cpu").manual_seed(t)
    w13 = (torch.randn(n, 2 * inter, d, generator=g) * 0.02).to(BF16)
    w2 = (torch.randn(n, d, inter, generator=g) * 0.02).to(BF16)
    w13, w2 = (w13.to(dev), w2.to(dev)) if where == "device" else (w13.pin_memory(), w2.pin_memory())
    x = torch.randn(t, d, generator=g).to(BF16).to(dev)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)]).to(dev)
    w = torch.softmax(torch.randn(t, k, generator=g), -1).to(BF16).to(dev)
    return x, w13, w2, ids, w


def sweep_moe(results: dict[str, float], same: dict[str, bool], sweep: bool, baseline=None) -> None:
    """Time the MoE kernel at every case (each block constant varied alone when `sweep`), into `results` (us)
    and `same` (bits equal to the default launch's)."""
    from triton.testing import do_bench

    import wisp.core.kernels.triton_moe as moe

    dev = torch.device("cuda")
    for shape in SHAPES:
        for t, where in CASES:
            x, w13, w2, ids, w = problem(shape, t, where, dev)
            name = f"moe {shape} T={t} {where}"
            ref = moe.triton_fused_moe(x, w13, w2, ids, w)
            results[name] = do_bench(lambda: moe.triton_fused_moe(x, w13, w2, ids, w)) * 1e3
            if baseline is not None:
                results[f"{name} baseline"] = do_bench(lambda: baseline.triton_fused_moe(x, w13, w2, ids, w)) * 1e3
            for const, values in VARIANTS.items() if sweep and where == "device" else ():
                default = getattr(moe, const)
                for value in values:
                    setattr(moe, const, value)
                    try:
                        same[f"{name} {const}={value}"] = bool(torch.equal(moe.triton_fused_moe(x, w13, w2, ids, w), ref))
                        results[f"{name} {const}={value}"] = do_bench(lambda: moe.triton_fused_moe(x, w13, w2, ids, w)) * 1e3
                    finally:
                        setattr(moe, const, default)


def sweep_attention(results: dict[str, float], same: dict[str, bool]) -> None:
    """Time decode attention by programs per row and a whole prefill at several context lengths."""
    from triton.testing import do_bench

    from wisp.engine.triton_attention import decode_attention, decode_meta, triton_paged_attention

    dev = torch.device("cuda")
    hq, hkv, hd, bs = 32, 4, 128, 16
    for ctx in (128, 512, 2048, 8192):
        nb = ctx // bs + 1
        kc = torch.randn(nb, hkv, bs, hd, device=dev, dtype=BF16)
        vc = torch.randn_like(kc)
        q = torch.randn(1, hq, hd, device=dev, dtype=BF16)
        tables = torch.randperm(nb, device=dev, dtype=torch.int32)[None]
        meta = decode_meta(torch.tensor([ctx - 1], device=dev))
        results[f"attention ctx={ctx}"] = do_bench(lambda: decode_attention(q, kc, vc, tables, meta)) * 1e3
        ref = decode_attention(q, kc, vc, tables, meta)
        for programs in (1, 2, 4, 8, 16, 32):
            out = decode_attention(q, kc, vc, tables, meta, programs=programs)
            results[f"attention ctx={ctx} programs/row={programs}"] = do_bench(
                lambda programs=programs: decode_attention(q, kc, vc, tables, meta, programs=programs)) * 1e3
            same[f"ctx={ctx} programs/row={programs}"] = bool(torch.equal(out, ref))
        chunk = torch.randn(ctx, hq, hd, device=dev, dtype=BF16)
        table = tables[0].tolist()
        results[f"prefill attention {ctx} tokens"] = do_bench(lambda: triton_paged_attention(chunk, kc, vc, table, 0)) * 1e3


def sweep_moe_attention(args) -> dict:
    """`wisp bench sweep moe-attention`: both sweeps, printed and written to `--out`."""
    require_cuda("wisp bench sweep moe-attention")
    baseline = None
    if args.compare_with:
        spec = importlib.util.spec_from_file_location("baseline_triton_moe", args.compare_with)
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)
    results: dict[str, float] = {}
    same: dict[str, bool] = {}  # launches' bits against the default launch's
    sweep_moe(results, same, not args.no_sweep, baseline)
    sweep_attention(results, same)
    width = max(map(len, results))
    for name, us in results.items():
        print(f"{name:<{width}} {us:8.1f} us")
    print("launches bitwise equal to the default launch:", all(same.values()), [k for k, v in same.items() if not v])
    record = {"gpu": torch.cuda.get_device_name(), "unit": "us", "results": results, "bits_equal_to_default": same}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    return record
