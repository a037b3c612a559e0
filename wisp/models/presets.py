"""Real models' shapes as Hugging Face config dicts, for planning and benchmarks without a checkpoint.

`--model qwen3-30b-a3b` (or qwen3-30b-a3b-fp8, olmoe-1b-7b, mixtral-8x7b, gpt-oss-20b, gpt-oss-120b,
deepseek-v2-lite) resolves here wherever only the shape matters.
"""

from __future__ import annotations

from typing import Any

from wisp.errors import WispError

QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "eos_token_id": 151645,
    "dtype": "bfloat16",
}

OLMOE_1B_7B: dict[str, Any] = {
    "architectures": ["OlmoeForCausalLM"],
    "model_type": "olmoe",
    "vocab_size": 50304,
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 1024,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "norm_topk_prob": False,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "eos_token_id": 50279,
    "dtype": "bfloat16",
}

MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "eos_token_id": 2,
    "dtype": "bfloat16",
}

# Qwen/Qwen3-30B-A3B-FP8's quantization_config: every projection in float8_e4m3fn with 128 x 128 block scales
QWEN3_30B_A3B_FP8: dict[str, Any] = {
    **QWEN3_30B_A3B,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}

# openai/gpt-oss-120b's shape: experts in MXFP4 (everything else bf16), alternating 128-token sliding windows,
# attention sinks, yarn rope over a 4096-token original context
GPT_OSS_120B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "vocab_size": 201088,
    "hidden_size": 2880,
    "num_hidden_layers": 36,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 2880,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "sliding_window": 128,
    "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)],
    "attention_bias": True,
    "swiglu_limit": 7.0,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                        "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False},
    "tie_word_embeddings": False,
    "eos_token_id": 200002,
    "dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4",
                            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"]},
}
GPT_OSS_20B: dict[str, Any] = {
    **GPT_OSS_120B,
    "num_hidden_layers": 24,
    "num_local_experts": 32,
    "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(24)],
}

# deepseek-ai/DeepSeek-V2-Lite's shape: latent attention (kv_lora_rank 512, no q LoRA), the first layer dense,
# 64 routed experts (top-6, softmax, not renormalised) beside 2 shared ones, yarn rope over a 4096-token original
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "vocab_size": 102400,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 1.0,
    "topk_method": "greedy",
    "norm_topk_prob": False,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6,
    "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096},
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "eos_token_id": 100001,
    "dtype": "bfloat16",
}

PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "qwen3-30b-a3b-fp8": QWEN3_30B_A3B_FP8,
    "olmoe-1b-7b": OLMOE_1B_7B,
    "mixtral-8x7b": MIXTRAL_8X7B,
    "gpt-oss-20b": GPT_OSS_20B,
    "gpt-oss-120b": GPT_OSS_120B,
    "deepseek-v2-lite": DEEPSEEK_V2_LITE,
}


def preset(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise WispError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return dict(PRESETS[name])
