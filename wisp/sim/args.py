"""The arguments of `wisp sim` (its implementation is in wisp/sim/commands.py); the budget arguments are
`wisp plan`'s (`wisp.plan.args.add_budget_args`), optional here.

Invariant: imports neither torch nor the engine (see wisp/cli_args.py), so building the parser is cheap.
"""

from __future__ import annotations

from wisp.cli_args import CACHE_POLICIES, parse_output_file
from wisp.plan.args import add_budget_args


def add_parser(sub) -> None:
    sim = sub.add_parser("sim", help="replay a routing trace under cache policies and allocator arms")
    sim.add_argument("--trace", required=True)
    sim.add_argument("--policies", default="lru,opt,lfu,static", help=f"comma list of: {', '.join(CACHE_POLICIES)}")
    sim.add_argument("--caps", default=None, help="comma list of capacities (default: top_k..N, up to 12 values)")
    sim.add_argument("--per-token", action="store_true",
                     help="every token its own step (the batch-1 decode view the planner prices), ignoring the "
                          "trace's step column (e.g. the Qwen1.5 log's batched passes of up to 57 experts)")
    sim.add_argument("--json", type=parse_output_file, default=None, help="also write the results as JSON here")
    sim.add_argument("--plot", type=parse_output_file, default=None, help="write a PNG of hit rate against capacity per policy")
    sim.add_argument("--sessions", nargs="+", default=None, metavar="FILE",
                     help="agent-session KV traces (needs --model, --vram-budget): the online controller against the "
                          "oracle, best static, the plan, 50-50 and KV-blind splits, per file and all back to back")
    sim.add_argument("--replay-layers", action="store_true",
                     help="with --sessions: replay a trace of fewer layers for every MoE layer at token offsets "
                          "(an approximation, labelled as such in the output)")
    sim.add_argument("--max-request-tokens", type=int, default=256,
                     help="with --sessions: tokens one request computes, at most (default 256)")
    add_budget_args(sim, required=False)
