"""`wisp bench agent`: multi-turn agent sessions replayed against one VRAM budget, one record per arm.

Workload: `--sessions FILE...` (`wisp.bench.agent_sessions`: AgentInstruct conversations, tokenized by the
checkpoint's tokenizer or, without one, a byte-level BPE trained on the sessions; or the agentinfer log's
real token counts). `--concurrency W` sessions run at once; each sends turn k+1 (the whole conversation
so far) when turn k's reply is done, as an agent framework does, and a finished session's slot takes the
next session in file order (so several files run back to back: a drifting workload). Replies are the
dataset's length, capped (`--max-reply-tokens`), with ignore_eos. `--phases W:N,...` changes the concurrency in
phases, one after another in one engine (`wisp.bench.agent_phases`); the engine's W is then the widest phase.

Tools: `--tools` sends AgentInstruct sessions as tool sessions (`wisp.bench.agent_tools`: the workflow's tools in
the first message, actions as hermes calls, observations as tool messages) and forces every reply to be one call to
those tools, as `tool_choice: "required"` would (`wisp.bench.agent_tool_replay`); max_tokens stays the dataset's reply
length, capped. The records then say `"tools": true` and how many turns ended in a complete call.

Routing: `--routing-trace FILE` replays real routing for every token, prefill and decode
(`wisp.trace.session_replay`), each session from its own offset; a one-layer trace is spread over all
layers at different offsets (an approximation, labelled `routing: approx-layer0:<file>`). Without a trace the
random router routes (far more repetitively than a trained model: labelled `routing: random-router`).

Why in process, not through the server and the `openai` client: the GPU machine has no FastAPI, uvicorn or
openai, and what is compared here is the engine's split, which the HTTP layer does not change. Times are
the engine's own (request arrival -> first token -> last token, `Sequence` timestamps). A turn's TTFT is
an agent's: the history it resends may come from the prefix cache (unlike `wisp bench prefill`'s cold TTFT).

Budget: `--vram-budget` is the whole device budget. Arms are sized by `wisp.bench.agent_arms` from a plan
made on this workload (its costs: host->device seconds per byte probed on CUDA, 1e-10 on the CPU; seconds per
recomputed token `--recompute-cost`, else estimated on the device, and recorded); after a warm-up the peak
allocator statistic is reset and each record reports `peak_gpu_bytes` (torch.cuda.max_memory_allocated while
serving) and `within_budget`.

Arms: each runs isolated from the others (`wisp.bench.agent_run`: a fresh process by default), in the order
given (repeats allowed, each its own record with its `position`) or, with `--order abba`, the arms and then the
same arms reversed, so that an effect of running early or late shows as a difference between an arm's two runs.
The controller arm's KV floor follows the requests in flight (`--admission-window`; 0 keeps W x L).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from wisp.bench.agent_arms import arm_specs, parse_arms
from wisp.bench.agent_phases import Phase, one_phase, parse_phases, sessions_for_phases
from wisp.bench.agent_run import run_arm_isolated
from wisp.bench.agent_sessions import END_OF_TEXT, Session, load_sessions, train_session_tokenizer
from wisp.bench.agent_tool_replay import ToolGrammarSource
from wisp.bench.decode import _git_commit, model_config_for, probe_h2d_gbps
from wisp.bench.routing import routing_for, uniform_trace
from wisp.config import EngineConfig, ModelConfig, resolve_device
from wisp.errors import WispError
from wisp.models.token_embedding import embedding_on_host
from wisp.plan.planner import PlanInputs, make_plan
from wisp.trace.kv_trace import KVTrace


def session_kv_trace(sessions: list[Session], phases: list[Phase], block_size: int) -> KVTrace:
    """The workload as the planner's KV trace: turns in the order `serve_phases` roughly sends them (per phase,
    round robin over groups of its width)."""
    kv, first = KVTrace(block_size), 0
    for phase in phases:
        for g in range(first, first + phase.sessions, phase.width):
            group = sessions[g : min(g + phase.width, first + phase.sessions)]
            for k in range(max(len(s.turns) for s in group)):
                for s in group:
                    if k < len(s.turns):
                        kv.add(s.name, len(s.turns[k].prompt_ids), s.turns[k].reply_tokens)
        first += phase.sessions
    return kv


def _sessions(args, cfg: ModelConfig) -> tuple[list[Session], ToolGrammarSource | None]:
    """The workload's sessions and, with --tools, what the arms force their calls with (the same tokenizer)."""
    from wisp.models.source import model_source

    path = model_source(EngineConfig(model=args.model, load_format=args.load_format))[0]
    tokenizer_file = path / "tokenizer.json" if path is not None else None
    if tokenizer_file is not None and tokenizer_file.is_file():
        from tokenizers import Tokenizer

        tokenizer, end_ids = Tokenizer.from_file(str(tokenizer_file)), tuple(cfg.eos_token_ids)
        text = tokenizer_file.read_text  # the file the engine's own grammars read
    else:
        texts = [p for p in args.sessions if "agentinfer" not in Path(p).name]
        tokenizer = train_session_tokenizer(texts, cfg.vocab_size, args.tools) if texts else None
        end_ids = (tokenizer.token_to_id(END_OF_TEXT),) if args.tools and tokenizer is not None else ()
        text = tokenizer.to_str if tokenizer is not None else str
    sessions = load_sessions(args.sessions, tokenizer, args.max_reply_tokens,
                             args.max_model_len - args.max_reply_tokens - 1, cfg.vocab_size, args.tools)
    tools = ToolGrammarSource(text(), end_ids, cfg.vocab_size) if args.tools else None
    return (sessions[: args.max_sessions] if args.max_sessions else sessions), tools


