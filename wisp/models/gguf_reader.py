"""A GGUF checkpoint seen as the loader's checkpoint reader: `in`, `get(hf_name)` and `close`, by the tensor names
a Hugging Face checkpoint of the same model uses, so `wisp.models.loader.load_model` builds the model from either.

`hf_to_gguf(cfg)` is the one table of names: llama.cpp's per-layer names (`blk.{i}.attn_q.weight`, ...) for the
family's Hugging Face names, and each layer's experts as the stacks the loader reads (`...experts.gate_up_proj`
[N, 2I, D] = llama.cpp's ffn_gate_exps and ffn_up_exps, `...experts.down_proj` [N, D, I] = ffn_down_exps). GPT-OSS's
names are its checkpoints' layout (`wisp.models.weight_names`, fused_layout "gpt_oss"): gate_up [N, D, 2I] with gate
and up interleaved (column 2j gate j, 2j + 1 up j), its bias [N, 2I] alike, down [N, I, D].
Tensors come dequantized (`wisp.models.gguf_file.GGUFFile.tensor`; the loader casts them to the model's dtype), but
GPT-OSS's MXFP4 experts, served packed under the hub's `_blocks` / `_scales` names (`mxfp4_blocks_and_scales`).
Put back where llama.cpp's converter changed them: the `llama` architecture's (Mixtral's) q and k rows, stored with
each head's rotary halves interleaved for its rotation of adjacent pairs (`rotary_halves`); DeepSeek-V2's kv_b, which
newer files split into k_b [H, r, nope] and v_b [H, v, r]; a shared-expert gate written 1-D.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from wisp.config import ModelConfig
from wisp.core.kernels.gguf_blocks import BLOCKS as GGUF_BLOCK_EXPERTS
from wisp.core.kernels.k_quants import split_blocks as split_k_quant
from wisp.core.kernels.q8_0 import split_blocks
from wisp.core.kernels.quantized_weights import BlockWeight
from wisp.errors import WispError
from wisp.models.expert_banks import BLOCK_KEYS, Q8_0_KEYS
from wisp.models.families import get_family
from wisp.models.gguf_file import GGUFFile

log = logging.getLogger(__name__)


LATENT_NAMES = (("kv_a_proj_with_mqa", "attn_kv_a_mqa"), ("kv_a_layernorm", "attn_kv_a_norm"), ("kv_b_proj", "attn_kv_b"),
                ("q_a_proj", "attn_q_a"), ("q_a_layernorm", "attn_q_a_norm"), ("q_b_proj", "attn_q_b"))


MXFP4_KEYS = ("_blocks", "_scales")  # (the hub's MXFP4 names)


def hf_to_gguf(cfg: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Hugging Face tensor name -> the GGUF tensors it is made of (two for a stacked gate/up, else one), for every
    tensor a checkpoint of `cfg` may hold (the optional ones included: callers test what the file has)."""
    n = get_family(cfg.family).weights
    names: dict[str, tuple[str, ...]] = {"model.embed_tokens.weight": ("token_embd.weight",),
                                         "model.norm.weight": ("output_norm.weight",), "lm_head.weight": ("output.weight",)}
    gpt_oss = n.fused_layout == "gpt_oss"
    for i in range(cfg.num_layers):
        b, layer = f"blk.{i}", n.layer(i)
        names[f"{layer}.input_layernorm.weight"] = (f"{b}.attn_norm.weight",)
        names[f"{layer}.post_attention_layernorm.weight"] = (f"{b}.{'post_attention' if gpt_oss else 'ffn'}_norm.weight",)
        names[n.attn(i, "sinks")] = (f"{b}.attn_sinks.weight",)
        names[n.router(i).removesuffix("weight") + "bias"] = (f"{b}.ffn_gate_inp.bias",)
        for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            names[n.attn(i, f"{hf}.weight")] = (f"{b}.{gg}.weight",)
            names[n.attn(i, f"{hf}.bias")] = (f"{b}.{gg}.bias",)
        names[n.attn(i, "q_norm.weight")] = (f"{b}.attn_q_norm.weight",)
        for hf, gg in LATENT_NAMES:  # DeepSeek-V2's latent attention
            names[n.attn(i, f"{hf}.weight")] = (f"{b}.{gg}.weight",)
        names[n.attn(i, "k_norm.weight")] = (f"{b}.attn_k_norm.weight",)
        names[n.router(i)] = (f"{b}.ffn_gate_inp.weight",)
        names[n.fused_experts(i, "gate_up")] = (f"{b}.ffn_gate_exps.weight", f"{b}.ffn_up_exps.weight")
        names[n.fused_experts(i, "down")] = (f"{b}.ffn_down_exps.weight",)
        names[n.fused_experts(i, "gate_up") + "_bias"] = (f"{b}.ffn_gate_exps.bias", f"{b}.ffn_up_exps.bias")
        if cfg.mxfp4_experts:  # the hub's MXFP4 names: blocks and scales, gate and up rows interleaved
            for part in ("gate_up", "down"):
                for suffix in MXFP4_KEYS:
                    names[n.fused_experts(i, part) + suffix] = names[n.fused_experts(i, part)]
            del names[n.fused_experts(i, "gate_up")], names[n.fused_experts(i, "down")]
        if cfg.expert_format in ("q8_0", "gguf_blocks"):  # kept packed: codes and scales, split from the file's blocks
            for part in ("gate_up", "down"):
                for suffix in Q8_0_KEYS if cfg.expert_format == "q8_0" else BLOCK_KEYS:
                    names[n.fused_experts(i, part) + suffix] = names[n.fused_experts(i, part)]
        names[n.fused_experts(i, "down") + "_bias"] = (f"{b}.ffn_down_exps.bias",)
        for which in ("gate", "up", "down"):
            names[n.shared_expert(i, which)] = (f"{b}.ffn_{which}_shexp.weight",)
            names[n.dense_mlp(i, which)] = (f"{b}.ffn_{which}.weight",)
        names[n.shared_expert_gate(i)] = (f"{b}.ffn_gate_inp_shexp.weight",)
    return names


