"""The supported model families: one registry entry per architecture, registered by name.

A `Family` holds everything that differs between architectures: how its config.json names things
(read by `wisp.models.hf_config` through the methods below), plain fields the model code
reads (`qk_norm`, `router_dtype`), and where its checkpoint keeps each tensor (`weights`, a
`wisp.models.weight_names.WeightNames`). No other module tests a family's name, so adding a family is
one `register(Family(...))` here plus, if its tensors are named in a new style, one `WeightNames`.

Invariants: family names and architectures are unique; looking up anything else raises WispError
listing the supported names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from wisp.core.kernels.expert_extras import SILU, Activation
from wisp.errors import WispError
from wisp.models.weight_names import DEEPSEEK_STYLE, GPT_OSS_STYLE, HF_STYLE, MIXTRAL_STYLE, WeightNames


@dataclass(frozen=True)
class Family:
    name: str  # the model code's key (ModelConfig.family)
    architecture: str  # config.json "architectures"[0]
    weights: WeightNames
    expert_width_field: str = "moe_intermediate_size"  # config field of one expert's MLP width
    every_layer_moe: bool = False  # else: MoE layers follow decoder_sparse_step and mlp_only_layers
    sliding_window_switch: bool = False  # sliding_window applies only when use_sliding_window is true
    always_renormalise: bool = False  # top-k weights renormalised whatever norm_topk_prob says
    shared_expert: bool = False  # a shared expert of shared_expert_intermediate_size, sigmoid-gated
    attention_bias_field: tuple[str, bool] = ("attention_bias", False)  # config field, its default
    qk_norm: str = "none"  # "none" | "per_head" (RMSNorm per head) | "full" (over all heads)
    router_dtype: torch.dtype | None = None  # dtype of the routing weights; None: the activations'
    routing: str = "softmax_topk"  # softmax over all experts, then top-k; or "topk_softmax" (GPT-OSS)
    attention_sinks: bool = False  # a learned per-head sink logit in every softmax (GPT-OSS)
    alternating_windows: bool = False  # sliding_window only on config.layer_types' "sliding_attention" layers
    clamped_swiglu: bool = False  # experts use swiglu_alpha / swiglu_limit's clamped SwiGLU (GPT-OSS)
    expert_bias: bool = False  # experts have gate_up and down biases; the router and o_proj have biases too
    norm_weight_float32: bool = False  # RMSNorm's weight multiplies the float32 activations (GPT-OSS)
    mla: bool = False  # multi-head latent attention (DeepSeek-V2): q/kv LoRA ranks, a decoupled rope key
    first_dense_layers: bool = False  # layers before first_k_dense_replace are dense, every later one MoE
    never_renormalise: bool = False  # top-k weights are the softmax's, whatever norm_topk_prob says
    shared_expert_gated: bool = True  # the shared expert's output is scaled by a sigmoid gate (Qwen2-MoE)
    router_float32: bool = False  # router logits computed in float32 from float32 activations (DeepSeek)
    gguf_architecture: str | None = None  # llama.cpp's name for it (GGUF general.architecture), where wisp reads GGUF

    def expert_widths(self, raw: dict[str, Any]) -> tuple[int, int]:
        """(MLP width of one expert, MLP width of a dense layer; the expert's when not given)."""
        moe = int(raw[self.expert_width_field])
        return moe, int(raw.get("intermediate_size", moe))

    def moe_layers(self, raw: dict[str, Any], num_layers: int) -> tuple[bool, ...]:
        """Per layer: True when its MLP is a routed MoE block."""
        if self.every_layer_moe:
            return (True,) * num_layers
        if self.first_dense_layers:
            first = int(raw.get("first_k_dense_replace", 0))
            return tuple(i >= first for i in range(num_layers))
        step = int(raw.get("decoder_sparse_step", 1) or 1)
        dense = raw.get("mlp_only_layers") or []
        return tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))

    def norm_topk_prob(self, raw: dict[str, Any]) -> bool:
        if self.never_renormalise:
            return False
        return True if self.always_renormalise else bool(raw.get("norm_topk_prob", False))

    def shared_expert_width(self, raw: dict[str, Any]) -> int:
        if not self.shared_expert:
            return 0
        if "n_shared_experts" in raw:  # DeepSeek: n_shared_experts experts of moe_intermediate_size, as one MLP
            return int(raw["n_shared_experts"] or 0) * int(raw["moe_intermediate_size"])
        return int(raw.get("shared_expert_intermediate_size") or 0)

    def attention_bias(self, raw: dict[str, Any]) -> bool:
        return bool(raw.get(*self.attention_bias_field))

    def window_layers(self, raw: dict[str, Any]) -> tuple[bool, ...]:
        """Per layer, whether the sliding window applies (empty: everywhere it is set)."""
        if not self.alternating_windows:
            return ()
        layers = int(raw["num_hidden_layers"])
        types = raw.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        if len(types) != layers:
            raise WispError(f"layer_types names {len(types)} layers but num_hidden_layers is {layers}")
        return tuple(t == "sliding_attention" for t in types)

    def expert_activation(self, raw: dict[str, Any]) -> Activation:
        if not self.clamped_swiglu:
            return SILU
        return Activation("clamped_swiglu", float(raw.get("swiglu_alpha", 1.702)), float(raw.get("swiglu_limit", 7.0)))

    def sliding_window(self, raw: dict[str, Any]) -> int | None:
        window = raw.get("sliding_window", 128 if self.alternating_windows else None)  # GPT-OSS's default: 128
        if self.sliding_window_switch and not raw.get("use_sliding_window", False):
            window = None
        return int(window) if window else None


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    taken = {f.architecture for f in FAMILIES.values()}
    if family.name in FAMILIES or family.architecture in taken:
        raise ValueError(f"family {family.name!r} ({family.architecture}) is already registered")
    FAMILIES[family.name] = family
    return family


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise WispError(f"unsupported model family {name!r}; supported: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_for_gguf(architecture: str) -> Family:
    """The family of a GGUF file's `general.architecture` (llama.cpp's name)."""
    for family in FAMILIES.values():
        if family.gguf_architecture == architecture:
            return family
    supported = ", ".join(f.gguf_architecture for f in FAMILIES.values() if f.gguf_architecture)
    raise WispError(f"unsupported GGUF architecture {architecture!r}; supported: {supported}")


def family_for_architecture(architecture: str | None) -> Family:
    for family in FAMILIES.values():
        if family.architecture == architecture:
            return family
    supported = ", ".join(f.architecture for f in FAMILIES.values())
    raise WispError(f"unsupported architecture {architecture!r}; supported: {supported}")


register(Family("qwen3_moe", "Qwen3MoeForCausalLM", HF_STYLE, sliding_window_switch=True, qk_norm="per_head",
                gguf_architecture="qwen3moe"))
register(Family("olmoe", "OlmoeForCausalLM", HF_STYLE, expert_width_field="intermediate_size", every_layer_moe=True,
                qk_norm="full", gguf_architecture="olmoe"))
register(Family("mixtral", "MixtralForCausalLM", MIXTRAL_STYLE, expert_width_field="intermediate_size",
                every_layer_moe=True, always_renormalise=True, router_dtype=torch.float32, gguf_architecture="llama"))
register(Family("qwen2_moe", "Qwen2MoeForCausalLM", HF_STYLE, sliding_window_switch=True, shared_expert=True,
                attention_bias_field=("qkv_bias", True), gguf_architecture="qwen2moe"))
register(Family("gpt_oss", "GptOssForCausalLM", GPT_OSS_STYLE, expert_width_field="intermediate_size",
                every_layer_moe=True, attention_bias_field=("attention_bias", True), routing="topk_softmax",
                attention_sinks=True, alternating_windows=True, clamped_swiglu=True, expert_bias=True,
                norm_weight_float32=True, gguf_architecture="gpt-oss"))
register(Family("deepseek_v2", "DeepseekV2ForCausalLM", DEEPSEEK_STYLE, first_dense_layers=True, never_renormalise=True,
                shared_expert=True, shared_expert_gated=False, mla=True, router_float32=True,
                router_dtype=torch.float32, gguf_architecture="deepseek2"))
