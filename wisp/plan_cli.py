"""`wisp plan` and `wisp sim`: the planner and the trace simulator on the command line.

Both need only a model's shape (a checkpoint directory's config.json, `demo`, or a preset name such as
qwen3-30b-a3b), a routing trace, and optionally a KV trace; no weights are loaded. Their arguments are
defined in wisp/plan_args.py (torch-free, so `wisp --help` stays fast).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from wisp.config import EngineConfig, ModelConfig, parse_dtype, resolve_device
from wisp.errors import WispError
from wisp.trace.policies import OUT_OF_DOMAIN, POLICIES


def model_shape(name: str, dtype: str | None = None) -> ModelConfig:
    """A model's config without its weights: a preset, 'demo', a folder or a hub id (as the engine resolves it)."""
    from wisp.engine.engine import model_source

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


def _plan_inputs(args):
    from wisp.planner import PlanInputs

    for name in ("max_concurrency", "max_model_len", "block_size"):
        if getattr(args, name) < 1:
            raise WispError(f"--{name.replace('_', '-')} must be >= 1")
    return PlanInputs(args.vram_budget, args.max_concurrency, args.max_model_len, args.block_size, args.t_byte,
                      args.recompute_cost, args.reserve, args.tokens_per_request)


def cmd_plan(args) -> int:
    from wisp.planner import make_plan, plot_plan, write_plan

    cfg = model_shape(args.model, args.dtype)
    trace, kv = load_traces(args)
    plan = make_plan(cfg, _plan_inputs(args), trace, kv, resolve_device(args.device))
    if args.out:
        write_plan(plan, args.out)
    else:
        print(json.dumps({k: v for k, v in plan.items() if not k.startswith("_")}, indent=1))
    if args.plot:
        plot_plan(plan, args.plot)
    print(
        f"wisp: plan C={plan['expert_cap']} ({plan['expert_bytes'] / 2**30:.2f} GiB experts), "
        f"kv_blocks={plan['kv_blocks']} ({plan['kv_bytes'] / 2**30:.2f} GiB), floor={plan['admission_floor_blocks']}",
        file=sys.stderr,
    )
    return 0


def cmd_sim(args) -> int:
    from wisp.planner import make_plan
    from wisp.trace.simulate import allocator_arms, policy_table, references

    trace, kv = load_traces(args)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise WispError(f"unknown policy {bad[0]!r}; choose from: {', '.join(POLICIES)}")
    n, k = trace.num_experts, trace.top_k
    if args.caps:
        try:
            caps = [int(c) for c in args.caps.split(",")]
        except ValueError:
            raise WispError(f"--caps must be comma-separated integers, got {args.caps!r}") from None
        if any(c < 0 for c in caps):
            raise WispError(f"--caps must be >= 0, got {args.caps!r}")
    else:
        caps = sorted(set(int(round(c)) for c in torch.linspace(k, n, min(12, n - k + 1)).tolist()))
    refs = references(trace)
    table = policy_table(trace, caps, policies)
    print(f"trace: {trace.num_tokens} tokens, {len(trace.layers)} layers, {n} experts, top-{k}, {refs} references")
    print("hit rate by capacity (misses / references; '-' = capacity below a step's expert set)")
    print(f"{'policy':8}" + "".join(f"{c:>8}" for c in caps))
    for p in policies:
        cells = ["       -" if m == OUT_OF_DOMAIN else f"{1 - m / refs:8.3f}" for m in table[p]]
        print(f"{p:8}" + "".join(cells))
    result = {"caps": caps, "references": refs, "misses": table}
    if args.model and args.vram_budget:
        cfg = model_shape(args.model, args.dtype)
        plan = make_plan(cfg, _plan_inputs(args), trace, kv, resolve_device(args.device))
        arms = allocator_arms(plan, cfg.num_experts)
        print(f"\nallocator arms at {args.vram_budget / 2**30:.2f} GiB (pageable {plan['pageable_bytes'] / 2**30:.2f} GiB, "
              f"floor {plan['admission_floor_blocks']} blocks)")
        print(f"{'arm':10}{'cap':>6}{'kv blocks':>11}{'floor ok':>9}{'exp miss/tok':>14}{'kv miss/req':>13}{'T (s/req)':>11}")
        for a in arms:
            cap = "-" if a["expert_cap"] is None else a["expert_cap"]
            print(f"{a['arm']:10}{cap:>6}{a['kv_blocks']:>11}{str(a['meets_floor']):>9}"
                  f"{a['expert_misses_per_token']:>14.3f}{a['kv_block_misses_per_request']:>13.2f}{a['predicted_latency_s']:>11.4f}")
        result["arms"] = arms
        uniform, uneven = plan["predicted_expert_misses_per_token"], plan["predicted_expert_misses_per_token_per_layer_caps"]
        gain = 1 - uneven / uniform if uniform else 0.0
        print(f"\nper-layer caps {plan['per_layer_caps']}: {uneven:.3f} expert misses/token against {uniform:.3f} "
              f"with C = {plan['expert_cap']} in every layer (same bytes; {100 * gain:.1f}% fewer)")
        result["per_layer_caps"] = {"caps": plan["per_layer_caps"], "misses_per_token": uneven,
                                    "uniform_misses_per_token": uniform, "gain": gain}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.plot:
        _plot_policies(caps, table, refs, args.plot)
    return 0


def _plot_policies(caps, table, refs, path) -> None:
    from wisp.planner import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for p, misses in table.items():
        pts = [(c, 1 - m / refs) for c, m in zip(caps, misses) if m != OUT_OF_DOMAIN]
        ax.plot([c for c, _ in pts], [h for _, h in pts], marker="o", label=p)
    ax.set(xlabel="expert slots per layer (C)", ylabel="hit rate", title="expert cache policies on the trace")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