def _phases(args, sessions: list[Session], vocab_size: int) -> tuple[list[Phase], list[Session]]:
    """The phases and the sessions they serve; sets args.concurrency to the engine's W (the widest phase)."""
    if args.phases is None:
        args.concurrency = args.concurrency or 4
        return one_phase(args.concurrency, len(sessions)), sessions
    phases = parse_phases(args.phases)
    widest = max(p.width for p in phases)
    if args.concurrency not in (None, widest):
        raise WispError(f"--concurrency {args.concurrency} with --phases {args.phases}: the engine's W is the widest "
                        f"phase ({widest}); leave --concurrency out")
    args.concurrency = widest
    return phases, sessions_for_phases(sessions, phases, vocab_size)


def fit_max_model_len(args, cfg: ModelConfig) -> None:
    """--max-model-len left out: 4096, or the model's max_position_embeddings when smaller (said on stderr)."""
    if args.max_model_len is None:
        args.max_model_len = min(4096, cfg.max_position_embeddings)
        if args.max_model_len < 4096:
            print(f"wisp: --max-model-len {args.max_model_len}, the model's max_position_embeddings", file=sys.stderr)


def arm_order(names: list[str], order: str) -> list[str]:
    """The arms in the order they run: as given, or ABBA (as given, then reversed)."""
    return names + names[::-1] if order == "abba" else list(names)


