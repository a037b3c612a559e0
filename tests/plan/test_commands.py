"""`wisp plan`, `wisp sim` and `--record-routing`, end to end on the demo model (`wisp.plan.commands`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_runner import run_many, run_wisp
from wisp.models.config_parsers import model_config
from wisp.models.random_checkpoint import DEMO_CONFIG
from wisp.plan.miss_curves import expert_miss_curve
from wisp.trace.format import RoutingTrace

pytestmark = pytest.mark.slow  # `wisp plan|sim|generate` subprocess runs and warm-up plans

PLAN_FIELDS = {"expert_cap", "per_layer_caps", "kv_blocks", "kv_bytes", "expert_bytes", "budget_bytes",
               "predicted_expert_misses_per_token", "predicted_latency_s", "admission_floor_blocks"}
COSTS = ["--t-byte", "2e-11", "--recompute-cost", "1e-4"]
SESSIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "agent_sessions"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A routing trace written by `wisp generate --record-routing`, and the cache dir (cap 16 = N: no
    prefill grouping, so the pager's steps are exactly the trace's steps; a one-token prompt, so no step
    routes to more than top_k = 4 experts and every cap from 4 up is in the pager's domain)."""
    base = tmp_path_factory.getbasetemp()
    cache, trace = base / "wisp-cache", base / "demo-trace.npz"
    proc = run_wisp(["--model", "demo", "--prompt", "H", "--max-tokens", "24", "--expert-cap", "16",
                     "--device", "cpu", "--record-routing", trace, "--json"], cache)
    assert proc.returncode == 0, proc.stderr
    return trace, cache, json.loads(proc.stdout)


def test_record_routing_writes_a_trace_matching_the_run(recorded):
    path, _, out = recorded
    trace = RoutingTrace.load(path)
    assert trace.num_tokens == 1 + 23 and trace.top_k == 4 and list(trace.layers) == [0, 1, 2, 3]
    assert out["stats"]["expert_hits"] + out["stats"]["expert_misses"] == sum(len(s) for l in trace.layers for s in trace.steps(l))


def test_plan_is_deterministic_and_complete_and_sim_matches_the_curve(recorded, tmp_path):
    trace, cache, _ = recorded
    args = ["--model", "demo", "--vram-budget", "48MiB", "--max-model-len", "512", "--trace", trace,
            "--reserve", "1MiB", "--device", "cpu", *COSTS]
    runs = run_many({
        "a": ("--out", tmp_path / "a.json", "--plot", tmp_path / "a.png", *args),
        "b": ("--out", tmp_path / "b.json", *args),
        "tiny": ("--out", tmp_path / "c.json", *args[:3], "4MiB", *args[4:]),
        "host": ("--out", tmp_path / "h.json", *args, "--embedding", "host"),  # the table not budgeted
    }, cache, command="plan")
    assert runs["a"].returncode == 0 and runs["b"].returncode == 0, runs["a"].stderr
    a, b = json.loads((tmp_path / "a.json").read_text()), json.loads((tmp_path / "b.json").read_text())
    assert a == b and PLAN_FIELDS <= set(a)
    host = json.loads((tmp_path / "h.json").read_text())
    demo = model_config(DEMO_CONFIG)
    assert a["non_expert_bytes"] - host["non_expert_bytes"] == demo.vocab_size * demo.hidden_size * 4  # float32
    assert (tmp_path / "a.png").stat().st_size > 10_000
    assert a["kv_blocks"] >= a["admission_floor_blocks"] == 4 * 512 // 16
    assert a["expert_bytes"] + a["kv_bytes"] <= a["pageable_bytes"]
    assert len(a["per_layer_caps"]) == 4 and sum(a["per_layer_caps"]) == 4 * a["expert_cap"]
    tiny = runs["tiny"]
    assert tiny.returncode == 2 and tiny.stderr.count("\n") == 1 and "smallest budget that does is" in tiny.stderr

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
                     "--reserve", "1MiB", "--device", "cpu", *COSTS], cache, command="sim")
    assert proc.returncode == 0, proc.stderr
    for arm in ("mv-wsa", "50-50", "kv-blind", "offload"):
        assert arm in proc.stdout
    assert "per-layer caps" in proc.stdout and "fewer)" in proc.stdout


