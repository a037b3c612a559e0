"""The typed plan (`wisp.plan.plan`): its JSON form is the file `wisp plan` has always written, and
`Plan.from_json` is where a plan is checked."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.errors import WispError
from wisp.models.config_parsers import model_config
from wisp.models.presets import preset
from wisp.plan.plan import FILE_ORDER, Plan
from wisp.plan.planner import PlanInputs, make_plan
from wisp.trace.format import RoutingTrace

DOCS = Path(__file__).resolve().parents[2] / "docs"
SAVED = sorted(DOCS.glob("plan_*.json"))
POOLS = {"per_layer_caps": [4, 4], "kv_blocks": 64, "kv_block_size": 16}


# the cost model's keys in plan files written before they were named for its fields -> the fields
OLD_COST_KEYS = {"t_byte_s": "seconds_per_byte", "recompute_cost_s_per_token": "recompute_seconds_per_token",
                 "c_exp_s": "expert_miss_seconds", "c_kv_s": "kv_miss_seconds"}


def renamed_cost_keys(obj: dict, names: dict) -> dict:
    """`obj` with its cost model's keys renamed by `names`, in the same order."""
    return {**obj, "cost_model": {names.get(k, k): v for k, v in obj["cost_model"].items()}}


@pytest.mark.parametrize("path", SAVED, ids=[p.name for p in SAVED])
def test_saved_plans_read_back_key_for_key(path):
    obj = json.loads(path.read_text())  # as checked in: the old cost-model keys
    assert set(OLD_COST_KEYS) <= set(obj["cost_model"])
    plan = Plan.from_json(obj)
    assert plan.report is not None and list(plan.to_json()) == list(obj) == list(FILE_ORDER)
    assert plan.to_json() == renamed_cost_keys(obj, OLD_COST_KEYS) and Plan.from_json(plan.to_json()) == plan
    assert plan.report.cost_model.seconds_per_byte == obj["cost_model"]["t_byte_s"]


def test_a_plan_is_written_with_the_cost_models_field_names_and_read_in_either_spelling():
    plan = Plan.from_json(json.loads(SAVED[0].read_text()))
    written = plan.to_json()["cost_model"]
    assert list(written) == ["seconds_per_byte", "recompute_seconds_per_token", "tokens_per_request",
                             "expert_miss_seconds", "kv_miss_seconds"]
    assert not set(OLD_COST_KEYS) & set(written)
    new_keys = {v: k for k, v in OLD_COST_KEYS.items()}
    assert Plan.from_json(renamed_cost_keys(plan.to_json(), new_keys)) == plan  # the old spelling, back again
    with pytest.raises(WispError, match="cost_model.kv_miss_seconds must be a number"):
        Plan.from_json({**plan.to_json(), "cost_model": {**written, "kv_miss_seconds": "x"}}, "plan p.json")


def test_a_planned_plan_round_trips_without_its_curves():
    cfg = model_config(preset("qwen3-30b-a3b"))
    trace = RoutingTrace.load(DOCS / "traces" / "qwen3_shape_random_8layer_trace.npz")
    inputs = PlanInputs(20 << 30, 4, 4096, seconds_per_byte=1.8e-11, recompute_seconds_per_token=2.3e-5)
    plan = make_plan(cfg, inputs, trace, None, torch.device("cpu"))
    back = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back == plan and back.curves is None and plan.curves is not None
    assert set(plan.to_json()) == set(FILE_ORDER) and not any(k.startswith("_") for k in plan.to_json())
    assert sum(plan.per_layer_caps) == len(plan.per_layer_caps) * plan.report.expert_cap


def test_a_file_with_only_the_pool_sizes_is_a_plan_without_a_report():
    plan = Plan.from_json({"per_layer_caps": [4, 4], "kv_blocks": 64})
    assert plan == Plan((4, 4), 64) and plan.kv_block_size == 16 and plan.report is None
    assert plan.to_json() == POOLS
    partial = Plan.from_json({**POOLS, "expert_cap": "not checked: the report is incomplete"})
    assert partial.report is None


@pytest.mark.parametrize("change, fragment", [
    (lambda o: [1, 2], "is not a JSON object"),
    (lambda o: {k: v for k, v in o.items() if k != "kv_blocks"}, "has no kv_blocks"),
    (lambda o: {**o, "per_layer_caps": [4, 4.0]}, "per_layer_caps must be a list of integers"),
    (lambda o: {**o, "kv_block_size": "16"}, "kv_block_size must be an integer"),
    (lambda o: {**o, "expert_cap": 4.5}, "expert_cap must be an integer"),
    (lambda o: {**o, "model": None}, "model must be a string"),
    (lambda o: {**o, "predicted_latency_s": True}, "predicted_latency_s must be a number"),
    (lambda o: {**o, "trace": [1]}, "trace must be a JSON object"),
    (lambda o: {**o, "cost_model": {**o["cost_model"], "c_kv_s": "x"}}, "cost_model.c_kv_s must be a number"),
    (lambda o: {**o, "unconstrained": {"expert_cap": 4, "kv_blocks": 1}}, "unconstrained has no predicted_latency_s"),
])
def test_bad_plans_name_the_source_and_the_key(change, fragment):
    obj = json.loads(SAVED[0].read_text())
    with pytest.raises(WispError, match=fragment) as err:
        Plan.from_json(change(obj), "plan p.json")
    assert str(err.value).startswith("plan p.json")


