"""Hybrid with no slots: a rank shared by columns against whole ranks only, in one process (GPU machine).

Processes on one H200 host differ by up to 20% in both servers' speeds, so two runs cannot say what the
column share (`wisp.core.rank_split`) is worth. This loads a preset with dummy weights in hybrid mode with no
expert slots, replays a routing trace, forces every decode step to be a split step, and alternates two arms
every `--round` tokens of one request: `whole` (each layer's split chooses whole ranks: its col_step is 0)
and `shared` (as built). Prints and saves per arm: the median step time, the CPU's share of ranks, and per
CPU layer the CPU side, the GPU's pairs (timed on the device) and the host's wait for them.

    python benchmarks/rank_split_column_shares.py --model olmoe-1b-7b \
        --routing-trace ../shared/data/layer0_only_vllm_logs/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl --out ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict

import torch

from wisp.bench.decode import _replay, model_config_for, probe_h2d_gbps
from wisp.bench.routing import routing_for
from wisp.engine.llm import LLM
from wisp.engine.sampling import SamplingParams
from wisp.engine.step_kinds import EAGER, StepKindChooser

ARMS = ("whole", "shared")


class SplitSteps(StepKindChooser):
    """Every decode step a split step (the chooser would also time graph steps)."""

    def pick(self, batch_size: int) -> str:
        return EAGER


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="olmoe-1b-7b")
    ap.add_argument("--routing-trace", required=True)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--round", type=int, default=32, help="tokens per arm before switching")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of both arms")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    gbps = probe_h2d_gbps(torch.device("cuda"))
    tokens = 2 * args.round * args.rounds
    llm = LLM(args.model, mode="hybrid", expert_cap=0, load_format="dummy", max_concurrency=1,
              max_model_len=args.prompt_len + tokens + 16)
    trace, _ = routing_for(args.routing_trace, model_config_for(args.model, "dummy"))
    replay = _replay(llm, trace)
    engine = llm.engine
    llm.generate([[1] * args.prompt_len], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    engine.runner.step_kinds = SplitSteps()
    splits = engine.runner.graphs.splits
    built = {layer: split.col_step for layer, split in splits.items()}
    pace = next(iter(engine.model.experts.values())).pace
    prompt = torch.randint(0, llm.config.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0))
    engine.add_request("ab", prompt.tolist(), SamplingParams(max_tokens=tokens + 1, ignore_eos=True), strict_length=False)
    while engine.requests["ab"].first_token_time is None:
        engine.step()
    replay.active = True
    steps = {arm: [] for arm in ARMS}
    totals = {arm: {} for arm in ARMS}
    for r in range(2 * args.rounds):
        arm = ARMS[r % 2]
        for layer, split in splits.items():
            split.col_step = built[layer] if arm == "shared" else 0
        before = asdict(pace.totals)
        for _ in range(args.round):
            start = time.perf_counter()
            engine.step()
            steps[arm].append(time.perf_counter() - start)
        for key, value in asdict(pace.totals).items():
            totals[arm][key] = totals[arm].get(key, 0) + value - before[key]
        totals[arm]["factors"] = (round(pace.factor, 3), round(pace.link_factor, 3))  # the CPU's, the link's
    record = {"model": args.model, "routing": args.routing_trace, "h2d_gbps_probe": round(gbps, 2),
              "gpu": torch.cuda.get_device_name(), "round": args.round, "rounds": args.rounds, "arms": {}}
    for arm in ARMS:
        t, n = totals[arm], max(totals[arm]["steps"], 1)
        record["arms"][arm] = {
            "median_step_s": round(statistics.median(steps[arm]), 6), "tok_s": round(len(steps[arm]) / sum(steps[arm]), 2),
            "cpu_ranks_per_layer": round(t["cpu_ranks"] / n, 3), "cpu_and_link_factors_at_end": t["factors"],
            **{f"{key}_per_layer_ms": round(1e3 * t[key] / n, 3) for key in ("kernel_s", "gpu_s", "gpu_wait_s", "wall_s")},
            "step_s": [round(s, 5) for s in steps[arm]]}
        a = record["arms"][arm]
        print(f"{arm:7s} median step {1e3 * a['median_step_s']:.2f} ms ({a['tok_s']} tok/s), CPU ranks "
              f"{a['cpu_ranks_per_layer']}, per layer: CPU {a['kernel_s_per_layer_ms']} ms, GPU pairs "
              f"{a['gpu_s_per_layer_ms']} ms, wait for them {a['gpu_wait_s_per_layer_ms']} ms; factors "
              f"{a['cpu_and_link_factors_at_end']}")
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
