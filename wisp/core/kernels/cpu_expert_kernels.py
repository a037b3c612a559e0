"""The kernels hybrid mode computes its CPU experts with (`CPU_EXPERT_KERNELS`, `--hybrid-cpu-kernel`).

Hybrid mode computes some experts of a decode step on the host, from the pinned masters, while the GPU
computes the rest; a step's CPU side is bound by how fast the CPU reads those experts' weights.
- "native" (the default with a GPU, where it builds): `native/cpu_experts.cpp`, the bank's weights against
  float32 rows, read once for all rows (docs/decisions/native-cpu-expert-kernel.md): bf16, or FP8 blocks, MXFP4
  or Q8_0 read packed (`native/weight_formats.h`): codes widened to their exact values in registers, the columns
  that share a scale summed apart and then scaled, with no rounding of the weights
  (docs/decisions/cpu-kernel-reads-quantized-experts-packed.md). Built on first use with torch's extension
  builder (ninja and a C++ compiler; cached under torch's extension folder, rebuilt when a source changes).
- "plain" (the fallback): torch's GEMM on exactly the routed rows.
- "reference": `wisp.core.kernels.moe.expert_mlp`, the device's own row-invariant kernel, whose fixed 16-row tiles
  make it slow at one row but give the device's bits on the CPU (the default for a CPU-only run, where nothing
  could be gained anyway).

Invariants:
- one OpenMP runtime: the library links the one torch loaded, so its threads are torch's team, never a
  second team contending for the same cores;
- the GEMV's bits do not depend on the CPU or the thread count: each output is one thread's sum over k in
  16 fixed lanes, folded in a fixed order, with no contraction into FMAs (tested against that order spelled
  out in torch, and at 1 and 2 threads);
- an expert runs whole in the native code (`gated_experts_mlp`: both GEMVs, the biases and the activation
  between, SiLU or GPT-OSS's clamped SwiGLU, whose exp is a fixed sequence of float32 operations, not a
  library's), so its bits do not depend on the CPU either (the activations tested against the same sequences
  spelled out in torch, within a few ulp of torch's);
- built once per Python, torch and CPU instruction set (`-march=native`), in its own build folder;
- the kernel is only called where it applies (a format it reads, K a multiple of 16); `native_experts_mlp`
  hands anything else to torch's plain kernel;
- it reads FP8 codes without checking each for NaN (0x7F, 0xFF read as +-480 x scale); `CpuExperts` scans a bank
  once at load (`fp8_nan_codes`) and gives one that holds any to torch's plain kernel, which keeps them NaN;
- every kernel here takes a layer's CPU experts at once (`ExpertsKernel`); the native one computes each
  output exactly as it would for that expert alone (one thread's sum, in the same order).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from wisp.core.kernels.expert_extras import SILU, Activation, ExpertExtras, extras_at, extras_of
from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.kernels.moe import expert_mlp
from wisp.core.kernels.quantized_weights import GGUF_BLOCK_FORMATS, dequantize_expert, weight_format

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "cpu_experts.cpp"
HEADERS = tuple(SOURCE.with_name(h) for h in ("weight_formats.h", "k_quant_formats.h", "row_dots.h",
                                                 "expert_activation.h", "checked_weights.h"))  # hashed into a flag
LANES = 16  # the kernel's sum runs in 16 lanes: K must be a multiple


STALE_LOCK_S = 600  # a build takes under a minute: an older lock file is a killed build's


def _cpu_tag() -> str:
    """This CPU's instruction sets, hashed: a build compiled with -march=native is loaded only by a CPU with
    the same ones (a shared or baked-in build folder could otherwise hand an AVX-512 build to a CPU without)."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return hashlib.sha1(f"{platform.machine()} {flags}".encode()).hexdigest()[:12]


def _build_directory(name: str) -> Path:
    """Where the kernel is built: torch's extension folder (TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions),
    one subfolder per Python, torch and CPU; a lock left by a killed build (torch waits on it for ever) removed."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    folder = root / f"{name}_py{sys.version_info.major}{sys.version_info.minor}_torch{torch.__version__}".replace("+", "_")
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        lock.unlink(missing_ok=True)
    return folder


def _ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; the ninja this package installs sits beside the interpreter,
    which is not on PATH when a virtual environment is used without activating it."""
    if shutil.which("ninja") is None:
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


