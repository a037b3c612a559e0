"""The arguments of every `wisp bench` kind: decode, prefill, serve, agent, soak, accuracy, perplexity, and the tool groups
llama-cpp (run, compare, pair, gguf, peak, sampler-cost), sweep (moe-attention, linear, cpu-experts) and
profile (steps, sampling, timeline).

Each kind's parser names the function that runs it in `run_bench` ("module.function" under wisp/bench/);
`wisp.cli.cmd_bench` imports it only then.

Invariant: imports neither torch nor the engine (see wisp/cli_args.py), so building the parser is cheap.
"""

from __future__ import annotations

import argparse

from collections.abc import Callable

from wisp.cli_args import (LOAD_FORMATS, MAX_NUM_BATCHED_TOKENS, MODES, add_backend_args, parse_load_control, parse_output_file,
                           parse_positive_float, parse_positive_int, parse_size)


def add_parser(sub) -> None:
    """`wisp bench` and its kinds."""
    bench = sub.add_parser("bench", help="benchmarks")
    kinds = bench.add_subparsers(dest="bench", required=True)
    _add_decode_parser(kinds)
    _add_prefill_parser(kinds)
    _add_serve_parser(kinds)
    _add_agent_parser(kinds)
    _add_soak_parser(kinds)
    _add_accuracy_parser(kinds)
    _add_perplexity_parser(kinds)
    _add_llama_cpp_parsers(kinds)
    _add_sweep_parsers(kinds)
    _add_profile_parsers(kinds)


def _kind(kinds, name: str, run: str, help: str, **kw) -> argparse.ArgumentParser:
    """A bench kind's parser, run by wisp.bench.`run` ("module.function")."""
    p = kinds.add_parser(name, help=help, description=help, **kw)
    p.set_defaults(run_bench=f"wisp.bench.{run}")
    return p


def _group(kinds, name: str, help: str, dest: str):
    """A kind that is a group of tools (`wisp bench NAME TOOL ...`): the subparsers its tools are added to."""
    return kinds.add_parser(name, help=help, description=help).add_subparsers(dest=dest, required=True)


