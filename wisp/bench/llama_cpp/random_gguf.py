"""`wisp bench llama-cpp gguf`: a random-weight GGUF in a wisp preset's real shapes, for the llama.cpp peer
(benchmarks/recipes/gpu_llama_cpp.sh).

    wisp bench llama-cpp gguf --model olmoe-1b-7b --out /tmp/olmoe.gguf [--type bf16|q8_0]

The architecture's metadata and tensor names are llama.cpp's (through the `gguf` package's constants), the
weights random with a standard deviation of 0.02 (bf16 normal; Q8_0 uniform codes under one scale; the router's
too: llama.cpp's CPU path costs the same whatever the routing),
the norms ones, and the vocabulary a placeholder of the preset's size (`<t0>`, `<t1>`, ...: llama-bench feeds
token ids, never text). Tensors are written one at a time, so the host never holds the model. Supported:
the OLMoE and Qwen3-MoE presets (llama.cpp's `olmoe` and `qwen3moe`), and GPT-OSS (`gpt-oss`: its experts in
MXFP4 whatever `--type` says, as its checkpoints ship and llama.cpp runs them natively, random codes and scales as
`--load-format dummy` makes them; the rest, biases and sinks included, as `--type` says).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import torch

from wisp.config import ModelConfig
from wisp.errors import WispError
from wisp.models.config_parsers import model_config
from wisp.models.presets import preset

ARCHES = {"olmoe": gguf.MODEL_ARCH.OLMOE, "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE, "gpt_oss": gguf.MODEL_ARCH.GPT_OSS}
MXFP4 = gguf.GGMLQuantizationType.MXFP4
EXPERT_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
TYPES = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}


def tensor_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, numpy shape: outermost first) of every tensor, in llama.cpp's layout for the family."""
    d, v, h, hkv, hd = cfg.hidden_size, cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    n, inter = cfg.num_experts, cfg.moe_intermediate_size
    shapes = [("token_embd.weight", (v, d)), ("output_norm.weight", (d,)), ("output.weight", (v, d))]
    q_norm, k_norm = {"full": (h * hd, hkv * hd), "per_head": (hd, hd)}.get(cfg.qk_norm, (0, 0))
    for i in range(cfg.num_layers):
        b = f"blk.{i}"
        post_norm = "post_attention_norm" if cfg.family == "gpt_oss" else "ffn_norm"
        shapes += [(f"{b}.attn_norm.weight", (d,)), (f"{b}.attn_q.weight", (h * hd, d)),
                   (f"{b}.attn_k.weight", (hkv * hd, d)), (f"{b}.attn_v.weight", (hkv * hd, d)),
                   (f"{b}.attn_output.weight", (d, h * hd)), (f"{b}.{post_norm}.weight", (d,)),
                   (f"{b}.ffn_gate_inp.weight", (n, d)), (f"{b}.ffn_gate_exps.weight", (n, inter, d)),
                   (f"{b}.ffn_up_exps.weight", (n, inter, d)), (f"{b}.ffn_down_exps.weight", (n, d, inter))]
        if q_norm:
            shapes += [(f"{b}.attn_q_norm.weight", (q_norm,)), (f"{b}.attn_k_norm.weight", (k_norm,))]
        if cfg.attention_bias or cfg.expert_bias:
            shapes += [(f"{b}.attn_q.bias", (h * hd,)), (f"{b}.attn_k.bias", (hkv * hd,)),
                       (f"{b}.attn_v.bias", (hkv * hd,))]
        if cfg.expert_bias:
            shapes += [(f"{b}.attn_output.bias", (d,)), (f"{b}.ffn_gate_inp.bias", (n,)),
                       (f"{b}.ffn_gate_exps.bias", (n, inter)), (f"{b}.ffn_up_exps.bias", (n, inter)),
                       (f"{b}.ffn_down_exps.bias", (n, d))]
        if cfg.attention_sinks:
            shapes.append((f"{b}.attn_sinks.weight", (h,)))
    return shapes


def tensor_type(cfg: ModelConfig, name: str, shape: tuple[int, ...], kind: str) -> gguf.GGMLQuantizationType:
    """A tensor's GGUF type: vectors and biases float32, MXFP4 experts in MXFP4, the rest `kind`."""
    if len(shape) == 1 or name.endswith(".bias"):
        return gguf.GGMLQuantizationType.F32
    if cfg.mxfp4_experts and name.endswith(EXPERT_TENSORS):
        return MXFP4
    return TYPES[kind]


