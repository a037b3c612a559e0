"""What every `wisp` parser shares: the parser class, the argument types, the option groups and the
names the command line offers.

Invariant: this module imports neither torch nor the engine, so `wisp --help` (and a typo caught by
argparse) answers without loading them; tests/test_layering.py enforces it. The option names come from
`wisp.options`, which the engine's config and the planner read too.

Bad input is one line on stderr and exit status 2, never a traceback: `Parser.error` goes through `fail`.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import NoReturn

from wisp.options import (ATTENTION_BACKENDS, CACHE_POLICIES, CUDA_GRAPH_MAX_BATCH, DEFAULT_MAX_DECODE_WAIT_MS,
                          EMBEDDINGS, LOAD_FORMATS, MAX_NUM_BATCHED_TOKENS, MODES, MOE_BACKENDS, check_load_control)
from wisp.options import DTYPE_NAMES as DTYPES

__all__ = [  # CACHE_POLICIES, DTYPES and LOAD_FORMATS are offered here for the parsers built elsewhere (cli, plan.args)
    "ATTENTION_BACKENDS", "CACHE_POLICIES", "CUDA_GRAPH_MAX_BATCH", "DTYPES", "EMBEDDINGS", "LOAD_FORMATS", "MAX_NUM_BATCHED_TOKENS",
    "MODES", "MOE_BACKENDS",
    "Parser", "add_backend_args", "add_engine_args", "backend_options", "fail", "parse_load_control", "parse_output_file",
    "parse_port", "parse_positive_float",
    "parse_positive_int",
    "parse_size", "parse_token_ids",
]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one `wisp: error:` line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message}")


def fail(message: str) -> NoReturn:
    # one line, whatever the message holds (hub and safetensors errors can span several)
    message = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    print(f"wisp: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_output_file(text: str) -> str:
    """A file the command will write: its folder must exist and be writable, and it must not be a folder itself
    (checked before any work, so a typo costs one line, not a run)."""
    path = os.path.abspath(os.path.expanduser(text))
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"cannot write {text}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: the folder {folder} is not writable")
    return text


def parse_token_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids is empty")
    return ids


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def parse_count(text: str) -> int:
    """An integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def parse_positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def parse_load_control(text: str) -> str:
    try:
        return check_load_control(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def parse_port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}")
    return value


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'2GiB' -> 2*2**30, '512MiB', '1.5GB' -> 1.5e9, '1e9' -> 10**9, '4096' -> 4096 (bytes, > 0)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected a size like 2GiB, 512MiB, 1e9 or 4096, got {text!r}")
    number, prefix, binary = match.groups()
    power = "kmgt".find(prefix.lower()) + 1 if prefix else 0
    if binary and not prefix:
        raise argparse.ArgumentTypeError(f"expected a size like 2GiB, 512MiB, 1e9 or 4096, got {text!r}")
    scaled = float(number) * ((1024 if binary else 1000) ** power)
    if not math.isfinite(scaled):
        raise argparse.ArgumentTypeError(f"size {text!r} is not a finite number of bytes")
    value = int(scaled)
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    return value


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """Where and how the engine runs: --device, the two kernel backends, --enforce-eager, --embedding (every
    command; `backend_options` hands them to the engine's config)."""
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--moe-backend", choices=MOE_BACKENDS, default="auto",
                   help="fused-MoE implementation (auto: triton on CUDA, torch on the CPU)")
    p.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                   help="paged attention (auto: triton on CUDA, torch on the CPU)")
    p.add_argument("--enforce-eager", action="store_true", help="never replay CUDA graphs for decode steps")
    p.add_argument("--cuda-graph-max-batch", type=parse_count, default=CUDA_GRAPH_MAX_BATCH, metavar="B",
                   help="decode steps of up to B requests (and --max-concurrency) replay CUDA graphs, one captured per "
                        f"batch size at start; wider steps run eagerly (default {CUDA_GRAPH_MAX_BATCH}; 0: none)")
    p.add_argument("--embedding", choices=EMBEDDINGS, default="auto",
                   help="where the token embedding table lives: host (pinned, each token's row read in place: "
                        "vocab x hidden bytes of VRAM freed) or device (auto: host on CUDA unless it is also the LM head)")
    p.add_argument("--hot-experts", type=int, default=0, metavar="H",
                   help="hybrid mode with no slots (--mode hybrid --expert-cap 0): hold each MoE layer's H most-routed "
                        "experts on the GPU (H x layers x one expert's bytes of VRAM); decode steps under CUDA graphs "
                        "serve their pairs from there instead of host memory")
    p.add_argument("--load-control", type=parse_load_control, default="on", metavar="on|off|width:N",
                   help="decode only as many running requests at once as their experts fit in the slots, the others "
                        "waiting their turn (off: every running request decodes at every step; width:N: at most N at "
                        "once, taking turns, a fixed-width baseline)")
    p.add_argument("--max-decode-wait-ms", type=parse_positive_float, default=DEFAULT_MAX_DECODE_WAIT_MS, metavar="MS",
                   help="load control's bound on how long a running request waits between two of its tokens")


def backend_options(args: argparse.Namespace) -> dict:
    """The `add_backend_args` options as EngineConfig fields."""
    return {"device": args.device, "moe_backend": args.moe_backend, "attention_backend": args.attention_backend,
            "enforce_eager": args.enforce_eager, "embedding": args.embedding, "hot_experts": args.hot_experts,
            "load_control": args.load_control, "max_decode_wait_ms": args.max_decode_wait_ms,
            "cuda_graph_max_batch": args.cuda_graph_max_batch}


def add_engine_args(p: argparse.ArgumentParser, record_help: str) -> None:
    """The engine options `generate` and `serve` share."""
    p.add_argument("--model", required=True, help="checkpoint directory, or 'demo' for the built-in tiny MoE")
    p.add_argument("--mode", choices=MODES, default="paged")
    p.add_argument("--expert-cap", type=int, default=None,
                   help="scratch slots per MoE layer (paged and hybrid modes; hybrid also takes 0: no slots, the GPU "
                        "reads in place what the CPU does not compute)")
    add_backend_args(p)
    p.add_argument("--max-num-batched-tokens", type=parse_positive_int, default=MAX_NUM_BATCHED_TOKENS,
                   help="tokens per engine step: decodes first, then prefill chunks (a longer prompt is chunked)")
    p.add_argument("--record-routing", default=None, metavar="FILE", help=record_help)
