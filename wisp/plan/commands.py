"""`wisp plan` and `wisp sim`: the planner and the trace simulator on the command line.

Both need only a model's shape (a checkpoint directory's config.json, `demo`, or a preset name such as
qwen3-30b-a3b), a routing trace, and optionally a KV trace; no weights are loaded. Their arguments are
defined in wisp/plan/args.py (torch-free, so `wisp --help` stays fast). `wisp sim --sessions` adds the
online controller against fixed splits on agent-session workloads (`wisp.plan.session_arms`).
`wisp plan --hybrid-costs` also prices every feasible cap both ways (`wisp.plan.hybrid_cost`): paged from the
exact LRU curve, hybrid from a simulation of its policy over the trace (hybrid does not cache the CPU's
experts, so it is not a stack algorithm and has no one-pass curve).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from wisp.config import EngineConfig, ModelConfig, parse_dtype, resolve_device
from wisp.errors import WispError
from wisp.plan.policies import OUT_OF_DOMAIN, POLICIES
from wisp.trace.format import RoutingTrace
from wisp.trace.kv_trace import KVTrace


def model_shape(name: str, dtype: str | None = None) -> ModelConfig:
    """A model's config without its weights: a preset, 'demo', a folder or a hub id (as the engine resolves it)."""
    from wisp.models.source import model_source

    cfg = model_source(EngineConfig(model=name, load_format="dummy"))[1]
    override = parse_dtype(dtype)
    if override is not None:
        from dataclasses import replace

        cfg = replace(cfg, dtype=override)
    return cfg


def load_traces(args) -> tuple:
    from wisp.trace.kv_trace import read_kv_trace
    from wisp.trace.readers import load_any

    if not Path(args.trace).is_file():
        raise WispError(f"routing trace {args.trace} does not exist")
    try:
        trace = load_any(args.trace)
    except (ValueError, KeyError, OSError, TypeError, AttributeError, IndexError) as exc:
        raise WispError(f"could not read routing trace {args.trace}: {exc}") from None
    kv = read_kv_trace(args.kv_trace, args.block_size) if args.kv_trace else None
    return trace, kv


def _plan_inputs(args, cfg: ModelConfig):
    """--embedding host plans for a served model that keeps its table in host memory, wherever `wisp plan` runs."""
    from wisp.models.token_embedding import embedding_on_host
    from wisp.plan.plan_file import read_hybrid_costs
    from wisp.plan.planner import PlanInputs

    for name in ("max_concurrency", "max_model_len", "block_size"):
        if getattr(args, name) < 1:
            raise WispError(f"--{name.replace('_', '-')} must be >= 1")
    costs_file = getattr(args, "hybrid_costs", None)  # `wisp plan` only
    return PlanInputs(args.vram_budget, args.max_concurrency, args.max_model_len, args.block_size,
                      seconds_per_byte=args.t_byte, recompute_seconds_per_token=args.recompute_cost,
                      reserve_bytes=args.reserve, tokens_per_request=args.tokens_per_request,
                      hybrid_costs=read_hybrid_costs(costs_file) if costs_file else None,
                      embedding_on_host=not cfg.tie_word_embeddings and (args.embedding == "host" or embedding_on_host(
                          args.embedding, resolve_device(args.device), cfg.tie_word_embeddings)))


def _make_plan(args, cfg: ModelConfig, trace, kv):
    """The plan the command line asks for."""
    from wisp.plan.planner import make_plan

    return make_plan(cfg, _plan_inputs(args, cfg), trace, kv, resolve_device(args.device))


def cmd_plan(args) -> int:
    """`wisp plan`: the plan (stdout or --out) and its summary line (stderr); with --hybrid-costs, the paged
    (exact LRU) against hybrid (simulated replay) miss time per cap and the advice, on stderr."""
    from wisp.plan.plan_file import plan_text, write_plan
    from wisp.plan.plots import plot_plan

    cfg = model_shape(args.model, args.dtype)
    trace, kv = load_traces(args)
    plan = _make_plan(args, cfg, trace, kv)
    if args.out:
        write_plan(plan, args.out)
    else:
        print(plan_text(plan))
    if args.plot:
        plot_plan(plan, args.plot)
    report = plan.report
    print(
        f"wisp: plan C={report.expert_cap} ({report.expert_bytes / 2**30:.2f} GiB experts), "
        f"kv_blocks={plan.kv_blocks} ({report.kv_bytes / 2**30:.2f} GiB), floor={report.admission_floor_blocks}",
        file=sys.stderr,
    )
    if plan.hybrid is not None:
        from wisp.plan.hybrid_cost import advice_lines

        print("\n".join(advice_lines(plan.hybrid, report.slot_bytes)), file=sys.stderr)
    return 0


def cmd_sim(args) -> int:
    from wisp.plan.plots import plot_policies
    from wisp.plan.simulate import policy_table, references

    trace, kv = load_traces(args)
    if args.per_token:
        trace = one_step_per_token(trace)
    cfg = model_shape(args.model, args.dtype) if args.model and args.vram_budget else None
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
        plan = _make_plan(args, cfg, trace, kv)
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
    from wisp.plan.arms import allocator_arms

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
    from wisp.plan.session_arms import workflow_name
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
    """The session workloads under every arm (`wisp.plan.session_arms`), printed; their JSON entry."""
    from wisp.plan.session_arms import SessionSetup, compare_workloads

    setup = SessionSetup(plan.curves.problem, plan.report.cost_model.expert_miss_seconds, plan.report.expert_cap,
                         args.max_request_tokens)
    results = compare_workloads(setup, sessions.routing, sessions.workflows)
    expert_side = "the routing trace's tokens in turn, one per computed token (not these sessions' own routing)"
    print(f"\nsession workloads at {args.vram_budget / 2**30:.2f} GiB, floor {setup.problem.kv_floor} blocks, "
          f"at most {setup.max_tokens} tokens computed per request")
    print(f"routing: {sessions.routing_note}")
    print(f"expert side: {expert_side}")
    print("seconds: predicted miss seconds over the workload; cap: oracle one per workflow, controller its start "
          "then each resize; mv-wsa: the plan above")
    for w in results:
        _print_workload(w)
    return {"routing": sessions.routing_note, "expert_side": expert_side, "max_request_tokens": setup.max_tokens,
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
