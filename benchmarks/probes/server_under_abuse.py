"""How `wisp serve --model demo` holds up under two abuses, measured from outside (prints and saves one JSON):

1. a prompt of megabytes: /health latency on a kept-alive connection (polled every 10 ms) and the largest gap in a
   running stream while a 3.9 MB prompt (under the default 4 MiB body limit) and a 10 MB one (under 16 MiB) are
   sent; the server's RSS before and after;
2. slowloris: CONNECTIONS connections that send part of a request's headers and stall for HOLD_S seconds; /health
   latency throughout, the server's open descriptors (sampled from /proc) against --max-connections, and whether a
   new connection is taken afterwards.

    python benchmarks/probes/server_under_abuse.py [--out FILE] [--connections 2000] [--hold-s 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

CAP, HEADER_S = 256, 2.0


def proc_status(pid: int) -> dict:
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS:"))
    return {"rss_mib": round(rss / 1024, 1), "descriptors": len(os.listdir(f"/proc/{pid}/fd"))}


def quantiles(values: list[float]) -> dict:
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50_ms": round(at(0.5) * 1e3, 1), "p99_ms": round(at(0.99) * 1e3, 1),
            "max_ms": round(ordered[-1] * 1e3, 1)}


def poll_health(base: str, stop: threading.Event, out: list) -> None:
    with httpx.Client(timeout=60) as http:
        while not stop.is_set():
            t = time.monotonic()
            http.get(base + "/health")
            out.append(time.monotonic() - t)
            time.sleep(0.01)


def big_prompt(base: str, pid: int, megabytes: float) -> dict:
    health, gaps, stop = [], [], threading.Event()

    def stream() -> None:
        last = time.monotonic()
        body = {"model": "demo", "prompt": "Hello", "max_tokens": 200, "temperature": 0, "stream": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as resp:
            for _ in resp.iter_lines():
                now = time.monotonic()
                gaps.append(now - last)
                last = now

    before = proc_status(pid)
    with ThreadPoolExecutor(2) as pool:
        polling, streaming = pool.submit(poll_health, base, stop, health), pool.submit(stream)
        time.sleep(0.5)
        t = time.monotonic()
        resp = httpx.post(base + "/v1/completions", timeout=300,
                          json={"model": "demo", "prompt": "word " * int(megabytes * 1e6 / 5), "max_tokens": 4})
        answered = time.monotonic() - t
        streaming.result()
        time.sleep(0.5)
        stop.set()
        polling.result()
    return {"prompt_mb": megabytes, "status": resp.status_code, "answer_s": round(answered, 3),
            "error": resp.json().get("error", {}).get("message", "")[:160], "health": quantiles(health),
            "stream_largest_gap_ms": round(max(gaps[1:], default=0) * 1e3, 1), "before": before,
            "after": proc_status(pid)}


def slowloris(base: str, host: str, port: int, pid: int, connections: int, hold_s: float) -> dict:
    health, stop, peak = [], threading.Event(), [0]
    closed_by_server = []

    def attacker() -> None:
        try:
            with socket.create_connection((host, port), timeout=10) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                start = time.monotonic()
                while time.monotonic() - start < hold_s:
                    time.sleep(0.5)
                    s.sendall(b"X")
        except OSError:
            closed_by_server.append(1)

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc_status(pid)["descriptors"])
            time.sleep(0.05)

    before = proc_status(pid)
    with ThreadPoolExecutor(connections + 2) as pool:
        polling, sampling = pool.submit(poll_health, base, stop, health), pool.submit(sample)
        attacks = [pool.submit(attacker) for _ in range(connections)]
        for a in attacks:
            a.result()
        stop.set()
        polling.result()
        sampling.result()
    fresh = httpx.get(base + "/health", timeout=10).status_code
    return {"connections": connections, "hold_s": hold_s, "max_connections": CAP, "header_timeout_s": HEADER_S,
            "closed_by_server": len(closed_by_server), "health": quantiles(health),
            "descriptors_before": before["descriptors"], "descriptors_peak": peak[0],
            "after": proc_status(pid), "new_connection_after": fresh}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/logs/server_under_abuse_cpu.json")
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--hold-s", type=float, default=5.0)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.NamedTemporaryFile("wb", suffix=".log", delete=False)
    server = subprocess.Popen([sys.executable, "-m", "wisp", "serve", "--model", "demo", "--device", "cpu", "--port",
                               str(port), "--max-request-bytes", "16MiB", "--max-connections", str(CAP),
                               "--header-timeout", str(HEADER_S)], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"server did not start; log: {log.name}")
            time.sleep(0.2)
        result = {"command": "python " + " ".join(sys.argv), "cpus": os.cpu_count(),
                  "big_prompts": [big_prompt(base, server.pid, mb) for mb in (3.9, 10.0)],
                  "slowloris": slowloris(base, "127.0.0.1", port, server.pid, args.connections, args.hold_s)}
    finally:
        server.terminate()
        server.wait(30)
    text = json.dumps(result, indent=1)
    print(text)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
