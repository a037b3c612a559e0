"""The arguments of `wisp bench decode`, `wisp bench prefill` and `wisp bench agent` (their
implementations are in wisp/bench/decode.py, wisp/bench/prefill.py and wisp/bench/agent.py).

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
    _add_agent_parser(kinds)


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
                     help="replay these recorded expert choices during decode (benchmark only; a one-layer trace is "
                          "spread over all layers, an approximation); 'uniform': i.i.d. uniform choices")
    dec.add_argument("--vram-budget", type=parse_size, default=None,
                     help="size paged runs' cap from this VRAM budget (with --expert-cap 0: hybrid's hot experts)")
    dec.add_argument("--prefetch", action="store_true",
                     help="paged runs copy each next layer's predicted experts ahead (eager; wisp.core.experts.prefetch)")
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


def _add_agent_parser(kinds) -> None:
    agent = kinds.add_parser("agent", help="multi-turn agent sessions against one VRAM budget, per allocator arm")
    agent.add_argument("--model", required=True, help="checkpoint dir, 'demo', or a preset with --load-format dummy")
    agent.add_argument("--load-format", choices=["safetensors", "dummy"], default="safetensors")
    agent.add_argument("--sessions", nargs="+", required=True, metavar="FILE",
                       help="AgentInstruct .json/.jsonl or the agentinfer log; several run back to back")
    agent.add_argument("--concurrency", type=int, default=4, help="sessions at once (W, also the engine's)")
    agent.add_argument("--vram-budget", type=parse_size, required=True, help="the whole device budget, e.g. 8GiB")
    agent.add_argument("--arms", default="mv-wsa,50-50,kv-blind,zero-copy,offload,controller",
                       help="comma list of mv-wsa, 50-50, kv-blind, zero-copy, offload, controller")
    agent.add_argument("--max-model-len", type=int, default=4096)
    agent.add_argument("--max-reply-tokens", type=int, default=64, help="cap on each reply (the dataset's length)")
    agent.add_argument("--max-sessions", type=int, default=None, help="only the first N sessions")
    agent.add_argument("--routing-trace", default=None, metavar="FILE",
                       help="real routing for every token (a one-layer trace is spread over all layers); 'uniform': "
                            "i.i.d. uniform top-k, a no-locality bound")
    agent.add_argument("--controller-start", choices=["plan", "50-50", "kv-blind"], default="plan",
                       help="the split the controller arm starts from")
    agent.add_argument("--max-num-batched-tokens", type=int, default=MAX_NUM_BATCHED_TOKENS)
    agent.add_argument("--resolve-every", type=int, default=32, help="controller: engine steps between re-solves")
    agent.add_argument("--min-gain", type=float, default=0.05, help="controller: hysteresis (relative latency gain)")
    agent.add_argument("--half-life", type=float, default=20000.0, help="controller: references per half-weight")
    agent.add_argument("--min-observations", type=int, default=2000, help="controller: expert references first")
    add_backend_args(agent)
    agent.add_argument("--out", default=None, help="write the records as a JSON list here")
    agent.add_argument("--plot", default=None, help="draw turn wall and TTFT per arm into this PNG")


def _add_model_and_modes(p, default_modes: str, modes: str) -> None:
    """What every bench runs: a model (or a shape preset) and the expert modes and caps to compare."""
    p.add_argument("--model", required=True, help="checkpoint dir, 'demo', or a preset with --load-format dummy")
    p.add_argument("--load-format", choices=["safetensors", "dummy"], default="safetensors")
    p.add_argument("--mode", default=default_modes, help=f"comma list of {modes}")
    p.add_argument("--expert-cap", default=None, help="comma list of caps for paged and hybrid runs (hybrid: 0 for no slots)")