ROTARY_PAIRS_INTERLEAVED = {"llama"}  # GGUF architectures whose q / k rows llama.cpp's converter permuted


def rotary_halves(w: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k [heads * hd, D] with each head's rows in llama.cpp's order (pairs: 0, hd/2, 1, hd/2 + 1, ...) back in
    the Hugging Face order (0 .. hd/2 - 1, then hd/2 .. hd - 1)."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def split_gguf_blocks(packed: torch.Tensor, qtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Experts in one of the GGUF block formats kept packed (`ModelConfig.expert_block_formats`), uint8 [..., bytes a
    row], as the bank holds them: Q8_0's codes and scales (`wisp.core.kernels.q8_0`), a k-quant's codes and heads
    (`wisp.core.kernels.k_quants`)."""
    return split_blocks(packed) if qtype == "Q8_0" else split_k_quant(packed, qtype)


def mxfp4_blocks_and_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's MXFP4 blocks, uint8 [..., G * 17] (a scale byte, then 16 bytes: element j in the low nibble of
    byte j and element j + 16 in its high nibble), as the hub's layout: blocks [..., G, 16] (elements 2k and 2k + 1
    in byte k's low and high nibbles) and scales [..., G]; the e8m0 scale bytes are the same."""
    groups = packed.reshape(*packed.shape[:-1], -1, 17)  # [..., G, 17]
    qs = groups[..., 1:]
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)  # [..., G, 32]: element order
    return codes[..., 0::2] | (codes[..., 1::2] << 4), groups[..., 0].contiguous()


