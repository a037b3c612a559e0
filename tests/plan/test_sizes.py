"""Model sizes for planning: the KV block size agrees with the engine's, and the bench's cap for a budget."""

from __future__ import annotations

import math

import pytest

from wisp.engine.kv_cache import KVCache
from wisp.models.config_parsers import model_config
from wisp.models.presets import PRESETS, preset
from wisp.models.demo import DEMO_CONFIG
from wisp.models.random_checkpoint import tensor_specs
from wisp.plan.planner import PlanInputs
from wisp.plan.sizes import ModelSizes, cap_for_budget, non_expert_params


def test_cap_for_budget_fills_the_budget_and_clamps():
    cfg = model_config(DEMO_CONFIG)
    sizes = ModelSizes.of(cfg, 16)
    base = sizes.non_expert_bytes + -(-40 // 16) * sizes.block_bytes + PlanInputs.reserve_bytes
    assert cap_for_budget(cfg, base + 7 * sizes.slot_bytes + 1, 40) == 7
    assert cap_for_budget(cfg, base, 40) == cfg.top_k
    assert cap_for_budget(cfg, base + 10**12, 40) == cfg.num_experts


@pytest.mark.parametrize("name", ["demo", *PRESETS])
@pytest.mark.parametrize("block_size", [16, 32])
def test_sizes_agree_with_the_engine_kv_cache_and_the_config(name, block_size):
    cfg = model_config(DEMO_CONFIG if name == "demo" else preset(name))
    sizes = ModelSizes.of(cfg, block_size)
    engine_block = KVCache.block_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, block_size, cfg.dtype,
                                       cfg.kv_tensors)
    assert sizes.block_bytes == engine_block
    assert sizes.expert_bytes == cfg.expert_bytes and sizes.slot_bytes == len(cfg.moe_layer_ids) * cfg.expert_bytes
    assert sizes.non_expert_bytes > 2 * cfg.expert_bytes


@pytest.mark.parametrize("name", ["demo", *PRESETS])
def test_sizes_count_every_tensor_a_checkpoint_of_the_shape_holds(name):
    """Against the tensors of a (random) checkpoint of that shape: the non-expert parameters, and for plain and
    MXFP4 experts the bytes of one expert (biases included)."""
    cfg = model_config(DEMO_CONFIG if name == "demo" else preset(name))
    element = cfg.dtype.itemsize
    expert_bytes = other = 0
    for _, tensor, shape, _ in tensor_specs(cfg):
        numel = math.prod(shape)
        if ".experts." not in tensor:
            other += numel
        else:
            expert_bytes += numel * (1 if tensor.endswith(("_blocks", "_scales")) else element)
    assert other == non_expert_params(cfg)
    if cfg.fp8_block is None:  # FP8's scales are not in the specs (tests/models/test_fp8_checkpoint checks those)
        assert expert_bytes == cfg.expert_bytes * cfg.num_experts * len(cfg.moe_layer_ids)
