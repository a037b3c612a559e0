"""vLLM in processes of its own, for the tests whose engine spawns processes (the OpenAI server, TP = 2): the
environment they run in, their start and stop as one process group (no worker outlives its test, and no shared
memory segment either), and offline runs of `offline_run` with their results."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# chosen per run, never inherited from the test process (the offline tests set some of these in-process)
PER_RUN = ("VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND")


def vllm_env(cache: Path, **env: str) -> dict[str, str]:
    """This checkout's wisp first on the path, vLLM's cache under `cache`, 1 GiB of CPU KV cache, then `env`.
    (Not TMPDIR: vLLM's ZeroMQ sockets live there, and a socket's path may not exceed 107 characters.)"""
    base = {k: v for k, v in os.environ.items() if k not in PER_RUN}
    return {**base, "PYTHONPATH": str(ROOT), "VLLM_CACHE_ROOT": str(cache), "VLLM_CPU_KVCACHE_SPACE": "1", **env}


def start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """`args` in the repository root, stdout and stderr to `log`, in a process group of its own."""
    with open(log, "wb") as out:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def kill_and_clean(proc: subprocess.Popen, log: Path) -> None:
    """Kill `proc` and every process of its group (vLLM's engine core and workers), if it still runs, then remove
    the files its run named in `log`: vLLM's CPU backend meets its ranks at $TMPDIR/vllm_dist_<id> and keeps
    their traffic in /dev/shm/vllm_dist_<id>-..., and, force-killing its workers at exit, leaves both behind."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for run in set(re.findall(r"vllm_dist_[0-9a-f]{32}", log.read_text(errors="replace"))):
        Path(tempfile.gettempdir(), run).unlink(missing_ok=True)
        for segment in Path("/dev/shm").glob(run + "*"):
            segment.unlink(missing_ok=True)


@dataclass
class OfflineRun:
    proc: subprocess.Popen
    out: Path
    log: Path

    def result(self, timeout: float = 400) -> dict:
        """offline_run's JSON, once the process has exited cleanly."""
        code = self.proc.wait(timeout=timeout)
        assert code == 0, f"{self.log.name} exited with {code}:\n{self.log.read_text(errors='replace')[-6000:]}"
        return json.loads(self.out.read_text())

    def stop(self) -> None:
        kill_and_clean(self.proc, self.log)


def offline(tmp_path: Path, name: str, checkpoint: Path, engine_args: dict, prompts: list[list[int]],
            **env: str) -> OfflineRun:
    """Start `offline_run` on `checkpoint`; its JSON, log and vLLM cache go under `tmp_path`, named `name`."""
    out, log = tmp_path / f"{name}.json", tmp_path / f"{name}.log"
    args = [sys.executable, "-m", "tests.integrations.vllm.offline_run", str(checkpoint), json.dumps(engine_args),
            json.dumps(prompts), str(out)]
    return OfflineRun(start(args, log, vllm_env(tmp_path / f"{name}_cache", **env)), out, log)
