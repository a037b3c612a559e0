"""wisp.bench.llama_cpp.gpu_peak (`wisp bench llama-cpp peak`): the peak is the largest sample taken while the
block runs, and a machine with no GPU to read (this one) gives None rather than a number."""

from __future__ import annotations

import json
import sys
import time

from tests.cli_runner import run_wisp
from wisp.bench.llama_cpp.gpu_peak import DeviceMemory, PeakGpuMemory


def test_the_peak_is_the_largest_sample_until_the_block_ends():
    samples = [5, 9, 7]
    taken = []

    def read() -> int:
        taken.append(samples[len(taken)] if len(taken) < len(samples) else 3)
        return taken[-1]

    with PeakGpuMemory(period_s=0.001, read=read) as memory:
        while len(taken) < 5:
            time.sleep(0.001)
    assert memory.peak == 9
    count = len(taken)
    time.sleep(0.02)
    assert len(taken) == count  # the sampler stopped with the block


def test_a_reader_with_nothing_to_read_leaves_no_peak():
    with PeakGpuMemory(period_s=0.001, read=lambda: None) as memory:
        time.sleep(0.01)
    assert memory.peak is None


class FakeNvml:
    """pynvml's calls gpu_peak makes, over two GPUs whose used bytes a test sets."""

    class NVMLError(Exception):
        pass

    nvmlMemory_v2 = 2

    def __init__(self, used: list[int]):
        self.used, self.open, self.versions = used, 0, set()

    def nvmlInit(self):
        self.open += 1

    def nvmlShutdown(self):
        self.open -= 1

    def nvmlDeviceGetCount(self):
        return len(self.used)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetMemoryInfo(self, handle, version=1):
        self.versions.add(version)
        return type("Memory", (), {"used": self.used[handle]})


def test_nvml_is_read_at_once_on_every_gpu_and_closed_after(monkeypatch):
    nvml = FakeNvml([100, 700])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with PeakGpuMemory(period_s=10.0) as memory:  # the block ends long before a second sample
        assert nvml.open == 1
    assert memory.peak == 700 and nvml.versions == {FakeNvml.nvmlMemory_v2} and nvml.open == 0
    with DeviceMemory() as device:
        nvml.used[0] = 900
        assert device.used() == 900
    assert nvml.open == 0


def test_the_command_runs_under_the_sampler_and_its_exit_code_is_kept(tmp_path):
    out = tmp_path / "peak.json"
    proc = run_wisp(["llama-cpp", "peak", "--out", out, "--", sys.executable, "-c", "import sys; sys.exit(3)"],
                    tmp_path, timeout=120, command="bench")
    assert proc.returncode == 3, proc.stderr
    record = json.loads(out.read_text())
    assert record["returncode"] == 3 and record["command"].endswith("sys.exit(3)")
    with DeviceMemory() as device:
        here = device.used()
    assert (record["peak_gpu_bytes"] is None) == (here is None) == (record["baseline_bytes"] is None)


def test_a_peak_without_a_program_or_with_a_missing_one_is_one_line(tmp_path):
    for program in ([], ["--", str(tmp_path / "no-such-program")]):
        proc = run_wisp(["llama-cpp", "peak", "--out", tmp_path / "peak.json", *program], tmp_path, timeout=120,
                        command="bench")
        assert proc.returncode == 2 and proc.stderr.startswith("wisp: error: ") and "Traceback" not in proc.stderr
