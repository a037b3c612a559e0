"""`wisp bench llama-cpp sampler-cost` end to end on the demo model (CPU: no GPU for NVML, so the sampler's
process finds none and idles): the arms take turns in ABBA order within one request, each its rounds' steps."""

from __future__ import annotations

import json

from tests.cli_runner import run_wisp


def test_the_arms_take_turns_in_one_request_and_are_summarised(tmp_path):
    out = tmp_path / "cost.json"
    flags = ["llama-cpp", "sampler-cost", "--model", "demo", "--device", "cpu", "--mode", "paged", "--expert-cap", "6",
             "--prompt-len", "8", "--round", "3", "--rounds", "2", "--out", out]
    proc = run_wisp(flags, tmp_path / "cache", timeout=300, command="bench")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["order"] == ["quiet", "sampled", "sampled", "quiet"]
    for arm in ("quiet", "sampled"):
        a = record["arms"][arm]
        assert a["steps"] == len(a["step_s"]) == 6 and all(s > 0 for s in a["step_s"])
        assert abs(a["tok_s"] - 6 / sum(a["step_s"])) <= 0.05 * a["tok_s"]  # step_s are rounded to 10 us
    assert "quiet" in proc.stdout and "sampled" in proc.stdout and record["gpu"] == "cpu"
