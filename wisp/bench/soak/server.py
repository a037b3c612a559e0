"""The server a soak drives: `python -m wisp serve` as a child process, its resident memory, its /metrics."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from wisp.bench.child_env import child_env
from wisp.bench.soak.config import SoakConfig
from wisp.errors import WispError

READY = re.compile(r"wisp: serving .* on (http://\S+)")


class ServerProcess:
    """`python -m wisp serve ... --port 0` with its output drained to a log file."""

    def __init__(self, cfg: SoakConfig, log_path: Path):
        args = [sys.executable, "-m", "wisp", "serve", "--model", cfg.model, "--device", cfg.device,
                "--host", "127.0.0.1", "--port", "0", "--mode", cfg.mode, "--enable-resize-endpoint",
                "--max-concurrency", str(cfg.max_concurrency), "--max-model-len", str(cfg.max_model_len),
                "--max-num-batched-tokens", str(cfg.max_num_batched_tokens), "--max-request-bytes", "64KiB",
                "--load-format", cfg.load_format, *cfg.server_args]
        env = child_env(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")  # the server runs this wisp
        if cfg.device == "cpu":
            env.setdefault("OMP_NUM_THREADS", "1")  # the clients share the machine's cores
        self.command = args
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.base: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(cfg.startup_timeout) or self.base is None:
            self.kill()
            last = (log_path.read_text().strip().splitlines() or ["no output"])[-1]
            raise WispError(f"the server did not start ({last}); its output is in {log_path}")

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            if self.base is None and (m := READY.search(line)):
                self.base = m.group(1)
                self._ready.set()
        self._ready.set()  # exited before the ready line

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM; the exit status (None if it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def rss_bytes(pid: int) -> int | None:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss
    except ImportError:
        pass
    except Exception:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def scrape(base: str) -> dict[str, float]:
    """/metrics as {name{label=value,...}: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base + "/metrics", timeout=30).text
    return {s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}
