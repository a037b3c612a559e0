"""A Hugging Face checkpoint's config (config.json, and generation_config.json) as one `ModelConfig`.

`parse_hf_config` is this format's parser (registered in `wisp.models.config_parsers`); `read_hf_config` reads
a checkpoint folder's two files into it, a missing or bad file being one WispError that names it. Naming
differences shared by all families (num_experts vs num_local_experts, rope_theta vs rope_parameters) are
resolved here; each family's own quirks (Mixtral's always-renormalised router, Qwen2-MoE's shared expert and
sparse-step layout, OLMoE's full-width q/k norms) live in its entry of `wisp.models.families`, read through
its methods. Unsupported quantization, rope types and routing methods are refused here, naming what is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from wisp.config import MlaShape, ModelConfig, RopeScaling, parse_dtype
from wisp.errors import WispError
from wisp.models.families import Family, family_for_architecture
from wisp.models.rope import ROPE_TYPES


SAMPLING_KEYS = ("temperature", "top_p", "top_k")


def read_hf_config(path: str | Path) -> ModelConfig:
    """The config of the checkpoint folder `path`: its config.json and (when present) generation_config.json."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise WispError(f"no config.json in {path}")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise WispError(f"{cfg_path} is not valid JSON: {exc}") from None
    gen_path = Path(path) / "generation_config.json"
    try:
        gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    except json.JSONDecodeError as exc:
        raise WispError(f"{gen_path} is not valid JSON: {exc}") from None
    try:
        return parse_hf_config(raw, gen)
    except KeyError as exc:
        raise WispError(f"{cfg_path} has no {exc.args[0]!r} field") from None
    except (TypeError, ValueError) as exc:
        raise WispError(f"{cfg_path} has an invalid value: {exc}") from None


