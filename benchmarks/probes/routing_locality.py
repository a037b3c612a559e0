"""How much locality routing traces have: carry-over and the LRU hit rate at every C, per trace, beside i.i.d.
uniform routing of the same shape.

    python benchmarks/probes/routing_locality.py \
        --trace trained=wisp/models/demo_checkpoint/routing_held_out.npz --trace random=/tmp/demo_random.npz \
        --out benchmarks/results/logs/demo_routing_locality.json

- carry-over: the share of a token's top-k experts that the token before it (same sequence, same layer) also chose,
  averaged over tokens and layers; i.i.d. uniform choice gives k / E.
- load min/max: the least and the most routed expert's share of its layer's choices, over all layers (uniform: 1/E).
- hit rate at C: 1 - m(C) / references, with m the exact LRU miss curve of each layer's per-token steps
  (`wisp.plan.miss_curves.expert_miss_curve`: what `ExpertPager` with C slots a layer meets decoding the trace one
  token at a time), summed over layers. Cold misses count as misses.
Each trace is read with its tokens as single-stream steps (its own `step` is ignored).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from wisp.plan.miss_curves import expert_miss_curve
from wisp.trace.format import RoutingTrace
from wisp.trace.readers import load_any


def carry_over(trace: RoutingTrace) -> float:
    shares = []
    for seq in trace.sequences():
        ids = seq.ids  # [T, L, K]
        for t in range(1, seq.num_tokens):
            for layer in range(seq.num_layers):
                now, before = set(ids[t, layer][ids[t, layer] >= 0]), set(ids[t - 1, layer][ids[t - 1, layer] >= 0])
                if now:
                    shares.append(len(now & before) / len(now))
    return float(np.mean(shares))


def load_shares(trace: RoutingTrace) -> tuple[float, float]:
    """The least and most loaded expert's share of its layer's references, over every layer (uniform: 1 / E)."""
    shares = [np.bincount(trace.ids[:, i][trace.ids[:, i] >= 0], minlength=trace.num_experts) / np.sum(trace.ids[:, i] >= 0)
              for i in range(trace.num_layers)]
    return float(min(s.min() for s in shares)), float(max(s.max() for s in shares))


def hit_rates(trace: RoutingTrace) -> list[float]:
    """Hit rate at C = 0..E over every layer (index C)."""
    misses = sum(expert_miss_curve(trace.steps(layer, per_token=True), trace.num_experts) for layer in trace.layers)
    return [round(1 - m / misses[0], 4) for m in misses]


def uniform_like(trace: RoutingTrace, seed: int = 0) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    t, n_layers, k = trace.ids.shape
    ids = np.stack([rng.permutation(trace.num_experts)[:k] for _ in range(t * n_layers)]).reshape(t, n_layers, k)
    return RoutingTrace(ids.astype(np.int16), layers=list(trace.layers), num_experts=trace.num_experts,
                        metadata={"note": "i.i.d. uniform top-k"})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", action="append", required=True, metavar="NAME=FILE")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    traces = {}
    for item in args.trace:
        name, _, path = item.partition("=")
        traces[name] = load_any(path)
    first = next(iter(traces.values()))
    traces["uniform"] = uniform_like(first)
    rows = {}
    for name, trace in traces.items():
        rows[name] = {"tokens": trace.num_tokens, "layers": trace.num_layers, "top_k": trace.top_k,
                      "experts": trace.num_experts, "carry_over": round(carry_over(trace), 4),
                      "expert_load_share_min_max": [round(x, 4) for x in load_shares(trace)],
                      "hit_rate_by_c": hit_rates(trace)}
    cs = range(first.top_k, first.num_experts + 1)
    print(f"{'trace':>14} {'carry-over':>10} {'load min/max':>13}  hit rate at " + " ".join(f"C={c:<4}" for c in cs))
    for name, row in rows.items():
        lo, hi = row["expert_load_share_min_max"]
        print(f"{name:>14} {row['carry_over']:>10.3f} {lo:>6.3f}/{hi:<6.3f}              "
              + " ".join(f"{row['hit_rate_by_c'][c]:<6.3f}" for c in cs))
    if args.out:
        args.out.write_text(json.dumps({"command": "python benchmarks/probes/routing_locality.py " +
                                        " ".join(f"--trace {t}" for t in args.trace), "traces": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
