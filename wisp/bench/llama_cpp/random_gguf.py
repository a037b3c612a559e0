"""`wisp bench llama-cpp gguf`: a random-weight GGUF in a wisp preset's real shapes, for the llama.cpp peer
(benchmarks/recipes/gpu_llama_cpp.sh).

    wisp bench llama-cpp gguf --model olmoe-1b-7b --out /tmp/olmoe.gguf [--type bf16|q8_0]

The architecture's metadata and tensor names are llama.cpp's (through the `gguf` package's constants), the
weights random with a standard deviation of 0.02 (bf16 normal; Q8_0 uniform codes under one scale; the router's
too: llama.cpp's CPU path costs the same whatever the routing),
the norms ones, and the vocabulary a placeholder of the preset's size (`<t0>`, `<t1>`, ...: llama-bench feeds
token ids, never text). Tensors are written one at a time, so the host never holds the model; the big ones (every
Q8_0 and MXFP4 tensor, bf16 ones over 64M elements) tile a pool of random blocks drawn once a process, each from
an offset its seed sets (`_random`: generation 5x faster for gpt-oss-20b, MXFP4 20x), the same file for a seed.
Supported: the OLMoE and Qwen3-MoE presets (llama.cpp's `olmoe` and `qwen3moe`), and GPT-OSS (`gpt-oss`: its experts in
MXFP4 whatever `--type` says, as its checkpoints ship and llama.cpp runs them natively, random codes and scales as
`--load-format dummy` makes them; the rest, biases and sinks included, as `--type` says).
"""

from __future__ import annotations

import functools
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
POOL_ROWS = {gguf.GGMLQuantizationType.Q8_0: 1 << 21, MXFP4: 1 << 22,  # 34- and 17-byte blocks: 68 MiB each
             gguf.GGMLQuantizationType.BF16: 1 << 26}  # elements: 128 MiB; bf16 tensors larger than this tile it
POOL_SEED = 0x5EED
OFFSET_STEP = 0x9E3779B97F4A7C15  # odd: seed -> seed * step mod a power of two is one-to-one


