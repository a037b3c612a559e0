"""`wisp bench serve`: concurrent streams, one record per run (a closed loop's W or an open loop's rate, under one
load control setting).

In process (the default) the model is loaded once per `--load-control` setting, warmed up on as many requests
at once as the engine runs, and every run then drives the same engine by hand (`engine_driver`), its counters
reset at the run's start; a `--routing-trace` replays over whole runs, prefill and decode. With `--server URL`
the runs are streamed requests against a live server (`server_driver`); the model argument then only gives the
prompts' vocabulary.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from pathlib import Path

import torch

from wisp.bench.decode import (_git_commit, _peak, _reset_peak, model_config_for, options_for, probe_h2d_gbps,
                               replay_routing)
from wisp.bench.routing import routing_for
from wisp.bench.serve.engine_driver import drive_engine, warm_up
from wisp.bench.serve.load import ClosedLoop, Load, OpenLoop, random_prompts
from wisp.bench.serve.summary import engine_fields, print_table, timing_fields, width_fields
from wisp.cli_args import backend_options
from wisp.config import resolve_device
from wisp.engine.llm import LLM
from wisp.engine.sampling import SamplingParams
from wisp.errors import WispError

OPEN_LOOP_REQUESTS = 8  # an open loop's requests without --num-requests


def loads_of(args) -> list[Load]:
    """Every run's schedule: a closed loop per --concurrency W (N: --num-requests, else max(8, 2W)), then an open
    loop per --request-rate (N: --num-requests, else 8); W = 1 when neither is given."""
    rates = args.request_rate or []
    widths = args.concurrency or ([] if rates else [1])
    return ([ClosedLoop(w, args.num_requests or max(8, 2 * w)) for w in widths]
            + [OpenLoop(r, args.num_requests or OPEN_LOOP_REQUESTS, args.seed) for r in rates])


def bench_serve(args) -> list[dict]:
    loads = loads_of(args)
    if args.server:
        if args.load_control or args.routing_trace:
            raise WispError("--load-control and --routing-trace are the server's own with --server: start "
                            "`wisp serve` with them")
        records = _over_http(args, loads)
    else:
        records = _in_process(args, loads)
    print_table(records)
    if args.plot:
        from wisp.bench.serve.plot import plot_runs

        plot_runs(records, args.plot)
    return records


def _common(args, max_concurrency: int | None) -> dict:
    return {"model": args.model, "load_format": args.load_format, "prompt_len": args.prompt_len,
            "output_len": args.output_len, "temperature": args.temperature, "seed": args.seed,
            "max_concurrency": max_concurrency, "target": args.server or "engine", "commit": _git_commit(),
            "command": "wisp bench serve " + " ".join(sys.argv[3:])}


def _save(records: list[dict], record: dict, out: str | None) -> None:
    """One more record: printed as it lands, and the file rewritten (a run cut short keeps what it measured);
    what JSON cannot hold (in load control's state, say) is written as its str."""
    records.append(record)
    print(json.dumps(record, default=str), file=sys.stderr, flush=True)
    if out:
        Path(out).write_text(json.dumps(records, indent=1, default=str))


def _in_process(args, loads: list[Load]) -> list[dict]:
    cfg = model_config_for(args.model, args.load_format) if args.routing_trace else None
    total = sum(load.num_requests for load in loads) * (args.prompt_len + args.output_len)
    trace, routing = routing_for(args.routing_trace, cfg, max(8192, total))
    device = resolve_device(args.device)
    gbps = probe_h2d_gbps(device)
    width = args.max_concurrency or max(load.concurrency if isinstance(load, ClosedLoop) else OPEN_LOOP_REQUESTS
                                        for load in loads)
    common = {**_common(args, width), "mode": args.mode, "routing": routing,
              "max_num_batched_tokens": args.max_num_batched_tokens, "moe_backend": args.moe_backend,
              "attention_backend": args.attention_backend, "max_decode_wait_ms": args.max_decode_wait_ms,
              "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "h2d_gbps_probe": round(gbps, 2)}
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=args.temperature, seed=args.seed)
    records: list[dict] = []
    for setting in args.load_control or ["on"]:
        llm = _load(args, setting, width)
        vocab = llm.config.vocab_size
        replay = replay_routing(llm, trace) if trace is not None else None
        warm_up(llm.engine, random_prompts(vocab, args.prompt_len, width, args.seed, len(loads)))
        if replay is not None:
            replay.active = True
        for k, load in enumerate(loads):
            llm.reset_stats()
            _reset_peak(device)
            prompts = random_prompts(vocab, args.prompt_len, load.num_requests, args.seed, k)
            run = drive_engine(llm.engine, load, prompts, params)
            _save(records, {**load.label, "load_control": setting, **timing_fields(run.requests, run.wall_s),
                            **width_fields(run.widths, run.steps), **engine_fields(llm.stats()),
                            "peak_gpu_bytes": _peak(device), "expert_cap": llm.expert_cap, **common}, args.out)
        del llm, replay
        gc.collect()  # the engine's device memory before the next setting's load
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return records


def _load(args, setting: str, width: int) -> LLM:
    opts = {"load_format": args.load_format, **backend_options(args), "load_control": setting,
            **({"dtype": args.dtype} if args.dtype else {})}
    return LLM(args.model, mode=args.mode, expert_cap=args.expert_cap, max_concurrency=width,
               max_model_len=args.prompt_len + args.output_len + 8, max_num_batched_tokens=args.max_num_batched_tokens,
               **options_for(opts, args.mode, args.expert_cap))


def _over_http(args, loads: list[Load]) -> list[dict]:
    from wisp.bench.serve.server_driver import (client_for, drive_server, httpx_module, metrics_fields, scrape,
                                                served_model)

    httpx = httpx_module()
    vocab = model_config_for(args.model, args.load_format).vocab_size
    common = {**_common(args, None), "mode": None, "routing": None, "load_control": None}
    records: list[dict] = []

    async def run_all() -> None:
        async with client_for(args.server, args.api_key) as client:
            model = await served_model(client)
            for k, load in enumerate(loads):
                before = await scrape(client)
                prompts = random_prompts(vocab, args.prompt_len, load.num_requests, args.seed, k)
                times, wall = await drive_server(client, model, load, prompts, args.output_len, args.temperature)
                _save(records, {**load.label, **timing_fields(times, wall), **width_fields(None, None),
                                **metrics_fields(before, await scrape(client)), **common}, args.out)

    try:
        asyncio.run(run_all())
    except httpx.HTTPError as exc:
        raise WispError(f"cannot benchmark {args.server}: {type(exc).__name__}: {exc}") from None
    return records
