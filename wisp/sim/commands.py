"""`wisp sim`: replacement policies, allocator arms and the online controller replayed over traces.

It needs only a model's shape and traces, as `wisp plan` does (it reads them with `wisp.plan.commands`'
`model_shape` and `load_traces`, and prices the arms on the plan `plan_from_args` makes); no weights are
loaded. Its arguments are defined in wisp/sim/args.py (torch-free, so `wisp --help` stays fast).
`wisp sim --sessions` adds the online controller against fixed splits on agent-session workloads
(`wisp.sim.session_arms`).

Bad input (a missing file, an unknown policy, malformed --caps, --sessions without a budget) is a
WispError, which `wisp.cli` reports as one line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from wisp.config import ModelConfig
from wisp.errors import WispError
from wisp.plan.commands import check_trace_fits, load_traces, model_shape, plan_from_args
from wisp.sim.policies import OUT_OF_DOMAIN, POLICIES
from wisp.trace.format import RoutingTrace
from wisp.trace.kv_trace import KVTrace


def cmd_sim(args) -> int:
    """`wisp sim`: the policy table (stdout, --json, --plot); with --model and --vram-budget also the allocator
    arms and per-layer caps, and with --sessions the controller on session workloads."""
    from wisp.sim.plots import plot_policies
    from wisp.sim.policy_table import policy_table, references

    trace, kv = load_traces(args)
    if args.per_token:
        trace = one_step_per_token(trace)
    cfg = model_shape(args.model, args.dtype) if args.model and args.vram_budget else None
    if cfg is not None:
        check_trace_fits(trace, cfg, args.model)
    sessions = _session_inputs(args, cfg, trace) if args.sessions or args.replay_layers else None
    if sessions and kv is None:
        kv = sessions.workflows[0][1]  # the plan is made on the first workflow, as a user would plan once
    policies = _policies(args.policies)
    caps = _sim_caps(args.caps, trace.top_k, trace.num_experts)
    refs = references(trace)
    table = policy_table(trace, caps, policies)
    _print_policy_table(trace, caps, policies, table, refs)
    result = {"caps": caps, "references": refs, "misses": table}
    if cfg is not None and args.vram_budget:
        plan = plan_from_args(args, cfg, trace, kv)
        result.update(_sim_budget(args, cfg, plan))
        if sessions:
            result["sessions"] = _sim_sessions(args, plan, sessions)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.plot:
        plot_policies(caps, table, refs, args.plot)
    return 0


def one_step_per_token(trace: RoutingTrace) -> RoutingTrace:
    """The same routing with the step column dropped, so every token is its own step."""
    return RoutingTrace(trace.ids, trace.weights, None, trace.layers, trace.num_experts, trace.metadata)


def _policies(text: str) -> list[str]:
    policies = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise WispError(f"unknown policy {bad[0]!r}; choose from: {', '.join(POLICIES)}")
    return policies


def _sim_caps(text: str | None, top_k: int, num_experts: int) -> list[int]:
    """--caps, or up to 12 capacities spread over top_k..num_experts."""
    if not text:
        spread = torch.linspace(top_k, num_experts, min(12, num_experts - top_k + 1)).tolist()
        return sorted(set(int(round(c)) for c in spread))
    try:
        caps = [int(c) for c in text.split(",")]
    except ValueError:
        raise WispError(f"--caps must be comma-separated integers, got {text!r}") from None
    if any(c < 0 for c in caps):
        raise WispError(f"--caps must be >= 0, got {text!r}")
    return caps


def _print_policy_table(trace, caps: list[int], policies: list[str], table: dict[str, list[int]], refs: int) -> None:
    print(f"trace: {trace.num_tokens} tokens, {len(trace.layers)} layers, {trace.num_experts} experts, "
          f"top-{trace.top_k}, {refs} references")
    print("hit rate by capacity (misses / references; '-' = capacity below a step's expert set)")
    print(f"{'policy':8}" + "".join(f"{c:>8}" for c in caps))
    for p in policies:
        cells = ["       -" if m == OUT_OF_DOMAIN else f"{1 - m / refs:8.3f}" for m in table[p]]
        print(f"{p:8}" + "".join(cells))


def _sim_budget(args, cfg: ModelConfig, plan) -> dict:
    """The allocator arms and the per-layer caps at --vram-budget, printed; their JSON entries."""
    from wisp.sim.arms import allocator_arms

    arms = allocator_arms(plan, cfg.num_experts)
    _print_arms(args.vram_budget, plan, arms)
    per_layer = _per_layer_gain(plan)
    print(f"\nper-layer caps {per_layer['caps']}: {per_layer['misses_per_token']:.3f} expert misses/token against "
          f"{per_layer['uniform_misses_per_token']:.3f} with C = {plan.report.expert_cap} in every layer (same bytes; "
          f"{100 * per_layer['gain']:.1f}% fewer)")
    return {"arms": [a.to_json() for a in arms], "per_layer_caps": per_layer}


def _print_arms(vram_budget: int, plan, arms) -> None:
    report = plan.report
    print(f"\nallocator arms at {vram_budget / 2**30:.2f} GiB (pageable {report.pageable_bytes / 2**30:.2f} GiB, "
          f"floor {report.admission_floor_blocks} blocks)")
    print(f"{'arm':10}{'cap':>6}{'kv blocks':>11}{'floor ok':>9}{'exp miss/tok':>14}{'kv miss/req':>13}{'T (s/req)':>11}")
    for a in arms:
        cap = "-" if a.expert_cap is None else a.expert_cap
        print(f"{a.arm:10}{cap:>6}{a.kv_blocks:>11}{str(a.meets_floor):>9}"
              f"{a.expert_misses_per_token:>14.3f}{a.kv_block_misses_per_request:>13.2f}{a.predicted_latency_s:>11.4f}")


def _per_layer_gain(plan) -> dict:
    """Per-layer caps against the uniform cap: both predicted misses per token and the fraction saved."""
    uniform = plan.report.predicted_expert_misses_per_token
    uneven = plan.report.predicted_expert_misses_per_token_per_layer_caps
    gain = 1 - uneven / uniform if uniform else 0.0
    return {"caps": list(plan.per_layer_caps), "misses_per_token": uneven, "uniform_misses_per_token": uniform,
            "gain": gain}


@dataclass(frozen=True)
class _Sessions:
    routing: RoutingTrace  # what the session streams route by (replayed over the model's layers if asked)
    routing_note: str
    workflows: tuple[tuple[str, KVTrace], ...]  # (name from the file name, its KV trace), in the order given


def _session_inputs(args, cfg: ModelConfig | None, trace: RoutingTrace) -> _Sessions:
    """--sessions checked and read before anything is printed; WispError on bad input."""
    from wisp.sim.session_arms import workflow_name
    from wisp.trace.kv_trace import read_kv_trace

    if not args.sessions:
        raise WispError("--replay-layers applies only with --sessions")
    if cfg is None or not args.vram_budget:
        raise WispError("--sessions needs --model and --vram-budget (the budget the compared splits share)")
    if args.max_request_tokens < 1:
        raise WispError("--max-request-tokens must be >= 1")
    names = [workflow_name(f) for f in args.sessions]
    for f, name in zip(args.sessions, names):
        if not Path(f).is_file():
            raise WispError(f"--sessions file {f} does not exist")
        if names.count(name) > 1:
            raise WispError(f"two --sessions files have the workflow name {name!r} (from the file name); rename one")
    moe = list(cfg.moe_layer_ids)
    note = str(trace.metadata.get("note", args.trace))
    if args.replay_layers:
        trace = trace.replayed_over(moe)
        note = str(trace.metadata["note"])
    elif len(trace.layers) != len(moe):
        raise WispError(f"the routing trace has {len(trace.layers)} MoE layer(s) but {args.model} has {len(moe)}: "
                        f"pass --replay-layers to replay it for every layer (an approximation)")
    return _Sessions(trace, note, tuple((n, read_kv_trace(f, args.block_size)) for n, f in zip(names, args.sessions)))


def _sim_sessions(args, plan, sessions: _Sessions) -> dict:
    """The session workloads under every arm (`wisp.sim.session_arms`), printed; their JSON entry."""
    from wisp.sim.session_arms import SessionSetup, compare_workloads

    setup = SessionSetup(plan.curves.problem, plan.report.cost_model.expert_miss_seconds, plan.report.expert_cap,
                         args.max_request_tokens)
    results = compare_workloads(setup, sessions.routing, sessions.workflows)
    expert_routing = "the routing trace's tokens in turn, one per computed token (not these sessions' own routing)"
    print(f"\nsession workloads at {args.vram_budget / 2**30:.2f} GiB, floor {setup.problem.kv_floor} blocks, "
          f"at most {setup.max_tokens} tokens computed per request")
    print(f"routing: {sessions.routing_note}")
    print(f"expert side: {expert_routing}")
    print("seconds: predicted miss seconds over the workload; cap: oracle one per workflow, controller its start "
          "then each resize; mv-wsa: the plan above")
    for w in results:
        _print_workload(w)
    return {"routing": sessions.routing_note, "expert_side": expert_routing, "max_request_tokens": setup.max_tokens,
            "expert_miss_seconds": setup.expert_miss_seconds, "kv_miss_seconds": setup.problem.kv_cost,
            "workloads": [w.to_json() for w in results]}


def _print_workload(w) -> None:
    print(f"\nworkload {w.name}: {w.requests} requests, {w.tokens} tokens")
    print(f"{'arm':12}{'cap':>14}{'kv blocks':>22}{'floor ok':>9}{'seconds':>11}{'/ oracle':>10}{'resizes':>9}")
    for a in w.arms:
        print(f"{a.arm:12}{_values(a.caps):>14}{_values(a.kv_blocks):>22}{str(a.meets_floor):>9}{a.seconds:>11.3f}"
              f"{a.ratio_to_oracle:>10.3f}{len(a.resizes):>9}")


def _values(values: tuple[int, ...]) -> str:
    """'24', '24/40/24', or '24/40/../24' past four values."""
    shown = [str(v) for v in values] if len(values) <= 4 else [str(values[0]), str(values[1]), "..", str(values[-1])]
    return "/".join(shown)
