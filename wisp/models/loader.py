"""Checkpoint loading: Hugging Face layout -> MoEDecoder with experts placed by mode.

Non-expert weights go to the compute device. Expert weights are streamed one tensor at a time from the
safetensors files (memory-mapped) into per-layer host masters [N, 2I, D] / [N, D, I], pinned when the
device is CUDA; in resident mode they are copied expert by expert straight into the device bank. So in
paged and offload modes peak device memory during load stays near non-expert bytes + scratch: no
layer's full bank ever exists on the device.

Faults (RELIABILITY.md, "Faults"): a checkpoint that is missing a shard, truncated, or holds a tensor in a
dtype wisp cannot compute in (float8, integer-packed quantized weights) is one WispError naming the file
or tensor, never garbage weights. Pinning that fails (`HostMemory`) falls back to pageable memory with one
warning in paged and offload modes; zero-copy cannot run on pageable memory and stops with a WispError
naming the bytes it needed.
"""

from __future__ import annotations

import json
import logging
import sys
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from wisp.config import EngineConfig, ModelConfig, packs_projections
from wisp.core.bank_keys import layout_key
from wisp.core.experts.presets import PRESETS, ModelParts, build_store
from wisp.core.experts.store import ExpertStore
from wisp.core.kernels.cpu_expert_kernels import native_kernel_error
from wisp.core.kernels.fp8_blocks import FP8, Fp8BlockWeight, dequantize_blocks, scale_key
from wisp.core.kernels.quantized_weights import BlockWeight
from wisp.core.learners.hybrid_pace import CpuPace
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.core.learners.hybrid_probe import probe_hybrid_costs
from wisp.core.kernels.registry import moe_kernels
from wisp.errors import WispError
from wisp.models.expert_banks import bank_layout, fill_bank
from wisp.models.families import get_family
from wisp.models.mla import load_mla_weights
from wisp.models.weight_names import WeightNames
from wisp.models.moe_decoder import AttentionWeights, LayerWeights, MLPWeights, MoEDecoder
from wisp.models.token_embedding import TokenEmbedding, embedding_on_host

log = logging.getLogger("wisp.models")

# dtypes a checkpoint tensor may have: wisp converts these to the compute dtype exactly or by rounding.
# float8 and integer tensors are quantized weights whose scales wisp would ignore: refused, not cast.
LOADABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class CheckpointReader:
    """Name -> tensor access over one or many safetensors files (index.json or a plain directory)."""

    def __init__(self, path: Path):
        self.path = path
        index = path / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise WispError(f"{index} is not a valid safetensors index: {exc}") from None
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in path.glob("*.safetensors"))
            if not files:
                raise WispError(f"no *.safetensors files in {path}")
            weight_map = {}
        self._stack = ExitStack()
        self._handles = {}
        for name in files:
            file = path / name
            if not file.is_file():
                raise WispError(f"checkpoint file {file} is missing (listed in the index)")
            try:
                self._handles[name] = self._stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
            except (SafetensorError, OSError) as exc:
                raise WispError(f"checkpoint file {file} is truncated or unreadable ({exc})") from None
        self.where: dict[str, str] = {}
        for name, handle in self._handles.items():
            for key in handle.keys():
                self.where[key] = name
        for key, name in weight_map.items():
            if key not in self.where:
                raise WispError(f"tensor {key} is listed in the index for {name} but not found there")

    def __contains__(self, key: str) -> bool:
        return key in self.where

    def get(self, key: str, allow_fp8: bool = False, allow_mxfp4: bool = False) -> torch.Tensor:
        """The tensor as stored; float8_e4m3fn only where the config says the checkpoint is FP8 (`allow_fp8`),
        uint8 only for MXFP4 experts (`allow_mxfp4`), any other quantized dtype never."""
        if key not in self.where:
            raise WispError(f"checkpoint in {self.path} has no tensor {key}")
        try:
            tensor = self._handles[self.where[key]].get_tensor(key)
        except SafetensorError as exc:
            raise WispError(f"could not read {key} from {self.where[key]} ({exc})") from None
        allowed = (allow_fp8 and tensor.dtype == FP8) or (allow_mxfp4 and tensor.dtype == torch.uint8)
        if tensor.dtype not in LOADABLE_DTYPES and not allowed:
            raise WispError(f"tensor {key} in {self.where[key]} is {str(tensor.dtype).removeprefix('torch.')}: a "
                            "quantized checkpoint, which wisp does not support (it loads float32, float16 and "
                            "bfloat16 weights only)")
        return tensor

    def block_weight(self, key: str) -> None:
        """No dense projection here is in a GGUF block format (`wisp.models.gguf_reader.GGUFCheckpoint.block_weight`)."""
        return None

    def close(self) -> None:
        self._stack.close()


