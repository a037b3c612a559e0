"""The online split controller against static splits and a per-workflow oracle on agent sessions (the
paper's Table 5 setting, simulated on the CPU): OLMoE-1B-7B shape, 8 GiB, concurrency 4, context 4096.

Each workload is AgentInstruct sessions (../shared/data/agent_sessions) run back to back: single workflows
(os, db, webshop) and the drift os -> db -> webshop. Expert routing: OLMoE's real layer-0 GSM8K trace,
replayed for all 16 layers at different offsets (an approximation: real layers differ). Costs: the
H200's probed 55.2 GB/s and the Qwen3-shape recompute estimate used in docs/planning.md. Seconds are
predicted miss seconds over the workload (`wisp.plan.controller_sim`: exact LRU misses per request).
"mv-wsa" is the offline plan made on the os sessions, as a user would plan once.

    python benchmarks/controller_sessions.py [--data ../shared/data] [--out benchmarks/results/logs/controller_sessions.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from wisp.config import ModelConfig
from wisp.models.presets import preset
from wisp.plan.arms import half_half_cap, kv_blind_cap
from wisp.plan.controller import ControllerConfig
from wisp.plan.controller_sim import simulate_controller, stream_seconds
from wisp.plan.planner import PlanInputs, make_plan
from wisp.plan.session_sim import session_requests
from wisp.trace.format import RoutingTrace
from wisp.trace.kv_trace import read_kv_trace
from wisp.trace.readers import load_any

WORKLOADS = {"os": ["os"], "db": ["db"], "webshop": ["webshop"], "os->db->webshop": ["os", "db", "webshop"]}


def all_layers(layer0: RoutingTrace, layers: int) -> RoutingTrace:
    """Layer 0's routing for every layer, layer l starting l * T / layers tokens later (an approximation)."""
    ids = layer0.ids[:, 0, :]
    t = len(ids)
    stacked = np.stack([np.roll(ids, -(l * t // layers), axis=0) for l in range(layers)], axis=1)
    return RoutingTrace(stacked, layers=list(range(layers)), num_experts=layer0.num_experts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", default="benchmarks/results/logs/controller_sessions.json")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens computed per request, at most")
    args = ap.parse_args()
    data = Path(args.data)
    cfg = ModelConfig.from_hf(preset("olmoe-1b-7b"))
    routing = all_layers(load_any(data / "layer0_only_vllm_logs" / "olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl"),
                         cfg.num_layers)
    kv = {w: read_kv_trace(data / "agent_sessions" / f"agentinstruct_{w}_sample5.json") for w in ("os", "db", "webshop")}
    inputs = PlanInputs(vram_budget=8 << 30, max_concurrency=4, max_model_len=4096, seconds_per_byte=1.8126e-11,
                        recompute_seconds_per_token=2.2631e-05)
    plan = make_plan(cfg, inputs, routing, kv["os"], torch.device("cpu"))
    problem, costs = plan.curves.problem, plan.report.cost_model
    config = ControllerConfig(problem, resolve_every=4, min_gain=0.05, half_life=20000.0, min_observations=2000)
    records = []
    for name, flows in WORKLOADS.items():
        requests = session_requests(routing, [(w, kv[w]) for w in flows], args.max_tokens)
        arms = {r.arm: r for r in simulate_controller(config, requests, costs.expert_miss_seconds,
                                                      start_cap=plan.report.expert_cap)}
        mv_wsa = stream_seconds(problem, requests, plan.report.expert_cap, costs.expert_miss_seconds)
        half, blind = half_half_cap(problem), kv_blind_cap(problem)
        oracle = arms["oracle"].seconds
        row = {"workload": name, "requests": len(requests), "tokens": sum(r.tokens for r in requests),
               "mv_wsa_cap": plan.report.expert_cap,
               "seconds": {"oracle": oracle, "mv-wsa": mv_wsa, "best-static": arms["best-static"].seconds,
                           "50-50": stream_seconds(problem, requests, half, costs.expert_miss_seconds),
                           "kv-blind": stream_seconds(problem, requests, blind, costs.expert_miss_seconds),
                           "controller": arms["controller"].seconds},
               "controller_resizes": arms["controller"].resizes}
        row["vs_oracle"] = {k: round(v / oracle - 1, 4) for k, v in row["seconds"].items()}
        records.append(row)
        print(f"{name:17} " + "  ".join(f"{k} {v:.2f}s ({row['vs_oracle'][k]:+.1%})" for k, v in row["seconds"].items())
              + f"  resizes {row['controller_resizes']}")
    out = {"setting": "olmoe-1b-7b shape, 8 GiB, W=4, L=4096, t_byte 1.8126e-11 s/B, recompute 2.2631e-05 s/token",
           "routing": "OLMoE layer-0 GSM8K trace for all 16 layers at offsets (approximation)",
           "command": "python benchmarks/controller_sessions.py", "workloads": records}
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