def parse_int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def list_of(parse: Callable[[str], object]) -> Callable[[str], list]:
    """A comma-list argument type; `parse` reads each item (its ArgumentTypeError names a bad one)."""
    def parse_list(text: str) -> list:
        items = [part.strip() for part in text.split(",") if part.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return [parse(item) for item in items]

    return parse_list



def _add_decode_parser(kinds) -> None:
    dec = _kind(kinds, "decode", "decode.bench_decode", "batch-1 decode in one or more expert modes")
    _add_model_and_modes(dec, "paged", "paged, resident, offload, zero-copy, accelerate")
    dec.add_argument("--prompt-len", type=int, default=128)
    dec.add_argument("--batch", default="1", help="comma list: requests decoded together (one token each per step)")
    dec.add_argument("--decode-tokens", type=int, default=128)
    dec.add_argument("--temperature", type=float, default=0.0)
    dec.add_argument("--dtype", default=None)
    add_backend_args(dec)
    dec.add_argument("--routing-trace", default=None, metavar="FILE",
                     help="replay these recorded expert choices during decode, request i its sequence i mod S "
                          "(benchmark only; a one-layer trace is spread over all layers, an approximation); "
                          "'uniform': i.i.d. uniform choices, independent per request")
    dec.add_argument("--vram-budget", type=parse_size, default=None,
                     help="size paged runs' cap from this VRAM budget (with --expert-cap 0: hybrid's hot experts)")
    dec.add_argument("--prefetch", action="store_true",
                     help="paged runs copy each next layer's predicted experts ahead (eager; wisp.core.experts.prefetch)")
    dec.add_argument("--peer-decode-tokens", type=int, default=16, help="decode tokens of the (slow) accelerate peer")
    dec.add_argument("--out", type=parse_output_file, default=None, help="write the records as a JSON list here")


def _add_prefill_parser(kinds) -> None:
    pre = _kind(kinds, "prefill", "prefill.bench_prefill", "cold time to first token against prompt length")
    _add_model_and_modes(pre, "resident,paged", "paged, resident, offload, zero-copy")
    pre.add_argument("--prompt-len", default="128,512,2048", help="comma list of prompt lengths")
    pre.add_argument("--max-num-batched-tokens", type=int, default=MAX_NUM_BATCHED_TOKENS,
                     help="the engine's token budget per step (prefill chunk size)")
    add_backend_args(pre)
    pre.add_argument("--out", type=parse_output_file, default=None, help="write the records as a JSON list here")
    pre.add_argument("--plot", type=parse_output_file, default=None, help="draw TTFT against prompt length into this PNG")


def _add_serve_parser(kinds) -> None:
    # conflict_handler: its --load-control (a list) replaces add_backend_args' single setting
    srv = _kind(kinds, "serve", "serve.run.bench_serve", "concurrent streams: aggregate tok/s, TTFT, inter-token "
                "latency and decode width per concurrency (closed loop) or request rate (open loop)",
                conflict_handler="resolve")
    srv.add_argument("--model", required=True, help="checkpoint dir, 'demo', or a preset with --load-format dummy")
    srv.add_argument("--load-format", choices=LOAD_FORMATS, default="auto")
    srv.add_argument("--mode", choices=MODES, default="paged")
    srv.add_argument("--expert-cap", type=int, default=None, help="scratch slots per MoE layer (paged, hybrid)")
    srv.add_argument("--dtype", default=None)
    srv.add_argument("--concurrency", type=list_of(parse_positive_int), default=None, metavar="W,...",
                     help="closed loop: W requests in flight at all times, one run per W (default 1 without "
                          "--request-rate)")
    srv.add_argument("--request-rate", type=list_of(parse_positive_float), default=None, metavar="R,...",
                     help="open loop: Poisson arrivals at R requests/s (seeded), one run per R")
    srv.add_argument("--num-requests", type=parse_positive_int, default=None,
                     help="requests per run (default: max(8, 2W) closed, 8 open)")
    srv.add_argument("--prompt-len", type=parse_positive_int, default=128, help="random token ids, distinct per request")
    srv.add_argument("--output-len", type=parse_positive_int, default=128, help="tokens each request generates (ignore_eos)")
    srv.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    srv.add_argument("--seed", type=int, default=0, help="prompts, arrivals and sampling")
    srv.add_argument("--max-concurrency", type=parse_positive_int, default=None,
                     help="the engine's running requests (default: the largest W; 8 or more with --request-rate)")
    srv.add_argument("--max-num-batched-tokens", type=parse_positive_int, default=MAX_NUM_BATCHED_TOKENS)
    add_backend_args(srv)
    srv.add_argument("--load-control", type=list_of(parse_load_control), default=None, metavar="on,off,width:N",
                     help="comma list: one engine load per setting, each running every W and rate (default: on)")
    srv.add_argument("--routing-trace", default=None, metavar="FILE",
                     help="replay these recorded expert choices (as `wisp bench decode`); 'uniform': i.i.d. uniform")
    srv.add_argument("--server", default=None, metavar="URL",
                     help="stream from this live OpenAI-compatible server (`wisp serve`) instead of an engine in "
                          "process (needs httpx; --model then only gives the prompts' vocabulary)")
    srv.add_argument("--api-key", default=None, help="with --server: its bearer key")
    srv.add_argument("--out", type=parse_output_file, default=None, help="write the records as a JSON list here")
    srv.add_argument("--plot", type=parse_output_file, default=None, help="draw tok/s and p99 ITL against W (or rate) into this PNG")


def _add_agent_parser(kinds) -> None:
    agent = _kind(kinds, "agent", "agent.bench_agent", "multi-turn agent sessions against one VRAM budget, per allocator arm")
    agent.add_argument("--model", required=True, help="checkpoint dir, 'demo', or a preset with --load-format dummy")
    agent.add_argument("--load-format", choices=LOAD_FORMATS, default="auto")
    agent.add_argument("--sessions", nargs="+", required=True, metavar="FILE",
                       help="AgentInstruct .json/.jsonl or the agentinfer log; several run back to back")
    agent.add_argument("--concurrency", type=int, default=None,
                       help="sessions at once (W, also the engine's; default 4, or the widest phase)")
    agent.add_argument("--phases", default=None, metavar="W:N,...",
                       help="phased concurrency: N sessions W at a time per phase, phase after phase in one engine, "
                            "e.g. 1:2,8:8,2:4 (wisp.bench.agent_phases)")
    agent.add_argument("--vram-budget", type=parse_size, required=True, help="the whole device budget, e.g. 8GiB")
    agent.add_argument("--arms", default="mv-wsa,50-50,kv-blind,zero-copy,offload,controller",
                       help="comma list of mv-wsa, 50-50, kv-blind, zero-copy, offload, controller (repeats allowed)")
    agent.add_argument("--order", choices=["as-given", "abba"], default="as-given",
                       help="abba: the arms, then the same arms in reverse (each arm early and late)")
    agent.add_argument("--isolation", choices=["process", "engine"], default="process",
                       help="process: each arm in a fresh Python process (nothing left from the arms before); "
                            "engine: a fresh engine in this process, device memory released between arms")
    agent.add_argument("--max-model-len", type=int, default=None,
                       help="longest prompt + reply, tokens (default: 4096, or the model's max_position_embeddings "
                            "when that is smaller)")
    agent.add_argument("--max-reply-tokens", type=int, default=64, help="cap on each reply (the dataset's length)")
    agent.add_argument("--max-sessions", type=int, default=None, help="only the first N sessions")
    agent.add_argument("--tools", action="store_true",
                       help="AgentInstruct sessions as tool sessions (each workflow's tools, actions as hermes calls, "
                            "observations as tool messages; wisp.bench.agent_tools), every reply forced to one call to "
                            "those tools, as tool_choice 'required' would")
    agent.add_argument("--routing-trace", default=None, metavar="FILE",
                       help="real routing for every token (a one-layer trace is spread over all layers); 'uniform': "
                            "i.i.d. uniform top-k, a no-locality bound")
    agent.add_argument("--controller-start", choices=["plan", "50-50", "kv-blind"], default="plan",
                       help="the split the controller arm starts from")
    agent.add_argument("--max-num-batched-tokens", type=int, default=MAX_NUM_BATCHED_TOKENS)
    agent.add_argument("--recompute-cost", type=parse_positive_float, default=None, metavar="S",
                       help="the plan's seconds per recomputed token (default: estimated from a timed GEMM on the device, "
                            "which a loaded CPU can put many times off)")
    agent.add_argument("--resolve-every", type=int, default=32, help="controller: engine steps between re-solves")
    agent.add_argument("--min-gain", type=float, default=0.05, help="controller: hysteresis (relative latency gain)")
    agent.add_argument("--half-life", type=float, default=20000.0, help="controller: references per half-weight")
    agent.add_argument("--min-observations", type=int, default=2000, help="controller: expert references first")
    agent.add_argument("--admission-window", type=int, default=128, metavar="STEPS",
                       help="controller: its KV floor follows the peak of requests in flight over this many steps "
                            "(0: the fixed floor, W x max-model-len)")
    agent.add_argument("--resize-cost-s", type=_seconds_or_off, default=2.0, metavar="S|off",
                       help="controller: a resize's stall assumed until one is measured, for its payback rule (a "
                            "re-solved split is adopted when its gain repays the stall in the time conditions held); "
                            "off: hysteresis only")
    add_backend_args(agent)
    agent.add_argument("--out", type=parse_output_file, default=None, help="write the records as a JSON list here")
    agent.add_argument("--plot", type=parse_output_file, default=None, help="draw turn wall and TTFT per arm into this PNG")


def _seconds_or_off(text: str) -> float | None:
    return None if text == "off" else parse_positive_float(text)


def _add_soak_parser(kinds) -> None:
    soak = _kind(kinds, "soak", "soak.run.bench_soak",
                 "soak `wisp serve` with mixed traffic, disconnects, bad requests and live resizes; exit status 1 "
                 "if a check failed")
    length = soak.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=None)
    length.add_argument("--seconds", type=float, default=None, help="default: 60")
    soak.add_argument("--max-requests", type=int, default=1_000_000, help="stop after this many requests")
    soak.add_argument("--concurrency", type=int, default=8, help="client threads")
    soak.add_argument("--model", default="demo")
    soak.add_argument("--device", default="cpu")
    soak.add_argument("--load-format", choices=LOAD_FORMATS, default="auto")
    soak.add_argument("--mode", default="paged")
    soak.add_argument("--max-concurrency", type=int, default=8, help="the server's")
    soak.add_argument("--max-model-len", type=int, default=512, help="the server's")
    soak.add_argument("--max-num-batched-tokens", type=int, default=64, help="the server's")
    soak.add_argument("--resize-every", type=float, default=10.0, help="seconds between live resizes")
    soak.add_argument("--resize-caps", type=parse_int_list, default=None,
                      help="comma-separated expert caps to cycle (default: around the start)")
    soak.add_argument("--probe-every", type=float, default=10.0, help="seconds between greedy probes")
    soak.add_argument("--bad-fraction", type=float, default=0.1, help="share of the requests that are bad ones")
    soak.add_argument("--seed", type=int, default=0)
    soak.add_argument("--server-arg", action="append", default=[],
                      help="one more `wisp serve` argument (repeatable; --server-arg=--flag for a flag)")
    soak.add_argument("--out", type=parse_output_file, default=None, help="write the JSON report here (the server's log beside it)")


