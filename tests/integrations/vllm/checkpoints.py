"""Tiny random bf16 checkpoints that vLLM's CPU backend runs (the vLLM test modules share them)."""

from __future__ import annotations

import torch

from tests.helpers import COMMON, FAMILY_SPECS

# vLLM's CPU attention takes head_dim 32 (the shared specs use 16 for Qwen3-MoE and 64 / 4 = 16 elsewhere)
HEADS_32 = {"qwen3_moe": {"head_dim": 32}, "olmoe": {"num_attention_heads": 2, "num_key_value_heads": 2},
            "mixtral": {"num_attention_heads": 2, "num_key_value_heads": 2}}


def tiny_bf16_checkpoint(family: str, path, **overrides):
    """A tiny random bf16 checkpoint of `family` (tests/helpers.py's spec, heads of 32, then `overrides` of its
    config), written by transformers."""
    import transformers

    cfg_cls, model_cls, kwargs = FAMILY_SPECS[family]
    torch.manual_seed(0)
    config = getattr(transformers, cfg_cls)(**{**COMMON, **kwargs, **HEADS_32[family], **overrides})
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5 if "embed" in name else 0.15)
    model.to(torch.bfloat16).save_pretrained(path)
    return path
