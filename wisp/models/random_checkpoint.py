"""Random-weight checkpoints in Hugging Face layout.

`write_random_checkpoint` writes config.json plus one safetensors shard per layer (with
model.safetensors.index.json), using the hub's per-expert tensor names, from a fixed seed. It is how
the random demo (`demo-random`, `wisp.models.demo`) exists on a fresh machine with no download, and how
benchmarks get real-shaped models.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors.torch import save_file

from wisp.config import ModelConfig
from wisp.core.kernels.fp8_blocks import quantize_blocks, scale_key
from wisp.models.config_parsers import model_config
from wisp.models.expert_banks import BLOCK_KEYS, Q8_0_KEYS, packed_role
from wisp.models.families import get_family

def tensor_specs(cfg: ModelConfig) -> Iterator[tuple[int, str, tuple[int, ...], float]]:
    """(shard, name, shape, std) of every tensor of a checkpoint; std 0 means all ones (norm weights).
    Shard 0 holds embeddings, final norm and LM head; shard i + 1 holds layer i."""
    n = get_family(cfg.family).weights
    d, v = cfg.hidden_size, cfg.vocab_size
    yield 0, "model.embed_tokens.weight", (v, d), 0.5
    yield 0, "model.norm.weight", (d,), 0.0
    if not cfg.tie_word_embeddings:
        yield 0, "lm_head.weight", (v, d), 0.05
    for i in range(cfg.num_layers):
        k = i + 1
        yield k, f"{n.layer(i)}.input_layernorm.weight", (d,), 0.0
        yield k, f"{n.layer(i)}.post_attention_layernorm.weight", (d,), 0.0
        if cfg.mla is not None:
            yield from _mla_specs(cfg, n, i, k)
        else:
            yield from _attention_specs(cfg, n, i, k)
        if not cfg.moe_layers[i]:
            inter = cfg.dense_intermediate_size
            for which, shape in (("gate", (inter, d)), ("up", (inter, d)), ("down", (d, inter))):
                yield k, n.dense_mlp(i, which), shape, 0.05
            continue
        yield k, n.router(i), (cfg.num_experts, d), 0.05
        if cfg.expert_bias:
            yield k, n.router(i).removesuffix("weight") + "bias", (cfg.num_experts,), 0.05
        if cfg.shared_expert_intermediate_size:
            si = cfg.shared_expert_intermediate_size
            for which, shape in (("gate", (si, d)), ("up", (si, d)), ("down", (d, si))):
                yield k, n.shared_expert(i, which), shape, 0.05
            if cfg.shared_expert_gated:
                yield k, n.shared_expert_gate(i), (1, d), 0.05
        inter = cfg.moe_intermediate_size
        if n.fused_layout == "gpt_oss":
            yield from _gpt_oss_expert_specs(cfg, n, i, k)
            continue
        if cfg.expert_format == "q8_0":  # stacked codes and scales (`wisp.models.expert_banks`); std: the weights'
            codes, scales = Q8_0_KEYS
            for part, (rows, cols) in (("gate_up", (2 * inter, d)), ("down", (d, inter))):
                yield k, n.fused_experts(i, part) + codes, (cfg.num_experts, rows, cols), 0.05
                yield k, n.fused_experts(i, part) + scales, (cfg.num_experts, rows, cols // 32), 0.05
            continue
        if cfg.expert_format == "gguf_blocks":  # each role in its GGUF type: stacked codes and scales (or heads)
            parts = (("gate_up", 2 * inter, d), ("down", d, inter))
            for (part, rows, cols), qtype in zip(parts, cfg.expert_block_formats[i]):
                for suffix, (shape, _) in zip(BLOCK_KEYS, packed_role(qtype, rows, cols)):
                    yield k, n.fused_experts(i, part) + suffix, (cfg.num_experts, *shape), 0.05
            continue
        for e in range(cfg.num_experts):
            for which, shape in (("gate", (inter, d)), ("up", (inter, d)), ("down", (d, inter))):
                yield k, n.expert(i, e, which), shape, 0.05


def _attention_specs(cfg: ModelConfig, n, i: int, k: int):
    """Multi-head (grouped-query) attention's tensors."""
    d, hd, h, hkv = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    for proj, rows in (("q", h * hd), ("k", hkv * hd), ("v", hkv * hd)):
        yield k, n.attn(i, f"{proj}_proj.weight"), (rows, d), 0.05
        if cfg.attention_bias:
            yield k, n.attn(i, f"{proj}_proj.bias"), (rows,), 0.05
    yield k, n.attn(i, "o_proj.weight"), (d, h * hd), 0.05
    if cfg.expert_bias:  # GPT-OSS: o_proj and router biases too
        yield k, n.attn(i, "o_proj.bias"), (d,), 0.05
    if cfg.attention_sinks:
        yield k, n.attn(i, "sinks"), (h,), 0.3
    norm = {"per_head": (hd, hd), "full": (h * hd, hkv * hd)}.get(cfg.qk_norm)
    if norm:
        yield k, n.attn(i, "q_norm.weight"), (norm[0],), 0.0
        yield k, n.attn(i, "k_norm.weight"), (norm[1],), 0.0


