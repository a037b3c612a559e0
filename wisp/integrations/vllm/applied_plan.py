"""A `wisp plan` file inside vLLM: its caps for the paged layers and its KV bytes for vLLM's KV cache (imports vLLM).

One budget, split once (the MV-WSA split, static): the plan's expert slots become each MoE layer's cap, and
its KV pool becomes vLLM's `cache_config.kv_cache_memory_bytes` in the worker that builds the model. Both vLLM
workers (CPU and CUDA) read that field when they report the memory for the KV cache, so the engine sizes its
KV blocks from the plan: floor(plan bytes / vLLM's bytes per block) blocks of vLLM's own block size (on the
CPU 128 tokens), within one block of the plan's bytes. Under tensor parallelism each rank sets its share of
the heads (`plan_fit.kv_bytes_per_rank`). The plan replaces a KV size given another way
(`kv_cache_memory_bytes`, `--kv-cache-memory-bytes`, `VLLM_CPU_KVCACHE_SPACE`), with one warning naming
it; vLLM's `num_gpu_blocks_override` together with a plan is an error (both would size the KV cache).

`apply_plan` runs when vLLM builds each MoE layer's method (the first one sets the KV size; the others find
it set), before any weight is loaded, so a plan for another model stops vLLM at once.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from wisp.config import ModelConfig
from wisp.errors import WispError
from wisp.integrations.vllm.plan_fit import PlanFit, fit_plan, kv_bytes_per_rank
from wisp.integrations.vllm.settings import WispSettings, WispVllmConfigError
from wisp.models.config_parsers import model_config
from wisp.plan.plan_file import read_plan

logger = logging.getLogger("vllm.wisp")


def apply_plan(settings: WispSettings | None, vllm_config) -> WispSettings | None:
    """`settings` with the plan's caps by decoder layer, vLLM's KV cache sized to the plan (no plan: unchanged)."""
    if settings is None or settings.plan is None:
        return settings
    source = f"plan {settings.plan}"
    try:
        fit = fit_plan(read_plan(settings.plan), served_model(vllm_config.model_config, source), source)
    except WispError as exc:  # unreadable or malformed plan file
        raise WispVllmConfigError(str(exc)) from None
    size_kv_cache(vllm_config, fit, source)
    return replace(settings, layer_caps=fit.layer_caps)


def served_model(vllm_model_config, source: str) -> ModelConfig:
    """wisp's view of the model vLLM serves: its Hugging Face config, in the dtype vLLM computes in."""
    try:
        cfg = model_config(vllm_model_config.hf_config.to_dict())
    except WispError as exc:
        raise WispVllmConfigError(f"wisp cannot read the served model's config ({exc}), so it cannot check "
                                  f"{source}; use expert_cap instead") from None
    return replace(cfg, dtype=vllm_model_config.dtype)


def size_kv_cache(vllm_config, fit: PlanFit, source: str) -> None:
    """Set this worker's KV cache bytes to its share of the plan's KV pool."""
    cache, model = vllm_config.cache_config, vllm_config.model_config
    if cache.num_gpu_blocks_override is not None:
        raise WispVllmConfigError(f"{source} and num_gpu_blocks_override both size vLLM's KV cache: give one")
    rank_bytes = kv_bytes_per_rank(fit.kv_bytes, model.get_total_num_kv_heads(),
                                   model.get_num_kv_heads(vllm_config.parallel_config))
    if cache.kv_cache_memory_bytes == rank_bytes:
        return
    if cache.kv_cache_memory_bytes is not None:
        logger.warning("wisp: %s sizes vLLM's KV cache to %d bytes, in place of the %d bytes given "
                       "(kv_cache_memory_bytes or VLLM_CPU_KVCACHE_SPACE)", source, rank_bytes,
                       cache.kv_cache_memory_bytes)
    logger.info("wisp: %s: expert caps %s by decoder layer, KV cache %d bytes (%d tokens) on this rank", source,
                fit.layer_caps, rank_bytes, fit.kv_tokens)
    cache.kv_cache_memory_bytes = rank_bytes
