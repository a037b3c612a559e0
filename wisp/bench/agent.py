"""`wisp bench agent`: multi-turn agent sessions replayed against one VRAM budget, one record per arm.

Workload: `--sessions FILE...` (`wisp.bench.agent_sessions`: AgentInstruct conversations, tokenized by the
checkpoint's tokenizer or, without one, a byte-level BPE trained on the sessions; or the agentinfer log's
real token counts). `--concurrency W` sessions run at once; each sends turn k+1 (the whole conversation
so far) when turn k's reply is done, as an agent framework does, and a finished session's slot takes the
next session in file order (so several files run back to back: a drifting workload). Replies are the
dataset's length, capped (`--max-reply-tokens`), with ignore_eos.

Routing: `--routing-trace FILE` replays real routing for every token, prefill and decode
(`wisp.trace.session_replay`), each session from its own offset; a one-layer trace is spread over all
layers at different offsets (an approximation, labelled `routing: approx-layer0:<file>`). Without a trace the
random router routes (far more repetitively than a trained model: labelled `routing: random-router`).

Why in process, not through the server and the `openai` client: the GPU machine has no FastAPI, uvicorn or
openai, and what is compared here is the engine's split, which the HTTP layer does not change. Times are
the engine's own (request arrival -> first token -> last token, `Sequence` timestamps). A turn's TTFT is
an agent's: the history it resends may come from the prefix cache (unlike `wisp bench prefill`'s cold TTFT).

Budget: `--vram-budget` is the whole device budget. Arms are sized by `wisp.bench.agent_arms` from a plan
made on this workload; after a warm-up the peak allocator statistic is reset and each record reports
`peak_gpu_bytes` (torch.cuda.max_memory_allocated while serving) and `within_budget`.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from wisp.bench.agent_arms import ArmSpec, arm_specs, parse_arms
from wisp.bench.agent_sessions import Session, load_sessions, train_session_tokenizer
from wisp.bench.decode import _git_commit, _peak, _reset_peak, model_config_for, probe_h2d_gbps
from wisp.bench.percentiles import percentile
from wisp.bench.routing import routing_for, uniform_trace
from wisp.cli_args import backend_options
from wisp.config import EngineConfig, ModelConfig, resolve_device
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import SamplingParams
from wisp.engine.split_controller.controller import ControllerConfig, SplitController
from wisp.models.token_embedding import embedding_on_host
from wisp.plan.planner import PlanInputs, make_plan
from wisp.trace.format import RoutingTrace
from wisp.trace.kv_trace import KVTrace
from wisp.trace.session_replay import SessionRoutingReplay


@dataclass(frozen=True)
class TurnTimes:
    session: int
    turn: int
    workflow: str
    arrival: float
    first_token: float
    finish: float
    output_tokens: int

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def wall(self) -> float:
        return self.finish - self.arrival

    @property
    def decode_tok_s(self) -> float | None:
        return (self.output_tokens - 1) / (self.finish - self.first_token) if self.output_tokens > 1 else None


def serve_sessions(engine: LLMEngine, sessions: list[Session], concurrency: int,
                   replay: SessionRoutingReplay | None, max_reply: int) -> list[TurnTimes]:
    """Run every session's turns, `concurrency` sessions at a time (see the module docstring)."""
    queue, live, done = deque(range(len(sessions))), {}, []
    stride = len(replay) // max(len(sessions), 1) if replay is not None else 0

    def submit(s: int, k: int) -> None:
        turn, rid = sessions[s].turns[k], f"s{s}t{k}"
        params = SamplingParams(max_tokens=min(turn.reply_tokens, max_reply), ignore_eos=True)
        engine.add_request(rid, list(turn.prompt_ids), params, strict_length=False)
        if replay is not None:
            replay.assign(rid, s * stride)
        live[rid] = (s, k, engine.requests[rid])

    for _ in range(concurrency):
        if queue:
            submit(queue.popleft(), 0)
    while engine.has_unfinished():
        for out in engine.step():
            if not out.finished:
                continue
            s, k, seq = live.pop(out.request_id)
            if replay is not None:
                replay.forget(out.request_id)
            done.append(TurnTimes(s, k, sessions[s].workflow, seq.arrival_time, seq.first_token_time,
                                  seq.finish_time, len(seq.output_ids)))
            if k + 1 < len(sessions[s].turns):
                submit(s, k + 1)
            elif queue:
                submit(queue.popleft(), 0)
    return done