def _mla_specs(cfg: ModelConfig, n, i: int, k: int):
    """DeepSeek-V2's latent attention tensors (`wisp.models.mla`), in the hub's names."""
    m, d, h = cfg.mla, cfg.hidden_size, cfg.num_heads
    q_out = h * (m.nope_dim + m.rope_dim)
    if m.q_lora_rank is None:
        yield k, n.attn(i, "q_proj.weight"), (q_out, d), 0.05
    else:
        yield k, n.attn(i, "q_a_proj.weight"), (m.q_lora_rank, d), 0.05
        yield k, n.attn(i, "q_a_layernorm.weight"), (m.q_lora_rank,), 0.0
        yield k, n.attn(i, "q_b_proj.weight"), (q_out, m.q_lora_rank), 0.05
    yield k, n.attn(i, "kv_a_proj_with_mqa.weight"), (m.cache_dim, d), 0.05
    yield k, n.attn(i, "kv_a_layernorm.weight"), (m.kv_lora_rank,), 0.0
    yield k, n.attn(i, "kv_b_proj.weight"), (h * (m.nope_dim + m.v_dim), m.kv_lora_rank), 0.05
    yield k, n.attn(i, "o_proj.weight"), (d, h * m.v_dim), 0.05


def _gpt_oss_expert_specs(cfg: ModelConfig, n, i: int, k: int):
    """GPT-OSS's fused expert tensors (`wisp.models.expert_banks`); MXFP4 ones as blocks and scales, whose
    std is unused (`RandomWeights` draws their bytes)."""
    ne, inter, d = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    gate_up, down = n.fused_experts(i, "gate_up"), n.fused_experts(i, "down")
    if cfg.mxfp4_experts:
        for name, (rows, cols) in ((gate_up, (2 * inter, d)), (down, (d, inter))):
            yield k, name + "_blocks", (ne, rows, cols // 32, 16), 1.0
            yield k, name + "_scales", (ne, rows, cols // 32), 1.0
    else:
        yield k, gate_up, (ne, d, 2 * inter), 0.05
        yield k, down, (ne, inter, d), 0.05
    yield k, gate_up + "_bias", (ne, 2 * inter), 0.05
    yield k, down + "_bias", (ne, d), 0.05


def random_mxfp4(name: str, shape: tuple[int, ...], seed: int, device) -> torch.Tensor:
    """Random MXFP4 bytes for a `*_blocks` (any code) or `*_scales` tensor (2^-7 .. 2^-4: weights of magnitude
    up to 6 x 2^-4, about the spread of a trained expert's), depending only on (name, shape, seed)."""
    gen = torch.Generator(device=device).manual_seed(_name_key(seed, name))
    low, high = (0, 256) if name.endswith("_blocks") else (120, 124)
    return torch.randint(low, high, shape, generator=gen, device=device, dtype=torch.uint8)


def random_k_quant_heads(shape: tuple[int, ...], std: float, gen: torch.Generator, device) -> torch.Tensor:
    """Random heads [..., H] of a k-quant (`wisp.core.kernels.k_quants`: H 16 for Q4_K / Q5_K, 18 for Q6_K): every
    6-bit (Q6_K: int8) scale random, the float16 d (and dmin) positive and sized so that weights spread about `std`
    (a mean scale of 32 times a mean code of 8; Q6_K: 64 times 16)."""
    heads = torch.randint(0, 256, shape, generator=gen, device=device, dtype=torch.uint8)
    d = torch.full(shape[:-1], std / (64 * 16 if shape[-1] == 18 else 32 * 8), dtype=torch.float16, device=device)
    fields = ((16, 18),) if shape[-1] == 18 else ((0, 2), (2, 4))  # Q6_K: d; Q4_K / Q5_K: d, dmin
    for lo, hi in fields:
        heads[..., lo:hi] = d.unsqueeze(-1).view(torch.uint8)
    return heads


def _name_key(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=7).digest(), "little")


def random_tensor(name: str, shape: tuple[int, ...], std: float, seed: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A tensor that depends only on (name, shape, std, seed): any subset can be made in any order."""
    if std == 0.0:
        return torch.ones(shape, dtype=dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(_name_key(seed, name))
    return (torch.randn(shape, generator=gen, device=device) * std).to(dtype)


class RandomWeights:
    """The checkpoint-reader interface (`in`, `get`, `close`) over random tensors made on `device`:
    `--load-format dummy`, real shapes with no file on disk. For an FP8 config the linear weights
    (`fp8_quantized`) come as float8 with their `weight_scale_inv`, as in a real FP8 checkpoint; for an MXFP4
    one (GPT-OSS) the experts come as random blocks and scales (`random_mxfp4`); for a Q8_0 one (a GGUF file's)
    as random int8 codes with one scale."""

    def __init__(self, cfg: ModelConfig, seed: int = 0, device: str | torch.device = "cpu"):
        self.specs = {name: (shape, std) for _, name, shape, std in tensor_specs(cfg)}
        self.quantized = {name for name in self.specs if cfg.fp8_block and fp8_quantized(name)}
        self.scale_of = {scale_key(name): name for name in self.quantized}  # scales' key -> their weight's
        self.cfg, self.seed, self.device = cfg, seed, torch.device(device)
        self._last: tuple[str, tuple[torch.Tensor, torch.Tensor]] | None = None  # a weight, then its scales

    def __contains__(self, key: str) -> bool:
        return key in self.specs or key in self.scale_of

    def get(self, key: str, allow_fp8: bool = False, allow_mxfp4: bool = False) -> torch.Tensor:
        if key in self.scale_of:
            return self._quantized(self.scale_of[key])[1]
        if key in self.quantized:
            return self._quantized(key)[0]
        shape, std = self.specs[key]
        if self.cfg.mxfp4_experts and key.endswith(("_blocks", "_scales")):
            return random_mxfp4(key, shape, self.seed, self.device)
        if key.endswith(Q8_0_KEYS[0]):  # random int8 codes; scales: the weights' std over 127 codes, as float16
            gen = torch.Generator(device=self.device).manual_seed(_name_key(self.seed, key))
            return torch.randint(-127, 128, shape, generator=gen, device=self.device, dtype=torch.int8)
        if key.endswith(Q8_0_KEYS[1]) or (key.endswith(BLOCK_KEYS[1]) and len(shape) == 3):  # Q8_0's scales
            return torch.full(shape, std * 3 ** 0.5 / 127, dtype=torch.float16, device=self.device)
        if key.endswith(BLOCK_KEYS):  # a role's GGUF blocks: Q8_0's codes [N, rows, K], a k-quant's [N, rows, G, C]
            gen = torch.Generator(device=self.device).manual_seed(_name_key(self.seed, key))
            if key.endswith(BLOCK_KEYS[1]):
                return random_k_quant_heads(shape, std, gen, self.device)
            if len(shape) == 3:
                return torch.randint(-127, 128, shape, generator=gen, device=self.device, dtype=torch.int8)
            return torch.randint(0, 256, shape, generator=gen, device=self.device, dtype=torch.uint8)
        return random_tensor(key, shape, std, self.seed, self.cfg.dtype, self.device)

    def _quantized(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self._last is None or self._last[0] != name:
            shape, std = self.specs[name]
            self._last = name, quantize_blocks(random_tensor(name, shape, std, self.seed, torch.float32, self.device),
                                               self.cfg.fp8_block)
        return self._last[1]

    def block_weight(self, key: str) -> None:
        """No dense projection here is in a GGUF block format (`wisp.models.gguf_reader.GGUFCheckpoint.block_weight`)."""
        return None

    def close(self) -> None:
        pass


def fp8_quantized(name: str) -> bool:
    """Whether an FP8 checkpoint stores this tensor in FP8: the projections (attention, dense, shared and
    routed experts), not embeddings, norms, the router or the LM head (as Qwen3-*-FP8 does)."""
    return name.endswith("_proj.weight")


def write_random_checkpoint(raw_config: dict[str, Any], path: str | Path, seed: int = 0, device: str = "cpu") -> Path:
    """Write a random checkpoint for `raw_config` (an HF config dict) into `path`, one shard per layer plus
    one for the head, with the hub's per-expert tensor names; the same tensors `RandomWeights` makes (FP8
    weights and their scales where the config has an fp8 quantization_config)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model_config(raw_config)
    n_shards = cfg.num_layers + 1
    weight_map: dict[str, str] = {}
    reader = RandomWeights(cfg, seed, device)
    for k, specs in itertools.groupby(tensor_specs(cfg), key=lambda spec: spec[0]):  # one shard in memory at a time
        names = [key for _, name, _, _ in specs for key in (name, scale_key(name)) if key in reader]  # FP8: scales next
        tensors = {name: reader.get(name).cpu().contiguous() for name in names}
        shard = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file(tensors, str(path / shard), metadata={"format": "pt"})
        weight_map.update({key: shard for key in tensors})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (path / "config.json").write_text(json.dumps(raw_config, indent=1))
    return path