class HostMemory:
    """Allocates the expert host masters: pinned when `pin`, else pageable.

    If pinning fails (torch raises RuntimeError: cudaHostAlloc out of memory, a locked-memory limit, no
    pinned allocator), then:
    - `required` (zero-copy mode: the kernel reads host memory in place, which only pinned memory allows):
      a WispError naming the bytes needed;
    - otherwise one warning, and this and every later allocation is pageable (`fell_back`; the engine then
      runs as pin_memory=False: copies are synchronous, CUDA graphs are off). Layers already pinned stay so.
    """

    def __init__(self, pin: bool, required: bool = False, total_bytes: int = 0):
        self.pin = pin
        self.required = required
        self.total_bytes = total_bytes  # every layer's masters, for the messages
        self.fell_back = False

    @classmethod
    def for_engine(cls, cfg: ModelConfig, engine: EngineConfig, device: torch.device) -> "HostMemory":
        pin = _wants_pinned(engine, device)
        total = cfg.num_experts * cfg.slot_bytes
        return cls(pin, required=engine.mode == "zero-copy", total_bytes=total)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, what: str) -> torch.Tensor:
        nbytes = _numel(shape) * torch.empty((), dtype=dtype).element_size()
        if self.pin:
            try:
                return _allocate(shape, dtype, pin=True)
            except RuntimeError as exc:
                self._pinning_failed(nbytes, what, exc)
        try:
            return _allocate(shape, dtype, pin=False)
        except RuntimeError as exc:
            raise WispError(f"could not allocate {nbytes} bytes of host memory for {what} "
                            f"({self.total_bytes} bytes for all experts): {_first_line(exc)}") from None

    def _pinning_failed(self, nbytes: int, what: str, exc: RuntimeError) -> None:
        cause = _first_line(exc)
        if self.required:
            raise WispError(f"could not pin {nbytes} bytes of host memory for {what} ({cause}); --mode zero-copy "
                            f"needs all {self.total_bytes} bytes of expert weights pinned: free host memory, raise "
                            "the locked-memory limit (ulimit -l), or use --mode paged") from None
        log.warning("could not pin %d bytes of host memory for %s (%s); using pageable memory for it and the "
                    "experts after it (all experts: %d bytes): expert copies are synchronous and CUDA graphs are "
                    "off, so steps are slower", nbytes, what, cause, self.total_bytes)
        self.pin = False
        self.fell_back = True


def _wants_pinned(engine: EngineConfig, device: torch.device) -> bool:
    """Whether the expert masters are pinned: on CUDA, when they stay on the host and pin_memory is set."""
    return device.type == "cuda" and engine.mode != "resident" and engine.pin_memory


def _allocate(shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=pin)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else exc.__class__.__name__


def load_model(reader, model_cfg: ModelConfig, engine: EngineConfig, device: torch.device,
               host: HostMemory | None = None) -> MoEDecoder:
    """Build the decoder from `reader` (a CheckpointReader, or RandomWeights for --load-format dummy).
    `host` allocates the expert host masters (default: `HostMemory.for_engine`); after the load its
    `fell_back` says whether pinning failed and pageable memory was used."""
    dtype = model_cfg.dtype
    host = host or HostMemory.for_engine(model_cfg, engine, device)
    try:
        names = get_family(model_cfg.family).weights

        def dev(key: str) -> torch.Tensor:  # non-expert weights: FP8 ones dequantized once, here
            return plain_tensor(reader, key, model_cfg.fp8_block).to(device=device, dtype=dtype)

        def opt(key: str) -> torch.Tensor | None:
            return dev(key) if key in reader else None

        packed = packs_projections(model_cfg, engine, device)

        def proj(key: str) -> torch.Tensor | Fp8BlockWeight | BlockWeight:  # a dense projection: packed where it can be
            if not packed:
                return dev(key)
            if model_cfg.fp8_block is None:  # a GGUF file's block formats
                block = reader.block_weight(key)
                return dev(key) if block is None else block.to(device)
            tensor = reader.get(key, allow_fp8=True)
            if tensor.dtype != FP8:  # a plain tensor in an FP8 checkpoint: as `dev` gives it, without a second read
                return tensor.to(device=device, dtype=dtype)
            return Fp8BlockWeight(tensor.to(device), reader.get(scale_key(key)).to(device=device, dtype=torch.float32))

        tied = model_cfg.tie_word_embeddings or "lm_head.weight" not in reader
        embed = _embedding(reader, model_cfg, engine, device, dev, tied)
        lm_head = embed.table if tied else proj("lm_head.weight")
        layers = [_load_layer(i, model_cfg, names, dev, opt, proj) for i in range(model_cfg.num_layers)]
        experts = _load_experts(reader, model_cfg, engine, names, device, host)
        return MoEDecoder(model_cfg, embed, dev("model.norm.weight"), lm_head, layers, experts,
                          backend=engine.resolve_backend("moe", device))
    finally:
        reader.close()


