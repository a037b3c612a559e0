"""What hybrid's hot experts serve and what their refreshes copy, replaying routing traces one token a step: the
shipped rule (`HotExperts.refresh`: a newcomer displaces a held expert only where its lead pays for the copy and is
more than noise) beside the rule before it (the set is the top H by score at every refresh), and i.i.d. uniform
routing of each trace's shape.

    python benchmarks/probes/hot_expert_swaps.py --hot 2,8,32 \
        --trace olmoe=../shared/data/layer0_only_vllm_logs/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl \
        --trace demo=wisp/models/demo_checkpoint/routing_held_out.npz \
        --out benchmarks/results/logs/hot_expert_swaps.json

- served: the share of routed pairs whose expert was held when its step ran (the set as of the step's start);
- copies a step: experts copied in after the set first filled, over the decode steps (each one expert's bytes over the
  link, on the step after a refresh).
Each layer of a trace is replayed apart and the figures summed over its layers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from wisp.core.experts.hot_experts import HotExperts
from wisp.trace.readers import load_any


class TopHotExperts(HotExperts):
    """The rule before: any lead displaces the weakest held expert, so every refresh holds the top H."""

    def worth_swapping(self, newcomer: int, held: int) -> bool:
        return bool(self.scores[newcomer] > self.scores[held])


def replay(ids: np.ndarray, num_experts: int, hot: int, rule: type[HotExperts]) -> dict:
    """ids [T, L, K]: each layer apart, a token a step."""
    served = pairs = copies_after_fill = steps_after_fill = 0
    for layer in range(ids.shape[1]):
        set_ = rule({"w": torch.zeros((num_experts, 1))}, hot, torch.device("cpu"))
        full = False
        for row in ids[:, layer, :]:
            routed = row[row >= 0]
            served += int(set_.is_hot[routed].sum())
            pairs += len(routed)
            set_.observe(routed[None])
            if set_.refresh_due():
                copied = set_.refresh()
                copies_after_fill += copied if full else 0
            full = full or -1 not in set_.expert_in_slot
            steps_after_fill += full
    return {"served": round(served / max(1, pairs), 4),
            "copies_a_step": round(copies_after_fill / max(1, steps_after_fill), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="append", required=True, help="NAME=PATH (any trace wisp reads)")
    parser.add_argument("--hot", default="2,8,32", help="comma-separated hot experts a layer")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = {}
    for spec in args.trace:
        name, path = spec.split("=", 1)
        trace = load_any(path)
        n = trace.num_experts
        uniform = np.stack([np.random.default_rng(l).random((len(trace.ids), n)).argsort(axis=1)[:, : trace.ids.shape[2]]
                            for l in range(trace.ids.shape[1])], axis=1)  # [T, L, K] i.i.d. uniform without repeats
        for hot in (int(h) for h in args.hot.split(",")):
            if hot > n:
                continue
            for routing, ids in ((name, trace.ids), (f"{name} shape, uniform", uniform)):
                row = results.setdefault(f"{routing}, {hot} hot", {"experts": n, "layers": int(ids.shape[1]),
                                                                  "tokens": int(ids.shape[0])})
                row["shipped"] = replay(ids, n, hot, HotExperts)
                row["top_h"] = replay(ids, n, hot, TopHotExperts)
                print(f"{routing:>32} H={hot:<3} shipped {row['shipped']}  top-H {row['top_h']}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
