"""`wisp bench profile steps`: profile eager (or `--graphs`) engine steps of a preset with dummy weights
(optionally fewer layers) and print the device's kernels by total time: a cold prefill of one prompt
(--phase prefill) or decode steps of `--batch` requests decoding together (--phase decode; load control off, so a
batch wider than the slots runs its wide expert-major step). On a CUDA device the profile is of the GPU's
kernels; on the CPU (`--device cpu`, e.g. the demo model) of the CPU's operators.

    wisp bench profile steps --model qwen3-30b-a3b --layers 8 --mode resident --phase decode
    wisp bench profile steps --model olmoe-1b-7b --mode resident --phase prefill --prompt-len 2048
    wisp bench profile steps --model qwen3-30b-a3b --mode paged --cap 16 --batch 4 --trace wide_step.json
    wisp bench profile steps --model olmoe-1b-7b --mode hybrid --cap 0 --graphs --warm 40 --prompt-len 512 \
        --routing-trace .gpu_data/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl --trace share_steps.json

`--host` profiles the host's Python instead (cProfile, the functions by their own time and by cumulative time):
where an engine step's host time goes, which a GPU-light step (resident at batch 1) shows best.
`--trace FILE` also writes the profile as a Chrome trace (the host's CUDA calls and the device's kernels and
copies on one clock: `wisp bench profile timeline` reads where a rank-share step's time goes from it).
"""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

import wisp.models.presets as presets
from wisp.bench.decode import replay_routing
from wisp.bench.routing import routing_for
from wisp.engine.llm import LLM
from wisp.engine.sampling import SamplingParams

def _warm_engine(args):
    """The engine with a request past its warm-up: (llm, routing label). The layer cut (`--layers`) changes the
    preset for this process only."""
    if args.layers:
        presets.PRESETS[args.model] = dict(presets.preset(args.model), num_hidden_layers=args.layers)
    llm = LLM(args.model, load_format="dummy", device=args.device, mode=args.mode, expert_cap=args.cap,
              max_concurrency=args.batch, load_control="off", max_model_len=args.prompt_len + args.warm + 2 * args.steps + 64,
              max_num_batched_tokens=max(args.batch * args.prompt_len, 512), enforce_eager=not args.graphs,
              **({"hot_experts": args.hot_experts} if args.hot_experts else {}))
    trace, routing = routing_for(args.routing_trace, llm.config, requests=args.batch)
    replay = replay_routing(llm, trace) if trace is not None else None

    def prompt(seed: int) -> list[int]:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(1, llm.config.vocab_size, (args.prompt_len,), generator=g).tolist()

    llm.generate([prompt(0)], SamplingParams(max_tokens=4, ignore_eos=True))  # compiles every kernel
    if replay is not None:
        replay.active = True
    for i in range(args.batch):
        llm.engine.add_request(f"x{i}", prompt(1 + i), SamplingParams(max_tokens=args.warm + 2 * args.steps + 30,
                                                                       ignore_eos=True))
    if args.phase == "decode":
        for _ in range(args.warm):  # the prefill and the first decode steps
            llm.engine.step()
    return llm, routing


def profile_steps(args) -> None:
    """`wisp bench profile steps`: build and warm the engine, profile its next steps, print the table (and
    write the Chrome trace with `--trace`)."""
    llm, routing = _warm_engine(args)
    eng = llm.engine
    cuda = eng.device.type == "cuda"

    def run(steps: int) -> float:
        """Seconds for `steps` engine steps, the device's work included."""
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.step()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    if cuda:
        torch.cuda.synchronize()
    steps = 1 if args.phase == "prefill" else args.steps
    how = f"{'graphs' if args.graphs else 'eager'}, routing {routing}"
    if args.host:
        import cProfile
        import pstats

        plain = run(steps) / steps  # unprofiled first: the step's time as it is
        host = cProfile.Profile()
        wall = host.runcall(run, steps)
        print(f"{args.model} {args.mode} {args.phase}: {steps} step(s), {plain * 1e3:.3f} ms a step unprofiled, "
              f"{wall / steps * 1e3:.3f} under cProfile ({how})")
        for key in ("tottime", "cumulative"):
            pstats.Stats(host).sort_stats(key).print_stats(args.rows)
        return
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        wall = run(steps)
    print(f"{args.model} {args.mode} {args.phase}: {steps} step(s), {wall / steps * 1e3:.2f} ms a step (profiled, {how})")
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.rows, max_name_column_width=60))
    if args.trace:
        prof.export_chrome_trace(args.trace)
