"""`wisp bench llama-cpp sampler-cost`: what the GPU memory sampler (`gpu_peak`) costs a wisp decode, in one
process (GPU machine).

The paired runs (`STAGE=paired bash benchmarks/recipes/gpu_llama_cpp.sh`) time decode under `gpu_peak`'s sampler.
This decodes one request and runs the same sampler, in its own process as there, during every other
`--round` tokens (in ABBA order: quiet, sampled, sampled, quiet, ..., so neither arm always has the shorter
context), so both arms share the process, the host and the routing. Prints and saves per arm: the mean,
median, 90th-percentile and slowest step and tok/s, and the arm of every round in order.

What it found, and why the sampler reads NVML: docs/decisions/gpu-memory-sampled-through-nvml.md.

    wisp bench llama-cpp sampler-cost --model olmoe-1b-7b --mode hybrid --expert-cap 0 \
        --routing-trace ../shared/data/layer0_only_vllm_logs/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl --out cost.json
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from wisp.bench.child_env import child_env
from wisp.bench.decode import model_config_for, replay_routing, step_spread
from wisp.bench.routing import routing_for
from wisp.engine.llm import LLM
from wisp.engine.sampling import SamplingParams

ARMS = ("quiet", "sampled")
SAMPLER = "import time\nfrom wisp.bench.llama_cpp.gpu_peak import PeakGpuMemory\nwith PeakGpuMemory():\n    time.sleep(1e9)"


@contextlib.contextmanager
def sampler_process():
    """`gpu_peak`'s sampler in a process of its own while the block runs."""
    proc = subprocess.Popen([sys.executable, "-c", SAMPLER], env=child_env())
    try:
        yield
    finally:
        proc.terminate()
        proc.wait()


def arm_order(rounds: int) -> list[str]:
    """ABBA: quiet, sampled, sampled, quiet, quiet, ... (2 x rounds entries)."""
    return [ARMS[(r + r // 2) % 2] for r in range(2 * rounds)]


def arm_summary(steps: list[float]) -> dict:
    return {"steps": len(steps), "mean_step_s": round(statistics.fmean(steps), 6), **step_spread(tuple(steps)),
            "tok_s": round(len(steps) / sum(steps), 2)}


def bench_sampler_cost(args) -> dict:
    """`wisp bench llama-cpp sampler-cost`: one request decoded in quiet and sampled rounds (ABBA); the record
    (per arm: the summary and every step), printed and written to `--out`."""
    tokens = 2 * args.round * args.rounds
    llm = LLM(args.model, device=args.device, mode=args.mode, expert_cap=args.expert_cap, load_format="dummy",
              max_concurrency=1, max_model_len=args.prompt_len + tokens + 16)
    trace = routing_for(args.routing_trace, model_config_for(args.model, "dummy"))[0] if args.routing_trace else None
    replay = replay_routing(llm, trace) if trace is not None else None
    engine = llm.engine
    llm.generate([[1] * args.prompt_len], SamplingParams(max_tokens=16, ignore_eos=True))  # warm-up, the chooser's too
    prompt = torch.randint(0, llm.config.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0))
    engine.add_request("cost", prompt.tolist(), SamplingParams(max_tokens=tokens + 1, ignore_eos=True),
                       strict_length=False)
    while engine.requests["cost"].first_token_time is None:
        engine.step()
    if replay is not None:
        replay.active = True
    order = arm_order(args.rounds)
    steps: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for arm in order:
        with sampler_process() if arm == "sampled" else contextlib.nullcontext():
            for _ in range(args.round):
                start = time.perf_counter()
                engine.step()
                steps[arm].append(time.perf_counter() - start)
    gpu = torch.cuda.get_device_name() if llm.engine.device.type == "cuda" else "cpu"
    record = {"model": args.model, "mode": args.mode, "expert_cap": args.expert_cap, "routing": args.routing_trace,
              "gpu": gpu, "round": args.round, "rounds": args.rounds, "order": order,
              "arms": {arm: {**arm_summary(steps[arm]), "step_s": [round(s, 5) for s in steps[arm]]} for arm in ARMS}}
    for arm in ARMS:
        a = record["arms"][arm]
        print(f"{arm:8s} mean {1e3 * a['mean_step_s']:.2f} ms, median {1e3 * a['step_s_median']:.2f}, "
              f"p90 {1e3 * a['step_s_p90']:.2f}, max {1e3 * a['step_s_max']:.2f} ({a['tok_s']} tok/s)")
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return record
