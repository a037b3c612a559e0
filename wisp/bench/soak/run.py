"""`wisp bench soak`: soak `wisp serve` with mixed traffic, disconnects, bad requests and live resizes.

    wisp bench soak --minutes 10 --out benchmarks/results/logs/soak_cpu_demo.json      # CPU demo
    MODE=background bash benchmarks/recipes/gpu_soak.sh; MODE=wait bash benchmarks/recipes/gpu_soak.sh   # the GPU soak

Starts `python -m wisp serve` on 127.0.0.1, port 0 (loopback only; the port is read from its ready line),
with `--enable-resize-endpoint`, then for a bounded time and request count runs `--concurrency` (8) client
threads, each looping over a random mix of completions and chat, streamed and not, through the official
`openai` client (max_retries=0). A third of the clients (0, 3, 6, ...) hang up mid-stream (closing the
stream after a few chunks) and sometimes mid-request (a short read timeout on a non-streamed one). One
request in `--bad-fraction` is a bad one sent with httpx (bad JSON, wrong types, a lone surrogate, an
underflowing temperature or top_p, too long, unknown model or route, an oversized body, a resize under the
admission floor): each must get a 4xx. Meanwhile a resizer thread posts `/admin/resize` every
`--resize-every` seconds (expert cap and KV blocks through a cycle around the start sizes: `apply_plan` on
the engine thread, requests running), a probe thread sends one greedy probe prompt every `--probe-every`
seconds, and a sampler records the server's RSS each second (psutil if installed, else /proc/PID/status).

At the end: the probe before the load, during it and after it must give the same text; once the server is
idle, /metrics must show 0 KV blocks used, 0 running, 0 waiting, and used + cached + free = capacity; RSS
after the warm-up (the first 20% of the run, at least 20 s, at most 120 s) must not grow: its peak within 10%
of its median over the first minute after the warm-up (`score_rss`); no response may be a 5xx; SIGTERM must
stop the server with exit status 0. It prints a summary, writes everything (with the RSS samples) to `--out`
as JSON, and exits 1 if a check failed. `run_soak(SoakConfig(...))` is the same as a function.

A model without a tokenizer (a preset with --load-format dummy) is driven with token-id prompts through
/v1/completions only (chat needs a tokenizer), and its probe compares the completion's token count and text
(the text is empty without a tokenizer, so that comparison is weaker there).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx
import openai

from wisp.bench.soak.config import SoakConfig
from wisp.bench.soak.server import ServerProcess, rss_bytes, scrape
from wisp.bench.soak.summary import report, summary
from wisp.bench.soak.traffic import Traffic

PROBE_PROMPT = "The soak probe: a fixed prompt whose greedy completion must never change."


def resize_plan(start_cap: int, start_blocks: int, floor: int, caps: list[int] | None) -> list[dict]:
    """The cycle of resizes: caps around the start cap, KV blocks between the floor and twice the start."""
    caps = caps or [max(1, start_cap // 2), start_cap * 2, start_cap * 3 // 2, start_cap]
    blocks = [floor, 2 * start_blocks, (floor + 2 * start_blocks) // 2, start_blocks]
    return [{"expert_cap": c, "kv_blocks": max(floor, blocks[i % len(blocks)])} for i, c in enumerate(caps)]


def run_soak(cfg: SoakConfig, out: str | None = None, echo=print) -> dict:
    """One soak: the server started, driven, checked and stopped (killed if it outlives the soak); the report."""
    log_path = Path(cfg.log) if cfg.log else (Path(out).with_suffix(".server.log") if out else
                                               Path(os.environ.get("TMPDIR", "/tmp")) / f"wisp-soak-{os.getpid()}.log")
    t0 = time.monotonic()
    server = ServerProcess(cfg, log_path)
    try:
        return _run(cfg, server, t0, echo)
    finally:
        server.kill()


def _run(cfg: SoakConfig, server: ServerProcess, t0: float, echo) -> dict:
    base = server.base
    startup_s = time.monotonic() - t0
    echo(f"soak: server up at {base} in {startup_s:.1f} s (pid {server.proc.pid}); running {cfg.seconds:.0f} s")
    m = scrape(base)
    floor, start_blocks, start_cap = (int(m["wisp_kv_admission_floor_blocks"]), int(m["wisp_kv_blocks_capacity"]),
                                      int(m["wisp_expert_cap"]))
    probe_client = openai.OpenAI(base_url=base + "/v1", api_key="soak", max_retries=0, timeout=300)
    try:
        probe_client.completions.create(model=cfg.model, prompt="tokenizer check", max_tokens=1)
        tokenizer = True
    except openai.BadRequestError:
        tokenizer = False
    probe_prompt = PROBE_PROMPT if tokenizer else list(range(3, 40))
    probes: list[dict] = []
    probe_lock = threading.Lock()

    def probe(phase: str) -> None:
        try:
            out = probe_client.completions.create(model=cfg.model, prompt=probe_prompt, max_tokens=cfg.probe_tokens,
                                                  temperature=0)
            rec = {"phase": phase, "t": round(time.monotonic() - t0, 2), "text": out.choices[0].text,
                   "completion_tokens": out.usage.completion_tokens, "finish_reason": out.choices[0].finish_reason}
        except Exception as exc:
            rec = {"phase": phase, "t": round(time.monotonic() - t0, 2), "error": repr(exc)[:300]}
        with probe_lock:
            probes.append(rec)

    probe("before")
    traffic = Traffic(cfg, base, tokenizer, floor)
    rss: list[tuple[float, int]] = []
    resizes: list[dict] = []
    plan = resize_plan(start_cap, start_blocks, floor, cfg.resize_caps)

    def sample_rss() -> None:
        while not traffic.stop.is_set():
            if (v := rss_bytes(server.proc.pid)) is not None:
                rss.append((round(time.monotonic() - load_t0, 2), v))
            traffic.stop.wait(cfg.rss_every)

    def resizer() -> None:
        i = 0
        with httpx.Client(base_url=base, timeout=300) as http:
            while not traffic.stop.wait(cfg.resize_every):
                body = plan[i % len(plan)]
                i += 1
                t = time.monotonic()
                try:
                    r = http.post("/admin/resize", json=body)
                    rec = {"t": round(t - load_t0, 2), "asked": body, "status": r.status_code,
                           "wall_s": round(time.monotonic() - t, 4), "answer": r.json() if r.content else None}
                except Exception as exc:
                    rec = {"t": round(t - load_t0, 2), "asked": body, "status": None, "error": repr(exc)[:300]}
                resizes.append(rec)
                if rec["status"] and rec["status"] >= 500:
                    traffic.tally.add("resize", "5xx", rec["status"], rec)

    def prober() -> None:
        while not traffic.stop.wait(cfg.probe_every):
            probe("during")

    load_t0 = time.monotonic()
    helpers = [threading.Thread(target=f, daemon=True) for f in (sample_rss, resizer, prober)]
    clients = [threading.Thread(target=traffic.run_client, args=(i,), daemon=True) for i in range(cfg.concurrency)]
    for t in helpers + clients:
        t.start()
    deadline = load_t0 + cfg.seconds
    last_report = load_t0
    while time.monotonic() < deadline and any(t.is_alive() for t in clients):
        time.sleep(0.5)
        if time.monotonic() - last_report >= 60:
            last_report = time.monotonic()
            echo(f"soak: {last_report - load_t0:.0f} s, {traffic.tally.sent} requests, "
                 f"{len(traffic.tally.server_errors)} 5xx so far, {len(resizes)} resizes, "
                 f"rss {rss[-1][1] / 2**20 if rss else 0:.0f} MiB")
    traffic.stop.set()
    for t in clients + helpers:
        t.join(300)
    load_s = time.monotonic() - load_t0

    # idle: every request has ended; nothing may be left in the engine
    idle = None
    for _ in range(600):
        m = scrape(base)
        if m.get("wisp_requests_running") == 0 and m.get("wisp_requests_waiting") == 0:
            idle = m
            break
        time.sleep(0.1)
    probe("after")
    final = scrape(base)
    health = httpx.get(base + "/health", timeout=10).status_code
    exit_code = server.stop()
    return report(cfg, server, startup_s, load_s, traffic, probes, resizes, rss, idle, final, health, exit_code)



def bench_soak(args) -> int:
    """`wisp bench soak`: one soak from the command line's arguments; 0 if every check passed, else 1."""
    seconds = args.minutes * 60 if args.minutes is not None else (args.seconds if args.seconds is not None else 60.0)
    cfg = SoakConfig(seconds=seconds, max_requests=args.max_requests, concurrency=args.concurrency, model=args.model,
                     device=args.device, load_format=args.load_format, mode=args.mode,
                     max_concurrency=args.max_concurrency, max_model_len=args.max_model_len,
                     max_num_batched_tokens=args.max_num_batched_tokens, resize_every=args.resize_every,
                     probe_every=args.probe_every, bad_fraction=args.bad_fraction, seed=args.seed,
                     resize_caps=args.resize_caps, server_args=args.server_arg)
    result = run_soak(cfg, args.out)
    print(summary(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"soak: wrote {args.out}")
    return 0 if all(result["passed"].values()) else 1
