"""Model sizes for planning: the KV block size agrees with the engine's, and the bench's cap for a budget."""

from __future__ import annotations

import pytest

from wisp.config import ModelConfig
from wisp.engine.kv_cache import KVCache
from wisp.models.presets import PRESETS, preset
from wisp.models.random_checkpoint import DEMO_CONFIG
from wisp.plan.planner import PlanInputs
from wisp.plan.sizes import ModelSizes, cap_for_budget


def test_cap_for_budget_fills_the_budget_and_clamps():
    cfg = ModelConfig.from_hf(DEMO_CONFIG)
    sizes = ModelSizes.of(cfg, 16)
    base = sizes.non_expert_bytes + -(-40 // 16) * sizes.block_bytes + PlanInputs.reserve_bytes
    assert cap_for_budget(cfg, base + 7 * sizes.slot_bytes + 1, 40) == 7
    assert cap_for_budget(cfg, base, 40) == cfg.top_k
    assert cap_for_budget(cfg, base + 10**12, 40) == cfg.num_experts


@pytest.mark.parametrize("name", ["demo", *PRESETS])
@pytest.mark.parametrize("block_size", [16, 32])
def test_sizes_agree_with_the_engine_kv_cache_and_the_config(name, block_size):
    cfg = ModelConfig.from_hf(DEMO_CONFIG if name == "demo" else preset(name))
    sizes = ModelSizes.of(cfg, block_size)
    engine_block = KVCache.block_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, block_size, cfg.dtype)
    assert sizes.block_bytes == engine_block
    assert sizes.expert_bytes == cfg.expert_bytes and sizes.slot_bytes == len(cfg.moe_layer_ids) * cfg.expert_bytes
    assert sizes.non_expert_bytes > 2 * cfg.expert_bytes
