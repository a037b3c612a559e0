"""`wisp bench sweep moe-attention`: the MoE and attention kernels on the GPU over their block sizes, one call
for the whole sweep.

    wisp bench sweep moe-attention --out $OUT/kernel_sweep.json [--compare-with OLD_triton_moe.py]

MoE: `triton_fused_moe` on OLMoE-1B-7B's and Qwen3-30B-A3B's expert shapes (bf16, top-8), Qwen3's in FP8
block-scaled and in Q8_0, Q4_K and Q6_K (a GGUF file's, kept packed), and gpt-oss-20b's in MXFP4 (top-4), at 1, 8 and 2048 tokens
with the bank on the device, and at 1 token read in place from pinned host memory (zero-copy and hybrid's GPU
pairs, where a row's contiguous bytes a step set the link's efficiency); the format's default launch
(`triton_moe.TILES`), then at 1 and 2048 tokens on the device and 1 in place each of its launch
parameters (rows, columns, warps, stages of either kernel) varied alone, with whether the output keeps the
default's bits; `--compare-with` another version of the module (a file) on the same inputs. Up to 8 tokens a call
is timed as a CUDA-graph replay; at one token the experts' bytes over the time are printed as GB/s (the H200's
HBM: about 4.8 TB/s). Attention: Qwen3's decode shapes (32 q / 4 kv heads of 128, 16-token blocks) at
several context lengths (decode by programs per row, and a whole prefill). Prints a table and writes the
figures (microseconds, triton.testing.do_bench).
"""

from __future__ import annotations

import importlib.util
import json
import sys

import torch

from wisp.bench.sweeps import require_cuda
from wisp.errors import WispError

SHAPES = {  # hidden, moe_intermediate, experts, top-k, weight format
    "olmoe": (2048, 1024, 64, 8, "bf16"), "qwen3": (2048, 768, 128, 8, "bf16"), "qwen3-fp8": (2048, 768, 128, 8, "fp8"),
    "qwen3-q8_0": (2048, 768, 128, 8, "q8_0"), "gpt-oss": (2880, 2880, 32, 4, "mxfp4"),
    "qwen3-q4_k": (2048, 768, 128, 8, "q4_k"), "qwen3-q6_k": (2048, 768, 128, 8, "q6_k"),  # a Q4_K_M file's two
}
FORMAT_IDS = {"bf16": 0, "fp8": 1, "mxfp4": 2, "q8_0": 3, "q4_k": 4, "q6_k": 6}  # `triton_moe.TILES`' keys
CASES = [(t, "device") for t in (1, 8, 2048)] + [(1, "host")]
VARIED = (1, 2048)  # token counts at which each launch parameter is varied
VARIANTS = {"rows": {0: (16, 32, 64), 1: (32, 64, 128)}, "cols": (64, 128, 256), "warps": (2, 8), "stages": (2, 4),
            "loads": {2: (1, 2, 4), 4: (1, 8), 6: (1, 8)}, "weights_first": (False, True)}  # per kernel; loads: per
# format; a value equal to the format's default launch is skipped
BF16 = torch.bfloat16


