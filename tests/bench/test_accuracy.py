"""`wisp bench accuracy` end to end on the demo model (CPU): hybrid's CPU path really runs and its outputs are
compared with resident's; resident against itself on the torch kernels (the CPU's own) differs by nothing."""

from __future__ import annotations

import json

from tests.cli_runner import run_wisp

FLAGS = ["accuracy", "--model", "demo", "--prompts", "2", "--prompt-len", "8", "--decode-tokens", "5"]


def test_hybrid_against_resident_is_compared_prompt_by_prompt(tmp_path):
    out = tmp_path / "acc.json"
    proc = run_wisp([*FLAGS, "--expert-cap", "4", "--out", out], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert [r["prompt"] for r in result["prompts"]] == [0, 1]
    for r in result["prompts"]:
        assert 0 < r["experts_on_cpu"] <= r["expert_misses"]  # the CPU-heavy costs send it the light misses
        assert 0.0 <= r["greedy_agreement"] <= 1.0 and r["max_abs_logit_diff"] < 0.01 * r["logit_scale"]
    assert result["summary"]["max_abs_logit_diff"] == max(r["max_abs_logit_diff"] for r in result["prompts"])
    assert result["config"]["expert_cap"] == 4 and "run_bench" not in result["config"]
    assert result["command"].startswith("wisp bench accuracy") and "all: max |logit diff|" in proc.stdout


def test_resident_on_the_cpus_own_kernels_is_the_zero_noise_floor(tmp_path):
    out = tmp_path / "floor.json"
    proc = run_wisp([*FLAGS, "--against", "resident-torch", "--out", out], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary == {"max_abs_logit_diff": 0.0, "greedy_agreement": 1.0, "prompts_fully_equal": 2}
