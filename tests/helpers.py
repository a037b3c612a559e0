"""Helpers the test modules share (import them from here; tests/conftest.py keeps only fixtures,
options and hooks): small random Hugging Face models of every supported family."""

from __future__ import annotations

import torch

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    eos_token_id=None,
    pad_token_id=0,
    bos_token_id=None,
    tie_word_embeddings=False,
)

# family -> (config class, model class, config kwargs); each exercises that family's quirks
FAMILY_SPECS = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_hidden_layers=3, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
             intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[1]),
    ),
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, intermediate_size=32, norm_topk_prob=False),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=48,
             shared_expert_intermediate_size=40, decoder_sparse_step=2, norm_topk_prob=False),
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(num_hidden_layers=3, head_dim=16, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32,
             sliding_window=4, swiglu_limit=1.5,  # a window the prompts outrun; a clamp the activations reach
             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                              "beta_slow": 1.0, "original_max_position_embeddings": 64, "truncate": False}),
    ),
}
FAMILIES = list(FAMILY_SPECS)


def make_hf_model(family: str, seed: int = 0):
    import transformers

    cfg_cls, model_cls, kwargs = FAMILY_SPECS[family]
    torch.manual_seed(seed)
    config = getattr(transformers, cfg_cls)(**COMMON, **kwargs)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # HF's init is tiny (std 0.02); widen it so routing and logits are far from ties
        for name, p in model.named_parameters():
            if p.dim() >= 2 and not name.endswith("_bias"):
                p.normal_(0.0, 0.5 if "embed" in name else 0.15)
            elif family == "gpt_oss" and ("bias" in name or "sinks" in name):  # HF zeroes the expert biases
                p.normal_(0.0, 0.3)
    return model