def test_plans_are_frozen():
    plan = Plan.from_json(POOLS)
    with pytest.raises(AttributeError):
        plan.kv_blocks = 1
    assert replace(plan, kv_blocks=1).kv_blocks == 1 and plan.kv_blocks == 64


def test_hybrid_costs_add_an_advice_and_change_nothing_else():
    cfg = model_config(preset("qwen3-30b-a3b"))
    trace = RoutingTrace.load(DOCS / "traces" / "qwen3_shape_random_8layer_trace.npz")
    inputs = PlanInputs(20 << 30, 4, 4096, seconds_per_byte=1.8e-11, recompute_seconds_per_token=2.3e-5)
    costs = HybridCosts(copy_s=3.4e-3, cpu_rows=(1, 8), cpu_s_at_rows=(2e-3, 4e-3), cpu_overhead_s=1e-4)
    paged = make_plan(cfg, inputs, trace, None, torch.device("cpu"))
    plan = make_plan(cfg, replace(inputs, hybrid_costs=costs), trace, None, torch.device("cpu"))
    assert paged.hybrid is None and "hybrid" not in paged.to_json()
    obj = plan.to_json()
    assert list(obj) == [*FILE_ORDER, "hybrid"] and {k: v for k, v in obj.items() if k != "hybrid"} == paged.to_json()
    advice = plan.hybrid
    assert advice.costs == costs and advice.paged_cap == plan.report.expert_cap
    assert [c.expert_cap for c in advice.caps] == list(plan.curves.problem.feasible_caps())
    assert all(c.hybrid_step_s >= 0 and c.paged_step_s >= 0 for c in advice.caps)  # hybrid is not bounded by paged
    back = Plan.from_json(json.loads(json.dumps(obj)))
    assert back == plan and back.hybrid == advice


@pytest.mark.parametrize("change, fragment", [
    (lambda h: [1], "hybrid must be a JSON object"),
    (lambda h: {**h, "mode": "cpu"}, "hybrid: mode must be one of paged, hybrid"),
    (lambda h: {**h, "caps": [{**h["caps"][0], "kv_blocks": "8"}]}, r"hybrid.caps\[0\].kv_blocks must be an integer"),
    (lambda h: {**h, "costs": {**h["costs"], "cpu_s_at_rows": []}}, "hybrid.costs: cpu_rows and cpu_s_at_rows"),
])
def test_a_bad_hybrid_advice_names_the_key(change, fragment):
    costs = {"copy_s": 1.0, "cpu_rows": [1], "cpu_s_at_rows": [0.5], "cpu_overhead_s": 0.0}
    hybrid = {"costs": costs, "caps": [{"expert_cap": 2, "kv_blocks": 8, "paged_step_s": 1.0, "hybrid_step_s": 0.5}],
              "paged_cap": 2, "mode": "hybrid", "expert_cap": 2, "kv_blocks": 8}
    assert Plan.from_json({**POOLS, "hybrid": hybrid}).hybrid.mode == "hybrid"
    with pytest.raises(WispError, match=fragment):
        Plan.from_json({**POOLS, "hybrid": change(hybrid)}, "plan p.json")


def test_an_embedding_table_in_host_memory_leaves_its_bytes_to_the_split():
    cfg = model_config(preset("qwen3-30b-a3b"))  # untied: 151936 x 2048 bf16, 622 MB
    trace = RoutingTrace.load(DOCS / "traces" / "qwen3_shape_random_8layer_trace.npz")
    inputs = PlanInputs(20 << 30, 4, 4096, seconds_per_byte=1.8e-11, recompute_seconds_per_token=2.3e-5)
    on_device = make_plan(cfg, inputs, trace, None, torch.device("cpu")).report
    on_host = make_plan(cfg, replace(inputs, embedding_on_host=True), trace, None, torch.device("cpu")).report
    table = cfg.vocab_size * cfg.hidden_size * 2
    assert on_device.non_expert_bytes - on_host.non_expert_bytes == table
    assert on_host.pageable_bytes - on_device.pageable_bytes == table
    assert on_host.expert_bytes + on_host.kv_bytes > on_device.expert_bytes + on_device.kv_bytes  # spent, not left