def problem(shape: str, t: int, where: str, dev: torch.device):
    """One MoE call's inputs: `t` tokens of a shape's top-k routing, the bank (its format's bytes and scales) on
    the device or pinned in host memory. Returns (x, w13, w2, ids, weights, extras, bytes one expert reads)."""
    from wisp.core.kernels.expert_extras import ExpertExtras
    from wisp.core.kernels.fp8_blocks import DEFAULT_BLOCK, FP8

    d, inter, n, k, fmt = SHAPES[shape]
    g = torch.Generator(device="cpu").manual_seed(t)
    shapes = [(n, 2 * inter, d), (n, d, inter)]
    if fmt == "bf16":
        bank, scales = [(torch.randn(s, generator=g) * 0.02).to(BF16) for s in shapes], []
    elif fmt == "fp8":  # random codes and block scales (quantizing a whole bank takes minutes): times, not values
        bank = [(torch.randn(s, generator=g) * 64).to(FP8) for s in shapes]
        scales = [torch.rand((n, -(-r // DEFAULT_BLOCK[0]), -(-c // DEFAULT_BLOCK[1])), generator=g) * 1e-3
                  for _, r, c in shapes]
    elif fmt in ("q4_k", "q6_k"):  # random codes, heads with random sub-block scales (`random_k_quant_heads`)
        from wisp.core.kernels.k_quants import bank_shapes
        from wisp.models.random_checkpoint import random_k_quant_heads

        roles = [bank_shapes(r, c, fmt.upper()) for _, r, c in shapes]
        bank = [torch.randint(0, 256, (n, *codes), generator=g, dtype=torch.uint8) for codes, _ in roles]
        scales = [random_k_quant_heads((n, *heads), 0.05, g, "cpu") for _, heads in roles]
    elif fmt == "q8_0":  # random codes, float16 scales per 32 columns
        bank = [torch.randint(-127, 128, s, generator=g, dtype=torch.int8) for s in shapes]
        scales = [(torch.rand((n, r, c // 32), generator=g) * 1e-3).half() for _, r, c in shapes]
    else:  # MXFP4: random bytes, scales near 2^-7
        bank = [torch.randint(0, 256, (n, r, c // 32, 16), generator=g, dtype=torch.uint8) for _, r, c in shapes]
        scales = [torch.randint(118, 122, (n, r, c // 32), generator=g, dtype=torch.uint8) for _, r, c in shapes]
    move = (lambda x: x.to(dev)) if where == "device" else (lambda x: x.pin_memory())
    bank, scales = [move(x) for x in bank], [move(x) for x in scales]
    extras = ExpertExtras(*scales) if scales else None
    per_expert = sum(x[0].numel() * x.element_size() for x in bank + scales)
    x = torch.randn(t, d, generator=g).to(BF16).to(dev)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)]).to(dev)
    w = torch.softmax(torch.randn(t, k, generator=g), -1).to(BF16).to(dev)
    return x, *bank, ids, w, extras, per_expert


def _timed(call, t: int) -> float:
    """Microseconds a call: replayed from a CUDA graph up to 8 tokens (decode runs in graphs; launched one by
    one, a short kernel would time its launches), else launched."""
    from triton.testing import do_bench, do_bench_cudagraph

    if t <= 8:
        try:
            return do_bench_cudagraph(call) * 1e3
        except RuntimeError:  # not capturable here: launched
            pass
    return do_bench(call) * 1e3


def _variants(fmt: int, fields=tuple(VARIANTS)):
    """(name, TILES entry) for each launch parameter in `fields` of each kernel varied alone from the format's
    default."""
    from dataclasses import replace

    import wisp.core.kernels.triton_moe as moe

    default = moe.TILES[fmt]
    for kernel, name in enumerate(("gate_up", "down")):
        for field, values in VARIANTS.items():
            if field not in fields:
                continue
            if field == "loads":  # steps a load, read in place: MXFP4's and the k-quants' own choices
                values = values.get(fmt, ())
            elif isinstance(values, dict):  # per kernel
                values = values[kernel]
            for value in values:
                if field == "cols" and (fmt == 1 and 128 % value or fmt == 3 and 32 % value or fmt >= 4):  # a step's
                    continue  # columns share one scale block (FP8's 128, Q8_0's 32; a k-quant's step is its 32)
                if getattr(default[kernel], field) == value:
                    continue
                tiles = list(default)
                tiles[kernel] = replace(default[kernel], **{field: value})
                yield f"{name}.{field}={value}", tuple(tiles)


def sweep_moe(results: dict[str, float], same: dict[str, bool], sweep: bool, baseline=None,
              bandwidth: dict[str, float] | None = None, shapes=tuple(SHAPES), fields=tuple(VARIANTS)) -> None:
    """Time the MoE kernel at every case (each launch parameter varied alone when `sweep`), into `results` (us),
    `same` (bits equal to the default launch's) and `bandwidth` (GB/s of expert bytes at one token)."""
    import wisp.core.kernels.triton_moe as moe

    dev = torch.device("cuda")
    for shape in shapes:
        _, _, _, k, fmt_name = SHAPES[shape]
        fmt = FORMAT_IDS[fmt_name]
        for t, where in CASES:
            x, w13, w2, ids, w, extras, per_expert = problem(shape, t, where, dev)
            call = (lambda mod=moe: mod.triton_fused_moe(x, w13, w2, ids, w, extras=extras))
            name = f"moe {shape} T={t} {where}"
            ref = call()
            results[name] = _timed(call, t)
            if t == 1 and bandwidth is not None:
                bandwidth[name] = k * per_expert / results[name] / 1e3
            if baseline is not None:
                try:
                    results[f"{name} baseline"] = _timed(lambda: call(baseline), t)
                except ValueError as e:  # an older module without this weight format
                    print(f"{name} baseline: {str(e).splitlines()[0][:120]}")
            if not (sweep and (where == "host" or t in VARIED)):
                continue
            default = moe.TILES[fmt]
            for variant, tiles in list(_variants(fmt, fields)):
                moe.TILES[fmt] = tiles
                try:
                    same[f"{name} {variant}"] = bool(torch.equal(call(), ref))
                    results[f"{name} {variant}"] = _timed(call, t)
                except Exception as e:  # noqa: BLE001 - a launch that does not fit (shared memory) is a result
                    results[f"{name} {variant}"] = float("nan")
                    print(f"{name} {variant}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                finally:
                    moe.TILES[fmt] = default


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
        sys.modules[spec.name] = baseline  # its dataclasses look their module up there
        spec.loader.exec_module(baseline)
    results: dict[str, float] = {}
    same: dict[str, bool] = {}  # launches' bits against the default launch's
    bandwidth: dict[str, float] = {}
    shapes = args.shapes.split(",") if args.shapes else list(SHAPES)
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        raise WispError(f"unknown MoE shapes {unknown}: the sweep knows {', '.join(SHAPES)}")
    fields = tuple(args.vary.split(",")) if args.vary else tuple(VARIANTS)
    if set(fields) - set(VARIANTS):
        raise WispError(f"--vary {args.vary}: comma-separated {', '.join(VARIANTS)}")
    sweep_moe(results, same, not args.no_sweep, baseline, bandwidth, shapes, fields)
    if not args.no_attention:
        sweep_attention(results, same)
    width = max(map(len, results))
    for name, us in results.items():
        gbs = f" {bandwidth[name]:7.0f} GB/s" if name in bandwidth else ""
        print(f"{name:<{width}} {us:8.1f} us{gbs}")
    print("launches bitwise equal to the default launch:", all(same.values()), [k for k, v in same.items() if not v])
    record = {"gpu": torch.cuda.get_device_name(), "unit": "us", "results": results, "bits_equal_to_default": same,
              "expert_gb_per_s_at_one_token": bandwidth}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    return record