def _add_accuracy_parser(kinds) -> None:
    acc = _kind(kinds, "accuracy", "accuracy.bench_accuracy",
                "how close hybrid mode's outputs are to resident: max logit difference and greedy agreement")
    acc.add_argument("--model", default="demo")
    acc.add_argument("--load-format", choices=LOAD_FORMATS, default="auto")
    acc.add_argument("--device", default="cpu")
    acc.add_argument("--dtype", default=None)
    acc.add_argument("--expert-cap", type=int, default=2)
    acc.add_argument("--prompts", type=int, default=4)
    acc.add_argument("--prompt-len", type=int, default=32)
    acc.add_argument("--decode-tokens", type=int, default=128)
    acc.add_argument("--vocab-limit", type=int, default=250, help="prompt token ids are drawn below this")
    acc.add_argument("--probe", action="store_true", help="use the machine's probed costs, not a CPU-heavy split")
    acc.add_argument("--against", choices=["hybrid", "resident-torch"], default="hybrid",
                     help="what resident is compared with; resident-torch (resident on the torch MoE kernels) gives "
                          "the difference any change of GEMM rounding makes: the noise floor for hybrid's figure")
    acc.add_argument("--seed", type=int, default=0)
    acc.add_argument("--out", type=parse_output_file, default=None)


