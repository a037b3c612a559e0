"""Sizing a running engine's pools: from a `wisp plan` file, or from a short built-in warm-up trace.

The warm-up generates from a few fixed prompts with routing recorded, times its prefill for the
recompute cost (seconds per token), probes the host->device time, plans the given VRAM budget, and
resets the counters it touched. Both return a `wisp.plan.plan.Plan`; a plan file is checked by
`Plan.from_json`, and here only for this engine's KV block size.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from wisp.config import packs_projections
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import SamplingParams
from wisp.errors import WispError
from wisp.plan.plan import Plan
from wisp.plan.plan_file import read_plan

if TYPE_CHECKING:
    from wisp.plan.planner import PlanInputs

WARMUP_PROMPTS = (
    "The history of computing began",
    "def fibonacci(n):",
    "Translate to French: good morning, how are you?",
    "List three uses of a paperclip:",
)


def plan_from_file(path: str, block_size: int = 16) -> Plan:
    """A `wisp plan` JSON, checked (`Plan.from_json`) and planned for this engine's block size."""
    plan = read_plan(path)
    if plan.kv_block_size != block_size:
        raise WispError(f"plan {path} was made for {plan.kv_block_size}-token KV blocks; this engine uses {block_size}")
    return plan


def plan_inputs(engine: LLMEngine, vram_budget: int, **costs) -> PlanInputs:
    """The planner's inputs for a budget on this engine: its concurrency, context, KV block size and where its
    embedding table lives; `costs`: any other `PlanInputs` field."""
    from wisp.plan.planner import PlanInputs

    config = engine.config
    device = engine.model.device
    packed = packs_projections(engine.model_config, config, device)
    return PlanInputs(vram_budget, config.max_concurrency, engine.max_model_len, config.kv_block_size,
                      embedding_on_host=engine.model.embed.on_host, packed_projections=packed, **costs)


def plan_from_warmup(engine: LLMEngine, vram_budget: int, tokens: int = 32) -> Plan:
    from wisp.plan.planner import make_plan
    from wisp.trace.recorder import RoutingRecorder

    cfg = engine.model_config
    recorder = RoutingRecorder(cfg.moe_layer_ids, cfg.num_experts, engine.config.model).attach(engine)
    try:
        for i, text in enumerate(WARMUP_PROMPTS):
            ids = engine.tokenizer.encode(text) if engine.tokenizer else [(7 * i + j) % cfg.vocab_size for j in range(8)]
            engine.add_request(f"warmup-{i}", ids, SamplingParams(max_tokens=tokens, ignore_eos=True), strict_length=False)
        t0 = time.perf_counter()
        before = engine.tokens_prefilled
        engine.step()  # the first step prefills every warm-up prompt: it times the recompute cost
        recompute = (time.perf_counter() - t0) / max(engine.tokens_prefilled - before, 1)
        while engine.has_unfinished():
            engine.step()
    finally:
        recorder.detach(engine)
    plan = make_plan(cfg, plan_inputs(engine, vram_budget, recompute_seconds_per_token=recompute), recorder.trace(),
                     None, engine.device)
    engine.reset_stats()
    return plan
