"""A layer's expert bank: its tensors' shapes (`bank_layout`) and filling it from a checkpoint (`fill_bank`).

The bank is what every expert store pages (`wisp.core.kernels.expert_extras` names its tensors): "gate_up"
[N, 2I, D] with gate's rows first, "down" [N, D, I], in the model dtype or quantized (FP8 with float32
block scales; MXFP4 packed as [.., in/32, 16] uint8 codes with [.., in/32] e8m0 scales; a GGUF file's Q8_0 as
int8 codes with [.., in/32] float16 scales; its k-quants as uint8 codes [.., in/256, C] with uint8 heads
[.., in/256, H], each role and layer in its own type), and for GPT-OSS
the biases "gate_up_bias" [N, 2I] and "down_bias" [N, D].

Checkpoint layouts read here, expert by expert, so a host never holds a layer twice:
- one tensor per expert and projection (`...experts.3.gate_proj.weight`, Mixtral's w1/w3/w2), plain or FP8
  with each weight's `weight_scale_inv`;
- stacked (`...experts.gate_up_proj` [N, 2I, D], `...experts.down_proj` [N, D, I]), plain;
- GPT-OSS: `gate_up_proj` [N, D, 2I] (x @ W) with gate and up interleaved (column 2j is gate j, 2j+1 up j),
  `down_proj` [N, I, D], their `_bias`es, or in MXFP4 `gate_up_proj_blocks` [N, 2I, D/32, 16] and
  `_scales` [N, 2I, D/32] (rows interleaved the same way), `down_proj_blocks` / `_scales`. Rows are
  de-interleaved and weights transposed into the bank's layout on the way in; packed MXFP4 rows move whole,
  so they stay packed.
"""

from __future__ import annotations

import torch

from wisp.config import ModelConfig
from wisp.core.kernels.expert_extras import DOWN_BIAS, DOWN_SCALE, GATE_UP_BIAS, GATE_UP_SCALE
from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.kernels.fp8_blocks import FP8, scale_key, scale_shape
from wisp.core.kernels.k_quants import bank_shapes as k_quant_shapes
from wisp.core.kernels.mxfp4 import BLOCK as MXFP4_BLOCK
from wisp.core.kernels.q8_0 import BLOCK as Q8_0_BLOCK
from wisp.errors import WispError
from wisp.models.weight_names import WeightNames

Q8_0_KEYS = ("_q8_0_codes", "_q8_0_scales")  # a stacked experts name's suffixes for its Q8_0 codes and scales
BLOCK_KEYS = ("_block_codes", "_block_scales")  # the same for "gguf_blocks" experts, whatever each tensor's type


