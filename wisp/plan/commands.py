"""`wisp plan`: the planner on the command line.

It needs only a model's shape (a checkpoint directory's config.json, `demo`, or a preset name such as
qwen3-30b-a3b), a routing trace, and optionally a KV trace; no weights are loaded. Its arguments are
defined in wisp/plan/args.py (torch-free, so `wisp --help` stays fast). `wisp plan --hybrid-costs` also
prices every feasible cap both ways (`wisp.plan.hybrid_cost`): paged from the exact LRU curve, hybrid from
a replay of its policy over the trace (hybrid does not cache the CPU's experts, so it is not a stack
algorithm and has no one-pass curve). `model_shape`, `load_traces` and `plan_from_args` are shared with
`wisp sim` (wisp/sim/commands.py), which reads the same budget arguments.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from wisp.config import EngineConfig, ModelConfig, packs_projections, parse_dtype, resolve_device
from wisp.errors import WispError


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

    path = Path(args.trace)
    if path.is_dir():
        raise WispError(f"routing trace {args.trace} is a folder; give a trace file (.npz or .jsonl)")
    if not path.is_file():
        raise WispError(f"routing trace {args.trace} does not exist")
    try:
        trace = load_any(args.trace)
    except (zipfile.BadZipFile, EOFError):
        raise WispError(f"could not read routing trace {args.trace}: not a whole .npz archive (truncated, or not "
                        "an .npz at all)") from None
    except (ValueError, KeyError, OSError, TypeError, AttributeError, IndexError) as exc:
        raise WispError(f"could not read routing trace {args.trace}: {exc}") from None
    if trace.num_tokens == 0:
        raise WispError(f"routing trace {args.trace} holds no tokens: there is nothing to plan or simulate from")
    kv = read_kv_trace(args.kv_trace, args.block_size) if args.kv_trace else None
    return trace, kv


def check_trace_fits(trace, cfg: ModelConfig, model: str) -> None:
    """A routing trace can price `model` only if it routes the model's top_k of at most its experts (a trace that
    names its expert count must name the model's)."""
    if trace.top_k != cfg.top_k:
        raise WispError(f"the routing trace routes top-{trace.top_k} but {model} routes top-{cfg.top_k}: record a "
                        f"trace of {model} (`wisp generate|serve --record-routing`)")
    named = trace.metadata.get("num_experts")
    if trace.num_experts > cfg.num_experts or (named is not None and int(named) != cfg.num_experts):
        raise WispError(f"the routing trace routes over {trace.num_experts} experts but {model} has "
                        f"{cfg.num_experts}: record a trace of {model} (`wisp generate|serve --record-routing`)")


def _plan_inputs(args, cfg: ModelConfig):
    """--embedding host plans for a served model that keeps its table in host memory, wherever `wisp plan` runs; a
    GGUF file's packed projections count at their bytes where a paged server on that device keeps them packed."""
    from wisp.models.token_embedding import embedding_on_host
    from wisp.plan.plan_file import read_hybrid_costs
    from wisp.plan.planner import PlanInputs

    for name in ("max_concurrency", "max_model_len", "block_size"):
        if getattr(args, name) < 1:
            raise WispError(f"--{name.replace('_', '-')} must be >= 1")
    costs_file = getattr(args, "hybrid_costs", None)  # `wisp plan` only
    device = resolve_device(args.device)
    return PlanInputs(args.vram_budget, args.max_concurrency, args.max_model_len, args.block_size,
                      seconds_per_byte=args.seconds_per_byte, recompute_seconds_per_token=args.recompute_cost,
                      reserve_bytes=args.reserve, tokens_per_request=args.tokens_per_request,
                      hybrid_costs=read_hybrid_costs(costs_file) if costs_file else None,
                      embedding_on_host=not cfg.tie_word_embeddings and (args.embedding == "host" or embedding_on_host(
                          args.embedding, device, cfg.tie_word_embeddings)),
                      packed_projections=packs_projections(cfg, PAGED_SERVER, device))


PAGED_SERVER = EngineConfig(model="", mode="paged")  # what a plan is for: a paged server with the default backends


def plan_from_args(args, cfg: ModelConfig, trace, kv):
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
    check_trace_fits(trace, cfg, args.model)
    plan = plan_from_args(args, cfg, trace, kv)
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