def _add_perplexity_parser(kinds) -> None:
    ppl = _kind(kinds, "perplexity", "perplexity.bench_perplexity",
                "bits per token and per byte of a model on a text, window by window, through wisp's engine")
    ppl.add_argument("--model", default="demo")
    ppl.add_argument("--text", default="demo-held-out",
                     help="a UTF-8 text file, or demo-held-out (default): the demo's held-out Python documentation")
    ppl.add_argument("--window", type=parse_positive_int, default=None,
                     help="tokens a window, each scored from scratch (default 512: the demo's training context)")
    ppl.add_argument("--mode", choices=MODES, default="resident")
    ppl.add_argument("--expert-cap", type=int, default=None)
    ppl.add_argument("--device", default="auto")
    ppl.add_argument("--dtype", default="auto")
    ppl.add_argument("--record-routing", type=parse_output_file, default=None, metavar="FILE",
                     help="write the scored tokens' routing (.npz/.jsonl), each token its own step")
    ppl.add_argument("--out", type=parse_output_file, default=None, help="write the figures as JSON here")


def _add_llama_cpp_parsers(kinds) -> None:
    tools = _group(kinds, "llama-cpp", "the llama.cpp peer: llama-bench in our harness, and our records beside it", "tool")
    run = _kind(tools, "run", "llama_cpp.llama_bench.bench_llama_cpp",
                "llama-bench at each expert placement, as wisp benchmark records")
    run.add_argument("--llama-bench", required=True, metavar="PATH", help="the llama-bench binary")
    run.add_argument("--gguf", required=True)
    run.add_argument("--model", required=True, help="the wisp preset (or config.json) the GGUF was written from")
    run.add_argument("--placements", default="all-cpu,half,all-gpu", help="comma list of all-cpu, half, all-gpu")
    run.add_argument("--prompts", default="512,2048", help="prompt lengths for TTFT (llama-bench -p)")
    run.add_argument("--decode-tokens", type=int, default=64)
    run.add_argument("--repetitions", type=int, default=2)
    run.add_argument("--extra", default="", help="more llama-bench flags, e.g. '-t 16 -fa 1'")
    run.add_argument("--commit", default=None, help="llama.cpp commit (default: .llama_cpp/COMMIT, from fetch.sh)")
    run.add_argument("--unsampled-decode", action="store_true", help="time the decode again without the GPU sampler")
    run.add_argument("--out", type=parse_output_file, required=True)
    compare = _kind(tools, "compare", "llama_cpp.compare.bench_compare",
                    "llama.cpp against wisp at each of llama.cpp's expert placements: one comparison file")
    compare.add_argument("--peer", required=True, help="`wisp bench llama-cpp run`'s records")
    compare.add_argument("--decode", action="append", required=True, help="our decode records (repeatable)")
    compare.add_argument("--prefill", action="append", default=[], help="our prefill records (repeatable)")
    compare.add_argument("--note", default=None)
    compare.add_argument("--out", type=parse_output_file, required=True)
    pair = _kind(tools, "pair", "llama_cpp.paired.bench_pair",
                 "a paired run's records (wisp, llama.cpp, wisp again on one machine) as rows of the paired file")
    pair.add_argument("--out-dir", required=True, help="the paired stage's output folder")
    pair.add_argument("--host", default="?", help="a name for the machine (the records' `host`)")
    pair.add_argument("--commit", default=None, help="the code that ran (default: the decode record's, often stale)")
    pair.add_argument("--mode", default="hybrid (no slots, rank split)", help="wisp's rows' `mode` label")
    pair.add_argument("--append", default=None, help="the paired results file to add the rows to")
    gguf = _kind(tools, "gguf", "llama_cpp.random_gguf.bench_gguf",
                 "write a random-weight GGUF in a wisp preset's real shapes, for llama-bench")
    gguf.add_argument("--model", required=True, help="a wisp preset (olmoe-1b-7b, qwen3-30b-a3b) or a config.json")
    gguf.add_argument("--out", type=parse_output_file, required=True)
    gguf.add_argument("--type", choices=["bf16", "q8_0"], default="bf16")
    gguf.add_argument("--seed", type=int, default=0)
    peak = _kind(tools, "peak", "llama_cpp.gpu_peak.bench_peak",
                 "run a program under the GPU memory sampler (NVML, as nvidia-smi counts); exit with its status",
                 usage="wisp bench llama-cpp peak [-h] --out FILE -- PROGRAM [ARG ...]")
    peak.add_argument("--out", type=parse_output_file, required=True, metavar="FILE",
                      help="write {command, returncode, peak_gpu_bytes, baseline_bytes} here")
    peak.add_argument("program", nargs=argparse.REMAINDER, help="-- then the program and its arguments")
    cost = _kind(tools, "sampler-cost", "llama_cpp.sampler_cost.bench_sampler_cost",
                 "what the GPU memory sampler costs a wisp decode: quiet and sampled rounds in one request")
    cost.add_argument("--model", default="olmoe-1b-7b")
    cost.add_argument("--mode", default="hybrid")
    cost.add_argument("--expert-cap", type=int, default=0)
    cost.add_argument("--routing-trace", default=None, help="replayed routing (default: the router's own)")
    cost.add_argument("--device", default="auto")
    cost.add_argument("--prompt-len", type=int, default=512)
    cost.add_argument("--round", type=int, default=32, help="tokens per arm before switching")
    cost.add_argument("--rounds", type=int, default=4, help="rounds of both arms")
    cost.add_argument("--out", type=parse_output_file, required=True)


