"""The `wisp` command line: `wisp generate|serve|plan|sim|bench ...`.

Building the parser imports neither torch nor the engine (the argument definitions live in torch-free
modules: wisp/cli_args.py, wisp/plan/args.py, wisp/sim/args.py, wisp/bench/args.py); a command's implementation is
imported only when it runs, so `wisp --help` is instant.

Bad input is one line on stderr and exit status 2, never a traceback: argparse errors and every
`WispError` raised below go through `fail`. `wisp serve` exits 0 after SIGINT/SIGTERM once its
requests have finished or, past a grace period, been aborted (see wisp/server/serve.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from collections.abc import Callable

from wisp.bench.args import add_parser as add_bench_parser
from wisp.cli_args import (
    DTYPES, LOAD_FORMATS, Parser, add_engine_args, backend_options, fail, parse_port, parse_positive_float, parse_positive_int,
    parse_size, parse_token_ids,
)
from wisp.errors import WispError
from wisp.options import is_hybrid_zero_copy
from wisp.plan.args import add_parser as add_plan_parser
from wisp.sim.args import add_parser as add_sim_parser


CLI_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}  # `generate`'s defaults where the model has none


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="wisp", description="Serve MoE models on GPUs too small to hold them.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add_generate_parser(sub)
    _add_serve_parser(sub)
    add_plan_parser(sub)
    add_sim_parser(sub)
    add_bench_parser(sub)
    return parser


def _add_generate_parser(sub) -> None:
    gen = sub.add_parser("generate", help="generate from one prompt")
    add_engine_args(gen, "write the routed experts (.npz/.jsonl)")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-ids", type=parse_token_ids, help="prompt as comma-separated token ids")
    gen.add_argument("--max-tokens", type=int, default=16)
    gen.add_argument("--temperature", type=float, default=None,
                     help="0: greedy; default: the model's generation_config.json, else 0")
    gen.add_argument("--top-p", type=float, default=None, help="default: the model's generation_config.json, else 1")
    gen.add_argument("--top-k", type=int, default=None, help="default: the model's generation_config.json, else 0 (off)")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--dtype", choices=["auto", *DTYPES], default="auto")
    gen.add_argument("--json", action="store_true", help="print one JSON object with tokens, text and stats")


def _add_serve_parser(sub) -> None:
    srv = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API")
    add_engine_args(srv, "write the routed experts at shutdown")
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    srv.add_argument("--port", type=parse_port, default=8000, help="port to bind (0: any free port)")
    kv = srv.add_mutually_exclusive_group()
    kv.add_argument("--kv-blocks", type=parse_positive_int, default=None, help="KV cache size in blocks")
    kv.add_argument("--kv-bytes", type=parse_size, default=None, help="KV cache size in bytes, e.g. 2GiB, 512MiB, 1e9")
    srv.add_argument("--max-concurrency", type=parse_positive_int, default=4, help="most requests running at once")
    srv.add_argument("--max-model-len", type=parse_positive_int, default=None, help="longest prompt + completion, tokens")
    srv.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    srv.add_argument("--max-request-bytes", type=parse_size, default="4MiB", metavar="SIZE",
                     help="largest request body accepted, e.g. 4MiB (default), 16MiB; a larger one gets a 413")
    srv.add_argument("--max-connections", type=parse_positive_int, default=1024,
                     help="connections open at once; past it a new one is closed at accept (default 1024)")
    srv.add_argument("--header-timeout", type=parse_positive_float, default=10.0, metavar="S",
                     help="seconds a connection has to send a request's headers (default 10)")
    srv.add_argument("--body-timeout", type=parse_positive_float, default=60.0, metavar="S",
                     help="seconds a request has to send its body after its headers (default 60)")
    srv.add_argument("--keep-alive-timeout", type=parse_positive_float, default=5.0, metavar="S",
                     help="seconds an idle keep-alive connection stays open (default 5)")
    sizing = srv.add_mutually_exclusive_group()
    sizing.add_argument("--plan", default=None, metavar="PLAN.json", help="size both pools from `wisp plan` output")
    sizing.add_argument("--vram-budget", type=parse_size, default=None,
                        help="plan both pools for this budget from a short built-in warm-up trace (hybrid with "
                             "--expert-cap 0: the KV pool's floor, then as many hot experts a layer as fit)")
    srv.add_argument("--split-controller", action="store_true",
                     help="with --plan or --vram-budget: re-split the budget while serving as the workload drifts")
    srv.add_argument("--load-format", choices=LOAD_FORMATS, default="auto",
                     help="auto: the checkpoint as found (a safetensors folder or a GGUF file); safetensors, gguf: "
                          "only that format; dummy: random weights of the model's (or a preset's) shape, made on the "
                          "device (no tokenizer: prompts as token ids)")
    srv.add_argument("--enable-resize-endpoint", action="store_true",
                     help="(debug) mount POST /admin/resize {expert_cap, kv_blocks}: resize both pools live; "
                          "for soak tests (`wisp bench soak`), never for production")


def _start_split_controller(engine, plan) -> None:
    from wisp.engine.split_controller.controller import ControllerConfig, SplitController, problem_of_plan

    if plan.report is None:
        raise WispError("--split-controller needs the budget and costs a plan was solved under: a plan file written "
                        "by `wisp plan` (this one has only caps and blocks), or --vram-budget")
    logging.getLogger("wisp.controller").setLevel(logging.INFO)  # every resize is logged: when, from -> to, why
    problem = problem_of_plan(plan.report, engine.model_config.top_k, engine.model_config.num_experts)
    cap = plan.report.expert_cap
    engine.set_live_split(SplitController(ControllerConfig(problem), cap, problem.kv_blocks(cap)))


def sampling_params(args: argparse.Namespace, model_defaults: tuple[tuple[str, float], ...] = ()):
    """`generate`'s SamplingParams: each of --temperature, --top-p, --top-k as given, else the model's
    generation_config value (`ModelConfig.sampling_defaults`), else `CLI_SAMPLING`'s."""
    from wisp import SamplingParams

    given = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}
    chosen = {**CLI_SAMPLING, **dict(model_defaults), **{k: v for k, v in given.items() if v is not None}}
    return SamplingParams(max_tokens=args.max_tokens, temperature=chosen["temperature"], top_p=chosen["top_p"],
                          top_k=int(chosen["top_k"]), seed=args.seed)


