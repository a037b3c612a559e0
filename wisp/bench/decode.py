"""`wisp bench decode`: batch-1 decode of one model in several expert modes, one JSON record per run.

Each run loads the model (a checkpoint, or a preset's shape with `--load-format dummy`: random weights
made on the device, so no 57 GiB file is written), prefills a fixed random prompt, then decodes
`--decode-tokens` tokens with the engine stepped by hand so prefill and decode counters are split.
A pinned host->device bandwidth probe runs in the same process; `roofline_step_s` is the bytes a decode
step copied divided by that bandwidth, plus the resident step time when a resident run is in the set.

`--routing-trace FILE` replays recorded expert choices during decode in place of the router's, each request
its own sequence of the trace (`wisp.trace.replay`: request i replays sequence i mod S; records say
`routing: "replay-per-request:<file>"`, or `"approx-layer<L>-per-request:<file>"` for a one-layer trace
spread over every MoE layer, and `routing_sequences: S`), so random weights page like the real model did;
`--routing-trace uniform` replays i.i.d. uniform choices, one independent draw per request of the largest
batch, a pessimistic bound (`wisp.bench.routing`). `--vram-budget X`
sizes paged runs' cap from a VRAM budget, and with `--expert-cap 0` hybrid's hot experts instead (as `wisp
serve` does: `wisp.plan.hot_budget`, here for one request of the prompt and decode tokens). `--mode accelerate` runs the peer: transformers + accelerate
with every layer's experts offloaded to the CPU (`wisp.bench.peer`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from wisp.bench.routing import routing_for
from wisp.cli_args import backend_options
from wisp.options import is_hybrid_zero_copy
from wisp.config import MODES, EngineConfig, ModelConfig, packs_projections, parse_dtype, resolve_device
from wisp.engine.llm import LLM
from wisp.engine.sampling import SamplingParams
from wisp.engine.sequence import Sequence
from wisp.errors import WispError
from wisp.models.token_embedding import embedding_on_host
from wisp.options import SCRATCH_MODES
from wisp.plan.probes import probe_seconds_per_byte
from wisp.plan.hot_budget import hot_split
from wisp.plan.planner import PlanInputs
from wisp.plan.sizes import cap_for_budget
from wisp.trace.format import RoutingTrace
from wisp.trace.replay import RoutingReplay


def _git_commit() -> str | None:
    """The checkout's commit, "-dirty" when files differ from it (a result is only as good as knowing what
    code produced it)."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def probe_h2d_gbps(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Pinned host->device GB/s on CUDA (the planner's probe); 0 on the CPU, where it means nothing."""
    return 1 / probe_seconds_per_byte(device, nbytes) / 1e9 if device.type == "cuda" else 0.0


def options_for(opts: dict, mode: str, cap: int | None) -> dict:
    """The engine options that apply to one run: --prefetch to paged mode, --hot-experts to hybrid with no slots."""
    keep = {"prefetch": mode == "paged", "hot_experts": is_hybrid_zero_copy(mode, cap)}
    return {k: v for k, v in opts.items() if keep.get(k, True)}


