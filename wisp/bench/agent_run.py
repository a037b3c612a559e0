"""One arm of `wisp bench agent`: a fresh engine at the arm's split, a warm-up, the phased sessions, one record.

Isolation (`run_arm_isolated`): arms are compared on equal terms only if none inherits anything from the arms
run before it. "process" (the default) runs the arm in a fresh Python process (spawned: a new CUDA context, an
empty caching allocator, no pinned host memory, Python heap or kernel caches left by another arm); the parent
keeps the plan, so every arm is sized from the same one. "engine" runs it in this process: the previous arm's
engine is dropped, collected and the device synchronised and its cached memory released first, and the record
says how much device memory was still allocated (`gpu_bytes_before_load`) or reserved by the allocator
(`gpu_reserved_before_load`) when the arm's engine started loading.

The record: the arm's split (`expert_cap`: the largest per-layer cap; `expert_caps`: each MoE layer's, so the
mv-wsa arm's uneven caps show that they spend the slots of the plan's uniform cap, where the controller starts),
its turns' TTFT, turn wall and per-stream decode speed (`summarize`), end-to-end wall, hit rate, KV and traffic
counters, peak device memory; per workflow and per phase (`per_phase`: each phase's wall, TTFT, decode and output
tok/s, hit rate, and the split and admission limit at its end); for the controller arm, every resize (seconds from
the start of serving, from -> to, the admission limit after it, its stall by part, why) and the controller's own
host seconds. With tools (`wisp.bench.agent_tool_replay`): `tool_calls`, how many turns ended in a complete call, were
cut at their max_tokens or neither (also per workflow), and `grammar_mask_s`, the seconds of the sampler's mask
calls on the forced calls (`ToolReplay.mask_s`: copying each bitmask to the device and filling the logits, and
computing a bitmask the runner did not prepare for the whole batch beforehand).
"""

from __future__ import annotations

import gc
import time
from dataclasses import replace

import torch

from wisp.bench.agent_arms import ArmSpec
from wisp.bench.agent_phases import Phase, serve_phases, summarize
from wisp.bench.agent_sessions import Session
from wisp.bench.agent_tool_replay import ToolGrammarSource, ToolReplay, call_counts
from wisp.bench.decode import _peak, _reset_peak
from wisp.cli_args import backend_options
from wisp.config import EngineConfig, ModelConfig
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import SamplingParams
from wisp.engine.split_controller.controller import ControllerConfig, SplitController
from wisp.plan.split import SplitProblem
from wisp.trace.format import RoutingTrace
from wisp.trace.session_replay import SessionRoutingReplay


def run_arm_isolated(isolation: str, args, cfg: ModelConfig, spec: ArmSpec, sessions: list[Session],
                     phases: list[Phase], trace: RoutingTrace | None, problem: SplitProblem,
                     tools: ToolGrammarSource | None = None) -> dict:
    """`run_arm` in a fresh process ("process") or in this one ("engine"); see the module docstring."""
    if isolation == "engine":
        return run_arm(args, cfg, spec, sessions, phases, trace, problem, tools)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # what this process cached is no arm's
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_arm, args, cfg, spec, sessions, phases, trace, problem, tools).result()