class GGUFCheckpoint:
    """The loader's reader over a GGUF file (see the module docstring); `cfg` is the file's own config."""

    def __init__(self, path: str | Path, cfg: ModelConfig):
        self.file = GGUFFile(path)
        self.cfg = cfg
        self.names = {hf: parts for hf, parts in hf_to_gguf(cfg).items() if all(p in self.file for p in parts)}
        if "blk.0.ffn_gate.0.weight" in self.file:  # llama.cpp's layout before April 2024: one tensor per expert
            raise WispError(f"{self.file.parts[0].name} keeps one tensor per expert (blk.N.ffn_gate.E.weight, llama.cpp's "
                            "layout before April 2024); wisp reads the stacked layout (blk.N.ffn_gate_exps.weight): "
                            "convert the model again with a current llama.cpp")
        self.shared_gates = {get_family(cfg.family).weights.shared_expert_gate(i) for i in range(cfg.num_layers)}
        if cfg.mla is not None:  # files since 2025 split kv_b into k_b [H, r, nope] and v_b [H, v, r]
            n = get_family(cfg.family).weights
            for i in range(cfg.num_layers):
                parts = (f"blk.{i}.attn_k_b.weight", f"blk.{i}.attn_v_b.weight")
                if n.attn(i, "kv_b_proj.weight") not in self.names and all(p in self.file for p in parts):
                    self.names[n.attn(i, "kv_b_proj.weight")] = parts
        self.gpt_oss = get_family(cfg.family).weights.fused_layout == "gpt_oss"
        packed = {self.file.tensor_type(f"blk.{i}.ffn_down_exps.weight") for i in range(cfg.num_layers)} - {None}
        kept = {"mxfp4": {"MXFP4"}, "q8_0": {"Q8_0"}, "gguf_blocks": set(GGUF_BLOCK_EXPERTS)}.get(cfg.expert_format, set())
        unpacked = sorted(packed - {"F32", "F16", "BF16"} - kept)
        if unpacked:
            log.warning("%s: its %s experts are dequantized to %s at load (%.2f GB in all): wisp does not keep them "
                        "packed yet", self.file.parts[0].name, "/".join(unpacked), str(cfg.dtype).removeprefix("torch."),
                        cfg.slot_bytes * cfg.num_experts / 1e9)
        self._split: dict[str, torch.Tensor] = {}  # packed experts' halves split and not yet handed out
        self.heads_of: dict[str, int] = {}  # q / k weights to put back in rotary-halves order: their head count
        if self.file.arch in ROTARY_PAIRS_INTERLEAVED:
            n = get_family(cfg.family).weights
            for i in range(cfg.num_layers):
                self.heads_of[n.attn(i, "q_proj.weight")] = cfg.num_heads
                self.heads_of[n.attn(i, "k_proj.weight")] = cfg.num_kv_heads

    def __contains__(self, key: str) -> bool:
        return key in self.names

    def get(self, key: str, allow_fp8: bool = False, allow_mxfp4: bool = False) -> torch.Tensor:
        if key not in self.names:
            raise WispError(f"the GGUF checkpoint {self.file.parts[0]} has no tensor for {key}")
        if key.endswith(Q8_0_KEYS):  # Q8_0 experts, kept packed: [N, rows, K] / [N, rows, K/32], gate then up
            return self._packed_experts(key, Q8_0_KEYS, split_gguf_blocks, lambda xs: torch.cat(xs, dim=1))
        if key.endswith(BLOCK_KEYS):  # a layer's experts in GGUF block formats, kept packed, each as its type splits
            return self._packed_experts(key, BLOCK_KEYS, split_gguf_blocks, lambda xs: torch.cat(xs, dim=1))
        if key.endswith(MXFP4_KEYS):  # MXFP4 experts, kept packed: [N, rows, G, 16] / [N, rows, G]
            odd = [p for p in self.names[key] if self.file.tensor_type(p) != "MXFP4"]
            if odd:
                raise WispError(f"{odd[0]} is {self.file.tensor_type(odd[0])}, but the file's first experts are MXFP4: "
                                "wisp reads MXFP4 experts only when every layer's are")
            return self._packed_experts(key, MXFP4_KEYS, lambda b, _: mxfp4_blocks_and_scales(b),
                                        lambda xs: torch.stack(xs, dim=2).flatten(1, 2))  # gate and up rows interleaved
        parts = [self.file.tensor(p) for p in self.names[key]]  # dequantized; the loader casts to the model's dtype
        if key.endswith("kv_b_proj.weight") and len(parts) == 2:  # [H * (nope + v), r], per head k's rows then v's
            k_b, v_b = parts
            return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, k_b.shape[1])
        if key in self.shared_gates:  # [1, D]; converters that squeezed it wrote [D]
            return parts[0].reshape(1, -1)
        if key in self.heads_of:
            return rotary_halves(parts[0], self.heads_of[key])
        if self.gpt_oss and key.endswith(("gate_up_proj", "gate_up_proj_bias")):  # gate and up interleaved
            pairs = torch.stack(parts, dim=2)  # [N, I, 2(, D)]
            interleaved = pairs.reshape(pairs.shape[0], -1, *pairs.shape[3:])  # [N, 2I(, D)]
            return interleaved.transpose(1, 2) if interleaved.dim() == 3 else interleaved  # [N, D, 2I] / [N, 2I]
        if self.gpt_oss and key.endswith("down_proj"):
            return parts[0].transpose(1, 2)  # [N, I, D]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # stacked gate then up: [N, 2I, D]

    def block_weight(self, key: str) -> BlockWeight | None:
        """The dense projection `key` as the file stores it, where that is one tensor in a GGUF block format (Q8_0, a
        k-quant): a `BlockWeight` (its rows put back in rotary-halves order where the converter permuted them);
        else None (the caller dequantizes it with `get`)."""
        parts = self.names.get(key, ())
        qtype = self.file.tensor_type(parts[0]) if len(parts) == 1 else None
        if qtype not in GGUF_BLOCK_EXPERTS:
            return None
        weight, scale = split_gguf_blocks(self.file.packed(parts[0]), qtype)  # [out, ...] each
        if key in self.heads_of:  # the rows' order, applied to whole rows of codes and scales
            order = rotary_halves(torch.arange(weight.shape[0])[:, None], self.heads_of[key])[:, 0]
            weight, scale = weight[order].contiguous(), scale[order].contiguous()
        return BlockWeight(weight, scale)

    def _packed_experts(self, key: str, suffixes: tuple[str, str], split, join) -> torch.Tensor:
        """The packed experts' weights or scales behind `key` (a stem and one of `suffixes`: weights', scales'):
        each GGUF tensor's blocks are read and `split(blocks, its GGML type)` once for both keys (`join` puts gate's and up's together),
        and each half is handed out once, so no layer's experts are held past their filling."""
        if key not in self._split:
            stem = key.removesuffix(suffixes[0]).removesuffix(suffixes[1])
            parts = [split(self.file.packed(p), self.file.tensor_type(p)) for p in self.names[key]]  # [(weights, scales)]
            for suffix, pieces in zip(suffixes, zip(*parts)):
                self._split[stem + suffix] = pieces[0] if len(pieces) == 1 else join(list(pieces))
        return self._split.pop(key)

    def close(self) -> None:
        self.file = None
        self._split.clear()
