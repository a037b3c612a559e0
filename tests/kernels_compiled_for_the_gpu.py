"""Compile (not run) the Triton kernel families, in the variants the models launch, for an H200 (sm_90) on any
machine, CPU-only ones included: `python -m tests.kernels_compiled_for_the_gpu` prints the kernels compiled, one
line each, and exits 1 on the first that does not compile (its error above).

Triton's interpreter, which the CPU tests run the kernels under, never type-checks a kernel as the compiler does
(two returns of different dtypes, a constexpr branch that only some formats reach), so a kernel can pass every
CPU test and fail to compile on the GPU. Here the kernels' front doors are called on CPU tensors with a stand-in
driver that names an sm_90 target, and every launch compiles to a cubin (Triton's bundled ptxas) instead of
running: the outputs are garbage, the compile is the GPU's. Run in a process without TRITON_INTERPRET.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET=1: the interpreter compiles nothing")

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)  # the H200 (sm_90), as `device` runs it


class CompileOnlyDriver:
    """The active driver's questions a compile asks, answered for TARGET; nothing ever launches."""

    def get_current_target(self):
        return TARGET

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


COMPILED: list[str] = []
_run = JITFunction.run


def _compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    COMPILED.append(self.fn.__name__)
    return kernel


def _launched_as(formats, call, **blocks):
    """call() with the MoE launch of weight formats `formats` (`triton_moe.TILES`' keys; one, or a tuple) changed by
    `blocks` (fields of `Blocks`) in both kernels: e.g. MXFP4 reading one step a load (loads=1), as a bank on the device
    does (here every bank is a CPU tensor, which the kernels take for one read in place)."""
    from dataclasses import replace

    import wisp.core.kernels.triton_moe as moe

    defaults = {f: moe.TILES[f] for f in (formats if isinstance(formats, tuple) else (formats,))}
    for f, default in defaults.items():
        moe.TILES[f] = tuple(replace(b, **blocks) for b in default)
    try:
        return call()
    finally:
        moe.TILES.update(defaults)