def parse_hf_config(raw: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    """A Hugging Face config.json (and generation_config.json) as one normalised config."""
    archs = raw.get("architectures") or []
    family = family_for_architecture(archs[0] if archs else None)
    fp8_block, expert_format = _quantization(raw)
    if expert_format == "mxfp4" and family.weights.fused_layout != "gpt_oss":
        raise WispError(f"MXFP4 experts are supported for GPT-OSS checkpoints only, not {family.architecture}")
    if expert_format in ("q8_0", "gguf_blocks") and family.weights.fused_layout == "gpt_oss":
        raise WispError("GGUF block experts are read packed from GGUF files of stacked experts, not GPT-OSS's")
    layout = _layout_fields(raw)
    experts = _expert_fields(raw, family, layout["num_layers"])
    rope = rope_scaling(raw)
    window = family.sliding_window(raw)
    eos = _eos_token_ids(raw, generation or {})
    attention = _attention_fields(raw)
    mla = None
    if family.mla:
        mla = mla_shape(raw, rope)
        layout["head_dim"], attention["num_kv_heads"] = mla.cache_dim, 1
        if raw.get("topk_method", "greedy") != "greedy":
            raise WispError(f"unsupported topk_method {raw['topk_method']!r}; supported: greedy")
    dtype = parse_dtype(raw.get("dtype") or raw.get("torch_dtype") or "float32") or torch.float32
    return ModelConfig(family=family.name, architecture=family.architecture, vocab_size=int(raw["vocab_size"]),
                       **layout, **attention, rope=rope, top_k=int(raw["num_experts_per_tok"]), **experts,
                       attention_bias=family.attention_bias(raw), qk_norm=family.qk_norm, clip_qkv=raw.get("clip_qkv"),
                       sliding_window=window, tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                       eos_token_ids=eos, sampling_defaults=_sampling_defaults(generation or {}), dtype=dtype,
                       fp8_block=fp8_block, expert_format=expert_format, expert_block_formats=_block_formats(raw),
                       packed_projection_sizes=_packed_projection_sizes(raw) if fp8_block is None else
                       _fp8_projection_sizes(layout, attention, fp8_block, family.mla),
                       window_layers=family.window_layers(raw), attention_sinks=family.attention_sinks,
                       routing=family.routing, expert_activation=family.expert_activation(raw),
                       expert_bias=family.expert_bias, norm_weight_float32=family.norm_weight_float32, mla=mla,
                       routed_scaling=float(raw.get("routed_scaling_factor") or 1.0),
                       router_float32=family.router_float32, shared_expert_gated=family.shared_expert_gated)


def rope_scaling(raw: dict[str, Any]) -> RopeScaling:
    """config.json's `rope_parameters` (or the older `rope_scaling`, or a bare `rope_theta`). Yarn's
    attention_factor is the given one, or 0.1 ln(factor) + 1, or with mscale and mscale_all_dim the ratio of those."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise WispError(f"unsupported rope_type {kind!r}; supported: {', '.join(ROPE_TYPES)}")
    theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
    if kind == "default":
        return RopeScaling(theta=theta)
    if kind == "linear":
        return RopeScaling("linear", theta, float(rope.get("factor") or 1.0),
                           mscale_all_dim=float(rope.get("mscale_all_dim") or 0.0))
    original = int(rope.get("original_max_position_embeddings") or raw.get("original_max_position_embeddings")
                   or raw["max_position_embeddings"])
    factor = rope.get("factor") or int(raw["max_position_embeddings"]) / original
    attention = rope.get("attention_factor")
    mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
    if attention is None:
        attention = (_mscale(factor, mscale) / _mscale(factor, mscale_all)) if mscale and mscale_all else _mscale(factor)
    return RopeScaling("yarn", theta, float(factor), float(rope.get("beta_fast") or 32),
                       float(rope.get("beta_slow") or 1), original, bool(rope.get("truncate", True)), float(attention),
                       float(mscale_all or 0.0))


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def mla_shape(raw: dict[str, Any], rope: RopeScaling) -> MlaShape:
    """The latent attention's shape from config.json, its softmax scale from its rope (`rope_scaling` of the same)."""
    nope, rope_dim = int(raw["qk_nope_head_dim"]), int(raw["qk_rope_head_dim"])
    scale = (nope + rope_dim) ** -0.5
    if rope.kind != "default" and rope.mscale_all_dim and rope.factor > 1:
        m = 0.1 * rope.mscale_all_dim * math.log(rope.factor) + 1.0
        scale *= m * m
    q_lora = raw.get("q_lora_rank")
    return MlaShape(int(q_lora) if q_lora else None, int(raw["kv_lora_rank"]), nope, rope_dim, int(raw["v_head_dim"]),
                    scale)


SUPPORTED_QUANTIZATION = ("fp8 (float8_e4m3fn weights with weight_scale_inv in 128 x 128 blocks), mxfp4 (GPT-OSS "
                          "experts as *_blocks and *_scales)")


def _block_formats(raw: dict[str, Any]) -> tuple[tuple[str, str] | None, ...]:
    """A GGUF file's per-layer (gate_up, down) expert types, where its experts stay in their block formats
    ("gguf_blocks", `wisp.models.gguf_config`); () otherwise."""
    quant = raw.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "gguf_blocks":
        return ()
    return tuple(None if layer is None else (str(layer[0]), str(layer[1])) for layer in quant["layers"])


def _packed_projection_sizes(raw: dict[str, Any]) -> tuple[int, int]:
    """A GGUF file's (parameters, bytes) of dense projections kept packed (`wisp.models.gguf_config`), else (0, 0)."""
    quant = raw.get("quantization_config")
    sizes = quant.get("packed_projections") if isinstance(quant, dict) else None
    return (int(sizes[0]), int(sizes[1])) if sizes else (0, 0)


def _fp8_projection_sizes(layout: dict[str, Any], attention: dict[str, Any], block: tuple[int, int],
                          mla: bool) -> tuple[int, int]:
    """An FP8 checkpoint's attention projections q, k, v and o, kept packed where `packs_projections` says:
    (parameters, bytes: a byte a weight and a float32 scale a block). Latent attention is dequantized at load: none."""
    if mla:
        return 0, 0
    d, hd, heads, kv = layout["hidden_size"], layout["head_dim"], layout["num_heads"], attention["num_kv_heads"]
    shapes = [(heads * hd, d), (kv * hd, d), (kv * hd, d), (d, heads * hd)]
    params = sum(r * c for r, c in shapes)
    scales = sum(-(-r // block[0]) * -(-c // block[1]) for r, c in shapes)
    return layout["num_layers"] * params, layout["num_layers"] * (params + 4 * scales)


def _quantization(raw: dict[str, Any]) -> tuple[tuple[int, int] | None, str]:
    """(the block of an FP8 block-scaled checkpoint or None, its experts' format: "plain", "mxfp4", "q8_0" for a
    GGUF file whose experts are all Q8_0, or "gguf_blocks" for one whose experts are in GGUF block formats,
    k-quants among them: `wisp.models.gguf_config`). Any other
    quantization (GPTQ, AWQ, bitsandbytes, compressed-tensors, other blocks...) is refused: its weights need
    scales wisp does not apply, so loading it anyway would compute garbage."""
    if raw.get("compression_config"):
        raise WispError(f"the checkpoint is quantized (compression_config), which wisp does not support; supported: "
                        f"{SUPPORTED_QUANTIZATION}, or float32, float16 and bfloat16 weights")
    quant = raw.get("quantization_config")
    if not quant:
        return None, "plain"
    method = quant.get("quant_method", "unknown") if isinstance(quant, dict) else "unknown"
    if method in ("mxfp4", "gguf_q8_0", "gguf_blocks"):  # the last two only from a GGUF file (`wisp.models.gguf_config`)
        return None, {"gguf_q8_0": "q8_0"}.get(method, method)
    block = tuple(quant.get("weight_block_size") or ()) if isinstance(quant, dict) else ()
    fmt = quant.get("fmt", "e4m3") if isinstance(quant, dict) else None
    if method != "fp8" or block != (128, 128) or fmt != "e4m3":
        raise WispError(f"the checkpoint is quantized (quant_method {method!r}, weight_block_size {list(block)}), "
                        f"which wisp does not support; supported: {SUPPORTED_QUANTIZATION}, or float32, float16 "
                        "and bfloat16 weights")
    return (128, 128), "plain"


def _layout_fields(raw: dict[str, Any]) -> dict[str, Any]:
    hidden, n_heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    n_layers = int(raw["num_hidden_layers"])
    head_dim = raw.get("head_dim") or hidden // n_heads
    return dict(hidden_size=hidden, num_heads=n_heads, num_layers=n_layers, head_dim=int(head_dim))


def _attention_fields(raw: dict[str, Any]) -> dict[str, Any]:
    return dict(num_kv_heads=int(raw.get("num_key_value_heads") or raw["num_attention_heads"]),
                max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)))


def _expert_fields(raw: dict[str, Any], family: Family, num_layers: int) -> dict[str, Any]:
    n_experts = raw.get("num_experts") or raw.get("num_local_experts") or raw.get("n_routed_experts")
    if not n_experts:
        raise WispError(f"{family.architecture} config has no num_experts / num_local_experts / n_routed_experts")
    moe_width, dense_width = family.expert_widths(raw)
    return dict(num_experts=int(n_experts), moe_intermediate_size=moe_width, dense_intermediate_size=dense_width,
                moe_layers=family.moe_layers(raw, num_layers), norm_topk_prob=family.norm_topk_prob(raw),
                shared_expert_intermediate_size=family.shared_expert_width(raw))


def _sampling_defaults(generation: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """generation_config.json's temperature, top_p and top_k, where each is a finite number (none at all where it says
    do_sample: false); a top_k of 0 or below means no top-k (0), as vLLM reads -1."""
    if generation.get("do_sample") is False:
        return ()
    found = []
    for key in SAMPLING_KEYS:
        value = generation.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            found.append((key, float(max(int(value), 0)) if key == "top_k" else float(value)))
    return tuple(found)


def _eos_token_ids(raw: dict[str, Any], generation: dict[str, Any]) -> tuple[int, ...]:
    """EOS ids of config.json, then generation_config.json: in-vocabulary ints, each once, in order."""
    eos: list[int] = []
    for src in (raw.get("eos_token_id"), generation.get("eos_token_id")):
        for tok in src if isinstance(src, list) else [src]:
            if isinstance(tok, int) and 0 <= tok < int(raw["vocab_size"]) and tok not in eos:
                eos.append(tok)
    return tuple(eos)