def _embedding(reader, model_cfg: ModelConfig, engine: EngineConfig, device: torch.device, dev,
               tied: bool) -> TokenEmbedding:
    """The token embedding table: in pinned host memory where `--embedding` puts it there (never through the
    device: its bytes would stay in the allocator's cache), else on the device like the other weights."""
    key = "model.embed_tokens.weight"
    if engine.embedding == "host" and tied:
        raise WispError("--embedding host: this model's embedding is also its LM head, which reads all of it every "
                        "step; keep it on the device (--embedding auto or device)")
    if engine.embedding == "host" and device.type == "cuda" and not engine.pin_memory:
        raise WispError("--embedding host needs pinned host memory (the GPU reads the table in place), and "
                        "pin_memory is off; use --embedding device")
    if not embedding_on_host(engine.embedding, device, tied, engine.pin_memory):
        return TokenEmbedding(dev(key), device)
    table = plain_tensor(reader, key, model_cfg.fp8_block)
    try:
        host = _allocate(tuple(table.shape), model_cfg.dtype, pin=True)
    except RuntimeError as exc:
        if engine.embedding == "host":
            nbytes = table.numel() * torch.empty((), dtype=model_cfg.dtype).element_size()
            raise WispError(f"--embedding host: could not pin {nbytes} bytes of host "
                            f"memory for the token embedding table ({_first_line(exc)}); use --embedding device") from None
        log.warning("could not pin host memory for the token embedding table (%s); keeping it on the device",
                    _first_line(exc))
        return TokenEmbedding(dev(key), device)
    host.copy_(table)
    del table
    if device.type == "cuda":
        torch.cuda.empty_cache()  # a table made on the device (dummy weights): give its bytes back
    return TokenEmbedding(host, device)


def plain_tensor(reader, key: str, fp8_block: tuple[int, int] | None) -> torch.Tensor:
    """A checkpoint tensor as plain numbers: an FP8 one (in an FP8 checkpoint) dequantized in float32 with its
    `weight_scale_inv`."""
    tensor = reader.get(key, allow_fp8=fp8_block is not None)
    if tensor.dtype == FP8:
        return dequantize_blocks(tensor, reader.get(scale_key(key)), torch.float32, fp8_block)
    return tensor


def _load_layer(i: int, cfg: ModelConfig, n: WeightNames, dev, opt, proj) -> LayerWeights:
    if cfg.mla is not None:
        attn = load_mla_weights(lambda name: n.attn(i, name), dev, opt, cfg.mla, cfg.num_heads)
    else:
        attn = _attention_weights(i, cfg, n, dev, opt, proj)
    lw = LayerWeights(
        input_norm=dev(f"{n.layer(i)}.input_layernorm.weight"),
        post_norm=dev(f"{n.layer(i)}.post_attention_layernorm.weight"),
        attn=attn,
    )
    if cfg.moe_layers[i]:
        router = dev(n.router(i))
        lw.router = router.float() if cfg.router_float32 else router  # converted once here, not every step
        lw.router_bias = opt(n.router(i).removesuffix("weight") + "bias")
        if cfg.shared_expert_intermediate_size:
            lw.shared = MLPWeights(*(proj(n.shared_expert(i, w)) for w in ("gate", "up", "down")))
            lw.shared_gate = dev(n.shared_expert_gate(i)) if cfg.shared_expert_gated else None
    else:
        lw.dense = MLPWeights(*(proj(n.dense_mlp(i, w)) for w in ("gate", "up", "down")))
    return lw