def _metadata(writer: gguf.GGUFWriter, cfg: ModelConfig, file_type: int) -> None:
    writer.add_name(f"random {cfg.family}")
    writer.add_file_type(file_type)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.dense_intermediate_size)
    writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    writer.add_block_count(cfg.num_layers)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope.theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_expert_count(cfg.num_experts)
    writer.add_expert_used_count(cfg.top_k)
    if cfg.sliding_window:
        writer.add_sliding_window(cfg.sliding_window)
    if cfg.rope.kind == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(cfg.rope.factor)
        writer.add_rope_scaling_orig_ctx_len(cfg.rope.original_max_position_embeddings)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"<t{i}>" for i in range(cfg.vocab_size)])
    writer.add_token_scores([0.0] * cfg.vocab_size)
    types = [gguf.TokenType.NORMAL] * cfg.vocab_size
    types[0], types[1], types[2] = gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


Q8_0_STD_SCALE = 0.02 / (127 * 128 / 3) ** 0.5  # uniform codes in -127..127 have a standard deviation of 73.3


def _random(name: str, shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType, seed: int) -> np.ndarray:
    """The tensor as GGUF data: norms ones, biases and sinks zeros; bf16 normal * 0.02 (raw uint16); Q8_0 random
    blocks: uniform codes in -127..127 under one float16 scale, a standard deviation of 0.02 (written as numpy
    makes random bytes, about 30x faster than drawing normals and quantizing them, which took 8.5 minutes of a
    10-minute device call for Qwen3-30B-A3B); MXFP4 random blocks: an e8m0 scale of 2^-7 .. 2^-4 and 16 bytes of
    random e2m1 codes (weights up to 6 x 2^-4, as `--load-format dummy` makes them)."""
    gen = torch.Generator().manual_seed(seed)
    if qtype == MXFP4:
        blocks = int(np.prod(shape)) // 32
        scales = torch.randint(120, 124, (blocks, 1), generator=gen, dtype=torch.uint8)
        codes = torch.randint(0, 256, (blocks, 16), generator=gen, dtype=torch.uint8)
        return torch.cat([scales, codes], dim=1).reshape(*shape[:-1], shape[-1] // 32 * 17).numpy()
    if len(shape) == 1 or name.endswith(".bias"):  # vectors stay float32, as converters write them
        return (torch.ones(shape) if name.endswith("norm.weight") else torch.zeros(shape)).numpy()
    if qtype == gguf.GGMLQuantizationType.Q8_0:
        blocks = np.empty((int(np.prod(shape)) // 32, 34), dtype=np.uint8)
        blocks[:, :2] = np.array([Q8_0_STD_SCALE], dtype=np.float16).view(np.uint8)
        blocks[:, 2:] = np.random.default_rng(seed).integers(-127, 128, (len(blocks), 32), dtype=np.int8).view(np.uint8)
        return blocks.reshape(*shape[:-1], shape[-1] // 32 * 34)
    x = torch.randn(shape, generator=gen) * 0.02
    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def check_room(out: Path, tensor_bytes: int) -> None:
    """One clear error, before anything is written, where `out`'s file system cannot hold the tensors (gpt-oss-120b's
    file is about 65 GB)."""
    free = shutil.disk_usage(out.parent).free
    if tensor_bytes > free:
        raise WispError(f"the GGUF needs {tensor_bytes / 1e9:.1f} GB and {out.parent} has {free / 1e9:.1f} GB free: "
                        "write it elsewhere (--out)")


def write_gguf(model: str, out: Path, kind: str = "bf16", seed: int = 0) -> Path:
    cfg = model_config(json.loads(Path(model).read_text()) if Path(model).is_file() else preset(model))
    if cfg.family not in ARCHES:
        raise WispError(f"no GGUF layout for {cfg.family}; supported: {', '.join(ARCHES)}")
    shapes = [(name, shape, tensor_type(cfg, name, shape, kind)) for name, shape in tensor_shapes(cfg)]
    byte_shapes = [gguf.quant_shape_to_byte_shape(shape, qtype) for _, shape, qtype in shapes]
    check_room(out, sum(int(np.prod(nbytes)) for nbytes in byte_shapes))
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[ARCHES[cfg.family]])
    file_type = gguf.LlamaFileType.MOSTLY_MXFP4_MOE if cfg.mxfp4_experts else {
        "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[kind]
    _metadata(writer, cfg, file_type)
    for (name, _, qtype), nbytes in zip(shapes, byte_shapes):  # the header first: each tensor's name, type, size
        writer.add_tensor_info(name, nbytes, np.dtype(np.uint8), int(np.prod(nbytes)), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, (name, shape, qtype) in enumerate(shapes):  # then the data, one tensor in memory at a time
        writer.write_tensor_data(_random(name, shape, qtype, seed + i).view(np.uint8))
    writer.close()
    return out


def bench_gguf(args) -> None:
    """`wisp bench llama-cpp gguf`: write the GGUF and print its path."""
    print(write_gguf(args.model, Path(args.out), args.type, args.seed))
