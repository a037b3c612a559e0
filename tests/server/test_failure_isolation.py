"""The HTTP API over the real demo engine, in process: a request that cannot be served hurts no other.

- temperature / top_p that float32 rounds to 0 (issue 13's curl) are a 400 naming the field, while a
  concurrent stream finishes exactly as it does alone;
- a request whose sampler raises (a test double, swapped in for requests with POISON_SEED) fails while 3
  other streams run beside it; it alone ends with an error (an SSE error event, or a 500 when not streamed), the other 3 finish
  with the text they have alone, and no KV block is left used.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

import wisp.engine.sequence as sequence_module
from wisp.config import EngineConfig
from wisp.engine.async_engine import AsyncEngine
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import Sampler
from wisp.server.app import build_app

MODEL = "demo"
POISON_SEED = 666
FAIL_AT = 3  # the poisoned request streams 2 tokens or more before it fails


class PoisonedSampler(Sampler):
    """The real sampler, except that a request seeded POISON_SEED raises at its first token from the
    FAIL_AT-th on that it samples with `batch_of` requests running (`scheduler` is set by the fixture)."""

    scheduler = None
    batch_of = 1
    failed_beside: int | None = None  # how many requests were running when it raised

    def __init__(self, params):
        super().__init__(params)
        self.calls = 0

    def prepare(self, logits, *args):
        self.calls += 1
        running = len(self.scheduler.running)
        if self.params.seed == POISON_SEED and self.calls >= FAIL_AT and running >= self.batch_of:
            type(self).failed_beside = running
            raise RuntimeError("injected sampler failure")
        return super().prepare(logits, *args)


@pytest.fixture
def served(device, attention_backend, monkeypatch):
    monkeypatch.setattr(sequence_module, "Sampler", PoisonedSampler)
    llm_engine = LLMEngine(EngineConfig(model=MODEL, device=device, mode="paged", expert_cap=6, max_model_len=128,
                                        max_concurrency=4, attention_backend=attention_backend))
    monkeypatch.setattr(PoisonedSampler, "scheduler", llm_engine.scheduler)
    engine = AsyncEngine(llm_engine)
    with TestClient(build_app(engine, MODEL)) as client:
        yield client, llm_engine, engine


def stream(client: TestClient, body: dict) -> list[dict]:
    """The SSE payloads of a streamed completion (checking the closing [DONE])."""
    resp = client.post("/v1/completions", json={**body, "stream": True})
    assert resp.status_code == 200, resp.text
    events = resp.text.split("\n\n")[:-1]
    assert events[-1] == "data: [DONE]", resp.text[-300:]
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


def text_of(events: list[dict]) -> tuple[str, str | None]:
    return "".join(e["choices"][0]["text"] for e in events), events[-1]["choices"][0]["finish_reason"]


def request(i: int, **extra) -> dict:
    return {"model": MODEL, "prompt": f"Hello number {i}, the quick brown fox", "max_tokens": 12,
            "temperature": 0.7, "seed": i, "ignore_eos": True, **extra}


def assert_idle(client: TestClient, llm_engine: LLMEngine) -> None:
    """Once the engine thread is idle, no request and no KV block is left (a 1-token request as a barrier)."""
    assert client.post("/v1/completions", json=request(99, max_tokens=1)).status_code == 200
    s = client.app.state.engine.stats()
    assert s["num_running"] == s["num_waiting"] == s["kv_blocks_used"] == 0
    assert llm_engine.pool.num_used == 0 and not llm_engine.requests


def test_the_underflowing_curl_is_400_and_a_concurrent_stream_is_unaffected(served):
    client, llm_engine, _ = served
    alone = text_of(stream(client, request(1)))
    bad = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "top_p": 1e-50}  # issue 13's curl
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(stream, client, request(1))
        refused = [client.post("/v1/completions", json=bad),
                   client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 4, "temperature": 1e-50,
                                                             "messages": [{"role": "user", "content": "Hi"}]})]
        together = text_of(running.result())
    for resp, field in zip(refused, ("top_p", "temperature")):
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] == field and field in err["message"] and err["type"] == "invalid_request_error"
    assert together == alone and alone[1] == "length"
    assert_idle(client, llm_engine)


def test_a_poisoned_request_among_4_streams_fails_alone(served):
    client, llm_engine, _ = served
    alone = [text_of(stream(client, request(i))) for i in range(3)]
    PoisonedSampler.batch_of = 4
    with ThreadPoolExecutor(4) as pool:
        poisoned = pool.submit(stream, client, request(3, seed=POISON_SEED, max_tokens=80))  # fails once all 4 run
        healthy = [pool.submit(stream, client, request(i)) for i in range(3)]
        together = [text_of(f.result()) for f in healthy]
        events = poisoned.result()
    assert PoisonedSampler.failed_beside == 4  # it failed in a batch with the 3 others
    assert together == alone and all(reason == "length" for _, reason in alone)
    err = events[-1]["error"]
    assert err["code"] == "request_failed" and err["type"] == "server_error" and "sampling" in err["message"]
    assert "injected" not in err["message"]  # the internal exception stays in the log
    assert all("error" not in e and e["choices"][0]["finish_reason"] is None for e in events[:-1])
    PoisonedSampler.batch_of = 1
    resp = client.post("/v1/completions", json=request(4, seed=POISON_SEED))  # not streamed: a 500 of its own
    assert resp.status_code == 500 and resp.json()["error"]["code"] == "request_failed", resp.text
    metrics = client.get("/metrics").text
    assert 'wisp_requests_finished_total{finish_reason="error"} 2.0' in metrics
    assert_idle(client, llm_engine)