def calls():
    """(name, thunk): each front door in the formats and variants that take another constexpr branch."""
    from wisp.core.kernels.expert_extras import ExpertExtras
    from wisp.core.kernels.fp8_blocks import FP8, Fp8BlockWeight
    from wisp.core.experts.pager import ExpertPager
    from wisp.core.kernels.step_count import StepCount
    from wisp.core.kernels.triton_step_count import count_step
    from wisp.core.kernels.triton_linear import triton_linear
    from wisp.core.kernels.triton_moe import triton_fused_moe
    from wisp.core.kernels.triton_norm import triton_add_rms_norm, triton_rms_norm
    from wisp.core.kernels.triton_qkv_heads import CacheSlots, triton_qkv_heads
    from wisp.core.kernels.triton_rope import triton_rope
    from wisp.core.kernels.triton_router import triton_route
    from wisp.engine.triton_attention import decode_attention, decode_meta, triton_paged_attention, write_kv
    from wisp.engine.triton_mla_attention import mla_decode_attention, mla_paged_attention
    from wisp.models.host_rows import gather_host_rows

    bf, n, k, d, i = torch.bfloat16, 8, 2, 256, 128
    x1, x3, x80 = (torch.randn(t, d, dtype=bf) for t in (1, 3, 80))
    ids3, w3 = torch.tensor([[0, 1], [2, 3], [1, 0]]), torch.rand(3, k, dtype=bf)
    ids80, w80 = torch.randint(0, n, (80, k)), torch.rand(80, k, dtype=bf)
    plain = torch.randn(n, 2 * i, d, dtype=bf), torch.randn(n, d, i, dtype=bf)
    fp8 = (torch.randn(n, 2 * i, d).to(FP8), torch.randn(n, d, i).to(FP8), torch.rand(n, 2, 2), torch.rand(n, 2, 1))
    mx = (torch.randint(0, 255, (n, 2 * i, d // 32, 16), dtype=torch.uint8),
          torch.randint(0, 255, (n, d, i // 32, 16), dtype=torch.uint8),
          torch.full((n, 2 * i, d // 32), 127, dtype=torch.uint8), torch.full((n, d, i // 32), 127, dtype=torch.uint8))
    q80 = (torch.randint(-127, 127, (n, 2 * i, d), dtype=torch.int8), torch.randint(-127, 127, (n, d, i), dtype=torch.int8),
           torch.rand(n, 2 * i, d // 32).half(), torch.rand(n, d, i // 32).half())
    biases = torch.randn(n, 2 * i, dtype=bf), torch.randn(n, d, dtype=bf)
    def blocks(rows: int, width: int) -> torch.Tensor:  # a k-quant's codes or heads, d = i = 256: one block a row
        return torch.randint(0, 255, (n, rows, 1, width), dtype=torch.uint8)

    kq = {q: (blocks(512, w), blocks(512, h)) for q, w, h in (("Q4_K", 128, 16), ("Q5_K", 160, 16))}
    q6_down = blocks(256, 192), blocks(256, 18)
    counts = StepCount(torch.zeros(6, dtype=torch.int64), n, hits=True)
    from wisp.core.kernels.expert_extras import Activation

    swiglu = Activation("clamped_swiglu", 1.702, 7.0)
    yield "moe bf16, a decode step counted", lambda: triton_fused_moe(x3, *plain, ids3, w3, count=counts)
    yield "moe bf16, a wide step", lambda: triton_fused_moe(x80, *plain, ids80, w80)
    yield "moe FP8", lambda: triton_fused_moe(x3, fp8[0], fp8[1], ids3, w3, extras=ExpertExtras(fp8[2], fp8[3]))
    yield "moe Q8_0", lambda: triton_fused_moe(x3, q80[0], q80[1], ids3, w3, extras=ExpertExtras(q80[2], q80[3]))
    yield "moe MXFP4 read in place (wide loads), biases, clamped SwiGLU", lambda: triton_fused_moe(
        x3, mx[0], mx[1], ids3, w3, extras=ExpertExtras(mx[2], mx[3], *biases), activation=swiglu)
    yield "moe MXFP4 on the device (a step a load)", lambda: _launched_as(2, lambda: triton_fused_moe(
        x3, mx[0], mx[1], ids3, w3, extras=ExpertExtras(mx[2], mx[3], *biases), activation=swiglu), loads=1)
    for fmt, name, bank in ((0, "bf16", plain), (1, "FP8", fp8), (2, "MXFP4 on the device", mx), (3, "Q8_0", q80)):
        extras = ExpertExtras(*bank[2:]) if len(bank) > 2 else None
        yield f"moe {name}, weights first", lambda fmt=fmt, bank=bank, extras=extras: _launched_as(
            fmt, lambda: triton_fused_moe(x3, bank[0], bank[1], ids3, w3, extras=extras), weights_first=True,
            **({"loads": 1} if fmt == 2 else {}))
    for (q, (codes, heads)), fmt in zip(kq.items(), (4, 5)):  # down in Q6_K, as a Q4_K_M file's more-bits layers
        yield f"moe {q} gate/up, Q6_K down, read in place (a super-block a load)", lambda codes=codes, heads=heads: (
            triton_fused_moe(x3, codes, q6_down[0], ids3, w3, extras=ExpertExtras(heads, q6_down[1])))
        yield f"moe {q} gate/up, Q6_K down, on the device (a step a load)", lambda codes=codes, heads=heads, fmt=fmt: (
            _launched_as((fmt, 6), lambda: triton_fused_moe(x3, codes, q6_down[0], ids3, w3,
                                                            extras=ExpertExtras(heads, q6_down[1])), loads=1))
    wt, bias = torch.randn(512, d, dtype=bf), torch.randn(512, dtype=bf)
    q8 = Fp8BlockWeight(torch.randn(512, d).to(FP8), torch.rand(4, 2))
    yield "linear bf16, spans in parallel", lambda: triton_linear(x1, wt, bias, parallel=True)
    yield "linear bf16, in one program", lambda: triton_linear(x80, wt, parallel=False)
    yield "linear FP8", lambda: triton_linear(x1, q8, parallel=True)
    yield "linear float32", lambda: triton_linear(x3.float(), wt.float())
    from wisp.core.kernels.quantized_weights import BlockWeight

    for name, block in (("Q4_K", BlockWeight(kq["Q4_K"][0][0], kq["Q4_K"][1][0])),  # a GGUF file's projections
                        ("Q6_K", BlockWeight(q6_down[0][0], q6_down[1][0])), ("Q8_0", BlockWeight(q80[0][0], q80[2][0]))):
        yield f"linear {name}, spans in parallel", lambda block=block: triton_linear(x1, block, parallel=True)
    yield "norm, add + norm", lambda: (triton_rms_norm(x3, x3[0], 1e-6), triton_add_rms_norm(x3, x3, x3[0], 1e-6))
    f32w = torch.ones(x3.shape[-1])
    yield "norm, add + norm, a float32 weight first (GPT-OSS)", lambda: (
        triton_rms_norm(x3, f32w, 1e-6, weight_in_float32=True), triton_add_rms_norm(x3, x3, f32w, 1e-6, weight_in_float32=True))
    h16, h32 = x3.half(), x3.float()
    yield "add + norm, float16 and float32", lambda: (triton_add_rms_norm(h16, h16, h16[0], 1e-6),
                                                      triton_add_rms_norm(h32, h32, h32[0], 1e-6))
    yield "step count", lambda: count_step(counts, ids80)
    yield "host rows", lambda: gather_host_rows(torch.randn(128, d, dtype=bf), torch.tensor([3, 5]))
    pager = ExpertPager({"gate_up": plain[0], "down": plain[1]}, 4, "cpu")
    yield "the device pager's decision and copies", lambda: pager.prepare_on_device(ids3)
    yield "router, with a replay", lambda: (triton_route(torch.randn(3, 64), 8, True, bf),
                                            triton_route(torch.randn(3, 64), 8, True, bf, torch.zeros(3, 8, dtype=torch.int64)))
    yield "router, top-k first (GPT-OSS)", lambda: triton_route(torch.randn(3, 32), 4, False, bf, topk_first=True)
    cos, sin = torch.rand(3, 1, 64, dtype=bf), torch.rand(3, 1, 64, dtype=bf)
    yield "rope", lambda: triton_rope(torch.randn(3, 4, 64, dtype=bf), cos, sin)
    qkv = torch.randn(3, (4 + 2 * 2) * 64, dtype=bf)
    kc, vc = torch.randn(6, 2, 16, 64, dtype=bf), torch.randn(6, 2, 16, 64, dtype=bf)
    slots = CacheSlots(kc, vc, torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2]))
    yield "q/k/v heads, per-head norm, into the cache", lambda: triton_qkv_heads(
        qkv, 4, 2, cos, sin, "per_head", qkv[0, :64], qkv[0, :64], cache=slots)
    yield "q/k/v heads, no norm, into the cache", lambda: triton_qkv_heads(qkv, 4, 2, cos, sin, cache=slots)
    yield "q/k/v heads, full norm", lambda: triton_qkv_heads(qkv, 4, 2, cos, sin, "full", qkv[0, :256], qkv[0, :128])
    q, tables, pos = torch.randn(3, 4, 64, dtype=bf), torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32), torch.tensor([5, 20, 31])
    yield "attention, decode with sinks and a window", lambda: decode_attention(
        q, kc, vc, tables, decode_meta(pos), 8, sinks=torch.zeros(4))
    yield "attention, decode", lambda: decode_attention(q, kc, vc, tables, decode_meta(pos))
    yield "attention, prefill", lambda: triton_paged_attention(q, kc, vc, [0, 1], 0)
    yield "k/v write", lambda: write_kv(q[:, :2], q[:, :2], kc, vc, torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2]))
    lat, cache = torch.randn(3, 16, 576, dtype=bf), torch.randn(6, 1, 16, 576, dtype=bf)
    yield "latent attention, decode", lambda: mla_decode_attention(lat, cache, tables, pos, 512)
    yield "latent attention, prefill", lambda: mla_paged_attention(lat, cache, [0, 1], 0, 512)


def main() -> int:
    driver.set_active(CompileOnlyDriver())
    JITFunction.run = _compile_only
    for name, call in calls():
        before = len(COMPILED)
        call()
        print(f"{name}: {', '.join(COMPILED[before:])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