@functools.cache
def _pool(qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """The process's pool of random rows for `qtype`, drawn once from POOL_SEED (the same in every process):
    POOL_ROWS[qtype] rows of Q8_0 blocks (uint8 x 34: the float16 Q8_0_STD_SCALE, then 32 int8 codes uniform in
    -127..127), MXFP4 blocks (uint8 x 17: an e8m0 scale byte uniform in 120..123, i.e. 2^-7 .. 2^-4, then 16 random
    bytes of e2m1 codes) or bf16 elements (uint16: normal x 0.02)."""
    rows, rng = POOL_ROWS[qtype], np.random.default_rng(POOL_SEED)
    if qtype == gguf.GGMLQuantizationType.BF16:
        x = torch.randn(rows, generator=torch.Generator().manual_seed(POOL_SEED)) * 0.02
        return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    if qtype == MXFP4:
        pool = np.empty((rows, 17), dtype=np.uint8)
        pool[:, 0] = rng.integers(120, 124, rows, dtype=np.uint8)
        pool[:, 1:] = rng.integers(0, 256, (rows, 16), dtype=np.uint8)
        return pool
    pool = np.empty((rows, 34), dtype=np.uint8)
    pool[:, :2] = np.array([Q8_0_STD_SCALE], dtype=np.float16).view(np.uint8)
    pool[:, 2:] = rng.integers(-127, 128, (rows, 32), dtype=np.int8).view(np.uint8)
    return pool


def _tiled(shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType) -> bool:
    """Whether `_random` tiles the tensor from its type's pool: every Q8_0 and MXFP4 tensor, and bf16 ones of more
    elements than the bf16 pool holds."""
    return qtype in (gguf.GGMLQuantizationType.Q8_0, MXFP4) or (
        qtype == gguf.GGMLQuantizationType.BF16 and int(np.prod(shape)) > POOL_ROWS[qtype])


def _tile(pool: np.ndarray, rows: int, seed: int, out: np.ndarray | None = None) -> np.ndarray:
    """`rows` rows of `pool` read cyclically from the seed's offset: row k is pool[(offset + k) % len(pool)], the
    offset seed x OFFSET_STEP mod len(pool) (a power of two), so seeds that differ mod len(pool) start at different
    rows. Filled by slice copies (memcpy speed) into a new array, or into the front of `out` (flat uint8, at least
    the rows' bytes) when given: the result is then a view of `out`, valid until `out` is written again."""
    n = len(pool)
    offset = seed * OFFSET_STEP % n
    if out is None:
        tiles = np.empty((rows, *pool.shape[1:]), dtype=pool.dtype)
    else:
        tiles = out[:rows * pool.strides[0]].view(pool.dtype).reshape(rows, *pool.shape[1:])
    done = min(rows, n - offset)
    tiles[:done] = pool[offset:offset + done]
    while done < rows:
        step = min(n, rows - done)
        tiles[done:done + step] = pool[:step]
        done += step
    return tiles


def _random(name: str, shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType, seed: int,
            out: np.ndarray | None = None) -> np.ndarray:
    """The tensor as GGUF data: one numpy array, the writer's bytes for it (a tiled tensor is built in the front of
    `out`, a flat uint8 buffer of at least its bytes, when given: then a view of it, valid until `out` is written
    again; else a new array). Norms ones, biases and sinks zeros (float32); Q8_0 and MXFP4 tensors,
    and bf16 ones of more than POOL_ROWS[BF16] elements, tile the process's pool of random rows (`_pool`: Q8_0
    blocks of uniform codes in -127..127 under the one float16 scale Q8_0_STD_SCALE, a standard deviation of 0.02;
    MXFP4 blocks of an e8m0 scale of 2^-7 .. 2^-4 and 16 bytes of random e2m1 codes, weights up to 6 x 2^-4, as
    `--load-format dummy` makes them; bf16 normal x 0.02) from an offset the seed sets (`_tile`), so tensors of
    different seeds differ and a seed gives the same bytes in every process; smaller bf16 tensors are drawn whole,
    normal x 0.02 from `seed` (raw uint16).

    Why tiling: drawing every code (numpy's generator for Q8_0, torch.randint for MXFP4) made 0.26 GB/s on one
    core, about 4 minutes for gpt-oss-120b's 65 GB file, too long beside llama-bench in one 10-minute device call;
    a tile is slice copies. Measured on a 2-core, 23 GB host for gpt-oss-20b's whole file (13.8 GB, `--type bf16`):
    generation alone 57.6 s before (MXFP4 experts 39.0 s: 0.26 GB/s), 10.6 s after (MXFP4 2.0 s: 5.2 GB/s; the
    rest is the per-layer bf16 matrices' normals, 0.2 GB/s); the file written to /dev/shm 76.7 s -> 23-30 s
    (tmpfs took 0.75-1 GB/s there), to /tmp 92.9 s -> 48 s (that host's disk: 0.38 GB/s). gpt-oss-120b's 65.3 GB:
    14 s of generation (MXFP4 4.6 s, its per-layer bf16 9.5 s), the rest file writes. Drawing normals and
    quantizing them, as Q8_0 once was, took 8.5 minutes of a call for Qwen3-30B-A3B. Values repeat with the pool's
    period (68 MiB of blocks, 128 MiB of bf16), which a benchmark's speed does not see."""
    if _tiled(shape, qtype):
        if qtype == gguf.GGMLQuantizationType.BF16:
            return _tile(_pool(qtype), int(np.prod(shape)), seed, out).reshape(shape)
        blocks = _tile(_pool(qtype), int(np.prod(shape)) // gguf.GGML_QUANT_SIZES[qtype][0], seed, out)
        return blocks.reshape(gguf.quant_shape_to_byte_shape(shape, qtype))
    if len(shape) == 1 or name.endswith(".bias"):  # vectors stay float32, as converters write them
        return (np.ones if name.endswith("norm.weight") else np.zeros)(shape, dtype=np.float32)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.02
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
    sizes = [int(np.prod(nbytes)) for nbytes in byte_shapes]
    check_room(out, sum(sizes))
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[ARCHES[cfg.family]])
    file_type = gguf.LlamaFileType.MOSTLY_MXFP4_MOE if cfg.mxfp4_experts else {
        "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[kind]
    _metadata(writer, cfg, file_type)
    for (name, _, qtype), nbytes, size in zip(shapes, byte_shapes, sizes):  # the header first: name, type, size
        writer.add_tensor_info(name, nbytes, np.dtype(np.uint8), size, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    # then the data, one tensor in memory at a time; the tiled ones in one buffer, reused (a fresh array a tensor
    # pays its pages' first touch again: gpt-oss-20b's MXFP4 tiles took 1.5 s so, 1.0 s in the buffer)
    scratch = np.empty(max((n for (_, shape, q), n in zip(shapes, sizes) if _tiled(shape, q)), default=0), np.uint8)
    for i, (name, shape, qtype) in enumerate(shapes):
        writer.write_tensor_data(_random(name, shape, qtype, seed + i, scratch).view(np.uint8))
    writer.close()
    return out


def bench_gguf(args) -> None:
    """`wisp bench llama-cpp gguf`: write the GGUF and print its path."""
    print(write_gguf(args.model, Path(args.out), args.type, args.seed))