def summarize(times: list[TurnTimes]) -> dict:
    """Timing fields of some turns: TTFT and turn wall percentiles, per-stream decode speed (median)."""
    ttft, wall = [t.ttft for t in times], [t.wall for t in times]
    rates = [r for r in (t.decode_tok_s for t in times) if r is not None]
    return {"ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
            "decode_tok_s": percentile(rates, 50), "turn_wall_p50_s": percentile(wall, 50),
            "turn_wall_p90_s": percentile(wall, 90), "turns": len(times)}


def session_kv_trace(sessions: list[Session], concurrency: int, block_size: int) -> KVTrace:
    """The workload as the planner's KV trace: turns in the order `serve_sessions` roughly sends them
    (round robin over groups of `concurrency` sessions)."""
    kv = KVTrace(block_size)
    for g in range(0, len(sessions), concurrency):
        group = sessions[g : g + concurrency]
        for k in range(max(len(s.turns) for s in group)):
            for s in group:
                if k < len(s.turns):
                    kv.add(s.name, len(s.turns[k].prompt_ids), s.turns[k].reply_tokens)
    return kv


def _engine(args, cfg: ModelConfig, spec: ArmSpec) -> LLMEngine:
    caps = {"per_layer_caps": spec.expert_caps} if spec.expert_caps else {}
    return LLMEngine(EngineConfig(model=args.model, mode=spec.mode, load_format=args.load_format,
                                  kv_blocks=spec.kv_blocks, max_concurrency=args.concurrency,
                                  max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
                                  **backend_options(args), **caps))


def _warm_up(engine: LLMEngine, length: int) -> None:
    """Kernels and allocator on a prompt no session shares; then counters and peak start from zero."""
    prompt = torch.randint(0, engine.model_config.vocab_size, (length,), generator=torch.Generator().manual_seed(7))
    engine.add_request("warm-up", prompt.tolist(), SamplingParams(max_tokens=4, ignore_eos=True), strict_length=False)
    while engine.has_unfinished():
        engine.step()
    engine.reset_stats()
    _reset_peak(engine.device)


def run_arm(args, cfg: ModelConfig, spec: ArmSpec, sessions: list[Session], trace: RoutingTrace | None,
            plan) -> dict:
    gc.collect()  # the previous arm's engine (reference cycles: model hooks, the live split) and its pinned memory
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    engine = _engine(args, cfg, spec)
    replay = None
    if trace is not None:
        replay = SessionRoutingReplay(trace, list(cfg.moe_layer_ids), cfg.num_experts, cfg.top_k, engine.device,
                                      args.max_num_batched_tokens + args.concurrency)
        engine.runner.set_routing_replay(replay)
    _warm_up(engine, min(512, args.max_model_len - 8))
    if spec.controller:
        p = plan.curves.problem
        config = ControllerConfig(p, resolve_every=args.resolve_every, min_gain=args.min_gain,
                                  half_life=args.half_life, min_observations=args.min_observations)
        engine.set_live_split(SplitController(config, spec.expert_cap, spec.kv_blocks))
    start = time.perf_counter()
    times = serve_sessions(engine, sessions, args.concurrency, replay, args.max_reply_tokens)
    e2e = time.perf_counter() - start
    stats = engine.stats()
    record = {"arm": spec.arm, "mode": spec.mode, "expert_cap": spec.expert_cap, "kv_blocks": spec.kv_blocks,
              **summarize(times), "e2e_wall_s": round(e2e, 3), "preemptions": stats["preemptions"], "hit_rate": round(stats["hit_rate"], 4),
              "kv_blocks_peak": stats["kv_peak_blocks_used"], "bytes_h2d": stats["bytes_h2d"],
              "prefix_hit_tokens": stats["prefix_hit_tokens"], "prefill_tokens": stats["tokens_prefilled"],
              "decode_tokens": stats["tokens_decoded"], "graph_steps": stats["graph_steps"],
              "peak_gpu_bytes": _peak(engine.device), "gpu_bytes_before_load": before}
    record["per_workflow"] = {w: summarize([t for t in times if t.workflow == w])
                              for w in dict.fromkeys(s.workflow for s in sessions)}
    if engine.live_split is not None:
        record["resizes"] = [{"at_s": round(e.at_s, 3), "stall_s": round(e.stall_s, 4), "from_cap": e.resize.from_cap,
                              "to_cap": e.resize.to_cap, "from_kv_blocks": e.resize.from_kv_blocks,
                              "to_kv_blocks": e.resize.to_kv_blocks, "reason": e.resize.reason}
                             for e in engine.live_split.events]
        record["expert_cap_end"], record["kv_blocks_end"] = engine.live_split.controller.expert_cap, engine.pool.num_blocks
        record["controller_host_s"] = round(engine.live_split.host_s, 4)  # observing and deciding, resizes apart
    engine.set_live_split(None)
    return record