def bank_layout(cfg: ModelConfig, layer: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Per bank tensor of MoE layer `layer`: its [N, ...] shape and dtype (the same for every MoE layer of a model
    but a GGUF file's whose block formats differ by layer)."""
    ne, inter, d = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    biases = {GATE_UP_BIAS: ((ne, 2 * inter), cfg.dtype), DOWN_BIAS: ((ne, d), cfg.dtype)} if cfg.expert_bias else {}
    if cfg.expert_format == "gguf_blocks":  # each role as its GGUF type keeps it packed: codes, then scales / heads
        formats = cfg.expert_block_formats[layer]
        roles = ((GATE_UP, GATE_UP_SCALE, 2 * inter, d), (DOWN, DOWN_SCALE, d, inter))
        layout = {}
        for (weight, scale, rows, depth), qtype in zip(roles, formats):
            (codes, codes_dtype), (scales, scales_dtype) = packed_role(qtype, rows, depth)
            layout[weight], layout[scale] = ((ne, *codes), codes_dtype), ((ne, *scales), scales_dtype)
        return {**layout, **biases}
    if cfg.mxfp4_experts:
        if d % MXFP4_BLOCK or inter % MXFP4_BLOCK:
            raise WispError(f"MXFP4 experts need hidden size ({d}) and expert width ({inter}) to be multiples of "
                            f"{MXFP4_BLOCK}")
        half = MXFP4_BLOCK // 2
        return {GATE_UP: ((ne, 2 * inter, d // MXFP4_BLOCK, half), torch.uint8),
                DOWN: ((ne, d, inter // MXFP4_BLOCK, half), torch.uint8),
                GATE_UP_SCALE: ((ne, 2 * inter, d // MXFP4_BLOCK), torch.uint8),
                DOWN_SCALE: ((ne, d, inter // MXFP4_BLOCK), torch.uint8), **biases}
    if cfg.expert_format == "q8_0":  # int8 codes, a float16 scale per 32 (a GGUF file's blocks, split by role)
        return {GATE_UP: ((ne, 2 * inter, d), torch.int8), DOWN: ((ne, d, inter), torch.int8),
                GATE_UP_SCALE: ((ne, 2 * inter, d // Q8_0_BLOCK), torch.float16),
                DOWN_SCALE: ((ne, d, inter // Q8_0_BLOCK), torch.float16), **biases}
    if cfg.fp8_block is None:
        return {GATE_UP: ((ne, 2 * inter, d), cfg.dtype), DOWN: ((ne, d, inter), cfg.dtype), **biases}
    if inter % cfg.fp8_block[0]:
        raise WispError(f"FP8 experts of width {inter} are not supported: gate and up are paged as one [2I, D] "
                        f"weight, which needs the width to be a multiple of the {cfg.fp8_block[0]}-row block")
    return {GATE_UP: ((ne, 2 * inter, d), FP8), DOWN: ((ne, d, inter), FP8),
            GATE_UP_SCALE: (scale_shape((ne, 2 * inter, d), cfg.fp8_block), torch.float32),
            DOWN_SCALE: (scale_shape((ne, d, inter), cfg.fp8_block), torch.float32), **biases}


def packed_role(qtype: str, rows: int, depth: int) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """(codes', scales') (shape, dtype) of one expert's [rows, depth] weight kept in GGUF type `qtype`."""
    if qtype == "Q8_0":
        return ((rows, depth), torch.int8), ((rows, depth // Q8_0_BLOCK), torch.float16)
    codes, heads = k_quant_shapes(rows, depth, qtype)
    return (codes, torch.uint8), (heads, torch.uint8)


def fill_bank(bank: dict[str, torch.Tensor], reader, cfg: ModelConfig, n: WeightNames, li: int, bar) -> None:
    """Fill layer li's allocated `bank` from `reader` (a CheckpointReader or RandomWeights), one expert at a
    time (`bar` advances per expert)."""
    if n.fused_layout == "gpt_oss":
        _fill_gpt_oss(bank, reader, cfg, n, li, bar)
        return
    if cfg.expert_format in ("q8_0", "gguf_blocks"):
        _fill_packed(bank, reader, cfg, n, li, bar, Q8_0_KEYS if cfg.expert_format == "q8_0" else BLOCK_KEYS)
        return
    fused = n.fused_experts(li, "gate_up") in reader
    if fused and cfg.fp8_block is not None:
        raise WispError(f"FP8 experts stacked in one tensor ({n.fused_experts(li, 'gate_up')}) are not supported; "
                        "supported: one gate/up/down weight per expert, each with its weight_scale_inv")
    stacked = (reader.get(n.fused_experts(li, "gate_up")), reader.get(n.fused_experts(li, "down"))) if fused else None
    inter = cfg.moe_intermediate_size
    for e in range(cfg.num_experts):
        if stacked is not None:
            bank[GATE_UP][e].copy_(stacked[0][e])
            bank[DOWN][e].copy_(stacked[1][e])
        elif cfg.fp8_block is None:
            bank[GATE_UP][e, :inter].copy_(reader.get(n.expert(li, e, "gate")))
            bank[GATE_UP][e, inter:].copy_(reader.get(n.expert(li, e, "up")))
            bank[DOWN][e].copy_(reader.get(n.expert(li, e, "down")))
        else:
            _fill_fp8_expert(bank, reader, cfg, n, li, e)
        bar.update(1)


def _fill_packed(bank, reader, cfg: ModelConfig, n: WeightNames, li: int, bar, suffixes: tuple[str, str]) -> None:
    """A GGUF file's packed experts (`wisp.models.gguf_reader`): stacked codes and scales, under the stacked experts'
    names plus `suffixes`, copied as they are."""
    sources = {}
    for weight, scale, part in ((GATE_UP, GATE_UP_SCALE, "gate_up"), (DOWN, DOWN_SCALE, "down")):
        key = n.fused_experts(li, part)
        sources[weight], sources[scale] = (reader.get(key + suffix) for suffix in suffixes)
    for e in range(cfg.num_experts):
        for name, source in sources.items():
            bank[name][e].copy_(source[e])
        bar.update(1)


def _fill_fp8_expert(bank, reader, cfg: ModelConfig, n: WeightNames, li: int, e: int) -> None:
    inter = cfg.moe_intermediate_size
    rows = inter // cfg.fp8_block[0]  # gate's scale rows
    for part, (weights, scales, at, scale_at) in {
        "gate": (GATE_UP, GATE_UP_SCALE, slice(0, inter), slice(0, rows)),
        "up": (GATE_UP, GATE_UP_SCALE, slice(inter, None), slice(rows, None)),
        "down": (DOWN, DOWN_SCALE, slice(None), slice(None)),
    }.items():
        key = n.expert(li, e, part)
        weight = reader.get(key, allow_fp8=True)
        if weight.dtype != FP8:
            raise WispError(f"the config says fp8 but {key} is {str(weight.dtype).removeprefix('torch.')}")
        bank[weights][e, at].copy_(weight)
        bank[scales][e, scale_at].copy_(reader.get(scale_key(key)))


def _fill_gpt_oss(bank, reader, cfg: ModelConfig, n: WeightNames, li: int, bar) -> None:
    inter = cfg.moe_intermediate_size
    gate_up, down = n.fused_experts(li, "gate_up"), n.fused_experts(li, "down")
    if cfg.mxfp4_experts:
        sources = {GATE_UP: gate_up + "_blocks", GATE_UP_SCALE: gate_up + "_scales", DOWN: down + "_blocks",
                   DOWN_SCALE: down + "_scales"}
        tensors = {name: reader.get(key, allow_mxfp4=True) for name, key in sources.items()}
        for name, key in sources.items():
            if tensors[name].dtype != torch.uint8:
                raise WispError(f"the config says mxfp4 but {key} is {str(tensors[name].dtype).removeprefix('torch.')}")
    else:
        if gate_up + "_blocks" in reader:
            raise WispError(f"{gate_up}_blocks is MXFP4 but the config has no quantization_config with quant_method "
                            "mxfp4")
        tensors = {GATE_UP: reader.get(gate_up).transpose(1, 2), DOWN: reader.get(down).transpose(1, 2)}
    tensors[GATE_UP_BIAS], tensors[DOWN_BIAS] = reader.get(gate_up + "_bias"), reader.get(down + "_bias")
    for e in range(cfg.num_experts):
        for name, source in tensors.items():
            if name in (GATE_UP, GATE_UP_SCALE, GATE_UP_BIAS):  # interleaved rows: gate's even, up's odd
                bank[name][e, :inter].copy_(source[e, 0::2])
                bank[name][e, inter:].copy_(source[e, 1::2])
            else:
                bank[name][e].copy_(source[e])
        bar.update(1)
