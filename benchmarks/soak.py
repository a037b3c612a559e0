"""Soak `wisp serve` with mixed traffic, disconnects, bad requests and live resizes (issue 13, item 4).

    python benchmarks/soak.py --minutes 10 --out benchmarks/results/logs/soak_cpu_demo.json      # CPU demo
    MODE=background bash benchmarks/gpu_soak.sh; MODE=wait bash benchmarks/gpu_soak.sh               # the GPU soak

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
of its median over the first minute after the warm-up (`score_rss`); no response may be a 5xx; SIGTERM must stop the server with exit status 0. It prints a
summary and writes everything (with the RSS samples) to `--out` as JSON. `run_soak(SoakConfig(...))` is the
same as a function (tests/server/test_soak.py runs a short one in CI).

A model without a tokenizer (a preset with --load-format dummy) is driven with token-id prompts through
/v1/completions only (chat needs a tokenizer), and its probe compares the completion's token count and text
(the text is empty without a tokenizer, so that comparison is weaker there).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parent.parent
READY = re.compile(r"wisp: serving .* on (http://\S+)")
PROBE_PROMPT = "The soak probe: a fixed prompt whose greedy completion must never change."
WORDS = ("expert", "cache", "token", "block", "router", "layer", "budget", "stream", "probe", "slot", "byte",
         "the", "a", "of", "and", "to", "with", "while", "resize", "serve")
SHARED_PREFIX = "You are a helpful assistant running inside a soak test. Answer briefly. "


@dataclass
class SoakConfig:
    seconds: float = 60.0
    max_requests: int = 1_000_000
    concurrency: int = 8
    model: str = "demo"
    device: str = "cpu"
    load_format: str = "safetensors"
    mode: str = "paged"
    max_concurrency: int = 8
    max_model_len: int = 512
    max_num_batched_tokens: int = 64
    max_tokens: tuple[int, int] = (2, 24)  # completion lengths drawn from this range
    bad_fraction: float = 0.1
    resize_every: float = 10.0
    resize_caps: list[int] | None = None  # None: around the start cap (halved, doubled, ...), clipped at start
    probe_every: float = 10.0
    probe_tokens: int = 24
    rss_every: float = 1.0
    warmup_fraction: float = 0.2
    seed: int = 0
    server_args: list[str] = field(default_factory=list)
    startup_timeout: float = 900.0
    log: str | None = None  # the server's output; default: next to --out, else a temp file


# -- the server ----------------------------------------------------------------------------------------
class ServerProcess:
    """`python -m wisp serve ... --port 0` with its output drained to a log file."""

    def __init__(self, cfg: SoakConfig, log_path: Path):
        args = [sys.executable, "-m", "wisp", "serve", "--model", cfg.model, "--device", cfg.device,
                "--host", "127.0.0.1", "--port", "0", "--mode", cfg.mode, "--enable-resize-endpoint",
                "--max-concurrency", str(cfg.max_concurrency), "--max-model-len", str(cfg.max_model_len),
                "--max-num-batched-tokens", str(cfg.max_num_batched_tokens), "--max-request-bytes", "64KiB",
                "--load-format", cfg.load_format, *cfg.server_args]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        if cfg.device == "cpu":
            env.setdefault("OMP_NUM_THREADS", "1")  # the clients share the machine's cores
        self.command = args
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=ROOT)
        self.base: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(cfg.startup_timeout) or self.base is None:
            self.kill()
            raise RuntimeError(f"the server did not start (see {log_path}):\n{log_path.read_text()[-3000:]}")

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            if self.base is None and (m := READY.search(line)):
                self.base = m.group(1)
                self._ready.set()
        self._ready.set()  # exited before the ready line

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM; the exit status (None if it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def rss_bytes(pid: int) -> int | None:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss
    except ImportError:
        pass
    except Exception:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def scrape(base: str) -> dict[str, float]:
    """/metrics as {name{label=value,...}: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base + "/metrics", timeout=30).text
    return {s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


# -- the traffic ---------------------------------------------------------------------------------------
class Tally:
    """Outcomes of every request, thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes: Counter = Counter()  # (kind, outcome) -> count
        self.statuses: Counter = Counter()  # HTTP status -> count
        self.server_errors: list[dict] = []  # the 5xx, with what was sent
        self.unexpected: list[dict] = []  # anything else that should not happen (first 50)
        self.sent = 0

    def take(self, limit: int) -> bool:
        with self.lock:
            if self.sent >= limit:
                return False
            self.sent += 1
            return True

    def add(self, kind: str, outcome: str, status: int | None = None, detail: dict | None = None) -> None:
        with self.lock:
            self.outcomes[(kind, outcome)] += 1
            if status is not None:
                self.statuses[status] += 1
                if status >= 500:
                    self.server_errors.append({"kind": kind, "status": status, **(detail or {})})
            if outcome.startswith("unexpected") and len(self.unexpected) < 50:
                self.unexpected.append({"kind": kind, "outcome": outcome, **(detail or {})})


def bad_requests(model: str, floor_blocks: int) -> list[tuple[str, str, str, dict | None, bytes | None]]:
    """(name, method, path, json body, raw body): each must be answered with a 4xx."""
    ok = {"model": model, "prompt": "Hello", "max_tokens": 4}
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    return [
        ("bad_json", "POST", "/v1/completions", None, b'{"model": "x", "prompt": '),
        ("prompt_type", "POST", "/v1/completions", {**ok, "prompt": {"a": 1}}, None),
        ("max_tokens_type", "POST", "/v1/completions", {**ok, "max_tokens": "lots"}, None),
        ("unknown_model", "POST", "/v1/completions", {**ok, "model": "no-such-model"}, None),
        ("surrogate_prompt", "POST", "/v1/completions", None,
         json.dumps(ok).replace('"Hello"', '"a\\ud800b"').encode()),
        ("surrogate_chat", "POST", "/v1/chat/completions", None,
         json.dumps(chat).replace('"Hi"', '"\\udfff"').encode()),
        ("temperature_underflow", "POST", "/v1/completions", {**ok, "temperature": 1e-50}, None),
        ("top_p_underflow", "POST", "/v1/chat/completions", {**chat, "top_p": 1e-50}, None),
        ("too_long", "POST", "/v1/completions", {**ok, "max_tokens": 10**6}, None),
        ("n_2", "POST", "/v1/completions", {**ok, "n": 2}, None),
        ("messages_type", "POST", "/v1/chat/completions", {**chat, "messages": "Hi"}, None),
        ("token_out_of_vocab", "POST", "/v1/completions", {**ok, "prompt": [1, 10**9]}, None),
        ("oversized_body", "POST", "/v1/completions", {**ok, "prompt": "x" * 100_000}, None),
        ("unknown_route", "GET", "/v1/nothing-here", None, None),
        ("resize_under_floor", "POST", "/admin/resize", {"kv_blocks": max(1, floor_blocks - 1)}, None),
    ]


class Traffic:
    def __init__(self, cfg: SoakConfig, base: str, tokenizer: bool, floor_blocks: int):
        self.cfg, self.base, self.tokenizer = cfg, base, tokenizer
        self.tally = Tally()
        self.bad = bad_requests(cfg.model, floor_blocks)
        self.stop = threading.Event()

    def client(self, timeout: float = 120.0) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key="soak", max_retries=0, timeout=timeout)

    def prompt(self, rng: random.Random):
        if not self.tokenizer:
            return [rng.randrange(1, 200) for _ in range(rng.randint(4, 120))]
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
        return (SHARED_PREFIX if rng.random() < 0.5 else "") + words

    def run_client(self, index: int) -> None:
        rng = random.Random(self.cfg.seed * 1000 + index)
        disconnects = index % 3 == 0  # a third of the clients hang up
        client = self.client()
        with httpx.Client(base_url=self.base, timeout=60) as http:
            while not self.stop.is_set() and self.tally.take(self.cfg.max_requests):
                if rng.random() < self.cfg.bad_fraction:
                    self.send_bad(http, rng)
                    continue
                chat = self.tokenizer and rng.random() < 0.5
                stream = rng.random() < 0.5
                kind = ("chat" if chat else "completion") + ("_stream" if stream else "")
                try:
                    self.send_good(client, rng, kind, chat, stream, disconnects)
                except openai.APIStatusError as exc:
                    outcome = "5xx" if exc.status_code >= 500 else "unexpected_4xx"
                    self.tally.add(kind, outcome, exc.status_code, {"message": str(exc)[:300]})
                except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                    self.tally.add(kind, "unexpected_transport_error", None, {"message": repr(exc)[:300]})
                except Exception as exc:  # the client's own parsing, an SSE error event, ...
                    self.tally.add(kind, "unexpected_error", None, {"message": repr(exc)[:300]})

    def send_good(self, client, rng, kind: str, chat: bool, stream: bool, disconnects: bool) -> None:
        max_tokens = rng.randint(*self.cfg.max_tokens)
        temperature = rng.choice([0.0, 0.0, 0.7, 1.0])
        extra = {"seed": rng.randrange(1 << 20)} if temperature else {}
        if chat:
            messages = [{"role": "user", "content": self.prompt(rng)}]
            if rng.random() < 0.3:
                messages = [{"role": "system", "content": "Be terse."}, *messages]
            call = lambda c, **kw: c.chat.completions.create(model=self.cfg.model, messages=messages,  # noqa: E731
                                                             max_tokens=max_tokens, temperature=temperature, **extra, **kw)
        else:
            prompt = self.prompt(rng)
            call = lambda c, **kw: c.completions.create(model=self.cfg.model, prompt=prompt, max_tokens=max_tokens,  # noqa: E731
                                                        temperature=temperature, **extra, **kw)
        if stream:
            hang_up_after = rng.randint(1, max(1, max_tokens // 2)) if disconnects else None
            chunks = 0
            finish = None
            events = call(client, stream=True)
            try:
                for chunk in events:
                    chunks += 1
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                    if hang_up_after is not None and chunks >= hang_up_after and finish is None:
                        break
            finally:
                events.close()
            if finish is None and hang_up_after is not None:
                self.tally.add(kind, "disconnected", 200)
            elif finish in ("stop", "length"):
                self.tally.add(kind, "ok", 200)
            else:
                self.tally.add(kind, "unexpected_finish", 200, {"finish_reason": finish, "chunks": chunks})
            return
        if disconnects and rng.random() < 0.3:  # hang up before the answer: a short read timeout
            try:
                with self.client(timeout=rng.uniform(0.02, 0.3)) as short:
                    out = call(short)
            except openai.APITimeoutError:
                self.tally.add(kind, "disconnected")
                return
        else:
            out = call(client)
        finish = out.choices[0].finish_reason
        self.tally.add(kind, "ok" if finish in ("stop", "length") else "unexpected_finish", 200,
                       {"finish_reason": finish})

    def send_bad(self, http: httpx.Client, rng: random.Random) -> None:
        name, method, path, body, raw = rng.choice(self.bad)
        kind = "bad:" + name
        try:
            if raw is not None:
                resp = http.request(method, path, content=raw, headers={"Content-Type": "application/json"})
            else:
                resp = http.request(method, path, json=body)
        except httpx.TransportError as exc:
            self.tally.add(kind, "unexpected_transport_error", None, {"message": repr(exc)[:300]})
            return
        status = resp.status_code
        if 400 <= status < 500:
            outcome = "4xx"
        elif status >= 500:
            outcome = "5xx"
        else:
            outcome = "unexpected_accepted"
        self.tally.add(kind, outcome, status, {"body": resp.text[:300]} if outcome != "4xx" else None)


def resize_plan(start_cap: int, start_blocks: int, floor: int, caps: list[int] | None) -> list[dict]:
    """The cycle of resizes: caps around the start cap, KV blocks between the floor and twice the start."""
    caps = caps or [max(1, start_cap // 2), start_cap * 2, start_cap * 3 // 2, start_cap]
    blocks = [floor, 2 * start_blocks, (floor + 2 * start_blocks) // 2, start_blocks]
    return [{"expert_cap": c, "kv_blocks": max(floor, blocks[i % len(blocks)])} for i, c in enumerate(caps)]


# -- the run -------------------------------------------------------------------------------------------
def run_soak(cfg: SoakConfig, out: str | None = None, echo=print) -> dict:
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
    return _report(cfg, server, startup_s, load_s, traffic, probes, resizes, rss, idle, final, health, exit_code)


def _report(cfg, server, startup_s, load_s, traffic, probes, resizes, rss, idle, final, health, exit_code) -> dict:
    tally = traffic.tally
    by_outcome: Counter = Counter()
    for (kind, outcome), n in tally.outcomes.items():
        by_outcome[outcome] += n
    texts = {(p.get("text"), p.get("completion_tokens")) for p in probes}
    probes_identical = len(texts) == 1 and all("error" not in p for p in probes)
    leak = None
    if idle is not None:
        leak = {k: int(idle.get(k, -1)) for k in ("wisp_kv_blocks_used", "wisp_requests_running",
                                                   "wisp_requests_waiting", "wisp_kv_blocks_cached",
                                                   "wisp_kv_blocks_free", "wisp_kv_blocks_capacity")}
        leak["blocks_accounted"] = (leak["wisp_kv_blocks_used"] + leak["wisp_kv_blocks_cached"]
                                    + leak["wisp_kv_blocks_free"] == leak["wisp_kv_blocks_capacity"])
    rss_summary = score_rss(rss, load_s, cfg.warmup_fraction)
    resize_ok = sum(1 for r in resizes if r.get("status") == 200)
    stalls = [r["answer"]["stall_s"] for r in resizes if r.get("status") == 200]
    finished = {k: v for k, v in final.items() if k.startswith("wisp_requests_finished_total")}
    five_xx = sum(n for s, n in tally.statuses.items() if s >= 500)
    report = {
        "config": {**asdict(cfg), "max_tokens": list(cfg.max_tokens)},
        "server_command": " ".join(server.command), "server_log": str(server.log_path),
        "startup_s": round(startup_s, 2), "load_s": round(load_s, 2), "requests": tally.sent,
        "requests_per_s": round(tally.sent / load_s, 2) if load_s else None,
        "by_outcome": dict(by_outcome),
        "by_kind_and_outcome": {f"{k}/{o}": n for (k, o), n in sorted(tally.outcomes.items())},
        "by_status": {str(s): n for s, n in sorted(tally.statuses.items(), key=lambda x: str(x[0]))},
        "five_xx": five_xx, "server_errors": tally.server_errors[:50], "unexpected": tally.unexpected,
        "resizes": {"asked": len(resizes), "applied": resize_ok,
                    "stall_s_max": max(stalls) if stalls else None,
                    "stall_s_median": statistics.median(stalls) if stalls else None, "log": resizes},
        "probes": probes, "probes_identical": probes_identical,
        "idle_metrics": leak, "finished_by_reason": finished,
        "tokens": {"prompt": final.get("wisp_prompt_tokens_total"), "generated": final.get("wisp_generation_tokens_total")},
        "health_after": health, "exit_code": exit_code,
        "rss": rss_summary, "rss_samples": rss,
    }
    unexpected = sum(n for o, n in by_outcome.items() if o.startswith("unexpected"))
    report["passed"] = {
        "no_5xx": five_xx == 0,
        "no_unexpected_outcome": unexpected == 0,
        "no_leak": bool(leak) and leak["wisp_kv_blocks_used"] == 0 and leak["wisp_requests_running"] == 0
        and leak["wisp_requests_waiting"] == 0 and leak["blocks_accounted"],
        "probes_identical": probes_identical,
        "resizes_applied": resize_ok > 0 or cfg.resize_every >= load_s,
        "rss_flat": bool(rss_summary and rss_summary.get("flat_within_10pct")),
        "clean_exit": exit_code == 0 and health == 200,
    }
    return report


def score_rss(rss: list[tuple[float, int]], load_s: float, warmup_fraction: float = 0.2) -> dict | None:
    """RSS over the run. After the warm-up (`warmup_fraction` of the run, 20-120 s): `growth`, the peak
    against the median of the first minute after it (a leak raises it: flat means <= 10%); `drift`, the last
    tenth's median against the first tenth's; `spread`, (max - min) / min, which also counts the dips when
    the allocator hands memory back (reported, not judged)."""
    if not rss:
        return None
    warmup = min(120.0, max(20.0, warmup_fraction * load_s))
    out = {"warmup_s": warmup, "first_mib": rss[0][1] / 2**20, "last_mib": rss[-1][1] / 2**20,
           "peak_mib": max(v for _, v in rss) / 2**20, "samples": len(rss)}
    after = [(t, v) for t, v in rss if t >= warmup]
    if len(after) < 2:
        return out
    values = [v for _, v in after]
    lo, hi = min(values), max(values)
    base = statistics.median([v for t, v in after if t < warmup + 60])
    tenth = max(1, len(values) // 10)
    out.update(after_warmup_min_mib=lo / 2**20, after_warmup_max_mib=hi / 2**20,
               after_warmup_base_mib=base / 2**20, after_warmup_growth=hi / base - 1,
               after_warmup_drift=statistics.median(values[-tenth:]) / statistics.median(values[:tenth]) - 1,
               after_warmup_spread=(hi - lo) / lo, flat_within_10pct=hi / base - 1 <= 0.10)
    return out


def summary(r: dict) -> str:
    rss = r["rss"] or {}
    lines = [
        f"soak: {r['requests']} requests in {r['load_s']:.0f} s ({r['requests_per_s']} req/s), server start {r['startup_s']} s",
        "  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(r["by_outcome"].items())),
        "  statuses: " + ", ".join(f"{k}: {v}" for k, v in r["by_status"].items()),
        f"  5xx: {r['five_xx']}",
        f"  resizes: {r['resizes']['applied']}/{r['resizes']['asked']} applied, stall max {r['resizes']['stall_s_max']} s",
        f"  idle after: {r['idle_metrics']}",
        f"  probes: {len(r['probes'])} ({Counter(p['phase'] for p in r['probes'])}), identical: {r['probes_identical']}",
        f"  rss: first {rss.get('first_mib', 0):.1f} MiB, after warm-up ({rss.get('warmup_s', 0):.0f} s) "
        f"{rss.get('after_warmup_min_mib', 0):.1f}-{rss.get('after_warmup_max_mib', 0):.1f} MiB, first minute "
        f"{rss.get('after_warmup_base_mib', 0):.1f}: growth {100 * rss.get('after_warmup_growth', 0):+.1f}%, drift "
        f"{100 * rss.get('after_warmup_drift', 0):+.1f}%, spread {100 * rss.get('after_warmup_spread', 0):.1f}%; "
        f"last {rss.get('last_mib', 0):.1f} MiB",
        f"  exit code {r['exit_code']}, /health after {r['health_after']}",
        "  passed: " + ", ".join(f"{k}={v}" for k, v in r["passed"].items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    length = p.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=None)
    length.add_argument("--seconds", type=float, default=None, help="default: 60")
    p.add_argument("--max-requests", type=int, default=1_000_000, help="stop after this many requests")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--model", default="demo")
    p.add_argument("--device", default="cpu")
    p.add_argument("--load-format", choices=["safetensors", "dummy"], default="safetensors")
    p.add_argument("--mode", default="paged")
    p.add_argument("--max-concurrency", type=int, default=8, help="the server's")
    p.add_argument("--max-model-len", type=int, default=512, help="the server's")
    p.add_argument("--max-num-batched-tokens", type=int, default=64, help="the server's")
    p.add_argument("--resize-every", type=float, default=10.0, help="seconds between live resizes")
    p.add_argument("--resize-caps", default=None, help="comma-separated expert caps to cycle (default: around the start)")
    p.add_argument("--probe-every", type=float, default=10.0)
    p.add_argument("--bad-fraction", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-arg", action="append", default=[], help="one more `wisp serve` argument (repeatable)")
    p.add_argument("--out", default=None, help="write the JSON report here")
    a = p.parse_args(argv)
    seconds = a.minutes * 60 if a.minutes is not None else (a.seconds if a.seconds is not None else 60.0)
    cfg = SoakConfig(seconds=seconds, max_requests=a.max_requests, concurrency=a.concurrency, model=a.model,
                     device=a.device, load_format=a.load_format, mode=a.mode, max_concurrency=a.max_concurrency,
                     max_model_len=a.max_model_len, max_num_batched_tokens=a.max_num_batched_tokens,
                     resize_every=a.resize_every, probe_every=a.probe_every, bad_fraction=a.bad_fraction, seed=a.seed,
                     resize_caps=[int(c) for c in a.resize_caps.split(",")] if a.resize_caps else None,
                     server_args=a.server_arg)
    report = run_soak(cfg, a.out)
    print(summary(report))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"soak: wrote {a.out}")
    return 0 if all(report["passed"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