def cmd_generate(args: argparse.Namespace) -> int:
    from wisp import LLM
    from wisp.trace.recorder import check_trace_path, recorder_for, save_trace

    sampling_params(args)  # the flags' own errors come before the model loads
    if args.record_routing:
        check_trace_path(args.record_routing)
    llm = LLM(args.model, mode=args.mode, expert_cap=args.expert_cap, dtype=args.dtype,
              max_num_batched_tokens=args.max_num_batched_tokens, **backend_options(args))
    params = sampling_params(args, llm.config.sampling_defaults)
    recorder = recorder_for(llm.engine, args.model, args.record_routing) if args.record_routing else None
    out = llm.generate([args.prompt if args.prompt is not None else args.prompt_ids], params)[0]
    stats = llm.stats()
    if args.json:
        print(json.dumps({"token_ids": out.token_ids, "text": out.text, "finish_reason": out.finish_reason, "stats": stats}))
    else:
        print(out.text if llm.tokenizer is not None else " ".join(map(str, out.token_ids)))
        print(
            f"[{stats['mode']} cap={stats['expert_cap']}] hits={stats['expert_hits']} misses={stats['expert_misses']} "
            f"hit_rate={stats['hit_rate']:.2f} h2d={stats['bytes_h2d'] / 2**20:.1f} MiB",
            file=sys.stderr,
        )
    if recorder is not None:
        save_trace(recorder.trace, args.record_routing)
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) TCP socket, so a taken port is a one-line error before the model loads."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        raise WispError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _apply_startup_plan(engine, plan) -> None:
    """Size the pools from a plan; a device out-of-memory doing so is one clear error (the plan's budget is
    more than this device has free), not a traceback."""
    import torch

    caps, blocks = list(plan.per_layer_caps), plan.kv_blocks
    try:
        engine.apply_plan(caps, blocks)
        return
    except torch.OutOfMemoryError as exc:
        cause = " ".join(str(exc).split())[:200]
    slot = engine.model_config.slot_bytes
    raise WispError(f"out of device memory applying the plan ({cause}): expert caps {caps} "
                    f"({sum(caps) * engine.model_config.expert_bytes} bytes; {slot} per cap step) and "
                    f"{blocks} KV blocks ({blocks * engine.block_bytes} bytes) do not fit beside the weights; "
                    "plan for a smaller --vram-budget")


def _check_hot_budget_flags(args: argparse.Namespace) -> None:
    """Before loading: with --vram-budget, hybrid with no slots sizes its hot experts itself, once."""
    if not (args.vram_budget and is_hybrid_zero_copy(args.mode, args.expert_cap)):
        return
    if args.hot_experts:
        raise WispError("--hot-experts and --vram-budget both size hybrid's hot experts: give one")
    if args.split_controller:
        raise WispError("--split-controller re-splits expert slots and KV blocks; hybrid-zero-copy has no slots "
                        "(--vram-budget sizes its hot experts once)")


