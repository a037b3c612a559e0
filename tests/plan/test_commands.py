"""`wisp plan` and `--record-routing`, end to end on the demo model (`wisp.plan.commands`)."""

from __future__ import annotations

import json

import pytest

from tests.cli_runner import PLAN_COSTS, record_demo_routing, run_many, run_wisp
from wisp.models.config_parsers import model_config
from wisp.models.demo import DEMO_CONFIG
from wisp.trace.format import RoutingTrace

pytestmark = pytest.mark.slow  # `wisp plan|generate` subprocess runs and warm-up plans

PLAN_FIELDS = {"expert_cap", "per_layer_caps", "kv_blocks", "kv_bytes", "expert_bytes", "budget_bytes",
               "predicted_expert_misses_per_token", "predicted_latency_s", "admission_floor_blocks"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A routing trace recorded by `wisp generate --record-routing`, the cache dir, and the run's output."""
    base = tmp_path_factory.getbasetemp()
    cache, trace = base / "wisp-cache", base / "demo-trace.npz"
    return trace, cache, record_demo_routing(trace, cache)


def test_record_routing_writes_a_trace_matching_the_run(recorded):
    path, _, out = recorded
    trace = RoutingTrace.load(path)
    assert trace.num_tokens == 1 + 23 and trace.top_k == 4 and list(trace.layers) == [0, 1, 2, 3]
    assert out["stats"]["expert_hits"] + out["stats"]["expert_misses"] == sum(len(s) for l in trace.layers for s in trace.steps(l))


def test_plan_is_deterministic_and_complete(recorded, tmp_path):
    trace, cache, _ = recorded
    args = ["--model", "demo", "--vram-budget", "48MiB", "--max-model-len", "512", "--trace", trace,
            "--reserve", "1MiB", "--device", "cpu", *PLAN_COSTS]
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


def test_bad_kv_traces_are_one_line(recorded, tmp_path):
    trace, cache, _ = recorded
    (tmp_path / "kv.json").write_text(json.dumps({"not": "a list"}))
    (tmp_path / "kv.jsonl").write_text(json.dumps({"prompt_tokens": "x"}) + "\n")
    base = ["--model", "demo", "--vram-budget", "48MiB", "--max-model-len", "512", "--trace", trace, "--reserve", "1MiB",
            "--device", "cpu", *PLAN_COSTS]
    runs = run_many({
        "obj": (*base, "--kv-trace", tmp_path / "kv.json"),
        "str": (*base, "--kv-trace", tmp_path / "kv.jsonl"),
    }, cache, command="plan")
    for proc in runs.values():
        assert proc.returncode == 2 and "KV trace" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_plan_hybrid_costs_compares_the_modes_and_bad_files_are_one_line(recorded, tmp_path):
    trace, cache, _ = recorded
    (tmp_path / "costs.json").write_text(json.dumps({"copy_s": 1e-3, "cpu_rows": [1], "cpu_s_at_rows": [2e-4]}))
    (tmp_path / "bad.json").write_text(json.dumps({"copy_s": 1e-3, "cpu_rows": [1]}))
    args = ["--model", "demo", "--vram-budget", "48MiB", "--max-model-len", "512", "--trace", trace,
            "--reserve", "1MiB", "--device", "cpu", *PLAN_COSTS]
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
