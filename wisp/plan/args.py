"""The arguments of `wisp plan` (its implementation is in wisp/plan/commands.py), and the budget arguments
`wisp sim` shares (wisp/sim/args.py).

Invariant: imports neither torch nor the engine (see wisp/cli_args.py), so building the parser is cheap.
A renamed flag keeps its old spelling as a hidden alias: --t-byte is --seconds-per-byte.
"""

from __future__ import annotations

import argparse

from wisp.cli_args import EMBEDDINGS, parse_output_file, parse_size
from wisp.models.presets import PRESETS


def add_budget_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--model", required=required, help=f"checkpoint dir, 'demo', or a preset: {', '.join(PRESETS)}")
    p.add_argument("--dtype", default=None, help="override the checkpoint dtype (sizes scale with it)")
    p.add_argument("--vram-budget", type=parse_size, required=required, help="total VRAM to plan for, e.g. 20GiB")
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-trace", default=None, help="KV workload (JSONL of requests, AgentInstruct sessions, ...)")
    p.add_argument("--seconds-per-byte", type=float, default=None, help="seconds per host->device byte (default: probe)")
    p.add_argument("--t-byte", type=float, dest="seconds_per_byte", default=None, help=argparse.SUPPRESS)  # old name
    p.add_argument("--recompute-cost", type=float, default=None, help="seconds per recomputed token (default: estimate)")
    p.add_argument("--reserve", type=parse_size, default=1 << 29, help="activations/workspace reserve (default 512MiB)")
    p.add_argument("--tokens-per-request", type=int, default=None)
    p.add_argument("--device", default="auto", help="where to probe the costs: auto, cpu or cuda")
    p.add_argument("--embedding", choices=EMBEDDINGS, default="auto",
                   help="where the served model keeps its token embedding table (auto: host memory on CUDA when it "
                        "is not also the LM head): a host table is not budgeted")


def add_parser(sub) -> None:
    plan = sub.add_parser("plan", help="split a VRAM budget between expert slots and the KV pool")
    add_budget_args(plan, required=True)
    plan.add_argument("--trace", required=True, help="routing trace (.npz/.jsonl, or a shared real trace)")
    plan.add_argument("--out", type=parse_output_file, default=None, help="write the plan JSON here (default: stdout)")
    plan.add_argument("--plot", type=parse_output_file, default=None, help="write a PNG with both miss curves and the predicted latency by expert fraction")
    plan.add_argument("--hybrid-costs", default=None, metavar="FILE.json",
                      help="a JSON object of hybrid mode's costs (copy_s, cpu_rows, cpu_s_at_rows, optional "
                           "cpu_overhead_s; seconds): also compare paged (exact LRU) and --mode hybrid (simulated) "
                           "decode time per cap, and say whether hybrid at a smaller cap wins (docs/hybrid.md)")

