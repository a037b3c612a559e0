"""`wisp bench llama-cpp peak`: the GPU memory a program holds, as nvidia-smi sees it, the one measure both
llama.cpp and wisp can be held to.

    wisp bench llama-cpp peak --out peak.json -- python3 -m wisp bench decode ...

llama.cpp reports no allocator peak of its own, so the llama.cpp placements are compared by the device
memory in use (nvidia-smi's `memory.used`: the CUDA context, cuBLAS workspaces and the allocator's cache
included), sampled every 100 ms. It is read through NVML (nvidia-ml-py: one driver call a sample, the count
nvidia-smi prints) from this one process, never by starting nvidia-smi, which takes the CPU from the programs
being timed (docs/decisions/gpu-memory-sampled-through-nvml.md). Run wisp's side under the same sampler to
compare like with like; `baseline_bytes` is what was in use before the program started (other processes),
and is included in the peak.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from wisp.errors import WispError


class DeviceMemory:
    """NVML, opened once: `used()` is the most memory in use on any GPU now, in bytes, as nvidia-smi's
    `memory.used` counts it (NVML's v2 figure, without the driver's reserve); None without NVML or a GPU."""

    def __enter__(self) -> "DeviceMemory":
        self.handles, self.nvml = [], None
        try:
            import pynvml
        except ImportError:  # no nvidia-ml-py: nothing to read
            return self
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:  # no driver (a CPU machine)
            return self
        self.nvml = pynvml
        try:
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError:
            self.handles = []
        return self

    def used(self) -> int | None:
        if not self.handles:
            return None
        try:
            return max(self.nvml.nvmlDeviceGetMemoryInfo(h, version=self.nvml.nvmlMemory_v2).used for h in self.handles)
        except self.nvml.NVMLError:
            return None

    def __exit__(self, *exc) -> None:
        if self.nvml is not None:
            self.nvml.nvmlShutdown()


class PeakGpuMemory:
    """The most memory in use on a GPU, sampled while the block runs (None without NVML): one reading when
    the block starts, then one every `period_s` until it ends. `read`: a sampler other than NVML's (tests)."""

    def __init__(self, period_s: float = 0.1, read: Callable[[], int | None] | None = None):
        self.period_s, self.read, self.peak, self._stop = period_s, read, None, threading.Event()

    def _take(self) -> bool:
        used = self._read()
        if used is not None:
            self.peak = used if self.peak is None else max(self.peak, used)
        return used is not None

    def _sample(self) -> None:
        while not self._stop.wait(self.period_s) and self._take():
            pass

    def __enter__(self) -> "PeakGpuMemory":
        self._opened = contextlib.ExitStack()
        self._read = self.read or self._opened.enter_context(DeviceMemory()).used
        self._thread = threading.Thread(target=self._sample, daemon=True)
        if self._take():  # before the block's work starts, so a short block still has a reading
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._opened.close()


def bench_peak(args) -> int:
    """`wisp bench llama-cpp peak --out FILE -- PROGRAM ...`: run the program under the sampler, write the
    record, and return the program's exit status."""
    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not command:
        raise WispError("no program given (put it after --)")
    with DeviceMemory() as device:
        baseline = device.used()
    with PeakGpuMemory() as memory:
        try:
            returncode = subprocess.run(command).returncode
        except OSError as exc:
            raise WispError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    Path(args.out).write_text(json.dumps({"command": " ".join(command), "returncode": returncode,
                                          "peak_gpu_bytes": memory.peak, "baseline_bytes": baseline,
                                          "sampler": f"NVML memory used (v2), every {memory.period_s * 1e3:.0f} ms"})
                              + "\n")
    return returncode
