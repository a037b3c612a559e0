"""Run the `wisp` command as a subprocess, the way a user does (shared by the CLI test modules)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def run_wisp(args, cache: Path, timeout: float = 300, command: str = "generate") -> subprocess.CompletedProcess:
    """`python -m wisp <command> *args` with WISP_CACHE=cache, offline, one torch thread (runs go side by side)."""
    return subprocess.run(
        [sys.executable, "-m", "wisp", command, *map(str, args)],
        env=dict(os.environ, WISP_CACHE=str(cache), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_many(cases: dict, cache: Path, command: str = "generate") -> dict[str, subprocess.CompletedProcess]:
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        futures = {name: pool.submit(run_wisp, args, cache, command=command) for name, args in cases.items()}
        return {name: f.result() for name, f in futures.items()}
