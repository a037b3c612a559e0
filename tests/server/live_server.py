"""`python -m wisp serve --model demo` as a subprocess on a free port, for the end-to-end tests that call it with the
official `openai` client (and httpx for what the client cannot send), as a user would."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Server:
    proc: subprocess.Popen
    base: str
    log: Path
    api_key: str = "none"

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key=self.api_key, max_retries=0, timeout=60, **kw)

    def metrics(self) -> dict[str, float]:
        """sample name (with its labels as {k=v}) -> value."""
        text = httpx.get(self.base + "/metrics", timeout=10).text
        return {s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items())): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def demo_server(cache: Path, log: Path, *args: str, api_key: str | None = None, model: str = "demo"):
    """A live `wisp serve --model demo` (or `model`: "demo-random") on the CPU, one OpenMP thread, `args` added,
    healthy within 120 s; killed on exit if it is still running."""
    port = free_port()
    env = dict(os.environ, WISP_CACHE=str(cache), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    key = ["--api-key", api_key] if api_key else []
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "wisp", "serve", "--model", model, "--device", "cpu", "--port", str(port), *key,
             *args], env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    srv = Server(proc, f"http://127.0.0.1:{port}", log, api_key or "none")
    deadline = time.monotonic() + 120
    try:
        while True:
            assert proc.poll() is None, f"server exited with {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"server not healthy after 120 s:\n{log.read_text()}"
            try:
                if httpx.get(srv.base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield srv
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