def _attention_weights(i: int, cfg: ModelConfig, n: WeightNames, dev, opt, proj) -> AttentionWeights:
    return AttentionWeights(
        q=proj(n.attn(i, "q_proj.weight")),
        k=proj(n.attn(i, "k_proj.weight")),
        v=proj(n.attn(i, "v_proj.weight")),
        o=proj(n.attn(i, "o_proj.weight")),
        q_bias=opt(n.attn(i, "q_proj.bias")),
        k_bias=opt(n.attn(i, "k_proj.bias")),
        v_bias=opt(n.attn(i, "v_proj.bias")),
        q_norm=opt(n.attn(i, "q_norm.weight")) if cfg.qk_norm != "none" else None,
        k_norm=opt(n.attn(i, "k_norm.weight")) if cfg.qk_norm != "none" else None,
        o_bias=opt(n.attn(i, "o_proj.bias")),
        sinks=dev(n.attn(i, "sinks")) if cfg.attention_sinks else None,
    )


def _allocate_bank(cfg: ModelConfig, li: int, target: torch.device | None, host: HostMemory) -> dict[str, torch.Tensor]:
    """Layer li's empty expert bank (`bank_layout`) on `target` (None: host memory from `host`)."""
    layout = bank_layout(cfg, li)
    if target is None:
        return {k: host.empty(shape, dt, f"layer {li}'s experts ({k})") for k, (shape, dt) in layout.items()}
    try:  # resident: straight into the device bank (a device out-of-memory is the engine's to explain)
        return {k: torch.empty(shape, dtype=dt, device=target) for k, (shape, dt) in layout.items()}
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as exc:  # e.g. the CPU allocator, for a CPU run
        nbytes = sum(_numel(shape) * torch.empty((), dtype=dt).element_size() for shape, dt in layout.values())
        raise WispError(f"could not allocate {nbytes} bytes on {target} for layer {li}'s experts: "
                        f"{_first_line(exc)}") from None


def _load_experts(
    reader: CheckpointReader, cfg: ModelConfig, engine: EngineConfig, n: WeightNames, device: torch.device,
    host: HostMemory,
) -> dict[int, ExpertStore]:
    """Fill each MoE layer's expert tensors, expert by expert, and wrap them in the mode's store."""
    caps = dict(zip(cfg.moe_layer_ids, engine.resolve_layer_caps(cfg)))
    target = device if engine.mode == "resident" else None  # None: host masters, from `host`
    stores: dict[int, ExpertStore] = {}
    # costs given rather than probed are the caller's to keep: never re-timed (`CpuPace.retime`)
    parts = ModelParts(costs=engine.hybrid_costs, pace=None if engine.hybrid_costs is None else CpuPace(retime=False),
                       dtype=cfg.dtype)
    kernels = moe_kernels(engine.resolve_backend("moe", device)).with_activation(cfg.expert_activation)
    bar = tqdm(total=len(cfg.moe_layer_ids) * cfg.num_experts, desc="Loading experts", unit="expert", file=sys.stderr,
               disable=None)
    probed: dict[tuple, HybridCosts] = {}  # per bank layout: a Q4_K_M file's layers keep down in Q4_K or Q6_K
    for li in cfg.moe_layer_ids:
        bank = _allocate_bank(cfg, li, target, host)
        fill_bank(bank, reader, cfg, n, li, bar)
        if engine.hybrid_costs is None and PRESETS[engine.mode].needs_cpu:
            layout = layout_key(bank)
            if layout not in probed:
                probed[layout] = _probe_cpu_costs(engine, cfg, bank, device)
            parts.costs = probed[layout]  # the CPU server this layer builds keeps its layout's costs
        stores[li] = build_store(engine.mode, bank, device, caps[li], parts, hot=engine.hot_experts,
                                 cpu_kernel=engine.hybrid_cpu_kernel, kernels=kernels)
    bar.close()
    return stores


def _probe_cpu_costs(engine: EngineConfig, cfg: ModelConfig, bank: dict[str, torch.Tensor], device: torch.device):
    """The copy and CPU costs a CPU-serving mode splits misses by, measured on one layer's bank (once for every layer
    of its layout: its tensors' shapes and dtypes)."""
    if engine.hybrid_cpu_kernel == "native" and (why := native_kernel_error()) is not None:
        raise WispError(f"hybrid CPU kernel 'native' could not be built here ({why}); choose plain or reference")
    return probe_hybrid_costs(bank, device, engine.hybrid_cpu_kernel, dtype=cfg.dtype, activation=cfg.expert_activation)