def bench_agent(args) -> list[dict]:
    names = arm_order(parse_arms(args.arms), args.order)
    device = resolve_device(args.device)
    cfg = model_config_for(args.model, args.load_format)
    fit_max_model_len(args, cfg)
    loaded, tools = _sessions(args, cfg)
    phases, sessions = _phases(args, loaded, cfg.vocab_size)
    trace, routing = routing_for(args.routing_trace, cfg, max(8192, len(sessions) * args.max_model_len))
    gbps = probe_h2d_gbps(device)
    inputs = PlanInputs(vram_budget=args.vram_budget, max_concurrency=args.concurrency, max_model_len=args.max_model_len,
                        seconds_per_byte=None if device.type == "cuda" else 1e-10,
                        recompute_seconds_per_token=args.recompute_cost,
                        embedding_on_host=embedding_on_host(args.embedding, device, cfg.tie_word_embeddings))
    plan_trace = trace if trace is not None else uniform_trace(cfg, 512)
    plan = make_plan(cfg, inputs, plan_trace, session_kv_trace(sessions, phases, 16), device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    common = {"model": args.model, "routing": routing, "workload": [Path(p).name for p in args.sessions],
              "sessions": len(sessions), "concurrency": args.concurrency, "vram_budget": args.vram_budget,
              "reserve_bytes": plan.report.reserve_bytes, "non_expert_bytes": plan.report.non_expert_bytes,
              "pageable_bytes": plan.report.pageable_bytes, "admission_floor_blocks": plan.report.admission_floor_blocks,
              "recompute_seconds_per_token": plan.report.cost_model.recompute_seconds_per_token,
              "h2d_gbps_probe": round(gbps, 2), "device": gpu, "commit": _git_commit(), "isolation": args.isolation,
              "tools": args.tools,
              "command": "wisp bench agent " + " ".join(sys.argv[3:])}
    if args.phases is not None:
        common["phases"] = args.phases
    records = []
    for position, spec in enumerate(arm_specs(plan, names, cfg.num_experts, args.controller_start)):
        r = run_arm_isolated(args.isolation, args, cfg, spec, sessions, phases, trace, plan.curves.problem, tools)
        r.update(common, position=position,
                 within_budget=r["peak_gpu_bytes"] <= args.vram_budget if device.type == "cuda" else None)
        records.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
        if args.out:  # after every arm: a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps(records, indent=1))
    _print_table(records)
    if args.plot:
        plot_arms(records, args.plot)
    return records


def _print_table(records: list[dict]) -> None:
    print(f"{'arm':11}{'cap':>5}{'kv blk':>8}{'TTFT p50':>10}{'p90':>8}{'dec tok/s':>11}{'turn p50':>10}{'p90':>8}"
          f"{'e2e s':>8}{'hit':>7}{'preempt':>8}{'peak GB':>9}")
    for r in records:
        cap = "-" if r["expert_cap"] is None else r["expert_cap"]
        print(f"{r['arm']:11}{cap:>5}{r['kv_blocks']:>8}{r['ttft_p50_s']:>10.3f}{r['ttft_p90_s']:>8.3f}"
              f"{r['decode_tok_s']:>11.2f}{r['turn_wall_p50_s']:>10.3f}{r['turn_wall_p90_s']:>8.3f}{r['e2e_wall_s']:>8.2f}"
              f"{r['hit_rate']:>7.3f}{r['preemptions']:>8}{r['peak_gpu_bytes'] / 1e9:>9.2f}")
    r = records[0]
    print(f"budget {r['vram_budget'] / 2**30:.2f} GiB on {r['device']}; routing {r['routing']}; "
          f"{r['sessions']} sessions at concurrency {r.get('phases', r['concurrency'])}")
    for r in records:
        if "tool_calls" in r:
            calls = r["tool_calls"]
            print(f"{r['arm']:11}tool calls: {calls['complete']} complete, {calls['cut']} cut at max_tokens, "
                  f"{calls['other']} other; grammar masks {r['grammar_mask_s']:.3f} s")
    r = records[0]
    if "phases" not in r:
        return
    print(f"{'arm':11}{'phase':>6}{'W':>4}{'wall s':>9}{'out tok/s':>11}{'dec tok/s':>11}{'TTFT p50':>10}{'hit':>7}"
          f"{'cap end':>9}{'kv end':>8}{'admit':>7}")
    for r in records:
        for p, ph in enumerate(r["per_phase"]):
            print(f"{r['arm']:11}{p:>6}{ph['width']:>4}{ph['wall_s']:>9.2f}{ph['output_tok_s'] or 0:>11.2f}"
                  f"{ph['decode_tok_s'] or 0:>11.2f}{ph['ttft_p50_s'] or 0:>10.3f}{ph['hit_rate'] or 0:>7.3f}"
                  f"{ph['expert_cap_end']:>9}{ph['kv_blocks_end']:>8}{ph['admission_limit_end']:>7}")


def plot_arms(records: list[dict], path: str) -> None:
    """Turn wall (p50, p90) and TTFT p50 per arm, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [r["arm"] for r in records]
    x = np.arange(len(arms))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(x - 0.27, [r["turn_wall_p50_s"] for r in records], 0.27, label="turn wall p50")
    ax.bar(x, [r["turn_wall_p90_s"] for r in records], 0.27, label="turn wall p90")
    ax.bar(x + 0.27, [r["ttft_p50_s"] for r in records], 0.27, label="TTFT p50")
    ax.set_xticks(x, arms)
    ax.set_ylabel("seconds")
    r = records[0]
    ax.set_title(f"{r['model']}, {r['vram_budget'] / 2**30:.0f} GiB, W={r['concurrency']}, {r['routing']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
