"""Random-weight checkpoints in Hugging Face layout, and the built-in `demo` model.

`write_random_checkpoint` writes config.json plus one safetensors shard per layer (with
model.safetensors.index.json), using the hub's per-expert tensor names, from a fixed seed. It is how
the demo exists on a fresh machine with no download, and how benchmarks get real-shaped models.

The demo is a tiny Qwen3-MoE with a byte-level tokenizer (every byte is a token, plus specials),
created on first use under $WISP_CACHE (default ~/.cache/wisp).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors.torch import save_file

from wisp.config import ModelConfig
from wisp.models.families import family_names

DEMO_VERSION = "v1"
DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 259,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 256,
    "dtype": "float32",
}
DEMO_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
DEMO_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tensors_of_layer(cfg: ModelConfig, i: int, gen: torch.Generator, dtype: torch.dtype, device) -> Iterator[tuple[str, torch.Tensor]]:
    n = family_names(cfg.family)
    d, hd, h, hkv = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, device=device) * 0.05).to(dtype).cpu()

    def ones(*shape: int) -> torch.Tensor:
        return torch.ones(shape, dtype=dtype)

    yield f"{n.layer(i)}.input_layernorm.weight", ones(d)
    yield f"{n.layer(i)}.post_attention_layernorm.weight", ones(d)
    for proj, rows in (("q", h * hd), ("k", hkv * hd), ("v", hkv * hd)):
        yield n.attn(i, f"{proj}_proj.weight"), rand(rows, d)
        if cfg.attention_bias:
            yield n.attn(i, f"{proj}_proj.bias"), rand(rows)
    yield n.attn(i, "o_proj.weight"), rand(d, h * hd)
    if cfg.qk_norm == "per_head":
        yield n.attn(i, "q_norm.weight"), ones(hd)
        yield n.attn(i, "k_norm.weight"), ones(hd)
    elif cfg.qk_norm == "full":
        yield n.attn(i, "q_norm.weight"), ones(h * hd)
        yield n.attn(i, "k_norm.weight"), ones(hkv * hd)
    if not cfg.moe_layers[i]:
        inter = cfg.dense_intermediate_size
        for which, shape in (("gate", (inter, d)), ("up", (inter, d)), ("down", (d, inter))):
            yield n.dense_mlp(i, which), rand(*shape)
        return
    yield n.router(i), rand(cfg.num_experts, d)
    inter = cfg.moe_intermediate_size
    for e in range(cfg.num_experts):
        for which, shape in (("gate", (inter, d)), ("up", (inter, d)), ("down", (d, inter))):
            yield n.expert(i, e, which), rand(*shape)


def write_random_checkpoint(raw_config: dict[str, Any], path: str | Path, seed: int = 0, device: str = "cpu") -> Path:
    """Write a random checkpoint for `raw_config` (an HF config dict) into `path`; returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = ModelConfig.from_hf(raw_config)
    dtype = cfg.dtype
    gen = torch.Generator(device=device).manual_seed(seed)
    n_shards = cfg.num_layers + 1
    weight_map: dict[str, str] = {}

    def shard(k: int, tensors: dict[str, torch.Tensor]) -> None:
        name = f"model-{k:05d}-of-{n_shards:05d}.safetensors"
        save_file({key: t.contiguous() for key, t in tensors.items()}, str(path / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in tensors})

    d, v = cfg.hidden_size, cfg.vocab_size
    head = {
        "model.embed_tokens.weight": (torch.randn((v, d), generator=gen, device=device) * 0.5).to(dtype).cpu(),
        "model.norm.weight": torch.ones(d, dtype=dtype),
    }
    if not cfg.tie_word_embeddings:
        head["lm_head.weight"] = (torch.randn((v, d), generator=gen, device=device) * 0.05).to(dtype).cpu()
    shard(1, head)
    for i in range(cfg.num_layers):
        shard(i + 2, dict(_tensors_of_layer(cfg, i, gen, dtype, device)))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (path / "config.json").write_text(json.dumps(raw_config, indent=1))
    return path


def _write_byte_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(DEMO_SPECIALS)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "chat_template": DEMO_CHAT_TEMPLATE}, indent=1)
    )


def cache_dir() -> Path:
    return Path(os.environ.get("WISP_CACHE", Path.home() / ".cache" / "wisp"))


def demo_path() -> Path:
    """The demo checkpoint's folder, written atomically on first use."""
    final = cache_dir() / f"demo-{DEMO_VERSION}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-", dir=final.parent))
    try:
        write_random_checkpoint(DEMO_CONFIG, tmp, seed=1234)
        (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": 256}))
        _write_byte_tokenizer(tmp)
        try:
            tmp.rename(final)
        except OSError:  # another process won the race
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
