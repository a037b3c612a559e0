"""Profile eager engine steps of a preset (dummy weights, optionally fewer layers) and print the GPU kernels
by total time: a cold prefill of one prompt (--phase prefill) or decode steps at batch 1 (--phase decode).

python benchmarks/profile_steps.py --model qwen3-30b-a3b --layers 8 --mode resident --phase decode
python benchmarks/profile_steps.py --model olmoe-1b-7b --mode resident --phase prefill --prompt-len 2048
python benchmarks/profile_steps.py --model olmoe-1b-7b --mode hybrid --cap 0 --graphs --warm 40 --prompt-len 512 \
    --routing-trace .gpu_data/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl --trace split_steps.json
`--host` profiles the host's Python instead (cProfile, the functions by their own time and by cumulative time):
where an engine step's host time goes, which a GPU-light step (resident at batch 1) shows best.
`--trace FILE` also writes the profile as a Chrome trace (the host's CUDA calls and the device's kernels and
copies on one clock: `benchmarks/step_timeline.py` reads where a split step's time goes from it).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

import wisp.models.presets as presets
from wisp import LLM, SamplingParams
from wisp.bench.decode import replay_routing
from wisp.bench.routing import routing_for

p = argparse.ArgumentParser()
p.add_argument("--model", default="qwen3-30b-a3b")
p.add_argument("--layers", type=int, default=None, help="keep the first N layers (default: all)")
p.add_argument("--mode", default="resident")
p.add_argument("--cap", type=int, default=None)
p.add_argument("--phase", choices=("prefill", "decode"), default="decode")
p.add_argument("--prompt-len", type=int, default=128)
p.add_argument("--rows", type=int, default=30, help="kernels to print")
p.add_argument("--graphs", action="store_true", help="decode with CUDA graphs (the profile lists the kernels replayed)")
p.add_argument("--warm", type=int, default=5, help="decode steps before the profiled ones (a chooser's trials)")
p.add_argument("--steps", type=int, default=10, help="decode steps profiled")
p.add_argument("--hot-experts", type=int, default=0)
p.add_argument("--routing-trace", default=None, help="replay this routing during decode (as `wisp bench decode`)")
p.add_argument("--trace", default=None, help="write the profile as a Chrome trace here")
p.add_argument("--host", action="store_true", help="profile the host's Python (cProfile) instead of the GPU's kernels")
args = p.parse_args()
if args.layers:
    presets.PRESETS[args.model] = dict(presets.preset(args.model), num_hidden_layers=args.layers)
llm = LLM(args.model, load_format="dummy", mode=args.mode, expert_cap=args.cap, max_concurrency=1,
          max_model_len=args.prompt_len + args.warm + 2 * args.steps + 64, max_num_batched_tokens=max(args.prompt_len, 512), enforce_eager=not args.graphs,
          **({"hot_experts": args.hot_experts} if args.hot_experts else {}))
eng = llm.engine
trace, routing = routing_for(args.routing_trace, llm.config)
replay = replay_routing(llm, trace) if trace is not None else None


def prompt(seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, llm.config.vocab_size, (args.prompt_len,), generator=g).tolist()


llm.generate([prompt(0)], SamplingParams(max_tokens=4, ignore_eos=True))  # compiles every kernel
if replay is not None:
    replay.active = True
eng.add_request("x", prompt(1), SamplingParams(max_tokens=args.warm + 2 * args.steps + 30, ignore_eos=True))
if args.phase == "decode":
    for _ in range(args.warm):  # the prefill and the first decode steps
        eng.step()
torch.cuda.synchronize()
steps = 1 if args.phase == "prefill" else args.steps
if args.host:
    import cProfile
    import pstats

    t0 = time.perf_counter()
    for _ in range(steps):  # unprofiled first: the step's time as it is
        eng.step()
    torch.cuda.synchronize()
    plain = (time.perf_counter() - t0) / steps
    host = cProfile.Profile()
    t0 = time.perf_counter()
    host.enable()
    for _ in range(steps):
        eng.step()
    torch.cuda.synchronize()
    host.disable()
    wall = time.perf_counter() - t0
    print(f"{args.model} {args.mode} {args.phase}: {steps} step(s), {plain * 1e3:.3f} ms a step unprofiled, "
          f"{wall / steps * 1e3:.3f} under cProfile ({'graphs' if args.graphs else 'eager'}, routing {routing})")
    for key in ("tottime", "cumulative"):
        pstats.Stats(host).sort_stats(key).print_stats(args.rows)
    raise SystemExit(0)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
print(f"{args.model} {args.mode} {args.phase}: {steps} step(s), {wall / steps * 1e3:.2f} ms a step (profiled, "
      f"{'graphs' if args.graphs else 'eager'}, routing {routing})")
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60))
if args.trace:
    prof.export_chrome_trace(args.trace)
