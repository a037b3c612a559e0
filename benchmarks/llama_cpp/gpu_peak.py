"""The GPU memory a program holds, as nvidia-smi sees it: the one measure both llama.cpp and wisp can be held to.

    python benchmarks/llama_cpp/gpu_peak.py --out peak.json -- python3 -m wisp bench decode ...

llama.cpp reports no allocator peak of its own, so the llama.cpp placements are compared by nvidia-smi's
`memory.used` (the CUDA context, cuBLAS workspaces and the allocator's cache included), sampled every 100 ms.
Run wisp's side under the same sampler to compare like with like; `baseline_bytes` is what was in use before
the program started (other processes), and is included in the peak.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from pathlib import Path


def gpu_memory_used() -> int | None:
    """The most memory.used of any GPU now, in bytes (None without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5).stdout
        return max(int(line) for line in out.split()) * 2**20
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


class PeakGpuMemory:
    """The largest `memory.used` nvidia-smi reports while the block runs (None without nvidia-smi)."""

    def __init__(self, period_s: float = 0.1):
        self.period_s, self.peak, self._stop = period_s, None, threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            used = gpu_memory_used()
            if used is None:
                return
            self.peak = used if self.peak is None else max(self.peak, used)
            self._stop.wait(self.period_s)

    def __enter__(self) -> "PeakGpuMemory":
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="write {command, returncode, peak_gpu_bytes, baseline_bytes} here")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the program and its arguments")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given (put it after --)")
    baseline = gpu_memory_used()
    with PeakGpuMemory() as memory:
        returncode = subprocess.run(command).returncode
    Path(args.out).write_text(json.dumps({"command": " ".join(command), "returncode": returncode,
                                          "peak_gpu_bytes": memory.peak, "baseline_bytes": baseline}) + "\n")
    sys.exit(returncode)


if __name__ == "__main__":
    main()
