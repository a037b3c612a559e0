"""`wisp bench agent` end to end on the demo model (CPU), its arms, and the session driver's turn order."""

from __future__ import annotations

import json

import pytest

from tests.cli_runner import run_wisp
from wisp.bench.agent_arms import ARMS, arm_specs, parse_arms
from wisp.errors import WispError

RECORD_KEYS = {"arm", "ttft_p50_s", "ttft_p90_s", "decode_tok_s", "turn_wall_p50_s", "turn_wall_p90_s", "e2e_wall_s",
               "preemptions", "hit_rate", "kv_blocks_peak", "bytes_h2d", "peak_gpu_bytes", "device", "command",
               "decode_tokens", "graph_steps"}


def _agentinfer_file(path, sessions: int = 3, turns: int = 3) -> None:
    """Token counts only (the agentinfer log's format): each turn's prompt grows."""
    rows = []
    for s in range(sessions):
        for t in range(turns):
            rows.append({"session_id": f"s{s}", "actor_id": "lead", "started_at": f"2026-01-01T00:00:{10 * t + s:02d}",
                         "input_tokens": 30 + 25 * t + 7 * s, "output_tokens": 5})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


@pytest.mark.slow
def test_bench_agent_writes_one_record_per_arm(tmp_path):
    sessions, out = tmp_path / "agentinfer_sessions.jsonl", tmp_path / "agent.json"
    _agentinfer_file(sessions)
    proc = run_wisp(["agent", "--model", "demo", "--sessions", sessions, "--concurrency", "2", "--vram-budget", "600MiB",
                     "--max-model-len", "256", "--max-reply-tokens", "4", "--device", "cpu", "--resolve-every", "2",
                     "--min-observations", "10", "--out", out, "--plot", tmp_path / "agent.png"],
                    tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())
    assert [r["arm"] for r in records] == list(ARMS)
    for r in records:
        assert RECORD_KEYS <= set(r) and r["turns"] == 9 and r["preemptions"] == 0
        assert r["kv_blocks"] >= r["admission_floor_blocks"] and r["routing"] == "random-router"
        assert r["prefix_hit_tokens"] > 0  # later turns resend the earlier prompt
    assert "resizes" in records[-1] and (tmp_path / "agent.png").stat().st_size > 0
    assert records[-1]["controller_host_s"] > 0  # the controller's own time between steps, reported
    assert {r["prefill_tokens"] for r in records} == {records[0]["prefill_tokens"]}  # same work in every arm


def test_arms_are_sized_on_one_plan_and_keep_the_floor():
    from types import SimpleNamespace

    from wisp.plan.split import SplitProblem

    problem = SplitProblem(budget_bytes=100 * 10 + 40 * 5, slot_bytes=100, block_bytes=5, expert_cost=1.0, kv_cost=1.0,
                           min_cap=2, max_cap=16, kv_floor=40)
    plan = SimpleNamespace(curves=SimpleNamespace(problem=problem), per_layer_caps=(8, 10), kv_blocks=42,
                           report=SimpleNamespace(expert_cap=9))
    specs = {s.arm: s for s in arm_specs(plan, list(ARMS), num_experts=16)}
    assert specs["mv-wsa"].expert_caps == (8, 10) and specs["mv-wsa"].kv_blocks == 42
    assert specs["kv-blind"].expert_cap == 10 and specs["kv-blind"].kv_blocks == 40  # everything but the floor
    assert specs["50-50"].expert_cap == 6 and specs["controller"].controller and specs["controller"].expert_cap == 9
    assert specs["zero-copy"].expert_caps is None and specs["zero-copy"].kv_blocks == 240
    assert all(s.kv_blocks >= problem.kv_floor for s in specs.values())
    with pytest.raises(WispError, match="choose from"):
        parse_arms("mv-wsa,lru")
    start = {s.arm: s for s in arm_specs(plan, ["controller"], 16, controller_start="50-50")}["controller"]
    assert start.expert_cap == 6 and start.kv_blocks == problem.kv_blocks(6)
