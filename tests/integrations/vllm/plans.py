"""Plans made by wisp's planner for tiny models (the vLLM plug-in's tests share them; no vLLM needed)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from wisp.config import ModelConfig
from wisp.plan.plan import Plan
from wisp.plan.planner import PlanInputs, make_plan
from wisp.plan.sizes import ModelSizes
from wisp.trace.format import RoutingTrace


def random_trace(cfg: ModelConfig, tokens: int = 64, seed: int = 0) -> RoutingTrace:
    """Uniform random top-k routing, one token a step, in every MoE layer of `cfg`."""
    rng = np.random.default_rng(seed)
    layers = cfg.moe_layer_ids
    ids = np.stack([np.stack([rng.choice(cfg.num_experts, cfg.top_k, replace=False) for _ in layers])
                    for _ in range(tokens)])
    return RoutingTrace(ids, layers=layers, num_experts=cfg.num_experts)


def tiny_plan(cfg: ModelConfig, slots: int, max_concurrency: int = 2, max_model_len: int = 100,
              caps: tuple[int, ...] | None = None, embedding_on_host: bool = False) -> Plan:
    """`wisp plan` for `cfg` under a budget of its non-expert weights, the admission floor's KV blocks and
    `slots` expert slots (no reserve, fixed costs, no KV trace: the KV pool is the floor); `caps` replaces
    the per-layer caps it chose (the report still describes the model)."""
    sizes = ModelSizes.of(cfg, 16, embedding_on_host)
    floor = max_concurrency * -(-max_model_len // 16)
    budget = sizes.non_expert_bytes + floor * sizes.block_bytes + slots * sizes.slot_bytes
    inputs = PlanInputs(budget, max_concurrency, max_model_len, 16, seconds_per_byte=1e-10,
                        recompute_seconds_per_token=1e-5, reserve_bytes=0, embedding_on_host=embedding_on_host)
    plan = make_plan(cfg, inputs, random_trace(cfg), None, torch.device("cpu"))
    return plan if caps is None else replace(plan, per_layer_caps=tuple(caps))
