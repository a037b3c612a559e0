"""wisp's paging inside vLLM's OpenAI server, `python -m vllm.entrypoints.openai.api_server` (skipped where vllm
is not installed). The server loads wisp through its entry point, in vLLM's layout on the CPU (API server, engine
core and one worker, each a process), with `--additional-config '{"wisp": {"mode": "paged", "expert_cap": 2}}'`,
on a tiny random Qwen3-MoE. One request from the official `openai` client must give the greedy token ids and
top-5 logprobs of vLLM without plug-ins (`VLLM_PLUGINS=""`), run offline on the same prompt alone in a process of
its own while the server starts. The server logs each MoE layer's slots at load and, shut down gracefully, its
worker's counters.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")  # a dependency of vLLM's
pytestmark = pytest.mark.slow  # a server and an offline run, about a minute on 2 cores

from tests.integrations.vllm.checkpoints import tiny_bf16_checkpoint  # noqa: E402
from tests.integrations.vllm.processes import kill_and_clean, offline, start, vllm_env  # noqa: E402

N, TOP_K = 8, 2
EXPERT_BYTES = (2 * 32 * 64 + 64 * 32) * 2  # one expert's gate_up [64, 64] and down [64, 32] in bf16
PROMPT = [1, 5, 9, 22, 7, 3]
WISP = {"wisp": {"mode": "paged", "expert_cap": TOP_K}}
LOADED = re.compile(r"wisp: model\.layers\.(\d+)\.mlp\.experts pages its (\d+) experts through (\d+) slots")
TOTALS = re.compile(r"wisp: (\d+) paged MoE layers: (\d+) steps, (\d+) hits, (\d+) misses, (\d+) loads, "
                    r"(\d+) bytes host->device")


@dataclass
class Server:
    proc: subprocess.Popen
    base: str
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(tmp_path: Path, checkpoint: Path) -> Server:
    port, log = free_port(), tmp_path / "server.log"
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint),
            "--skip-tokenizer-init", "--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "128",
            "--host", "127.0.0.1", "--port", str(port), "--additional-config", json.dumps(WISP),
            "--shutdown-timeout", "30"]  # drain: the worker exits through atexit, which logs wisp's counters
    env = vllm_env(tmp_path / "server_cache", VLLM_CPU_OMP_THREADS_BIND="nobind")
    return Server(start(args, log, env), f"http://127.0.0.1:{port}", log)


def wait_healthy(server: Server, deadline: float) -> None:
    while True:
        assert server.proc.poll() is None, f"server exited with {server.proc.returncode}:\n{server.text()[-6000:]}"
        assert time.monotonic() < deadline, f"server not healthy in time:\n{server.text()[-6000:]}"
        try:
            if openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0).models.list().data:
                return
        except (OSError, openai.APIError):
            pass
        time.sleep(0.5)


def greedy(server: Server, model: str) -> tuple[list[int], list[dict[str, float]]]:
    """One completion request: the 8 greedy token ids and each step's top-5 logprobs (tokens named by id)."""
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)
    done = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=5,
                                     extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True})
    choice = done.choices[0]
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in choice.token_ids]
    return choice.token_ids, choice.logprobs.top_logprobs


def shut_down(server: Server) -> None:
    """SIGTERM to the API server, as a supervisor stops it; it drains and stops its engine core and worker."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pass
    kill_and_clean(server.proc, server.log)


def test_the_openai_server_pages_with_vllms_tokens_and_logprobs(tmp_path):
    checkpoint = tiny_bf16_checkpoint("qwen3_moe", tmp_path / "qwen3_moe")
    server = serve(tmp_path, checkpoint)
    vllm_alone = offline(tmp_path, "vllm", checkpoint, {"distributed_executor_backend": "uni"}, [PROMPT],
                         VLLM_PLUGINS="", VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind")
    try:
        (tokens, top5), = vllm_alone.result()["outputs"]
        wait_healthy(server, time.monotonic() + 300)
        paged = greedy(server, str(checkpoint))
    finally:
        vllm_alone.stop()
        shut_down(server)
    assert len(tokens) == 8 and paged == (tokens, [{f"token_id:{t}": lp for t, lp in step.items()} for step in top5])
    wisp = server.text()
    loaded = sorted((int(layer), int(n), int(c)) for layer, n, c in LOADED.findall(wisp))
    assert loaded == [(0, N, TOP_K), (2, N, TOP_K)]
    (totals,) = TOTALS.findall(wisp)
    layers, steps, hits, misses, loads, moved = map(int, totals)
    assert layers == 2 and steps >= 2 * 8 and loads == misses > 2 * TOP_K and moved == loads * EXPERT_BYTES