def _add_sweep_parsers(kinds) -> None:
    sweeps = _group(kinds, "sweep", "kernel timings over their launch parameters", "sweep")
    moe = _kind(sweeps, "moe-attention", "sweeps.moe_attention.sweep_moe_attention",
                "the Triton MoE and attention kernels over their block sizes (CUDA)")
    moe.add_argument("--out", type=parse_output_file, default="kernel_sweep.json")
    moe.add_argument("--compare-with", default=None, help="another triton_moe.py, timed on the same inputs")
    moe.add_argument("--no-sweep", action="store_true", help="the default blocks only")
    moe.add_argument("--shapes", default=None, help="MoE shapes to time, comma-separated (default: all of "
                     "olmoe, qwen3, qwen3-fp8, qwen3-q8_0, qwen3-q4_k, qwen3-q6_k, gpt-oss)")
    moe.add_argument("--vary", default=None, help="launch fields to vary, comma-separated (default: all of rows, cols, "
                     "warps, stages, loads, weights_first)")
    moe.add_argument("--no-attention", action="store_true", help="the MoE kernels only")
    linear = _kind(sweeps, "linear", "sweeps.linear.sweep_linear",
                   "a preset's dense projections: cuBLAS on 16-row tiles against triton_linear and its tiles (CUDA)")
    linear.add_argument("--models", default="olmoe-1b-7b,qwen3-30b-a3b")
    linear.add_argument("--rows", type=parse_int_list, default=[1, 16, 512, 2048], help="row counts to time")
    linear.add_argument("--no-sweep", action="store_true", help="only cuBLAS tiles and the default tile")
    linear.add_argument("--graph-rows", type=int, default=16,
                        help="row counts up to this are timed as CUDA-graph replays (decode runs in graphs; launched "
                             "one by one, a few-microsecond kernel times its launch)")
    linear.add_argument("--out", type=parse_output_file, default=None)
    cpu = _kind(sweeps, "cpu-experts", "sweeps.cpu_experts.sweep_cpu_experts",
                "hybrid's CPU expert kernels, alone and (CUDA) beside the GPU's in-place reads or copies")
    cpu.add_argument("--hidden", type=int, default=2048, help="D (OLMoE-1B-7B: 2048)")
    cpu.add_argument("--intermediate", type=int, default=1024, help="I (OLMoE-1B-7B: 1024)")
    cpu.add_argument("--experts", type=int, default=64)
    cpu.add_argument("--top-k", type=int, default=8)
    cpu.add_argument("--rows", type=int, default=1)
    cpu.add_argument("--per-call", type=parse_int_list, default=[1],
                     help="comma-separated: distinct experts a call computes (a rank split: 4-5)")
    cpu.add_argument("--bank", default="pinned",
                     help="comma-separated: pinned (cudaHostAlloc), huge (huge pages, registered)")
    cpu.add_argument("--kernels", default=None, help="comma-separated CPU kernels (default: all that load)")
    cpu.add_argument("--weights", default="bf16",
                     help="comma-separated expert formats: bf16 (the --bank kinds), fp8, mxfp4, q8_0, q4_k, q5_k, q6_k (pinned banks)")
    cpu.add_argument("--threads", type=parse_int_list, default=None,
                     help="comma-separated torch thread counts (default: torch's)")
    cpu.add_argument("--repeats", type=int, default=48)
    cpu.add_argument("--out", type=parse_output_file, default=None)


