"""benchmarks/llama_cpp/sampler_cost.py end to end on the demo model (CPU: no nvidia-smi, so the sampled arm's
sampler stops at once): both arms alternate in one request and each gets its rounds' steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_arms_alternate_in_one_request_and_are_summarised(tmp_path):
    out = tmp_path / "cost.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "llama_cpp" / "sampler_cost.py"), "--model", "demo",
                           "--device", "cpu", "--mode", "paged", "--expert-cap", "6", "--prompt-len", "8", "--round", "3",
                           "--rounds", "2", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    for arm in ("quiet", "sampled"):
        a = record["arms"][arm]
        assert a["steps"] == len(a["step_s"]) == 6 and all(s > 0 for s in a["step_s"])
        assert a["p90_step_s"] <= max(a["step_s"]) and min(a["step_s"]) <= a["median_step_s"] <= max(a["step_s"])
    assert "quiet" in proc.stdout and "sampled" in proc.stdout and record["gpu"] == "cpu"
