"""`wisp sim`, end to end on the demo model (`wisp.sim.commands`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_runner import PLAN_COSTS, record_demo_routing, run_many, run_wisp
from wisp.plan.miss_curves import expert_miss_curve
from wisp.trace.format import RoutingTrace

pytestmark = pytest.mark.slow  # `wisp sim|generate` subprocess runs

SESSIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "agent_sessions"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A routing trace recorded by `wisp generate --record-routing`, the cache dir, and the run's output."""
    cache, trace = tmp_path_factory.getbasetemp() / "wisp-cache", tmp_path_factory.mktemp("sim") / "demo-trace.npz"
    return trace, cache, record_demo_routing(trace, cache)


def test_sim_matches_the_curve(recorded, tmp_path):
    trace, cache, _ = recorded
    sim = run_wisp(["--trace", trace, "--policies", "lru,opt", "--caps", "4,8,16", "--json", tmp_path / "s.json"],
                   cache, command="sim")
    assert sim.returncode == 0, sim.stderr
    result = json.loads((tmp_path / "s.json").read_text())
    t = RoutingTrace.load(trace)
    lru = [int(sum(expert_miss_curve(t.steps(l), 16)[c] for l in t.layers)) for c in (4, 8, 16)]
    assert result["misses"]["lru"] == lru
    assert all(o <= l for o, l in zip(result["misses"]["opt"], result["misses"]["lru"]))
    assert "lru" in sim.stdout and "opt" in sim.stdout


@pytest.mark.parametrize("args, fragment", [
    (["--trace", "/nonexistent.npz"], "does not exist"),
    (["--trace", "TRACE", "--policies", "lru,fifo"], "unknown policy 'fifo'"),
    (["--trace", "TRACE", "--caps", "4,x"], "--caps must be comma-separated integers"),
    (["--trace", "TRACE", "--sessions", "/nonexistent.json"], "--sessions needs --model and --vram-budget"),
    (["--trace", "TRACE", "--model", "demo", "--vram-budget", "48MiB", "--sessions", "/nonexistent.json"],
     "--sessions file /nonexistent.json does not exist"),
    (["--trace", "TRACE", "--replay-layers"], "--replay-layers applies only with --sessions"),
])
def test_sim_bad_input_is_one_line(recorded, args, fragment):
    trace, cache, _ = recorded
    proc = run_wisp([str(trace) if a == "TRACE" else a for a in args], cache, command="sim")
    assert proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr


def test_sim_prints_the_allocator_arms(recorded):
    trace, cache, _ = recorded
    proc = run_wisp(["--trace", trace, "--model", "demo", "--vram-budget", "48MiB", "--max-model-len", "512",
                     "--reserve", "1MiB", "--device", "cpu", *PLAN_COSTS], cache, command="sim")
    assert proc.returncode == 0, proc.stderr
    for arm in ("mv-wsa", "50-50", "kv-blind", "offload"):
        assert arm in proc.stdout
    assert "per-layer caps" in proc.stdout and "fewer)" in proc.stdout


@pytest.mark.skipif(not SESSIONS.is_dir(), reason="../shared/data is not here")
def test_sim_compares_the_controller_on_session_workloads(recorded, tmp_path):
    trace, cache, _ = recorded
    files = [SESSIONS / f"agentinstruct_{w}_sample5.json" for w in ("os", "db")]
    proc = run_wisp(["--trace", trace, "--model", "demo", "--vram-budget", "48MiB", "--max-model-len", "512",
                     "--reserve", "1MiB", "--device", "cpu", *PLAN_COSTS, "--sessions", *files,
                     "--json", tmp_path / "s.json"], cache, command="sim")
    assert proc.returncode == 0, proc.stderr
    sessions = json.loads((tmp_path / "s.json").read_text())["sessions"]
    workloads = sessions["workloads"]
    assert [w["workload"] for w in workloads] == ["os", "db", "os->db"]
    for w in workloads:
        arms = {a["arm"]: a for a in w["arms"]}
        assert list(arms) == ["oracle", "controller", "best-static", "mv-wsa", "50-50", "kv-blind"]
        assert arms["oracle"]["ratio_to_oracle"] == 1.0
        assert all(a["seconds"] >= arms["oracle"]["seconds"] for a in arms.values() if a["arm"] != "controller")
        assert f"workload {w['workload']}:" in proc.stdout
    assert workloads[2]["requests"] == workloads[0]["requests"] + workloads[1]["requests"]
    assert "controller" in proc.stdout and "/ oracle" in proc.stdout


def test_sim_sessions_replays_a_trace_of_fewer_layers_only_when_asked(recorded, tmp_path):
    trace, cache, _ = recorded
    t = RoutingTrace.load(trace)
    RoutingTrace(t.ids[:, :1], layers=[0], num_experts=t.num_experts).save(tmp_path / "one-layer.npz")
    rows = [{"session": f"s{i % 2}", "prompt_tokens": 40 * (i // 2 + 1), "output_tokens": 8} for i in range(6)]
    (tmp_path / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    args = ["--trace", tmp_path / "one-layer.npz", "--model", "demo", "--vram-budget", "48MiB", "--max-model-len",
            "512", "--reserve", "1MiB", "--device", "cpu", *PLAN_COSTS, "--sessions", tmp_path / "chat.jsonl"]
    runs = run_many({"plain": args, "replayed": (*args, "--replay-layers")}, cache, command="sim")
    plain, replayed = runs["plain"], runs["replayed"]
    assert plain.returncode == 2 and "pass --replay-layers" in plain.stderr and "Traceback" not in plain.stderr
    assert replayed.returncode == 0, replayed.stderr
    assert "an approximation" in replayed.stdout and "workload chat:" in replayed.stdout


def test_sim_per_token_ignores_the_step_column(tmp_path):
    # two steps of two tokens each: as steps the first is {0, 1, 2, 3} (C = 2 is below it), per token
    # every step has two experts and every policy runs at C = 2 (the new ones too)
    ids = [[[0, 1]], [[2, 3]], [[0, 1]], [[0, 1]]]
    trace = tmp_path / "t.npz"
    RoutingTrace(ids, step=[0, 0, 1, 1], num_experts=4).save(trace)
    runs = run_many({
        "steps": ("--trace", trace, "--caps", "2,4", "--policies", "lru,lrfu,arc", "--json", tmp_path / "a.json"),
        "tokens": ("--trace", trace, "--caps", "2,4", "--policies", "lru,lrfu,arc", "--per-token",
                   "--json", tmp_path / "b.json"),
    }, tmp_path / "cache", command="sim")
    assert all(r.returncode == 0 for r in runs.values()), runs["tokens"].stderr
    steps, tokens = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert steps["misses"]["lru"] == [-1, 4] and steps["references"] == 6
    assert tokens["references"] == 8
    assert tokens["misses"]["lru"] == tokens["misses"]["lrfu"] == tokens["misses"]["arc"] == [6, 4]


def test_sim_negative_caps_are_one_line(recorded):
    trace, cache, _ = recorded
    neg = run_wisp(["--trace", trace, "--caps=-1,4"], cache, command="sim")
    assert neg.returncode == 2 and "--caps must be >= 0" in neg.stderr