def _add_profile_parsers(kinds) -> None:
    profiles = _group(kinds, "profile", "where an engine step's time goes", "profile")
    steps = _kind(profiles, "steps", "profiles.steps.profile_steps",
                  "profile eager (or graph) engine steps of a preset with dummy weights: kernels by total time")
    steps.add_argument("--model", default="qwen3-30b-a3b")
    steps.add_argument("--layers", type=int, default=None, help="keep the first N layers (default: all)")
    steps.add_argument("--mode", default="resident")
    steps.add_argument("--cap", type=int, default=None)
    steps.add_argument("--device", default="auto", help="auto, cpu or cuda")
    steps.add_argument("--phase", choices=("prefill", "decode"), default="decode")
    steps.add_argument("--prompt-len", type=int, default=128)
    steps.add_argument("--batch", type=int, default=1,
                       help="requests decoding together (load control off: a batch wider than the slots runs wide)")
    steps.add_argument("--rows", type=int, default=30, help="kernels (or functions) to print")
    steps.add_argument("--graphs", action="store_true",
                       help="decode with CUDA graphs (the profile lists the kernels replayed)")
    steps.add_argument("--warm", type=int, default=5, help="decode steps before the profiled ones (a chooser's trials)")
    steps.add_argument("--steps", type=int, default=10, help="decode steps profiled")
    steps.add_argument("--hot-experts", type=int, default=0)
    steps.add_argument("--routing-trace", default=None, help="replay this routing during decode (as `wisp bench decode`)")
    steps.add_argument("--trace", default=None, help="write the profile as a Chrome trace here")
    steps.add_argument("--host", action="store_true",
                       help="profile the host's Python (cProfile) instead of the device's kernels")
    sampling = _kind(profiles, "sampling", "profiles.sampling.profile_sampling",
                     "a decode step's sampling alone: ms a step at batch sizes and sampling parameters")
    sampling.add_argument("--vocab", type=int, default=151936, help="the logits' width (Qwen3's: 151936)")
    sampling.add_argument("--batch", type=parse_int_list, default=[1, 4, 16], help="requests sampled together")
    sampling.add_argument("--params", default="greedy,temperature,top-p,qwen3",
                          help="comma-separated presets: greedy, temperature, top-p, qwen3")
    sampling.add_argument("--device", default="auto", help="auto, cpu or cuda")
    sampling.add_argument("--repeats", type=int, default=20)
    sampling.add_argument("--out", type=parse_output_file, default=None)
    timeline = _kind(profiles, "timeline", "profiles.timeline.share_timeline",
                     "where a rank-share decode step's time goes, from a Chrome trace of `wisp bench profile steps --trace`")
    timeline.add_argument("trace", help="the Chrome trace (JSON)")
    timeline.add_argument("--rows", type=int, default=25, help="serial-piece kernels to list")


def _add_model_and_modes(p, default_modes: str, modes: str) -> None:
    """What every bench runs: a model (or a shape preset) and the expert modes and caps to compare."""
    p.add_argument("--model", required=True, help="checkpoint dir, 'demo', or a preset with --load-format dummy")
    p.add_argument("--load-format", choices=LOAD_FORMATS, default="auto")
    p.add_argument("--mode", default=default_modes, help=f"comma list of {modes}")
    p.add_argument("--expert-cap", default=None, help="comma list of caps for paged and hybrid runs (hybrid: 0 for no slots)")