def _hold_hot_for_budget(engine, args: argparse.Namespace) -> str:
    """Hybrid with no slots under --vram-budget: the KV pool's floor, then as many hot experts a layer as the
    rest holds (`wisp.plan.hot_budget`); returns the line that says so."""
    import torch

    from wisp.engine.warmup import plan_inputs
    from wisp.plan.hot_budget import hot_split

    split = hot_split(engine.model_config, plan_inputs(engine, args.vram_budget))
    try:
        engine.hold_hot_experts(split.hot_experts, split.kv_blocks)
    except torch.OutOfMemoryError as exc:
        raise WispError(f"out of device memory holding {split.hot_experts} hot experts a layer and "
                        f"{split.kv_blocks} KV blocks ({' '.join(str(exc).split())[:200]}): "
                        "give a smaller --vram-budget") from None
    return (f"wisp: budget applied: {split.hot_experts} hot experts a layer, {split.kv_blocks} KV blocks "
            f"(hybrid-zero-copy)")


def cmd_serve(args: argparse.Namespace) -> int:
    from wisp.config import EngineConfig
    from wisp.engine.async_engine import AsyncEngine
    from wisp.engine.engine import LLMEngine
    from wisp.server.app import build_app
    from wisp.server.connections import ConnectionLimits
    from wisp.server.serve import serve
    from wisp.trace.recorder import recorder_for, save_trace

    _check_hot_budget_flags(args)
    sock = _bind(args.host, args.port)
    try:
        engine = LLMEngine(EngineConfig(
            model=args.model, mode=args.mode, expert_cap=args.expert_cap, kv_blocks=args.kv_blocks,
            kv_bytes=args.kv_bytes, max_concurrency=args.max_concurrency, max_model_len=args.max_model_len,
            max_num_batched_tokens=args.max_num_batched_tokens, load_format=args.load_format, **backend_options(args),
        ))
        if args.vram_budget and engine.can_hold_hot:  # hybrid-zero-copy: the budget sizes its hot experts
            print(_hold_hot_for_budget(engine, args), flush=True)
        elif args.plan or args.vram_budget:
            from wisp.engine.warmup import plan_from_file, plan_from_warmup

            plan = plan_from_file(args.plan, engine.config.kv_block_size) if args.plan else plan_from_warmup(engine, args.vram_budget)
            _apply_startup_plan(engine, plan)
            print(f"wisp: plan applied: expert caps {list(plan.per_layer_caps)}, {plan.kv_blocks} KV blocks", flush=True)
            if args.split_controller:
                _start_split_controller(engine, plan)
        elif args.split_controller:
            raise WispError("--split-controller needs --plan or --vram-budget: the budget it splits")
        recorder = recorder_for(engine, args.model, args.record_routing) if args.record_routing else None
    except BaseException:
        sock.close()
        raise
    async_engine = AsyncEngine(engine)
    if async_engine.sampling_defaults:  # as vLLM's server says it: requests that leave these out sample with them
        print(f"wisp: sampling defaults from the model's generation_config: {async_engine.sampling_defaults}", flush=True)
    app = build_app(async_engine, args.model, api_key=args.api_key, max_request_bytes=args.max_request_bytes)
    if args.enable_resize_endpoint:
        from wisp.server.admin import add_resize_route

        add_resize_route(app, async_engine, args.api_key)
    host = f"[{args.host}]" if ":" in args.host else args.host
    limits = ConnectionLimits(args.max_connections, args.header_timeout, args.body_timeout, args.keep_alive_timeout)
    serve(app, async_engine, sock, f"wisp: serving {args.model} on http://{host}:{sock.getsockname()[1]}", limits=limits)
    if recorder is not None:
        save_trace(recorder.trace, args.record_routing)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """The bench kind's function (named by wisp/bench/args.py in `run_bench`), imported only now; its exit
    status where it returns one (an int), else 0."""
    import importlib

    module, _, function = args.run_bench.rpartition(".")
    status = getattr(importlib.import_module(module), function)(args)
    return status if isinstance(status, int) else 0


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs command `name`; plan and sim are imported only now (they load torch)."""
    if name == "plan":
        from wisp.plan.commands import cmd_plan

        return cmd_plan
    if name == "sim":
        from wisp.sim.commands import cmd_sim

        return cmd_sim
    return {"generate": cmd_generate, "serve": cmd_serve, "bench": cmd_bench}[name]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="wisp: %(message)s")  # warnings (a deprecated spelling) read as the errors do
    try:
        status = _command(args.command)(args)
        sys.stdout.flush()  # a reader that left shows here, not at interpreter exit
        return status
    except WispError as exc:
        fail(str(exc))
    except BrokenPipeError:  # the reader of stdout left (`wisp sim ... | head`): the rest goes nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        fail("stdout was closed before all of the output was written (broken pipe)")


if __name__ == "__main__":
    raise SystemExit(main())
