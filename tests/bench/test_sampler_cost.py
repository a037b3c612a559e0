"""benchmarks/llama_cpp/sampler_cost.py end to end on the demo model (CPU: no nvidia-smi, so the sampler's
process finds none and idles): the arms take turns in ABBA order within one request, each its rounds' steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_arms_take_turns_in_one_request_and_are_summarised(tmp_path):
    out = tmp_path / "cost.json"
    script = ROOT / "benchmarks" / "llama_cpp" / "sampler_cost.py"
    flags = ["--model", "demo", "--device", "cpu", "--mode", "paged", "--expert-cap", "6", "--prompt-len", "8",
             "--round", "3", "--rounds", "2", "--out", str(out)]
    proc = subprocess.run([sys.executable, str(script), *flags], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["order"] == ["quiet", "sampled", "sampled", "quiet"]
    for arm in ("quiet", "sampled"):
        a = record["arms"][arm]
        assert a["steps"] == len(a["step_s"]) == 6 and all(s > 0 for s in a["step_s"])
        assert abs(a["tok_s"] - 6 / sum(a["step_s"])) <= 0.05 * a["tok_s"]  # step_s are rounded to 10 us
    assert "quiet" in proc.stdout and "sampled" in proc.stdout and record["gpu"] == "cpu"