def _peak(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def model_config_for(model: str, load_format: str) -> ModelConfig:
    from wisp.models.source import model_source

    return model_source(EngineConfig(model=model, load_format=load_format))[1]


def run_decode(model: str, mode: str, cap: int | None, opts: dict, prompt_len: int, decode_tokens: int,
               temperature: float, trace: RoutingTrace | None = None, batch: int = 1) -> dict:
    """One load + prefill + decode of `batch` requests at once; returns the measured record (without
    probe/roofline fields). A decode step computes one token of every request."""
    t0 = time.perf_counter()
    opts = options_for(opts, mode, cap)
    llm = LLM(model, mode=mode, expert_cap=cap, max_concurrency=batch, max_model_len=prompt_len + decode_tokens + 8,
              **opts)
    load_s = time.perf_counter() - t0
    replay = replay_routing(llm, trace) if trace is not None else None
    peak_load = _peak(llm.engine.device)
    _warm_up(llm, prompt_len)
    params = SamplingParams(max_tokens=decode_tokens + 1, ignore_eos=True, temperature=temperature, seed=0)
    timed = _timed_decode(llm, _prompts(llm.config.vocab_size, prompt_len, batch), params, replay)
    device = llm.engine.device
    return {
        "mode": mode, "expert_cap": llm.expert_cap, "layers": llm.config.num_layers, "prompt_len": prompt_len,
        "batch": batch, "decode_tokens": timed.decode_steps(batch), "temperature": temperature,
        "load_s": round(load_s, 2), **_measures(timed, batch),
        "peak_gpu_bytes_load": peak_load, "peak_gpu_bytes": _peak(device), "device": str(device),
        "graph_steps": timed.stats["graph_steps"], "piece_steps": timed.stats["piece_steps"], "routing": "router",
        "embedding": timed.stats["embedding"], "load_control": timed.stats.get("load_control"),
        **({"hybrid_costs": timed.stats["hybrid_costs"], "hybrid_cpu_factor": timed.stats["hybrid_cpu_factor"],
            "hybrid_link_factor": timed.stats["hybrid_link_factor"],
            "hybrid_cpu_steps": timed.stats["hybrid_cpu_steps"], "hybrid_step_kinds": timed.stats["hybrid_step_kinds"],
            "hybrid_step_windows": timed.stats["hybrid_step_windows"],
            "experts_on_cpu": timed.stats["expert_cpu_computed"],
            **{key: timed.stats[key] for key in ("hot_bytes", "hot_copies") if key in timed.stats}}
           if "hybrid_costs" in timed.stats else {}),
        **({"prefetch": True, "experts_prefetched": timed.stats["expert_prefetched"]} if opts.get("prefetch") else {}),
        **({"hot_experts": opts["hot_experts"]} if opts.get("hot_experts") else {}),
    }


def replay_routing(llm: LLM, trace: RoutingTrace) -> RoutingReplay:
    """Replay `trace` in place of the router, each request its own sequence (inactive until the timed decode;
    the graphs read it)."""
    cfg, engine = llm.config, llm.engine.config  # a one-layer trace arrives spread over every MoE layer
    replay = RoutingReplay(trace, cfg.moe_layer_ids, cfg.num_experts, cfg.top_k, llm.engine.device,
                           engine.max_num_batched_tokens + engine.max_concurrency)
    llm.engine.runner.set_routing_replay(replay)
    return replay


def _prompts(vocab: int, prompt_len: int, batch: int) -> list[list[int]]:
    """Request 0's prompt is the one batch-1 records have always used (seed 0); the warm-up's is seed 1."""
    return [torch.randint(0, vocab, (prompt_len,), generator=torch.Generator().manual_seed(100 + i if i else 0)).tolist()
            for i in range(batch)]


def _warm_up(llm: LLM, prompt_len: int) -> None:
    """Allocator and kernels, on another prompt of the same length (the timed one must miss the prefix
    cache); then the counters and the peak start from zero."""
    other = torch.randint(0, llm.config.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    llm.generate([other], SamplingParams(max_tokens=4, ignore_eos=True))
    llm.reset_stats()
    _reset_peak(llm.engine.device)


@dataclass(frozen=True)
class TimedDecode:
    """What one timed prefill + decode left: its sequences, stats after the prefill and at the end, times."""

    seqs: list[Sequence]
    prefill: dict
    stats: dict
    t_start: float
    t_first: float
    t_end: float
    step_s: tuple[float, ...]  # each decode step's wall time, in order

    def decode_steps(self, batch: int) -> int:
        return sum(len(seq.output_ids) - 1 for seq in self.seqs) // batch  # decode steps of each request


def step_spread(steps: tuple[float, ...]) -> dict:
    """The median, 90th percentile and slowest of a decode's steps (a whole run's mean, `step_s`, also
    holds its slow tail: a step-kind chooser's measuring steps, a host's stalls)."""
    if not steps:
        return {}
    ordered = sorted(steps)
    return {"step_s_median": round(statistics.median(ordered), 6),
            "step_s_p90": round(ordered[int(0.9 * (len(ordered) - 1))], 6), "step_s_max": round(ordered[-1], 6)}


def _timed_decode(llm: LLM, prompts: list[list[int]], params: SamplingParams, replay: RoutingReplay | None) -> TimedDecode:
    """The engine stepped by hand so the prefill's counters and the decode's are split."""
    engine = llm.engine
    t_start = time.perf_counter()
    seqs = []
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{i}", prompt, params, strict_length=False)
        seqs.append(engine.requests[f"bench-{i}"])
    while any(s.first_token_time is None for s in seqs):  # prefill (in chunks past the step budget)
        engine.step()
    prefill = llm.stats()
    t_first = time.perf_counter()
    if replay is not None:
        replay.active = True
    steps, t_end = [], t_first
    while engine.has_unfinished():
        engine.step()
        now = time.perf_counter()
        steps.append(now - t_end)
        t_end = now
    return TimedDecode(seqs, prefill, llm.stats(), t_start, t_first, t_end, tuple(steps))


def _measures(timed: TimedDecode, batch: int) -> dict:
    """Time to first token, decode speed, hit rate and copies of the decode (the prefill's subtracted)."""
    s, prefill, n_dec = timed.stats, timed.prefill, timed.decode_steps(batch)
    decode_s = timed.t_end - timed.t_first
    decode_bytes = s["bytes_h2d"] - prefill["bytes_h2d"]
    hits = s["expert_hits"] - prefill["expert_hits"]
    routed = hits + s["expert_misses"] - prefill["expert_misses"]
    return {
        "ttft_s": round(timed.seqs[0].first_token_time - timed.t_start, 4),
        "prefill_tokens": prefill["tokens_prefilled"],  # computed for the timed prompts (all of them: a cold TTFT)
        "decode_tok_s": round(batch * n_dec / decode_s, 3),
        "step_s": round(decode_s / n_dec, 6),
        **step_spread(timed.step_s),
        "hit_rate": round(hits / routed, 4) if routed else 0.0,
        "bytes_h2d_per_token": round(decode_bytes / (n_dec * batch)),
        "bytes_h2d_per_step": round(decode_bytes / n_dec),  # one token of each request
        "h2d_gbps_achieved": round(decode_bytes / decode_s / 1e9, 3),
        "expert_device_bytes": s["expert_device_bytes"],
    }


def bench_decode(args) -> list[dict]:
    opts = _engine_options(args)
    cfg = model_config_for(args.model, args.load_format) if args.routing_trace else None
    trace, routing = routing_for(args.routing_trace, cfg, requests=max(_batches(args)))
    device = resolve_device(args.device)
    gbps = probe_h2d_gbps(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    records, resident_step, commit = [], None, _git_commit()
    for mode, cap, batch in _runs(args):
        r = _run_one(args, mode, cap, batch, opts, trace, routing)
        if mode == "resident":
            resident_step = r["step_s"]
        step_bytes = r.get("bytes_h2d_per_step", r["bytes_h2d_per_token"])  # the accelerate peer: batch 1
        roofline = (step_bytes / (gbps * 1e9) if gbps else 0.0) + (resident_step or 0.0)
        r.update(commit=commit, preset=args.model, load_format=args.load_format, moe_backend=args.moe_backend,
                 attention_backend=opts["attention_backend"], h2d_gbps_probe=round(gbps, 2),
                 roofline_step_s=round(roofline, 6) if resident_step is not None else None, gpu=gpu,
                 command="wisp bench decode " + " ".join(sys.argv[3:]))
        records.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    _print_table(records, gbps, gpu)
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))
    return records


def _engine_options(args) -> dict:
    opts = {"load_format": args.load_format, **backend_options(args), **({"prefetch": True} if args.prefetch else {})}
    if args.dtype:
        opts["dtype"] = args.dtype
    if args.vram_budget and args.expert_cap == "0" and args.hot_experts:
        raise WispError("--hot-experts and --vram-budget both size hybrid's hot experts: give one")
    return opts


def _hot_for_budget(args, batch: int) -> int:
    """Hybrid with no slots under --vram-budget: its hot experts a layer beside `batch` requests' KV floor (as
    `wisp serve` sizes them, `wisp.plan.hot_budget`), at the weights' dtype the run will use."""
    cfg, context, on_host = _budget_shape(args)
    if (dtype := parse_dtype(args.dtype)) is not None:
        cfg = replace(cfg, dtype=dtype)
    inputs = PlanInputs(args.vram_budget, batch, context, embedding_on_host=on_host,
                        packed_projections=_packs_projections(args, cfg))
    return hot_split(cfg, inputs).hot_experts


def _budget_shape(args) -> tuple[ModelConfig, int, bool]:
    """What sizing a run for --vram-budget reads: the model's config, a request's context (the prompt, the decode
    tokens and a margin) and whether the embedding table lives in host memory."""
    cfg = model_config_for(args.model, args.load_format)
    return (cfg, args.prompt_len + args.decode_tokens + 8,
            embedding_on_host(args.embedding, resolve_device(args.device), cfg.tie_word_embeddings))


def _packs_projections(args, cfg: ModelConfig) -> bool:
    """Whether a run sized for --vram-budget (paged or hybrid: not resident) keeps the model's projections packed."""
    return packs_projections(cfg, EngineConfig(model=args.model, mode="paged", moe_backend=args.moe_backend),
                             resolve_device(args.device))


def _runs(args) -> list[tuple[str, int | None, int]]:
    """(mode, cap, batch) of every run: per batch, resident first, each paged cap (or the budget's)."""
    caps = [int(c) for c in args.expert_cap.split(",")] if args.expert_cap else [None]
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    bad = [m for m in modes if m not in (*MODES, "accelerate")]
    if bad:
        raise WispError(f"unknown mode {bad[0]!r}; choose from: {', '.join((*MODES, 'accelerate'))}")
    if args.vram_budget and args.expert_cap != "0":  # (with --expert-cap 0 it sizes hot experts: _engine_options)
        cfg, context, on_host = _budget_shape(args)
        caps = [cap_for_budget(cfg, args.vram_budget, context, embedding_on_host=on_host,
                               packed_projections=_packs_projections(args, cfg))]
    return [(m, c, b) for b in _batches(args) for m in sorted(modes, key=lambda m: m != "resident")
            for c in (caps if m in SCRATCH_MODES else [None])]


def _batches(args) -> list[int]:
    return [int(b) for b in str(args.batch).split(",")]


def _run_one(args, mode: str, cap: int | None, batch: int, opts: dict, trace: RoutingTrace | None,
             routing: str) -> dict:
    """One run's record: the accelerate peer's, or wisp's (labelled with the replayed trace, the budget)."""
    if mode == "accelerate":
        from wisp.bench.peer import run_accelerate

        r = run_accelerate(args.model, args.prompt_len, args.peer_decode_tokens)
    else:
        if args.vram_budget and is_hybrid_zero_copy(mode, cap):
            opts = {**opts, "hot_experts": _hot_for_budget(args, batch)}
        r = run_decode(args.model, mode, cap, opts, args.prompt_len, args.decode_tokens, args.temperature, trace, batch)
    if trace is not None and mode != "accelerate":
        r["routing"], r["routing_sequences"] = routing, len(trace.sequence_lengths)
    if args.vram_budget:
        r["vram_budget"] = args.vram_budget
    return r


def _print_table(records: list[dict], gbps: float, gpu: str) -> None:
    print(f"{'mode':9} {'cap':>4} {'B':>2} {'tok/s':>8} {'step ms':>8} {'roof ms':>8} {'hit':>6} {'MB/tok':>8} {'peak GB':>8}")
    for r in records:
        roof = f"{r['roofline_step_s'] * 1e3:8.2f}" if r["roofline_step_s"] is not None else "       -"
        print(f"{r['mode']:9} {r['expert_cap']:>4} {r.get('batch', 1):>2} {r['decode_tok_s']:>8} {r['step_s'] * 1e3:>8.2f} {roof} "
              f"{r['hit_rate']:>6} {r['bytes_h2d_per_token'] / 1e6:>8.1f} {r['peak_gpu_bytes'] / 1e9:>8.2f}")
    print(f"pinned H2D probe: {gbps:.1f} GB/s on {gpu}")
