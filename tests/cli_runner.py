"""Run the `wisp` command as a subprocess, the way a user does (shared by the CLI test modules)."""

from __future__ import annotations

import json
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


# the planner's two costs given, so `wisp plan` and `wisp sim` runs are deterministic (no probe)
PLAN_COSTS = ["--seconds-per-byte", "2e-11", "--recompute-cost", "1e-4"]


def record_demo_routing(trace: Path, cache: Path) -> dict:
    """Write a routing trace to `trace` with `wisp generate --record-routing` on the demo model; the run's JSON
    output (cap 16 = N: no prefill grouping, so the pager's steps are exactly the trace's steps; a one-token
    prompt, so no step routes to more than top_k = 4 experts and every cap from 4 up is in the pager's domain)."""
    proc = run_wisp(["--model", "demo", "--prompt", "H", "--max-tokens", "24", "--expert-cap", "16",
                     "--device", "cpu", "--record-routing", trace, "--json"], cache)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