@pytest.mark.skipif(not SESSIONS.is_dir(), reason="../shared/data is not here")
def test_sim_compares_the_controller_on_session_workloads(recorded, tmp_path):
    trace, cache, _ = recorded
    files = [SESSIONS / f"agentinstruct_{w}_sample5.json" for w in ("os", "db")]
    proc = run_wisp(["--trace", trace, "--model", "demo", "--vram-budget", "48MiB", "--max-model-len", "512",
                     "--reserve", "1MiB", "--device", "cpu", *COSTS, "--sessions", *files,
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
            "512", "--reserve", "1MiB", "--device", "cpu", *COSTS, "--sessions", tmp_path / "chat.jsonl"]
    runs = run_many({"plain": args, "replayed": (*args, "--replay-layers")}, cache, command="sim")
    plain, replayed = runs["plain"], runs["replayed"]
    assert plain.returncode == 2 and "pass --replay-layers" in plain.stderr and "Traceback" not in plain.stderr
    assert replayed.returncode == 0, replayed.stderr
    assert "an approximation" in replayed.stdout and "workload chat:" in replayed.stdout


def test_serve_with_a_bad_plan_is_one_line(recorded, tmp_path):
    _, cache, _ = recorded
    (tmp_path / "plan.json").write_text("{not json")
    proc = run_wisp(["--model", "demo", "--device", "cpu", "--port", "0", "--plan", tmp_path / "plan.json"], cache,
                    command="serve")
    assert proc.returncode == 2 and "could not read plan" in proc.stderr and proc.stderr.count("\n") == 1


def test_record_routing_to_an_unwritable_place_fails_before_the_run(recorded, tmp_path):
    _, cache, _ = recorded
    proc = run_wisp(["--model", "demo", "--prompt", "H", "--max-tokens", "2", "--device", "cpu",
                     "--record-routing", tmp_path / "missing-dir" / "t.npz"], cache)
    assert proc.returncode == 2 and "not a writable directory" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_kv_traces_and_caps_are_one_line(recorded, tmp_path):
    trace, cache, _ = recorded
    (tmp_path / "kv.json").write_text(json.dumps({"not": "a list"}))
    (tmp_path / "kv.jsonl").write_text(json.dumps({"prompt_tokens": "x"}) + "\n")
    base = ["--model", "demo", "--vram-budget", "48MiB", "--max-model-len", "512", "--trace", trace, "--reserve", "1MiB",
            "--device", "cpu", *COSTS]
    runs = run_many({
        "obj": (*base, "--kv-trace", tmp_path / "kv.json"),
        "str": (*base, "--kv-trace", tmp_path / "kv.jsonl"),
    }, cache, command="plan")
    for proc in runs.values():
        assert proc.returncode == 2 and "KV trace" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    neg = run_wisp(["--trace", trace, "--caps=-1,4"], cache, command="sim")
    assert neg.returncode == 2 and "--caps must be >= 0" in neg.stderr


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


def test_plan_hybrid_costs_compares_the_modes_and_bad_files_are_one_line(recorded, tmp_path):
    trace, cache, _ = recorded
    (tmp_path / "costs.json").write_text(json.dumps({"copy_s": 1e-3, "cpu_rows": [1], "cpu_s_at_rows": [2e-4]}))
    (tmp_path / "bad.json").write_text(json.dumps({"copy_s": 1e-3, "cpu_rows": [1]}))
    args = ["--model", "demo", "--vram-budget", "48MiB", "--max-model-len", "512", "--trace", trace,
            "--reserve", "1MiB", "--device", "cpu", *COSTS]
    runs = run_many({
        "paged": args,
        "hybrid": (*args, "--hybrid-costs", tmp_path / "costs.json"),
        "bad": (*args, "--hybrid-costs", tmp_path / "bad.json"),
        "missing": (*args, "--hybrid-costs", tmp_path / "missing.json"),
    }, cache, command="plan")
    paged, hybrid = runs["paged"], runs["hybrid"]
    assert paged.returncode == 0 and hybrid.returncode == 0, hybrid.stderr
    assert "hybrid" not in paged.stderr and paged.stderr.count("\n") == 1
    plan = json.loads(hybrid.stdout)
    assert {k: v for k, v in plan.items() if k != "hybrid"} == json.loads(paged.stdout)
    advice = plan["hybrid"]
    assert advice["paged_cap"] == plan["expert_cap"] and advice["mode"] in ("paged", "hybrid")
    assert all(c["hybrid_step_s"] >= 0 and c["paged_step_s"] >= 0 for c in advice["caps"])
    assert "paged ms" in hybrid.stderr and "<- paged plan" in hybrid.stderr and "wisp: recommend" in hybrid.stderr
    for name, fragment in (("bad", "has no cpu_s_at_rows"), ("missing", "could not read --hybrid-costs")):
        proc = runs[name]
        assert proc.returncode == 2 and fragment in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr
