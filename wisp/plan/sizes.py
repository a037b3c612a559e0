"""A model's byte sizes for planning, from its config alone (no weights are read).

Owns `ModelSizes`: one expert, one expert slot (that expert in every MoE layer), one KV block (all
layers, K and V) and everything that is not a routed expert (attention, dense and shared MLPs, norms,
routers, embeddings and LM head, plus paged mode's two expert-sized staging buffers), and
`cap_for_budget`, the largest paged cap a batch-1 run can afford under a VRAM budget.

Invariants: slot_bytes = number of MoE layers * expert_bytes; block_bytes equals the engine's
`KVCache.block_bytes` for the same shape (this package may not import the engine, so a test checks the
two agree); every size scales with the element size of the config's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wisp.config import ModelConfig

GiB = 1 << 30
DEFAULT_RESERVE_BYTES = GiB // 2  # activations and workspace, kept out of the pageable budget


@dataclass(frozen=True)
class ModelSizes:
    non_expert_bytes: int  # weights outside the routed experts, plus the two expert-sized staging buffers
    expert_bytes: int  # one expert
    slot_bytes: int  # one slot in every MoE layer
    block_bytes: int  # one KV block across layers

    @classmethod
    def of(cls, cfg: ModelConfig, block_size: int, embedding_on_host: bool = False,
           packed_projections: bool = False) -> "ModelSizes":
        """embedding_on_host: the token embedding table lives in pinned host memory (`--embedding`), not in VRAM;
        packed_projections: a GGUF file's packed projections stay packed (`wisp.config.packs_projections`), at
        their bytes as stored (`ModelConfig.packed_projection_sizes`)."""
        element = torch.empty((), dtype=cfg.dtype).element_size()
        staging = 2 * cfg.expert_bytes  # paged mode's two staging buffers for wide steps (`wisp.core.experts.expert_major`)
        kv_block = cfg.kv_tensors * cfg.num_layers * cfg.num_kv_heads * block_size * cfg.head_dim * element  # MLA: 1
        params, packed = cfg.packed_projection_sizes if packed_projections else (0, 0)
        weights = (non_expert_params(cfg, embedding_on_host) - params) * element + packed
        if cfg.router_float32:  # DeepSeek's routers are held in float32
            weights += len(cfg.moe_layer_ids) * cfg.num_experts * cfg.hidden_size * (4 - element)
        return cls(weights + staging, cfg.expert_bytes, cfg.slot_bytes, kv_block)


def _attention_params(cfg: ModelConfig) -> int:
    """One layer's attention projections, their biases and q/k norms, sinks, and the layer's two norms."""
    d, hd = cfg.hidden_size, cfg.head_dim
    if cfg.mla is not None:
        return _mla_params(cfg) + 2 * d
    params = d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 2 * d
    if cfg.attention_bias:
        params += hd * (cfg.num_heads + 2 * cfg.num_kv_heads)
    if cfg.qk_norm == "per_head":
        params += 2 * hd
    elif cfg.qk_norm == "full":
        params += hd * (cfg.num_heads + cfg.num_kv_heads)
    if cfg.expert_bias:  # GPT-OSS: o_proj's bias too
        params += d
    if cfg.attention_sinks:
        params += cfg.num_heads
    return params


def _mla_params(cfg: ModelConfig) -> int:
    """One layer's latent attention (`wisp.models.mla`): q (or its LoRA pair and norm), kv_a, its norm, kv_b, o."""
    m, d, h = cfg.mla, cfg.hidden_size, cfg.num_heads
    q_out = h * (m.nope_dim + m.rope_dim)
    q = d * q_out if m.q_lora_rank is None else d * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * q_out
    bias = (m.q_lora_rank or 0) + m.cache_dim + d if cfg.attention_bias else 0
    return q + d * m.cache_dim + m.kv_lora_rank + m.kv_lora_rank * h * (m.nope_dim + m.v_dim) + h * m.v_dim * d + bias


def _mlp_params(cfg: ModelConfig, moe: bool) -> int:
    """One layer's MLP outside the routed experts: a dense MLP, or the router plus any shared expert."""
    d = cfg.hidden_size
    if not moe:
        return 3 * d * cfg.dense_intermediate_size
    params = cfg.num_experts * (d + (1 if cfg.expert_bias else 0))  # the router (and its bias)
    if cfg.shared_expert_intermediate_size:
        params += 3 * d * cfg.shared_expert_intermediate_size + (d if cfg.shared_expert_gated else 0)
    return params


def non_expert_params(cfg: ModelConfig, embedding_on_host: bool = False) -> int:
    """Parameters outside the routed experts: every layer's attention and MLP, embeddings, the final norm
    (on the device: without the token embedding table where it lives in host memory, `--embedding`)."""
    d = cfg.hidden_size
    layers = sum(_attention_params(cfg) + _mlp_params(cfg, moe) for moe in cfg.moe_layers)
    embed = cfg.vocab_size * d * (1 if cfg.tie_word_embeddings or embedding_on_host else 2)
    return layers + embed + d


def cap_for_budget(cfg: ModelConfig, budget: int, max_model_len: int, block_size: int = 16,
                   embedding_on_host: bool = False, packed_projections: bool = False) -> int:
    """The largest paged cap whose scratch fits `budget` beside the non-expert weights, a batch-1 KV pool
    and the planner's reserve (clamped to [top_k, num_experts])."""
    sizes = ModelSizes.of(cfg, block_size, embedding_on_host, packed_projections)
    kv = -(-max_model_len // block_size) * sizes.block_bytes
    cap = (budget - sizes.non_expert_bytes - kv - DEFAULT_RESERVE_BYTES) // sizes.slot_bytes
    return int(min(max(cap, cfg.top_k), cfg.num_experts))
