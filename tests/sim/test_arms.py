"""The allocator arms (`wisp.sim.arms`): the mv-wsa row is the plan's own prediction, every arm fits
the pageable budget, and the JSON rows keep `wisp sim --json`'s keys."""

from __future__ import annotations

from pathlib import Path

import torch

from wisp.models.config_parsers import model_config
from wisp.models.presets import preset
from wisp.plan.planner import PlanInputs, make_plan
from wisp.sim.arms import allocator_arms
from wisp.trace.format import RoutingTrace

TRACE = Path(__file__).resolve().parents[2] / "docs" / "traces" / "qwen3_shape_random_8layer_trace.npz"


def test_arms_price_the_plan():
    cfg = model_config(preset("qwen3-30b-a3b"))
    inputs = PlanInputs(24 << 30, 4, 4096, seconds_per_byte=1.8e-11, recompute_seconds_per_token=2.3e-5)
    plan = make_plan(cfg, inputs, RoutingTrace.load(TRACE), None, torch.device("cpu"))
    arms = allocator_arms(plan, cfg.num_experts)
    assert [a.arm for a in arms] == ["mv-wsa", "50-50", "kv-blind", "offload"]
    mv = arms[0]
    assert (mv.expert_cap, mv.kv_blocks) == (plan.report.expert_cap, plan.kv_blocks) and mv.meets_floor
    assert mv.predicted_latency_s == plan.report.predicted_latency_s
    assert min(a.predicted_latency_s for a in arms[:3] if a.meets_floor) == mv.predicted_latency_s  # the optimum
    report = plan.report
    for a in arms[:3]:
        assert a.expert_cap * report.slot_bytes + a.kv_blocks * report.block_bytes <= report.pageable_bytes
    assert list(mv.to_json()) == ["arm", "expert_cap", "kv_blocks", "meets_floor", "expert_misses_per_token",
                                  "kv_block_misses_per_request", "predicted_latency_s"]