@functools.cache
def _build() -> str | None:
    """Build and load the kernel once per process: None when it loaded, else why it could not."""
    try:
        from torch.utils import cpp_extension

        _ninja_on_path()
        name = f"wisp_cpu_{_cpu_tag()}"
        cpp_extension.load(name=name, sources=[str(SOURCE)], is_python_module=False,
                           build_directory=str(_build_directory(name)),
                           extra_cflags=["-O3", "-march=native", "-ffp-contract=off", "-fopenmp",
                                         f"-DWISP_HEADERS={_headers_hash()}"],
                           extra_ldflags=["-fopenmp"])  # links libgomp.so.1: the runtime torch already loaded
        torch.ops.wisp_cpu.grouped_rows_matmul  # noqa: B018 (registered, or raises)
    except Exception as exc:  # no compiler, no ninja, a build error: say why, once
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        log.warning("hybrid mode's native CPU kernel did not build (%s); using torch's", reason)
        return reason
    return None


def native_kernel_error() -> str | None:
    """None when the native kernel is built and loaded (building it now if need be), else why not."""
    return _build()


def _headers_hash() -> str:
    """The headers' contents hashed: a flag of the build, so an edited header rebuilds the kernel."""
    return hashlib.sha1(b"".join(h.read_bytes() for h in HEADERS)).hexdigest()[:12]


def _loaded() -> None:
    if (reason := _build()) is not None:
        raise RuntimeError(f"the native CPU kernel is not available: {reason}")


def grouped_rows_matmul(x: torch.Tensor, weights: list[torch.Tensor], counts: list[int],
                        scales: list[torch.Tensor] | None = None) -> torch.Tensor:
    """x [M, K] float32 in groups of `counts` rows, group g against weights[g] [N, K] -> [M, N] float32, in one
    parallel region. Weights: contiguous bf16 without `scales`, or every one quantized with its scale (FP8
    blocks, MXFP4, Q8_0; `wisp.core.kernels.quantized_weights`), all on the CPU."""
    _loaded()
    return torch.ops.wisp_cpu.grouped_rows_matmul(x, weights, scales or [], [0, *itertools.accumulate(counts)])


def gated_experts_mlp(x: torch.Tensor, gate_ups: list[torch.Tensor], downs: list[torch.Tensor], counts: list[int],
                      gate_up_scales: list[torch.Tensor] | None = None, down_scales: list[torch.Tensor] | None = None,
                      gate_up_biases: list[torch.Tensor] | None = None, down_biases: list[torch.Tensor] | None = None,
                      activation: Activation = SILU) -> torch.Tensor:
    """Gated experts: x [M, D] float32 in groups of `counts` rows, group g through gate_ups[g] [2I, D] (gate rows
    first), its bias [2I], the activation, downs[g] [D, I] and its bias [D] (weights bf16, or quantized with their
    scales; biases bf16 or float32, all or none) -> [M, D] float32, in one native call."""
    _loaded()
    return torch.ops.wisp_cpu.gated_experts_mlp(x, gate_ups, gate_up_scales or [], gate_up_biases or [], downs,
                                                down_scales or [], down_biases or [], [0, *itertools.accumulate(counts)],
                                                activation.kind, activation.alpha, activation.limit)


def gate_mul(h: torch.Tensor, activation: Activation = SILU) -> torch.Tensor:
    """The native activation alone: h [M, 2I] float32 (gate, then up) -> [M, I] float32."""
    _loaded()
    return torch.ops.wisp_cpu.gate_mul(h, activation.kind, activation.alpha, activation.limit)


def rank_share_rows(ids: torch.Tensor, cpu_ranks: int, hidden: torch.Tensor, gate_up_bank: torch.Tensor,
                    down_bank: torch.Tensor, rows: torch.Tensor, extras: ExpertExtras | None = None,
                    activation: Activation = SILU) -> tuple[int, int]:
    """Hybrid's rank share on the host, in one native call: each pair (b, k) of the routing ids [B, K] with
    k < cpu_ranks gets rows[b, k] = its expert's gated MLP of hidden[b] (bf16 [B, D]) from the banks
    (gate_up [N, 2I, D], down [N, D, I]: bf16, or quantized beside their [N, ...] scale banks; bias banks
    [N, 2I], [N, D] where biased: the bank's `extras`), exactly as `gated_experts_mlp` computes it; the other rows
    stay as they are. Returns (distinct experts computed, distinct experts routed)."""
    _loaded()
    ex = ExpertExtras() if extras is None else extras
    computed, routed = torch.ops.wisp_cpu.rank_share_rows(
        ids, cpu_ranks, hidden, gate_up_bank, ex.gate_up_scale, down_bank, ex.down_scale, ex.gate_up_bias,
        ex.down_bias, activation.kind, activation.alpha, activation.limit, rows)
    return computed, routed