def controller_config(args, problem: SplitProblem) -> ControllerConfig:
    """The controller arm's settings; with an admission window its floor goes down to one request's context
    (the plan's floor is W requests' contexts)."""
    window = args.admission_window or None
    if window is not None:
        problem = replace(problem, kv_floor=problem.kv_floor // args.concurrency)
    return ControllerConfig(problem, resolve_every=args.resolve_every, min_gain=args.min_gain,
                            half_life=args.half_life, min_observations=args.min_observations, admission_window=window,
                            resize_cost_s=args.resize_cost_s)


def run_arm(args, cfg: ModelConfig, spec: ArmSpec, sessions: list[Session], phases: list[Phase],
            trace: RoutingTrace | None, problem: SplitProblem, tools: ToolGrammarSource | None = None) -> dict:
    before, reserved = _release_device()
    engine = _engine(args, spec)
    replay = None
    if trace is not None:
        replay = SessionRoutingReplay(trace, list(cfg.moe_layer_ids), cfg.num_experts, cfg.top_k, engine.device,
                                      args.max_num_batched_tokens + args.concurrency)
        engine.runner.set_routing_replay(replay)
    _warm_up(engine, min(512, args.max_model_len - 8))
    forced = ToolReplay(tools, [s.workflow for s in sessions]) if tools is not None else None  # grammars compiled
    if spec.controller:
        engine.set_live_split(SplitController(controller_config(args, problem), spec.expert_cap, spec.kv_blocks))
    start = time.perf_counter()
    times, marks = serve_phases(engine, sessions, phases, replay, args.max_reply_tokens, lambda: _mark(engine), forced)
    e2e = time.perf_counter() - start
    stats = engine.stats()
    record = {"arm": spec.arm, "mode": spec.mode, "expert_cap": spec.expert_cap,
              "expert_caps": list(spec.expert_caps) if spec.expert_caps else None, "kv_blocks": spec.kv_blocks,
              **summarize(times), "e2e_wall_s": round(e2e, 3), "preemptions": stats["preemptions"],
              "hit_rate": round(stats["hit_rate"], 4), "kv_blocks_peak": stats["kv_peak_blocks_used"],
              "bytes_h2d": stats["bytes_h2d"], "prefix_hit_tokens": stats["prefix_hit_tokens"],
              "prefill_tokens": stats["tokens_prefilled"], "decode_tokens": stats["tokens_decoded"],
              "graph_steps": stats["graph_steps"], "peak_gpu_bytes": _peak(engine.device),
              "gpu_bytes_before_load": before, "gpu_reserved_before_load": reserved}
    record["per_workflow"] = {w: summarize([t for t in times if t.workflow == w])
                              for w in dict.fromkeys(s.workflow for s in sessions)}
    record["per_phase"] = _phase_records(times, phases, marks)
    if forced is not None:
        verdicts = [(t.workflow, forced.judge(t.workflow, list(t.output_ids), t.finish_reason)[1]) for t in times]
        record["tool_calls"] = call_counts(v for _, v in verdicts)
        for w, per in record["per_workflow"].items():
            per["tool_calls"] = call_counts(v for vw, v in verdicts if vw == w)
        record["grammar_mask_s"] = round(forced.mask_s, 4)
    if engine.live_split is not None:
        live, offset = engine.live_split, engine.live_split.started - start  # resizes timed from serving's start
        record["resizes"] = [{"at_s": round(e.at_s + offset, 3), "stall_s": round(e.stall_s, 4),
                              "from_cap": e.resize.from_cap, "to_cap": e.resize.to_cap,
                              "from_kv_blocks": e.resize.from_kv_blocks, "to_kv_blocks": e.resize.to_kv_blocks,
                              "admission_limit": e.admission_limit, "kv_s": round(e.timings.kv_s, 4),
                              "experts_s": round(e.timings.experts_s, 4), "graphs_s": round(e.timings.graphs_s, 4),
                              "reason": e.resize.reason} for e in live.events]
        record["expert_cap_end"], record["kv_blocks_end"] = live.controller.expert_cap, engine.pool.num_blocks
        record["controller_host_s"] = round(live.host_s, 4)  # observing and deciding, resizes apart
    engine.set_live_split(None)
    return record


def _release_device() -> tuple[int, int]:
    """Collect what earlier arms left (reference cycles: model hooks, the live split) and hand the allocator's cache
    back; (bytes still allocated, bytes still reserved) on CUDA, else (0, 0)."""
    gc.collect()
    if not torch.cuda.is_available():
        return 0, 0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


def _engine(args, spec: ArmSpec) -> LLMEngine:
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


def _mark(engine: LLMEngine) -> dict:
    """Where serving stands at a phase boundary."""
    stats = engine.stats()
    return {"t": time.perf_counter(), "hits": stats["expert_hits"], "misses": stats["expert_misses"],
            "expert_cap": engine.expert_cap, "kv_blocks": engine.pool.num_blocks,
            "admission_limit": engine.scheduler.max_running}


def _phase_records(times: list, phases: list[Phase], marks: list[dict]) -> list[dict]:
    out = []
    for p, (phase, a, b) in enumerate(zip(phases, marks, marks[1:])):
        turns = [t for t in times if t.phase == p]
        wall, routed = b["t"] - a["t"], (b["hits"] - a["hits"]) + (b["misses"] - a["misses"])
        out.append({"width": phase.width, "sessions": phase.sessions, **summarize(turns),
                    "start_s": round(a["t"] - marks[0]["t"], 3), "wall_s": round(wall, 3),
                    "output_tok_s": round(sum(t.output_tokens for t in turns) / wall, 3) if wall > 0 else None,
                    "hit_rate": round((b["hits"] - a["hits"]) / routed, 4) if routed else None,
                    "expert_cap_end": b["expert_cap"], "kv_blocks_end": b["kv_blocks"],
                    "admission_limit_end": b["admission_limit"]})
    return out
