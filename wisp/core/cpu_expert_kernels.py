"""The kernels hybrid mode computes its CPU experts with (`CPU_EXPERT_KERNELS`, `--hybrid-cpu-kernel`).

Hybrid mode computes some experts of a decode step on the host, from the pinned masters, while the GPU
computes the rest; a step's CPU side is bound by how fast the CPU reads those experts' weights.
- "native" (the default with a GPU, where it builds): `native/bf16_rows_matmul.cpp`, bf16 weights against
  float32 rows. On the H200's 16-core host it reads an OLMoE expert at about 71 GB/s, where torch's bf16
  GEMV reads 25-47 and llama.cpp's CPU path about 64. Built on first use with torch's extension builder
  (ninja and a C++ compiler; cached under torch's extension folder, rebuilt when the source changes).
- "plain" (the fallback): torch's GEMM on exactly the routed rows.
- "reference": `wisp.core.moe.expert_mlp`, the device's own row-invariant kernel, whose fixed 16-row tiles
  cost 13x more at one row on a 2-core AVX2 host (11.9 against 0.9 ms for an OLMoE expert in bf16) but
  give the device's bits on the CPU (the default for a CPU-only run, where nothing could be gained anyway).

Invariants:
- one OpenMP runtime: the library links the one torch loaded, so its threads are torch's team, never a
  second team contending for the same cores;
- bits do not depend on the CPU or the thread count: each output is one thread's sum over k in 16 fixed
  lanes, folded in a fixed order, with no contraction into FMAs (tested against itself at 1 and 2
  threads, and against a float64 reference within float32's rounding);
- the kernel is only called where it applies (bf16 weights, no quantization scales, K a multiple of 16);
  `native_expert_mlp` hands anything else to torch's plain kernel.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch
import torch.nn.functional as F

from wisp.core.expert_extras import SILU, Activation, ExpertExtras
from wisp.core.moe import expert_mlp
from wisp.core.quantized_weights import dequantize_expert

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "bf16_rows_matmul.cpp"
LANES = 16  # the kernel's sum runs in 16 lanes: K must be a multiple


@functools.cache
def _build() -> str | None:
    """Build and load the kernel once per process: None when it loaded, else why it could not."""
    try:
        from torch.utils import cpp_extension

        cpp_extension.load(name="wisp_cpu", sources=[str(SOURCE)], is_python_module=False,
                           extra_cflags=["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"],
                           extra_ldflags=["-fopenmp"])  # links libgomp.so.1: the runtime torch already loaded
        torch.ops.wisp_cpu.bf16_rows_matmul  # noqa: B018 (registered, or raises)
    except Exception as exc:  # no compiler, no ninja, a build error: say why, once
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        log.warning("hybrid mode's native CPU kernel did not build (%s); using torch's", reason)
        return reason
    return None


def native_kernel_error() -> str | None:
    """None when the native kernel is built and loaded (building it now if need be), else why not."""
    return _build()


def bf16_rows_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32, w [N, K] bf16 (both contiguous, on the CPU) -> x @ w.T [M, N] float32."""
    if (reason := _build()) is not None:
        raise RuntimeError(f"the native CPU kernel is not available: {reason}")
    return torch.ops.wisp_cpu.bf16_rows_matmul(x, w)


def applies(w_gate_up: torch.Tensor, w_down: torch.Tensor, extras: ExpertExtras | None) -> bool:
    """Whether the native kernel computes this expert (else torch's plain kernel does)."""
    return (w_gate_up.dtype == torch.bfloat16 and w_down.dtype == torch.bfloat16
            and (extras is None or extras.scales is None)
            and w_gate_up.shape[-1] % LANES == 0 and w_down.shape[-1] % LANES == 0)


def native_expert_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                      extras: ExpertExtras | None = None, activation: Activation = SILU) -> torch.Tensor:
    """One expert on the rows x [M, D] (bf16 weights [2I, D] and [D, I]): [M, D] float32, the
    activation taken in float32; biases added in float32. Other weights: torch's plain kernel."""
    if not applies(w_gate_up, w_down, extras):
        return plain_expert_mlp(x, w_gate_up, w_down, extras, activation)
    h = bf16_rows_matmul(x.float().contiguous(), w_gate_up.contiguous())  # [M, 2I]
    if extras is not None and extras.gate_up_bias is not None:
        h = h + extras.gate_up_bias.float()
    gate, up = h.chunk(2, dim=-1)  # [M, I] each
    a = F.silu(gate) * up if activation == SILU else activation(gate, up)
    out = bf16_rows_matmul(a.contiguous(), w_down.contiguous())  # [M, D]
    if extras is not None and extras.down_bias is not None:
        out = out + extras.down_bias.float()
    return out


def plain_expert_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                     extras: ExpertExtras | None = None, activation: Activation = SILU) -> torch.Tensor:
    """One expert on exactly the rows x [M, D] with torch's own GEMM (not row-invariant): [M, D]. Quantized
    weights (FP8 or MXFP4 scales in `extras`) are dequantized to x's dtype first; biases are added."""
    w_gate_up, w_down = dequantize_expert(w_gate_up, w_down, extras, x.dtype)
    b_gate_up, b_down = (None, None) if extras is None else (extras.gate_up_bias, extras.down_bias)
    gate, up = F.linear(x, w_gate_up, b_gate_up).chunk(2, dim=-1)  # [M, I] each
    h = F.silu(gate) * up if activation == SILU else activation(gate, up)
    return F.linear(h, w_down, b_down)


CPU_EXPERT_KERNELS = {"native": native_expert_mlp, "plain": plain_expert_mlp,
                      "reference": expert_mlp}  # wisp.options.HYBRID_CPU_KERNELS


def default_cpu_kernel(device: torch.device) -> str:
    """"reference" on a CPU-only run; with a GPU "native" where it builds (building it now), else "plain"."""
    if device.type == "cpu":
        return "reference"
    return "native" if native_kernel_error() is None else "plain"
