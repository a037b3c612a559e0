"""Calibrating a hybrid layer's costs on the machine it runs on (`HybridCosts`).

- copy_s: one expert copied from its pinned host master into a device tensor (the median of `repeats`);
- cpu_s_at_rows: one expert's pairs computed on the CPU from the host master with the CPU kernel the layer
  will use (`wisp.core.kernels.cpu_expert_kernels.CPU_EXPERT_KERNELS`) for each row count, the fastest of
  `repeats` + 2 after three warm-up calls (what the CPU can do: `CpuPace` scales it by what steps measure),
  then each row count's time capped by the next larger one's, so the curve never falls with rows (a dip would
  break `assign_misses`' exactness argument) and a stall while timing a few rows is clipped rather than spread
  to every row count. Erring low is the safe side: `CpuPace` corrects a CPU slower than probed once steps use
  it, while one probed too slow is never used, so never measured again
  (docs/decisions/probe-keeps-the-fastest-cpu-time.md);
- cpu_overhead_s: one step's fixed cost of using the CPU at all: the hidden rows to the host and one row
  back to the device.

Timed with the device synchronised around each measurement; the experts probed are the first few of one
layer (every layer of a model has the same shapes). The result is what `assign_misses` reads each step.
"""

from __future__ import annotations

import itertools
import statistics
import time
import torch

from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.kernels.expert_extras import SILU, Activation, extras_at, extras_of
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.core.kernels.cpu_expert_kernels import CPU_EXPERT_KERNELS, default_cpu_kernel

PROBE_ROWS = (1, 2, 4, 8, 16, 32, 64)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_s(fn, device: torch.device, repeats: int, pick=statistics.median, warm_ups: int = 1) -> float:
    """`pick` (median, or min) of `repeats` timed calls of fn after `warm_ups` untimed ones, the device synchronised
    around each."""
    for _ in range(warm_ups):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return pick(times)


@torch.inference_mode()
def probe_hybrid_costs(host: dict[str, torch.Tensor], device: torch.device | str, cpu_kernel: str | None = None,
                       rows: tuple[int, ...] = PROBE_ROWS, repeats: int = 3, dtype: torch.dtype | None = None,
                       activation: Activation = SILU) -> HybridCosts:
    """dtype, activation: the model's compute dtype (None: plain weights' own) and expert activation, so the
    CPU times are those of the expert the model runs."""
    device = torch.device(device)
    dtype = dtype or host[GATE_UP].dtype
    if not dtype.is_floating_point:
        raise ValueError(f"quantized experts ({dtype}) need the model's compute dtype to be probed")
    experts_fn = CPU_EXPERT_KERNELS[cpu_kernel or default_cpu_kernel(device)]
    num_experts = host[GATE_UP].shape[0]
    extras = extras_of(host)
    dest = {name: torch.empty(t.shape[1:], dtype=t.dtype, device=device) for name, t in host.items()}
    turn = itertools.count()

    def copy_one():
        e = next(turn) % num_experts  # a different expert each time, so no cache helps the host side
        for name, master in host.items():
            dest[name].copy_(master[e], non_blocking=True)

    copy_s = timed_s(copy_one, device, repeats)
    d = host[DOWN].shape[1]  # [N, D, I] (MXFP4: [N, D, I/32, 16])
    cpu_s = []
    for n in rows:
        x = torch.randn((n, d), generator=torch.Generator().manual_seed(n)).to(dtype)

        def cpu_one(x=x):
            e = next(turn) % num_experts
            experts_fn(x, [n], [host[GATE_UP][e]], [host[DOWN][e]], [extras_at(extras, e)], activation)

        cpu_s.append(timed_s(cpu_one, torch.device("cpu"), repeats + 2, pick=min, warm_ups=3))
    for i in reversed(range(len(cpu_s) - 1)):  # a smaller step is never dearer than a larger one
        cpu_s[i] = min(cpu_s[i], cpu_s[i + 1])
    hidden = torch.zeros((1, d), dtype=dtype, device=device)
    overhead_s = timed_s(lambda: hidden.cpu().to(device), device, repeats)
    return HybridCosts(copy_s, tuple(rows), tuple(cpu_s), overhead_s)
