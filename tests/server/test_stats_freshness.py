"""/metrics is fresh without a per-step host read (issue 13, item 6).

`LLMEngine.stats()` reads every layer's device counters back (a host sync), so the engine thread calls it
only when a scrape asks (`AsyncEngine.refresh_stats`, awaited by the /metrics route) and once when it goes
idle; never once per step. A FakeEngine that counts its stats() calls checks both halves.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.fake_engine import FakeEngine
from tests.server.helpers import MODEL, run_app
from tests.server.test_disconnect import Client, scope
from wisp.engine.async_engine import AsyncEngine
from wisp.engine.sampling import SamplingParams


class CountingEngine(FakeEngine):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.stats_calls = 0
        self.stats_threads: set[str] = set()

    def stats(self) -> dict:
        self.stats_calls += 1
        self.stats_threads.add(threading.current_thread().name)
        return {**super().stats(), "steps": self.steps}


def run(coro_fn, **kw):
    fake = CountingEngine(**kw)
    engine = AsyncEngine(fake)
    engine.start()
    try:
        return asyncio.run(asyncio.wait_for(coro_fn(engine, fake), 30)), fake
    finally:
        engine.shutdown()


def test_no_stats_read_per_step_one_when_idle():
    async def body(engine, fake):
        before = fake.stats_calls
        outs = [o async for o in engine.generate("a", [1, 2], SamplingParams(max_tokens=60))]
        assert len(outs) == 60 and fake.steps >= 60
        for _ in range(500):  # the thread goes idle after the last step, and snapshots once
            if fake.stats_calls > before:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # and no more while idle
        return fake.stats_calls - before

    calls, fake = run(body)
    assert calls == 1  # the idle snapshot, not one per step (60 steps)
    assert fake.stats_threads <= {"wisp-engine", "MainThread"}  # MainThread: the constructor's first snapshot


def test_a_refresh_mid_run_is_fresh_and_taken_between_steps():
    async def body(engine, fake):
        stream = await engine.submit("long", [1], SamplingParams(max_tokens=400))
        for _ in range(5):
            await stream.__anext__()
        stale = engine.stats()
        assert stale["steps"] == 0  # the constructor's snapshot: nothing refreshed it during the run
        calls = fake.stats_calls
        fresh = await engine.refresh_stats()
        assert fake.stats_calls == calls + 1 and fresh is engine.stats()
        assert fresh["num_running"] == 1 and fresh["steps"] >= 5 and engine.stats_age() < 1.0
        for _ in range(20):
            await stream.__anext__()
        # 25 tokens consumed: at least 25 steps ran (the engine may run ahead of the stream, so `fresh` may
        # already count a few of these 20)
        later = await engine.refresh_stats()
        assert later is not fresh and fake.stats_calls == calls + 2 and later["steps"] >= max(25, fresh["steps"])
        stream.close()

    _, fake = run(body, step_delay=0.002, max_model_len=512, num_blocks=256)
    assert fake.stats_threads == {"MainThread", "wisp-engine"}  # after the constructor's, all on the engine thread


def test_a_refresh_behind_a_long_step_times_out_to_the_last_snapshot():
    async def body(engine, fake):
        fake.step_delay = 0.5
        stream = await engine.submit("slow", [1], SamplingParams(max_tokens=4))
        await asyncio.sleep(0.05)  # the first (0.5 s) step is running
        old = engine.stats()
        assert await engine.refresh_stats(timeout=0.1) is old  # served stale rather than waiting
        assert engine.stats_age() >= 0.05
        async for _ in stream:
            pass

    run(body)


def test_refresh_without_a_running_thread_returns_the_snapshot():
    fake = CountingEngine()
    engine = AsyncEngine(fake)
    snap = engine.stats()
    assert asyncio.run(engine.refresh_stats()) is snap  # never started: no thread to ask
    engine.start()
    engine.shutdown()
    assert asyncio.run(engine.refresh_stats()) is engine.stats()  # after shutdown: the final snapshot


def test_call_runs_on_the_engine_thread_between_steps_and_raises_its_error():
    async def body(engine, fake):
        stream = await engine.submit("r", [1], SamplingParams(max_tokens=50))
        await stream.__anext__()
        name = await engine.call(lambda e: (e.steps, threading.current_thread().name))
        assert name[1] == "wisp-engine"
        with pytest.raises(ZeroDivisionError):
            await engine.call(lambda e: 1 / 0)
        async for _ in stream:  # the engine goes on
            pass
        return name

    run(body, step_delay=0.001)


def metric(text: str, name: str) -> float:
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


async def scrape(app) -> str:
    """GET /metrics through the raw ASGI interface (the app runs in this loop, beside a stream)."""
    sent: list[bytes] = []

    async def send(message: dict) -> None:
        sent.append(message.get("body", b""))

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    await app({**scope("/metrics"), "method": "GET", "headers": [(b"host", b"test")]}, receive, send)
    return b"".join(sent).decode()


def test_scrape_mid_stream_shows_the_running_request():
    """Over the app: a scrape while a stream runs sees it (1 running, blocks used), then 0 once it ends."""

    async def body(app, engine, fake):
        client = Client(app, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 300, "stream": True})
        await client.wait_for_chunks(10)
        calls = fake.stats_calls
        text = await scrape(app)
        assert fake.stats_calls == calls + 1
        assert metric(text, "wisp_requests_running") == 1 and metric(text, "wisp_kv_blocks_used") > 0
        assert metric(text, "wisp_stats_age_seconds") < 1.0
        client.disconnect()
        await asyncio.wait_for(client.task, 5)
        for _ in range(500):
            text = await scrape(app)
            if metric(text, "wisp_requests_running") == 0:
                break
            await asyncio.sleep(0.01)
        assert metric(text, "wisp_kv_blocks_used") == 0

    run_app(body, CountingEngine(step_delay=0.003, max_model_len=512, num_blocks=256))
