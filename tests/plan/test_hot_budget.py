"""`hot_split`: hybrid with no slots under a VRAM budget (hot experts a layer, then KV blocks)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.config import ModelConfig
from wisp.errors import WispError
from wisp.models.config_parsers import model_config
from wisp.models.presets import preset
from wisp.models.demo import DEMO_CONFIG
from wisp.plan.hot_budget import hot_split
from wisp.plan.planner import PlanInputs
from wisp.plan.sizes import ModelSizes

CONFIGS = {"demo": model_config(DEMO_CONFIG), "olmoe-1b-7b": model_config(preset("olmoe-1b-7b"))}


def smallest_budget(cfg: ModelConfig, inputs: PlanInputs) -> int:
    sizes = ModelSizes.of(cfg, inputs.block_size, inputs.embedding_on_host)
    return sizes.non_expert_bytes + inputs.reserve_bytes + inputs.admission_floor_blocks * sizes.block_bytes


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(CONFIGS)), concurrency=st.integers(1, 8), context=st.integers(1, 4096),
       extra=st.integers(0, 2**36), on_host=st.booleans())
def test_the_split_fits_keeps_the_floor_and_holds_all_the_experts_that_fit(name, concurrency, context, extra, on_host):
    cfg = CONFIGS[name]
    probe = PlanInputs(0, concurrency, context, embedding_on_host=on_host)
    inputs = PlanInputs(smallest_budget(cfg, probe) + extra, concurrency, context, embedding_on_host=on_host)
    sizes = ModelSizes.of(cfg, inputs.block_size, on_host)
    got = hot_split(cfg, inputs)
    used = (sizes.non_expert_bytes + inputs.reserve_bytes + got.hot_experts * sizes.slot_bytes
            + got.kv_blocks * sizes.block_bytes)
    assert used <= inputs.vram_budget and got.kv_blocks >= inputs.admission_floor_blocks
    assert 0 <= got.hot_experts <= cfg.num_experts
    room = inputs.vram_budget - sizes.non_expert_bytes - inputs.reserve_bytes - inputs.admission_floor_blocks * sizes.block_bytes
    assert got.hot_experts == cfg.num_experts or (got.hot_experts + 1) * sizes.slot_bytes > room  # no expert left out
    assert inputs.vram_budget - used < sizes.block_bytes  # the rest went to KV blocks


def test_a_budget_below_the_floor_names_the_smallest_that_serves():
    cfg = CONFIGS["olmoe-1b-7b"]
    inputs = PlanInputs(0, 4, 4096)
    need = smallest_budget(cfg, inputs)
    assert hot_split(cfg, PlanInputs(need, 4, 4096)).hot_experts == 0
    with pytest.raises(WispError, match=f"smallest budget that does is .* \\({need} bytes\\)"):
        hot_split(cfg, PlanInputs(need - 1, 4, 4096))
