"""The arguments of `wisp bench decode` and `wisp bench prefill` (their implementations are in
wisp/bench/decode.py and wisp/bench/prefill.py).

Invariant: imports neither torch nor the engine (see wisp/cli_args.py), so building the parser is cheap.
"""

from __future__ import annotations

from wisp.cli_args import MAX_NUM_BATCHED_TOKENS, add_backend_args, parse_size


def add_parser(sub) -> None:
    """`wisp bench` and its kinds."""
    bench = sub.add_parser("bench", help="benchmarks")
    kinds = bench.add_subparsers(dest="bench", required=True)
    _add_decode_parser(kinds)
    _add_prefill_parser(kinds)


def _add_decode_parser(kinds) -> None:
    dec = kinds.add_parser("decode", help="batch-1 decode in one or more expert modes")
    _add_model_and_modes(dec, "paged", "paged, resident, offload, zero-copy, accelerate")
    dec.add_argument("--prompt-len", type=int, default=128)
    dec.add_argument("--batch", default="1", help="comma list: requests decoded together (one token each per step)")
    dec.add_argument("--decode-tokens", type=int, default=128)
    dec.add_argument("--temperature", type=float, default=0.0)
    dec.add_argument("--dtype", default=None)
    add_backend_args(dec)
    dec.add_argument("--routing-trace", default=None, metavar="FILE",
                     help="replay these recorded expert choices during decode (benchmark only)")
    dec.add_argument("--vram-budget", type=parse_size, default=None, help="size paged runs' cap from this VRAM budget")
    dec.add_argument("--peer-decode-tokens", type=int, default=16, help="decode tokens of the (slow) accelerate peer")
    dec.add_argument("--out", default=None, help="write the records as a JSON list here")


def _add_prefill_parser(kinds) -> None:
    pre = kinds.add_parser("prefill", help="cold time to first token against prompt length")
    _add_model_and_modes(pre, "resident,paged", "paged, resident, offload, zero-copy")
    pre.add_argument("--prompt-len", default="128,512,2048", help="comma list of prompt lengths")
    pre.add_argument("--max-num-batched-tokens", type=int, default=MAX_NUM_BATCHED_TOKENS,
                     help="the engine's token budget per step (prefill chunk size)")
    add_backend_args(pre)
    pre.add_argument("--out", default=None, help="write the records as a JSON list here")
    pre.add_argument("--plot", default=None, help="draw TTFT against prompt length into this PNG")


def _add_model_and_modes(p, default_modes: str, modes: str) -> None:
    """What every bench runs: a model (or a shape preset) and the expert modes and caps to compare."""
    p.add_argument("--model", required=True, help="checkpoint dir, 'demo', or a preset with --load-format dummy")
    p.add_argument("--load-format", choices=["safetensors", "dummy"], default="safetensors")
    p.add_argument("--mode", default=default_modes, help=f"comma list of {modes}")
    p.add_argument("--expert-cap", default=None, help="comma list of caps for paged runs")
