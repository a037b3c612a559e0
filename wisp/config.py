"""Configuration: one normalised model config and the engine options, both frozen and validated once.

`ModelConfig` holds a model's shape with one name per concept, whatever its checkpoint calls it; the value
types it holds (`RopeScaling`, `MlaShape`) live here too. Reading a checkpoint's own config into one is the
job of `wisp.models.config_parsers` (each family's quirks in its entry of `wisp.models.families`), so this
module imports nothing from `wisp.models` and the model code reads plain fields.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from wisp.core.kernels.expert_extras import SILU, Activation
from wisp.core.kernels.fp8_blocks import DEFAULT_BLOCK
from wisp.core.kernels.gguf_blocks import block_bytes
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.errors import WispError
from wisp.options import (ATTENTION_BACKENDS, CUDA_GRAPH_MAX_BATCH, DEFAULT_MAX_DECODE_WAIT_MS, DTYPE_NAMES, EMBEDDINGS,
                          HYBRID_CPU_KERNELS, LOAD_FORMATS, MAX_NUM_BATCHED_TOKENS, check_load_control, MODES,
                          IN_PLACE_MODES, MOE_BACKENDS, SCRATCH_MODES)

log = logging.getLogger("wisp")

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """'auto'/None -> None (use the checkpoint's), else a torch dtype; unknown names raise WispError."""
    if name is None or name == "auto":
        return None
    if isinstance(name, torch.dtype):
        return name
    key = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(name, name)
    if key not in DTYPES:
        raise WispError(f"unsupported dtype {name!r}; choose one of: auto, {', '.join(DTYPES)}")
    return DTYPES[key]


@dataclass(frozen=True)
class RopeScaling:
    """The rotary embedding's scaling: "default", "linear" (frequencies / factor) or "yarn" (a blend of
    both over beta_fast..beta_slow rotations of the original context, cos and sin times attention_factor).
    `wisp.models.rope` turns it into inverse frequencies."""

    kind: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    original_max_position_embeddings: int = 4096
    truncate: bool = True
    attention_factor: float = 1.0
    mscale_all_dim: float = 0.0  # yarn's softmax-scale correction, read by MLA's scale (`wisp.models.hf_config`)


@dataclass(frozen=True)
class MlaShape:
    """Multi-head latent attention's shape (DeepSeek-V2, `wisp.models.mla`): per head a query of nope_dim +
    rope_dim and a value of v_dim, a latent of kv_lora_rank per token, queries through a LoRA pair of
    q_lora_rank (None: one projection); softmax_scale includes yarn's correction."""

    q_lora_rank: int | None
    kv_lora_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    softmax_scale: float

    @property
    def cache_dim(self) -> int:
        """One token's cache entry: the latent, then the rope key."""
        return self.kv_lora_rank + self.rope_dim


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder needs, with one name per concept."""

    family: str
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeScaling
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    norm_topk_prob: bool
    dense_intermediate_size: int  # MLP width of non-MoE layers (Qwen2/3-MoE mlp_only_layers)
    moe_layers: tuple[bool, ...]  # per layer: True when its MLP is a routed MoE block
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: 0 = no shared expert
    attention_bias: bool = False
    qk_norm: str = "none"  # "none" | "per_head" (Qwen3) | "full" (OLMoE)
    clip_qkv: float | None = None
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    # generation_config.json's sampling values ("temperature", "top_p", "top_k"), in that order, where it gives them:
    # the defaults of `wisp generate` for the flags left out (as vLLM's --generation-config auto)
    sampling_defaults: tuple[tuple[str, float], ...] = ()
    dtype: torch.dtype = torch.float32
    fp8_block: tuple[int, int] | None = None  # FP8 block-scaled linear weights (`wisp.core.kernels.fp8_blocks`): the block
    expert_format: str = "plain"  # the experts' bytes: "plain" (dtype, or FP8 with fp8_block), "mxfp4" (GPT-OSS,
    # `wisp.core.kernels.mxfp4`), "q8_0" (a GGUF file's, `wisp.core.kernels.q8_0`) or "gguf_blocks" (a GGUF file's
    # block formats per layer and role: `expert_block_formats`); everything else plain
    # per layer (None: not an MoE layer), "gguf_blocks" only: the (gate_up, down) experts' GGUF types, each of Q8_0,
    # Q4_K, Q5_K, Q6_K (`wisp.core.kernels.k_quants`), kept packed as the file stores them
    expert_block_formats: tuple[tuple[str, str] | None, ...] = ()
    # a GGUF file whose experts stay packed: (parameters, bytes as stored) of its dense projections and LM head in
    # Q8_0 or a k-quant, which stay packed too where `packs_projections` says (the planner counts them so)
    packed_projection_sizes: tuple[int, int] = (0, 0)
    window_layers: tuple[bool, ...] = ()  # per layer: sliding_window applies there (empty: every layer)
    attention_sinks: bool = False  # a learned per-head logit in every softmax's denominator (GPT-OSS)
    routing: str = "softmax_topk"  # or "topk_softmax": softmax over the top-k router logits (GPT-OSS)
    expert_activation: Activation = SILU
    expert_bias: bool = False  # experts carry gate_up and down biases, the router and o_proj biases (GPT-OSS)
    norm_weight_float32: bool = False  # RMSNorm multiplies its weight in float32 before the cast (GPT-OSS)
    mla: MlaShape | None = None  # latent attention (DeepSeek-V2): then num_kv_heads = 1, head_dim = its cache entry
    routed_scaling: float = 1.0  # routed experts' weights are multiplied by this (DeepSeek)
    router_float32: bool = False  # router logits in float32 from float32 activations (DeepSeek)
    shared_expert_gated: bool = True  # the shared expert's output is sigmoid-gated (Qwen2-MoE), else added

    @property
    def mxfp4_experts(self) -> bool:
        return self.expert_format == "mxfp4"

    @property
    def rope_dim(self) -> int:
        """Channels the rotary embedding turns: the head, or MLA's decoupled rope part."""
        return self.mla.rope_dim if self.mla is not None else self.head_dim

    @property
    def kv_tensors(self) -> int:
        """Tensors a KV block holds per layer: K and V, or MLA's one compressed entry."""
        return 1 if self.mla is not None else 2

    def window_of(self, layer: int) -> int | None:
        """The sliding window of attention in `layer` (None: full attention)."""
        return self.sliding_window if not self.window_layers or self.window_layers[layer] else None

    @property
    def moe_layer_ids(self) -> list[int]:
        return [i for i, m in enumerate(self.moe_layers) if m]

    def expert_bytes_of(self, layer: int) -> int:
        """Bytes of one expert (gate, up and down) of MoE layer `layer` as it is paged: in `dtype`, packed (MXFP4,
        Q8_0, the GGUF block formats) with its scales, or FP8 plus its float32 block scales (gate_up's [2I/B, D/B] and
        down's [D/B, I/B]): the unit the pager moves."""
        d, inter = self.hidden_size, self.moe_intermediate_size
        size = self.dtype.itemsize
        biases = (2 * inter + d) * size if self.expert_bias else 0
        if self.expert_format == "gguf_blocks":  # the file's own bytes, role by role
            gate_up, down = self.expert_block_formats[layer]
            return block_bytes(gate_up, 2 * inter, d) + block_bytes(down, d, inter) + biases
        if self.mxfp4_experts:  # half a byte a weight, one e8m0 byte per 32
            return 3 * d * inter // 2 + 3 * d * inter // 32 + biases
        if self.expert_format == "q8_0":  # a byte a weight, a float16 scale per 32: the GGUF file's 34-byte blocks
            return 3 * d * inter + 2 * (3 * d * inter // 32) + biases
        if self.fp8_block is not None:
            bo, bi = self.fp8_block
            scales = (2 * inter // bo) * -(-d // bi) + -(-d // bo) * -(-inter // bi)
            return 3 * d * inter + 4 * scales + biases
        return 3 * d * inter * size + biases

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert of the model's largest MoE layer (`expert_bytes_of`; every layer's are the same but
        where a GGUF file's block formats differ by layer): what a staging buffer must hold."""
        return max((self.expert_bytes_of(li) for li in self.moe_layer_ids), default=self.expert_bytes_of(0))

    @property
    def slot_bytes(self) -> int:
        """Bytes of one expert slot in every MoE layer: the sum of each layer's `expert_bytes_of`."""
        return sum(self.expert_bytes_of(li) for li in self.moe_layer_ids)


def packs_projections(cfg: ModelConfig, config: EngineConfig, device: torch.device) -> bool:
    """Whether the dense projections (and an untied LM head) stay packed on the device, as the checkpoint stores
    them: an FP8 checkpoint's block-scaled ones, a GGUF file's Q8_0 and k-quant ones when its experts are kept packed
    too (its other types are dequantized). Half their VRAM or less, which the modes that keep experts off the GPU
    turn into expert slots: where the Triton GEMM dequantizes them in-kernel (CUDA, `moe_backend` "triton" as
    resolved by `config`), in every mode but resident. Resident, every weight fits and the faster form wins: dequantized once at
    load, FP8's in-kernel dequantization cost more than its bytes saved on the H200 (q/k/v of Qwen3-30B-A3B at one
    row 12.0 us against 10.7, at 2048 rows 223 against 129: docs/decisions/dense-projection-tiles-split-k-for-decode.md).
    The values multiplied are the same."""
    kept = cfg.fp8_block == DEFAULT_BLOCK or cfg.expert_format in ("q8_0", "gguf_blocks")
    return (kept and device.type == "cuda" and config.mode != "resident"
            and config.resolve_backend("moe", device) == "triton")


@dataclass(frozen=True)
class EngineConfig:
    """How to run a model: device, expert residency mode, scratch capacity and compute dtype.

    `expert_cap` None means: all experts in resident/offload mode; in paged mode, half the experts
    (at least top_k). Validated against the model by `resolve`.
    """

    model: str
    device: str = "auto"
    mode: str = "paged"
    expert_cap: int | None = None
    dtype: str | None = None
    pin_memory: bool = field(default=True)
    # KV pool and scheduling
    kv_block_size: int = 16
    kv_blocks: int | None = None  # pool size in blocks; default: the admission floor
    kv_bytes: int | None = None  # or in bytes (exclusive with kv_blocks)
    max_concurrency: int = 4  # W: requests running at once, and the promise the floor protects
    max_model_len: int | None = None  # L: prompt + output tokens; default min(max_position_embeddings, 4096)
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS  # tokens per step: decodes, then prefill chunks (chunked prefill)
    per_layer_caps: tuple[int, ...] | None = None  # one cap per MoE layer (a plan's uneven caps), paged and hybrid modes
    moe_backend: str = "auto"  # "torch" (the reference, CPU and CUDA), "triton" (CUDA), auto: triton on CUDA
    attention_backend: str = "auto"  # "torch" (reference) or "triton" (CUDA; same fixed order, one kernel)
    load_format: str = "auto"  # LOAD_FORMATS: the checkpoint as found, one named format, or "dummy" (random weights of the
    # model's shape, made on the device)
    enforce_eager: bool = False  # never replay CUDA graphs (they need both Triton backends)
    cuda_graph_max_batch: int = CUDA_GRAPH_MAX_BATCH  # decode graphs for batch sizes 1..min(this, max_concurrency)
    hybrid_costs: HybridCosts | None = None  # hybrid mode's copy / CPU costs; None: probed at load
    hybrid_cpu_kernel: str | None = None  # hybrid's CPU kernel (HYBRID_CPU_KERNELS); None: native (else plain) with a GPU
    prefetch: bool = False  # copy each next layer's predicted experts ahead (wisp.core.experts.prefetch; eager, paged only)
    hot_experts: int = 0  # hybrid with no slots: each MoE layer's H most-routed experts held on the device (wisp.core.experts.hot_experts)
    embedding: str = "auto"  # the token embedding table: "host" (pinned, read in place), "device"; auto: host on CUDA when untied
    load_control: str = "on"  # decode only as many requests at once as their experts fit the slots (wisp.engine.load_control),
    # "off", or "width:N" (at most N at once, taking turns: a baseline)
    max_decode_wait_ms: float = DEFAULT_MAX_DECODE_WAIT_MS  # load control's bound on a running request's wait between tokens

    def __post_init__(self) -> None:
        if self.kv_blocks is not None and self.kv_bytes is not None:
            raise WispError("give the KV pool size as --kv-blocks or --kv-bytes, not both")
        for name in ("kv_block_size", "max_concurrency", "kv_blocks", "kv_bytes", "max_model_len", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise WispError(f"{name.replace('_', '-')} must be >= 1, got {value}")
        if self.max_num_batched_tokens < self.max_concurrency:
            raise WispError(f"max-num-batched-tokens {self.max_num_batched_tokens} is below --max-concurrency "
                            f"{self.max_concurrency}: every running request's decode token must fit one step")
        if self.mode == "hybrid" and self.expert_cap == 0:  # the old spelling of hybrid with no slots
            log.warning("--mode hybrid --expert-cap 0 is deprecated: it is --mode hybrid-zero-copy")
            object.__setattr__(self, "mode", "hybrid-zero-copy")
        if self.mode not in MODES:
            raise WispError(f"unknown mode {self.mode!r}; choose one of: {', '.join(MODES)}")
        if self.mode == "hybrid-zero-copy":
            if self.expert_cap not in (None, 0) or self.per_layer_caps is not None:
                raise WispError("--mode hybrid-zero-copy keeps no expert slots: give it no --expert-cap (use "
                                "--hot-experts to hold the most-routed experts on the GPU)")
            object.__setattr__(self, "expert_cap", 0)
        if self.expert_cap is not None and self.mode not in (*SCRATCH_MODES, "hybrid-zero-copy"):
            log.warning("--expert-cap %s does nothing in --mode %s: it has no expert slots (%s); the cap is for "
                        "%s", self.expert_cap, self.mode, NO_SLOTS_BECAUSE.get(self.mode, "no slots"),
                        " and ".join(SCRATCH_MODES))
        if self.load_format not in LOAD_FORMATS:
            raise WispError(f"unknown load format {self.load_format!r}; choose one of: {', '.join(LOAD_FORMATS)}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise WispError(f"unknown attention backend {self.attention_backend!r}; choose one of: {', '.join(ATTENTION_BACKENDS)}")
        if self.hybrid_cpu_kernel not in (None, *HYBRID_CPU_KERNELS):
            raise WispError(f"unknown hybrid CPU kernel {self.hybrid_cpu_kernel!r}; choose one of: {', '.join(HYBRID_CPU_KERNELS)}")
        if self.embedding not in EMBEDDINGS:
            raise WispError(f"unknown embedding placement {self.embedding!r}; choose one of: {', '.join(EMBEDDINGS)}")
        if self.prefetch and self.mode != "paged":
            raise WispError(f"--prefetch fills paged mode's expert slots: it needs --mode paged, not {self.mode}")
        if self.hot_experts < 0:
            raise WispError(f"hot-experts must be >= 0, got {self.hot_experts}")
        if self.hot_experts and self.mode != "hybrid-zero-copy":
            raise WispError("--hot-experts holds experts on the GPU for hybrid mode with no slots: it needs "
                            f"--mode hybrid-zero-copy (got --mode {self.mode})")
        try:
            object.__setattr__(self, "load_control", check_load_control(self.load_control))
        except ValueError as exc:
            raise WispError(str(exc)) from None
        if not self.max_decode_wait_ms > 0:
            raise WispError(f"max-decode-wait-ms must be > 0, got {self.max_decode_wait_ms}")
        if self.cuda_graph_max_batch < 0:
            raise WispError(f"cuda-graph-max-batch must be >= 0, got {self.cuda_graph_max_batch}")
        if self.moe_backend not in MOE_BACKENDS:
            raise WispError(f"unknown MoE backend {self.moe_backend!r}; choose one of: {', '.join(MOE_BACKENDS)}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise WispError(f"unknown device {self.device!r}; choose one of: auto, cpu, cuda")
        parse_dtype(self.dtype)

    def torch_device(self) -> torch.device:
        return resolve_device(self.device)

    def resolve_backend(self, kind: str, device: torch.device) -> str:
        """The "moe" or "attention" backend in use: "auto" is triton on CUDA, torch elsewhere; triton off
        CUDA is a WispError, as is zero-copy on CUDA without the Triton MoE kernel (only it reads host memory)."""
        name = self.moe_backend if kind == "moe" else self.attention_backend
        if name == "auto":
            name = "triton" if device.type == "cuda" else "torch"
        if name == "triton" and device.type != "cuda":
            raise WispError(f"--{kind}-backend triton needs a CUDA device (this run is on {device.type})")
        if kind == "moe" and self.reads_in_place and device.type == "cuda":
            what = f"--mode {self.mode}"
            if name != "triton":
                raise WispError(f"{what} reads experts from host memory in place and needs --moe-backend triton")
            if not self.pin_memory:
                raise WispError(f"{what} reads experts in place, which needs pinned host memory (pin_memory=True)")
        return name

    @property
    def reads_in_place(self) -> bool:
        """Whether the GPU's kernel reads experts from pinned host memory: zero-copy, and hybrid-zero-copy."""
        return self.mode in IN_PLACE_MODES

    def resolve_max_model_len(self, model: ModelConfig) -> int:
        limit = model.max_position_embeddings
        if self.max_model_len is None:
            return min(limit, 4096)
        if self.max_model_len > limit:
            raise WispError(f"max-model-len {self.max_model_len} exceeds the model's max_position_embeddings {limit}")
        return self.max_model_len

    def resolve_layer_caps(self, model: ModelConfig) -> list[int]:
        """The scratch capacity of each MoE layer, each checked against top_k <= C <= num_experts."""
        if self.hot_experts > model.num_experts:
            raise WispError(f"hot-experts {self.hot_experts} exceeds the model's {model.num_experts} experts per layer")
        if self.per_layer_caps is None:
            return [self.resolve_cap(model)] * len(model.moe_layer_ids)
        caps = [int(c) for c in self.per_layer_caps]
        if len(caps) != len(model.moe_layer_ids):
            raise WispError(f"{len(caps)} per-layer caps given for {len(model.moe_layer_ids)} MoE layers")
        for cap in caps:
            check_cap(cap, model)
        return caps

    def resolve_cap(self, model: ModelConfig) -> int:
        """The per-layer scratch capacity C, checked against top_k <= C <= num_experts."""
        n, k = model.num_experts, model.top_k
        if self.expert_cap is None:
            return n if self.mode not in SCRATCH_MODES else max(k, n // 2)
        return check_cap(int(self.expert_cap), model, self.mode)


NO_SLOTS_BECAUSE = {"resident": "every expert stays on the device", "offload": "each layer is copied in whole",
                    "zero-copy": "experts are read from host memory in place"}


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; asking for cuda without one is a WispError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise WispError("--device cuda was asked for but no CUDA device is available")
    return torch.device(name)


def check_cap(cap: int, model: ModelConfig, mode: str | None = None) -> int:
    """top_k <= cap <= num_experts; hybrid-zero-copy keeps none (0: the GPU reads in place what the CPU does
    not compute)."""
    n, k = model.num_experts, model.top_k
    if cap == 0 and mode == "hybrid-zero-copy":
        return cap
    if cap < k or cap > n:
        also = " (or --mode hybrid-zero-copy, with no slots)" if mode == "hybrid" else ""
        raise WispError(f"expert cap {cap} is out of range: it must be between top_k={k} and num_experts={n}{also}")
    return cap
