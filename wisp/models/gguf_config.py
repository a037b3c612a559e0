"""A GGUF file's metadata as one `ModelConfig`: the format's parser (registered in `wisp.models.config_parsers`).

The metadata (llama.cpp's keys, `{arch}.block_count` ...) is rewritten as the Hugging Face config the same model
ships with, then parsed by `wisp.models.hf_config.parse_hf_config`, so the family (found by its GGUF architecture
name in `wisp.models.families`) reads its quirks in one place for both formats. What a GGUF file leaves to
llama.cpp's per-architecture code is filled from `LLAMA_CPP_DEFAULTS` (whether the top-k weights are renormalised).
The compute dtype is float32 for an F32 file, else bfloat16 (`FILE_TYPE_DTYPES`). GPT-OSS's MXFP4 experts
stay MXFP4 (the config says so, as the hub's MXFP4 checkpoints do); experts whose every tensor is Q8_0, Q4_K, Q5_K or
Q6_K stay in those block formats, per layer and role (`packed_block_experts`); every other quantized tensor is
dequantized.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wisp.config import ModelConfig
from wisp.core.kernels.gguf_blocks import BLOCKS as GGUF_BLOCK_EXPERTS
from wisp.errors import WispError
from wisp.models.families import family_for_gguf
from wisp.models.hf_config import parse_hf_config

# what llama.cpp's graph for the architecture assumes where the file says nothing: renormalised top-k weights
LLAMA_CPP_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3moe": {"norm_topk_prob": True},
    "qwen2moe": {"norm_topk_prob": False},
    "olmoe": {"norm_topk_prob": False},
    "llama": {},  # Mixtral: its family always renormalises
    "gpt-oss": {},
    "deepseek2": {"topk_method": "greedy"},
}
YARN_DEFAULTS: dict[str, dict[str, Any]] = {"gpt-oss": {"truncate": False}}  # llama.cpp's yarn for the architecture
# general.file_type -> the compute dtype: ALL_F32 float32; MOSTLY_F16 bfloat16 too (these models are trained in bf16,
# and float16 activations can overflow where llama.cpp computes in float32); `--dtype` overrides
FILE_TYPE_DTYPES = {0: "float32", 1: "bfloat16", 32: "bfloat16"}


def packed_block_experts(layer_types: dict[int, tuple[str, str, str]]) -> bool:
    """Whether experts of these GGML types (per MoE layer: gate's, up's, down's) stay packed in their block formats
    ("gguf_blocks"): each of `GGUF_BLOCK_EXPERTS`, gate and up alike in every layer (the bank stacks them)."""
    return bool(layer_types) and all(g == u and {g, d} <= set(GGUF_BLOCK_EXPERTS) for g, u, d in layer_types.values())


def decimal(value: float) -> float:
    """A float32 metadata value as the shortest decimal that is the same float32 (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def hf_config_from_gguf(meta: dict[str, Any], experts: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Hugging Face config dict of a GGUF file's metadata (its `general.architecture` must have a family).
    `experts` (`GGUFFile.expert_facts`): the experts' GGML type (MXFP4 ones kept packed where the family reads MXFP4:
    GPT-OSS) and the widths their tensors have, which win over the metadata's (older files lack the keys)."""
    experts = experts or {}
    expert_type = experts.get("type")
    arch = str(meta.get("general.architecture", ""))
    family = family_for_gguf(arch)

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    if not get("expert_count"):
        raise WispError(f"the GGUF file's {arch} model has no experts ({arch}.expert_count): wisp serves "
                        "mixture-of-experts models only")
    required = ("block_count", "embedding_length", "attention.head_count", "expert_used_count")
    missing = [f"{arch}.{k}" for k in required if get(k) is None]
    if missing:
        raise WispError(f"the GGUF file lacks {', '.join(missing)}")
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise WispError("the GGUF file has no tokenizer.ggml.tokens (its vocabulary)")
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    moe_width = experts.get("width") or get("expert_feed_forward_length", get("feed_forward_length"))
    raw: dict[str, Any] = {
        "architectures": [family.architecture],
        "vocab_size": len(tokens),
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "rms_norm_eps": decimal(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": decimal(get("rope.freq_base", 10000.0)),
        "num_experts": int(get("expert_count")),
        "num_experts_per_tok": int(get("expert_used_count")),
        "intermediate_size": int(get("feed_forward_length", moe_width)),
        family.expert_width_field: int(moe_width),  # (after: OLMoE and Mixtral name the expert width so)
        "shared_expert_intermediate_size": int(experts.get("shared_width") or get("expert_shared_feed_forward_length", 0)),
        "eos_token_id": [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id") if isinstance(meta.get(k), int)],
        "torch_dtype": FILE_TYPE_DTYPES.get(meta.get("general.file_type"), "bfloat16"),
        **LLAMA_CPP_DEFAULTS.get(arch, {}),
    }
    if expert_type == "MXFP4" and family.weights.fused_layout == "gpt_oss":
        raw["quantization_config"] = {"quant_method": "mxfp4"}
    elif experts.get("types") == {"Q8_0"} and family.weights.fused_layout != "gpt_oss":  # kept packed: every expert's
        raw["quantization_config"] = {"quant_method": "gguf_q8_0"}
    elif family.weights.fused_layout != "gpt_oss" and packed_block_experts(experts.get("layer_types") or {}):
        layers = experts["layer_types"]  # k-quants among them: each layer's roles kept in their own types
        raw["quantization_config"] = {"quant_method": "gguf_blocks", "layers": [
            [layers[i][0], layers[i][2]] if i in layers else None for i in range(int(get("block_count")))]}
    if raw.get("quantization_config", {}).get("quant_method") in ("gguf_q8_0", "gguf_blocks"):
        sizes = experts.get("projections") or {}  # latent attention is dequantized at load: only the others stay packed
        parts = [sizes.get("other", (0, 0))] + ([] if family.mla else [sizes.get("attention", (0, 0))])
        raw["quantization_config"]["packed_projections"] = [sum(p[0] for p in parts), sum(p[1] for p in parts)]
    if get("expert_weights_norm") is not None:
        raw["norm_topk_prob"] = bool(get("expert_weights_norm"))
    if family.mla:
        raw.update(latent_attention_fields(get, heads))
    if get("rope.scaling.type") == "yarn":
        raw["rope_scaling"] = {"rope_type": "yarn", "factor": decimal(get("rope.scaling.factor")),
                               "original_max_position_embeddings": int(get("rope.scaling.original_context_length")),
                               "beta_fast": float(get("rope.scaling.yarn_beta_fast", 32.0)),
                               "beta_slow": float(get("rope.scaling.yarn_beta_slow", 1.0)), **YARN_DEFAULTS.get(arch, {}),
                               **raw.pop("rope_extra", {})}
    if get("attention.sliding_window"):
        raw["sliding_window"] = int(get("attention.sliding_window"))
    if get("swiglu_clamp_exp") is not None:  # a limit per layer in llama.cpp; the families take one
        clamp = get("swiglu_clamp_exp")
        raw["swiglu_limit"] = decimal(clamp[0] if isinstance(clamp, list) else clamp)
    return raw


def latent_attention_fields(get, heads: int) -> dict[str, Any]:
    """DeepSeek-V2's latent attention and MoE layout from llama.cpp's keys. Files since 2025 describe the absorbed
    form (key_length = kv_lora_rank + rope dims, and the per-head widths in key_length_mla / value_length_mla); older
    ones the per-head widths in key_length / value_length. llama.cpp keeps yarn's mscale_all_dim as
    yarn_log_multiplier = 0.1 * mscale_all_dim, and no separate mscale (taken equal, as DeepSeek-V2's are)."""
    rope = int(get("rope.dimension_count"))
    key, value = get("attention.key_length_mla"), get("attention.value_length_mla")
    if key is None:
        key, value = get("attention.key_length"), get("attention.value_length")
    fields = {"kv_lora_rank": int(get("attention.kv_lora_rank")), "q_lora_rank": get("attention.q_lora_rank"),
              "qk_rope_head_dim": rope, "qk_nope_head_dim": int(key) - rope, "v_head_dim": int(value),
              "num_key_value_heads": heads, "n_shared_experts": int(get("expert_shared_count", 0)),
              "first_k_dense_replace": int(get("leading_dense_block_count", 0)),
              "routed_scaling_factor": decimal(get("expert_weights_scale", 1.0)),
              "norm_topk_prob": bool(get("expert_weights_norm", False))}
    if get("rope.scaling.type") == "yarn" and get("rope.scaling.yarn_log_multiplier") is not None:
        mscale = decimal(decimal(get("rope.scaling.yarn_log_multiplier")) / 0.1)
        fields["rope_extra"] = {"mscale": mscale, "mscale_all_dim": mscale}
    return fields


def parse_gguf_metadata(meta: dict[str, Any], generation: dict[str, Any] | None = None,
                        experts: dict[str, Any] | None = None) -> ModelConfig:
    """The config of a GGUF file from its metadata (`GGUFFile.metadata`) and its experts' facts."""
    try:
        return parse_hf_config(hf_config_from_gguf(meta, experts), generation)
    except (KeyError, TypeError, ValueError) as exc:
        raise WispError(f"the GGUF file's metadata is invalid: {exc}") from None