def _sessions(args, cfg: ModelConfig) -> list[Session]:
    from wisp.models.source import model_source

    path = model_source(EngineConfig(model=args.model, load_format=args.load_format))[0]
    tokenizer_file = path / "tokenizer.json" if path is not None else None
    if tokenizer_file is not None and tokenizer_file.is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    else:
        texts = [p for p in args.sessions if "agentinfer" not in Path(p).name]
        tokenizer = train_session_tokenizer(texts, cfg.vocab_size) if texts else None
    sessions = load_sessions(args.sessions, tokenizer, args.max_reply_tokens,
                             args.max_model_len - args.max_reply_tokens - 1, cfg.vocab_size)
    return sessions[: args.max_sessions] if args.max_sessions else sessions


def bench_agent(args) -> list[dict]:
    names = parse_arms(args.arms)
    device = resolve_device(args.device)
    cfg = model_config_for(args.model, args.load_format)
    sessions = _sessions(args, cfg)
    trace, routing = routing_for(args.routing_trace, cfg, max(8192, len(sessions) * args.max_model_len))
    gbps = probe_h2d_gbps(device)
    inputs = PlanInputs(vram_budget=args.vram_budget, max_concurrency=args.concurrency, max_model_len=args.max_model_len,
                        seconds_per_byte=None if device.type == "cuda" else 1e-10,
                        embedding_on_host=embedding_on_host(args.embedding, device, cfg.tie_word_embeddings))
    plan_trace = trace if trace is not None else uniform_trace(cfg, 512)
    plan = make_plan(cfg, inputs, plan_trace, session_kv_trace(sessions, args.concurrency, 16), device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    common = {"model": args.model, "routing": routing, "workload": [Path(p).name for p in args.sessions],
              "sessions": len(sessions), "concurrency": args.concurrency, "vram_budget": args.vram_budget,
              "reserve_bytes": plan.report.reserve_bytes, "non_expert_bytes": plan.report.non_expert_bytes,
              "pageable_bytes": plan.report.pageable_bytes, "admission_floor_blocks": plan.report.admission_floor_blocks,
              "h2d_gbps_probe": round(gbps, 2), "device": gpu, "commit": _git_commit(),
              "command": "wisp bench agent " + " ".join(sys.argv[3:])}
    records = []
    for spec in arm_specs(plan, names, cfg.num_experts, args.controller_start):
        r = run_arm(args, cfg, spec, sessions, trace, plan)
        r.update(common, within_budget=r["peak_gpu_bytes"] <= args.vram_budget if device.type == "cuda" else None)
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
          f"{r['sessions']} sessions at concurrency {r['concurrency']}")


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
