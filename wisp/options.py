"""The names of wisp's choices (expert modes, kernel backends, dtypes, cache policies) and the token
budget's default, in one torch-free place: the engine's config and the command line both read them here,
so `wisp --help` can list them without loading torch."""

MODES = ("paged", "resident", "offload", "zero-copy", "hybrid", "hybrid-zero-copy")  # wisp.core.experts.presets
SCRATCH_MODES = ("paged", "hybrid")  # modes with a C-slot expert scratch per layer (hybrid: paged + CPU misses)
IN_PLACE_MODES = ("zero-copy", "hybrid-zero-copy")  # no slots: the GPU's kernel reads experts from pinned host memory
HYBRID_CPU_KERNELS = ("native", "plain", "reference")  # hybrid mode's CPU kernels (wisp.core.kernels.cpu_expert_kernels)
MOE_BACKENDS = ("auto", "torch", "triton")  # auto: triton on CUDA, torch on the CPU
ATTENTION_BACKENDS = ("auto", "torch", "triton")
EMBEDDINGS = ("auto", "device", "host")  # where the token embedding table lives (auto: host on CUDA when untied)
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")  # auto: the checkpoint as found; dummy: random weights
DTYPE_NAMES = ("float32", "bfloat16", "float16")
CACHE_POLICIES = ("lru", "opt", "lfu", "lrfu", "arc", "static")  # the replacement policies `wisp sim` replays
DEFAULT_MAX_DECODE_WAIT_MS = 2000.0  # load control's bound on a running request's wait between two tokens
MAX_NUM_BATCHED_TOKENS = 2048  # tokens per engine step (decodes, then prefill chunks)
# decode steps of up to this many requests replay CUDA graphs, one captured per batch size (0: none; 32 measured:
# docs/decisions/decode-graphs-up-to-32-requests.md)
CUDA_GRAPH_MAX_BATCH = 32


def is_hybrid_zero_copy(mode: str, expert_cap: int | None) -> bool:
    """hybrid-zero-copy, also in its deprecated spelling `--mode hybrid --expert-cap 0`."""
    return mode == "hybrid-zero-copy" or (mode == "hybrid" and expert_cap == 0)


def check_load_control(text: str) -> str:
    """`text` if it names a load control: "on" (by working sets), "off", or "width:N" (at most N requests decode at
    once, taking turns under the same wait bound: the fixed-width baseline load control is measured against);
    else ValueError with the choices."""
    if text in ("on", "off"):
        return text
    kind, _, width = text.partition(":")
    if kind == "width" and width.isdigit() and int(width) >= 1:
        return f"width:{int(width)}"
    raise ValueError(f"unknown load control {text!r}; choose one of: on, off, width:N (N >= 1)")