def fp8_nan_codes(codes: torch.Tensor) -> bool:
    """Whether contiguous float8_e4m3fn codes hold a NaN code anywhere (one native scan at memory speed: a bank
    that does is not the native kernel's to read)."""
    _loaded()
    return bool(torch.ops.wisp_cpu.fp8_nan_codes(codes))


def rows_matmul(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32, w [N, K] (bf16, or quantized with its scale) -> x @ w.T [M, N] float32 (one group)."""
    return grouped_rows_matmul(x, [w], [x.shape[0]], None if scale is None else [scale])


NATIVE_FORMATS = ("plain", "fp8", "mxfp4", "q8_0", "q4_k", "q5_k", "q6_k")  # `weight_format`s it reads (plain: bf16)


def _reads(w: torch.Tensor, scale: torch.Tensor | None) -> bool:
    """Whether the native kernel reads weight w with its scale (None for plain weights): a format it knows (bf16
    when plain), a depth K (MXFP4's [N, K/32, 16] holds 32 a group) that is a positive multiple of 16."""
    try:
        fmt = weight_format(w, scale)
    except ValueError:
        return False
    if fmt not in NATIVE_FORMATS or (fmt == "plain" and w.dtype != torch.bfloat16):
        return False
    depth = w.shape[-2] * {"mxfp4": 32, "q4_k": 256, "q5_k": 256, "q6_k": 256}.get(fmt, 0) or w.shape[-1]
    group = {"mxfp4": 32, "q8_0": 32}.get(fmt, LANES)  # MXFP4 and Q8_0 rows: whole groups of 32 (k-quants' of 256)
    return depth > 0 and depth % group == 0


def applies(w_gate_up: torch.Tensor, w_down: torch.Tensor, extras: ExpertExtras | None) -> bool:
    """Whether the native kernel computes this expert, whole (else torch's plain kernel does): weights in a format
    it reads, one for both roles or each a GGUF block format (a Q4_K_M file's Q6_K down beside Q4_K gate/up),
    biases (where there are) bf16 or float32."""
    scales = None if extras is None else extras.scales
    biases = () if extras is None else (extras.gate_up_bias, extras.down_bias)
    roles = (w_gate_up, None if scales is None else scales[0]), (w_down, None if scales is None else scales[1])
    if not all(_reads(w, s) for w, s in roles):
        return False
    formats = {weight_format(w, s) for w, s in roles}  # one, or each of a GGUF file's block formats
    return ((len(formats) == 1 or formats <= set(GGUF_BLOCK_FORMATS))
            and all(b is None or b.dtype in (torch.bfloat16, torch.float32) for b in biases))


ExpertsKernel = Callable[..., torch.Tensor]
"""`kernel(x, counts, gate_ups, downs, extras, activation)`: a layer's CPU experts at once. x [M, D] holds each
expert's rows in turn (`counts` of them), gate_ups / downs / extras are per expert; returns [M, D] float32."""


def one_at_a_time(expert_fn) -> ExpertsKernel:
    """The experts kernel that runs the one-expert kernel `expert_fn(x, w_gate_up, w_down, extras, activation)`
    on each expert's rows in turn."""
    def experts(x: torch.Tensor, counts: list[int], gate_ups, downs, extras, activation: Activation = SILU):
        outs, start = [], 0
        for n, w_gate_up, w_down, ex in zip(counts, gate_ups, downs, extras):
            outs.append(expert_fn(x[start : start + n], w_gate_up, w_down, ex, activation).float())
            start += n
        return torch.cat(outs) if outs else x.new_zeros((0, x.shape[1]), dtype=torch.float32)

    return experts


def native_experts_mlp(x: torch.Tensor, counts: list[int], gate_ups: list[torch.Tensor], downs: list[torch.Tensor],
                       extras: list[ExpertExtras | None], activation: Activation = SILU) -> torch.Tensor:
    """A layer's CPU experts with the native kernel, in one native call (`gated_experts_mlp`): both GEMVs of every
    expert in one parallel region each, the biases and the activation in float32 between ([M, D] float32). Where
    some expert's weights are in a format it does not read, or the experts are not all in one format: torch's
    plain kernel, one expert at a time. The experts of one call share their shapes (they are one layer's); the
    format is checked on each, the rest on the first. (Lean: the eager hybrid step calls it once a layer.)"""
    scales = [None if ex is None else ex.scales for ex in extras]
    first = (gate_ups[0].dtype, downs[0].dtype, None if scales[0] is None else (scales[0][0].dtype, scales[0][1].dtype))
    if not (all((gu.dtype, dn.dtype, None if s is None else (s[0].dtype, s[1].dtype)) == first
                for gu, dn, s in zip(gate_ups, downs, scales)) and applies(gate_ups[0], downs[0], extras[0])):
        return one_at_a_time(plain_expert_mlp)(x, counts, gate_ups, downs, extras, activation)
    gate_ups, downs = [w.contiguous() for w in gate_ups], [w.contiguous() for w in downs]
    gate_up_scales = None if scales[0] is None else [s[0].contiguous() for s in scales]
    down_scales = None if scales[0] is None else [s[1].contiguous() for s in scales]
    return gated_experts_mlp(x.float().contiguous(), gate_ups, downs, counts, gate_up_scales, down_scales,
                             _biases(extras, "gate_up_bias", gate_ups[0].shape[0]),
                             _biases(extras, "down_bias", downs[0].shape[0]), activation)


def _biases(extras: list[ExpertExtras | None], role: str, width: int) -> list[torch.Tensor] | None:
    """Each expert's bias of `role` (float32 zeros where one has none), or None where none has one (`applies` has
    checked their dtype: bf16 or float32, which the native code reads as they are)."""
    biases = [None if ex is None else getattr(ex, role) for ex in extras]
    if all(b is None for b in biases):
        return None
    return [torch.zeros(width) if b is None else b.contiguous() for b in biases]


def plain_expert_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                     extras: ExpertExtras | None = None, activation: Activation = SILU) -> torch.Tensor:
    """One expert on exactly the rows x [M, D] with torch's own GEMM (not row-invariant): [M, D]. Quantized
    weights (FP8, MXFP4 or Q8_0 scales in `extras`) are dequantized to x's dtype first; biases are added."""
    w_gate_up, w_down = dequantize_expert(w_gate_up, w_down, extras, x.dtype)
    b_gate_up, b_down = (None, None) if extras is None else (extras.gate_up_bias, extras.down_bias)
    gate, up = F.linear(x, w_gate_up, b_gate_up).chunk(2, dim=-1)  # [M, I] each
    h = F.silu(gate) * up if activation == SILU else activation(gate, up)
    return F.linear(h, w_down, b_down)


CPU_EXPERT_KERNELS: dict[str, ExpertsKernel] = {  # wisp.options.HYBRID_CPU_KERNELS
    "native": native_experts_mlp, "plain": one_at_a_time(plain_expert_mlp), "reference": one_at_a_time(expert_mlp)}


class CpuExperts:
    """A layer's experts as the CPU computes them: its kernel and the pinned masters' per-expert views,
    made once (a view per call costs microseconds, and hybrid's CPU side sits on a step's critical path).
    An FP8 bank holding a NaN code goes to torch's plain kernel rather than the native one, which does not read
    NaN codes (scanned once here)."""

    def __init__(self, host: dict[str, torch.Tensor], kernel: ExpertsKernel):
        if kernel is native_experts_mlp and any(
                host[key].dtype == torch.float8_e4m3fn and fp8_nan_codes(host[key].contiguous()) for key in (GATE_UP, DOWN)):
            kernel = CPU_EXPERT_KERNELS["plain"]
        self.kernel = kernel
        self.gate_ups, self.downs = host[GATE_UP].unbind(0), host[DOWN].unbind(0)  # [N] views each
        extras = extras_of(host)
        self.extras = [extras_at(extras, e) for e in range(len(self.gate_ups))]

    def rows(self, hidden: torch.Tensor, pairs: torch.Tensor, counts: list[int], experts: list[int], top_k: int,
             activation: Activation = SILU) -> torch.Tensor:
        """The float32 outputs [M, D] of the flat (token, k) pairs [M] (token-major indices into [T*K]), given
        expert by expert (`experts`, `counts` pairs each, in turn), in one kernel call on hidden [T, D]'s rows."""
        return self.kernel(hidden[pairs // top_k], counts, [self.gate_ups[e] for e in experts],
                           [self.downs[e] for e in experts], [self.extras[e] for e in experts], activation)


def default_cpu_kernel(device: torch.device) -> str:
    """"reference" on a CPU-only run; with a GPU "native" where it builds (building it now), else "plain"."""
    if device.type == "cpu":
        return "reference"
    return "native" if native_kernel_error() is None else "plain"
