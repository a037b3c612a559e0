"""`wisp bench agent` end to end on the demo model (CPU), its arms, and the session driver's turn order."""

from __future__ import annotations

import json

import pytest

from tests.cli_runner import run_wisp
from wisp.bench.agent import arm_order
from wisp.bench.agent_arms import ARMS, arm_specs, parse_arms
from wisp.errors import WispError

RECORD_KEYS = {"arm", "ttft_p50_s", "ttft_p90_s", "decode_tok_s", "turn_wall_p50_s", "turn_wall_p90_s", "e2e_wall_s",
               "preemptions", "hit_rate", "kv_blocks_peak", "bytes_h2d", "peak_gpu_bytes", "device", "command",
               "decode_tokens", "graph_steps"}


def _agentinfer_file(path, sessions: int = 3, turns: int = 3, reply: int = 5) -> None:
    """Token counts only (the agentinfer log's format): each turn's prompt grows."""
    rows = []
    for s in range(sessions):
        for t in range(turns):
            rows.append({"session_id": f"s{s}", "actor_id": "lead", "started_at": f"2026-01-01T00:00:{10 * t + s:02d}",
                         "input_tokens": 30 + 25 * t + 7 * s, "output_tokens": reply})
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


def _budget_leaving_slots(slots: int, max_concurrency: int, max_model_len: int, block_size: int = 16):
    """(the demo's whole VRAM budget on the CPU, its ModelSizes), the budget such that the KV floor of
    max_concurrency x max_model_len leaves exactly `slots` expert slots: the planner's reserve, the non-expert bytes
    (staging buffers included), `slots` slots, the floor and half a slot more (slots + 1 do not fit beside the
    floor), from `ModelSizes` as `wisp bench agent` plans it."""
    from wisp.bench.decode import model_config_for
    from wisp.plan.sizes import DEFAULT_RESERVE_BYTES, ModelSizes

    sizes = ModelSizes.of(model_config_for("demo", "safetensors"), block_size)
    floor = max_concurrency * -(-max_model_len // block_size)
    return (DEFAULT_RESERVE_BYTES + sizes.non_expert_bytes + slots * sizes.slot_bytes + floor * sizes.block_bytes
            + sizes.slot_bytes // 2), sizes


@pytest.mark.slow
def test_bench_agent_phases_abba_records_each_phase_and_the_split_over_time(tmp_path):
    """Concurrency 1, then 8, then 2 on a budget derived from the model's sizes so that W = 8's floor leaves 7 slots
    of 16 and one request's context leaves room for all 16: the static arm keeps W = 8's KV all along; the
    controller's floor follows the sessions in flight (more slots while one runs, grown back before the 8 are
    admitted). The plan's costs are given (the recompute cost estimated on a loaded CPU varies many times over from
    run to run) and --min-gain 0 takes the W = 1 trade on any predicted gain, not on one above a threshold that the
    KV misses no split removes can dilute. Arms in ABBA order, each in a fresh process."""
    slots, width, max_model_len = 7, 8, 256  # width: the widest phase
    budget, sizes = _budget_leaving_slots(slots, width, max_model_len)
    sessions, out = tmp_path / "agentinfer_sessions.jsonl", tmp_path / "agent.json"
    _agentinfer_file(sessions, sessions=6, reply=10)
    proc = run_wisp(["agent", "--model", "demo", "--sessions", sessions, "--phases", "1:2,8:8,2:4", "--vram-budget",
                     budget, "--max-model-len", max_model_len, "--max-reply-tokens", "10", "--device", "cpu",
                     "--recompute-cost", "1e-5", "--resolve-every", "4", "--min-observations", "10", "--min-gain", "0",
                     "--admission-window", "16", "--resize-cost-s", "off", "--arms", "mv-wsa,controller", "--order",
                     "abba", "--out", out],
                    tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())
    assert [(r["arm"], r["position"]) for r in records] == [("mv-wsa", 0), ("controller", 1), ("controller", 2),
                                                            ("mv-wsa", 3)]
    floor, pageable = records[0]["admission_floor_blocks"], records[0]["pageable_bytes"]  # W = 8's floor
    assert {r["recompute_seconds_per_token"] for r in records} == {1e-5}  # the plan priced KV misses as given

    def blocks_beside(cap: int) -> int:
        return (pageable - cap * sizes.slot_bytes) // sizes.block_bytes

    # the budget as derived: W = 8's floor leaves `slots` slots; one request's context leaves room for all 16
    assert blocks_beside(slots) >= floor > blocks_beside(slots + 1) and blocks_beside(16) >= floor // width
    for r in records:
        assert r["concurrency"] == 8 and r["phases"] == "1:2,8:8,2:4" and r["sessions"] == 14 and r["turns"] == 42
        assert r["preemptions"] == 0 and r["isolation"] == "process" and r["gpu_bytes_before_load"] == 0
        assert r["kv_blocks"] >= floor and sum(r["expert_caps"]) <= slots * len(r["expert_caps"])
        assert [(p["width"], p["sessions"], p["turns"]) for p in r["per_phase"]] == [(1, 2, 6), (8, 8, 24), (2, 4, 12)]
        for p in r["per_phase"]:
            assert p["wall_s"] > 0 and p["output_tok_s"] > 0 and 0 <= p["hit_rate"] <= 1
        assert sum(p["wall_s"] for p in r["per_phase"]) == pytest.approx(r["e2e_wall_s"], rel=0.05)
    assert {r["prefill_tokens"] for r in records} == {records[0]["prefill_tokens"]}  # the same work in every arm
    # one plan: the mv-wsa arm's per-layer caps spend the slots of the uniform cap the controller starts at
    assert sum(records[0]["expert_caps"]) == sum(records[1]["expert_caps"])
    assert records[0]["kv_blocks"] == records[1]["kv_blocks"]
    for r in records[1:3]:
        first = r["per_phase"][0]
        assert first["kv_blocks_end"] < floor and first["admission_limit_end"] < 8  # one session: KV below W = 8's
        assert first["expert_cap_end"] > r["expert_cap"]  # ... and more expert slots
        assert any(e["reason"].startswith("admission") and e["admission_limit"] == 8 for e in r["resizes"])
        assert all(0 <= e["at_s"] <= r["e2e_wall_s"] for e in r["resizes"])
    for r in records[::3]:
        assert "resizes" not in r and {p["kv_blocks_end"] for p in r["per_phase"]} == {r["kv_blocks"]}


def test_abba_runs_each_arm_early_and_late():
    assert arm_order(["mv-wsa", "controller"], "abba") == ["mv-wsa", "controller", "controller", "mv-wsa"]
    assert arm_order(["a", "b", "a"], "as-given") == ["a", "b", "a"]


def test_phases_set_the_engine_width_to_the_widest_and_refuse_another():
    from types import SimpleNamespace

    from wisp.bench.agent import _phases

    sessions = [object()] * 3
    args = SimpleNamespace(phases=None, concurrency=None)
    phases, phased = _phases(args, sessions, 100)
    assert args.concurrency == 4 and [(p.width, p.sessions) for p in phases] == [(4, 3)] and phased is sessions
    with pytest.raises(WispError, match="widest phase"):
        _phases(SimpleNamespace(phases="1:2,4:1", concurrency=2), sessions, 100)


def test_the_default_max_model_len_fits_the_model(capsys):
    """demo has max_position_embeddings 2048: the default takes that, and says so; a given one is kept."""
    from types import SimpleNamespace

    from wisp.bench.agent import fit_max_model_len
    from wisp.bench.args import add_parser
    from wisp.cli_args import Parser
    from wisp.bench.decode import model_config_for

    parser = Parser(prog="wisp")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "agent", "--model", "demo", "--sessions", "s.json", "--vram-budget", "1GiB"])
    demo = model_config_for("demo", "safetensors")
    assert args.max_model_len is None and demo.max_position_embeddings < 4096
    fit_max_model_len(args, demo)
    assert args.max_model_len == demo.max_position_embeddings
    assert f"--max-model-len {demo.max_position_embeddings}" in capsys.readouterr().err
    given = SimpleNamespace(max_model_len=512)
    fit_max_model_len(given, demo)
    assert given.max_model_len == 512
