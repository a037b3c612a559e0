"""One `wisp bench serve --server URL` run: streamed /v1/completions requests against a live OpenAI-compatible
server (`wisp serve`), started by a load schedule (`wisp.bench.serve.load`), over httpx (an optional dependency:
without it, one WispError saying how to get it).

Each request sends its prompt as token ids with `max_tokens` = the output length, `ignore_eos` and
`stream_options.include_usage`; its times are those of the streamed chunks that carried text, and its token
count the usage the server reports. A chunk can carry several tokens (`wisp serve` holds back text that may
still change: an incomplete UTF-8 character, a possible stop string), so inter-token latencies here are gaps
between chunks, as `vllm bench serve` counts them; a model served without a tokenizer (`--load-format dummy`)
streams its whole output in the last chunk, which then is the only time. The server's expert counters and
preemptions come from its /metrics, read before and after the run; the decode width is not seen from here.
"""

from __future__ import annotations

import asyncio
import json
import time

from wisp.bench.serve.load import Load
from wisp.bench.serve.request_times import RequestTimes
from wisp.errors import WispError

METRICS = {"expert_hits": "wisp_expert_hits_total", "expert_misses": "wisp_expert_misses_total",
           "bytes_h2d": "wisp_expert_bytes_h2d_total", "preemptions": "wisp_preemptions_total"}


def httpx_module():
    try:
        import httpx
    except ImportError:
        raise WispError("wisp bench serve --server needs httpx: pip install httpx") from None
    return httpx


def client_for(url: str, api_key: str | None, transport=None):
    """An async client of the server at `url` (no connection limit: every stream in flight has its own)."""
    httpx = httpx_module()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=httpx.Timeout(600.0),
                             limits=httpx.Limits(max_connections=None), transport=transport)


async def served_model(client) -> str:
    """The name the server serves its model under (the first of /v1/models)."""
    resp = await client.get("/v1/models")
    if resp.status_code != 200:
        raise WispError(f"{client.base_url}/v1/models answered {resp.status_code}: {resp.text[:200]}")
    return resp.json()["data"][0]["id"]


async def scrape(client) -> dict[str, float] | None:
    """The server's counters of METRICS from /metrics (None when it has none to give)."""
    from prometheus_client.parser import text_string_to_metric_families

    resp = await client.get("/metrics")
    if resp.status_code != 200:
        return None
    samples = {s.name: s.value for fam in text_string_to_metric_families(resp.text) for s in fam.samples}
    return {key: samples.get(name) for key, name in METRICS.items()}


def metrics_fields(before: dict | None, after: dict | None) -> dict:
    """The run's expert traffic and preemptions: the counters' growth over it (None where unknown)."""
    grew = {key: (int(after[key] - before[key]) if before and after and None not in (before[key], after[key]) else None)
            for key in METRICS}
    hits, misses = grew["expert_hits"], grew["expert_misses"]
    routed = None if None in (hits, misses) else hits + misses
    return {**grew, "hit_rate": round(hits / routed, 4) if routed else None,
            "bytes_h2d_per_token": None, "load_control_state": None}


async def stream_one(client, body: dict, times: RequestTimes, clock=time.perf_counter) -> None:
    """POST one streamed completion; time each chunk that carries text (or the last, if none did)."""
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise WispError(f"the server answered {resp.status_code}: {(await resp.aread())[:200]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                raise WispError(f"the server failed a request: {event['error'].get('message')}")
            for choice in event.get("choices") or []:
                if choice.get("text") or (choice.get("finish_reason") and not times.token_times):
                    times.token_times.append(clock())
            if event.get("usage"):
                times.tokens = event["usage"]["completion_tokens"]


async def drive_server(client, model: str, load: Load, prompts: list[list[int]], output_len: int,
                       temperature: float, clock=time.perf_counter) -> tuple[list[RequestTimes], float]:
    """Run `load` to the end against the server; each request's times, and the wall from the first start to
    the last token."""
    times: list[RequestTimes] = []
    in_flight: set[asyncio.Task] = set()
    t0 = clock()
    while True:
        now = clock()
        for _ in range(load.due(now - t0, len(times), len(in_flight))):
            i, offset = len(times), load.scheduled(len(times))
            times.append(RequestTimes(t0 + offset if offset is not None else now))
            body = {"model": model, "prompt": prompts[i], "max_tokens": output_len, "temperature": temperature,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            in_flight.add(asyncio.create_task(stream_one(client, body, times[i], clock)))
        upcoming = load.next_start(len(times))
        if not in_flight and upcoming is None:
            break
        wait = None if upcoming is None else max(0.0, t0 + upcoming - clock())
        if not in_flight:
            await asyncio.sleep(wait)
            continue
        done, in_flight = await asyncio.wait(in_flight, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # a failed request fails the run
    end = max((r.token_times[-1] for r in times if r.token_times), default=t0)
    return times, end - t0
