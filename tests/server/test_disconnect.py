"""A client that goes away (or a handler that uvicorn cancels at shutdown) aborts its request.

Driven through raw ASGI calls, so the test decides exactly when `http.disconnect` arrives: the
scope says ASGI spec 2.3, as uvicorn's does, which is the path where Starlette watches for it.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.helpers import MODEL
from tests.server.helpers import run_app as run_app_over
from wisp.engine.async_engine import AsyncEngine


def scope(path: str) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
    }


class Client:
    """One ASGI request whose disconnect the test triggers."""

    def __init__(self, app, path: str, body: dict):
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.inbox.put_nowait({"type": "http.request", "body": json.dumps(body).encode(), "more_body": False})
        self.body_chunks: list[bytes] = []
        self.status: int | None = None
        self.task = asyncio.create_task(app(scope(path), self.inbox.get, self._send))

    async def _send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message.get("body"):
            self.body_chunks.append(message["body"])

    async def wait_for_chunks(self, n: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.body_chunks) < n:
            assert time.monotonic() < deadline and not self.task.done(), self.body_chunks
            await asyncio.sleep(0.005)

    def disconnect(self) -> None:
        self.inbox.put_nowait({"type": "http.disconnect"})


async def until(predicate, timeout: float = 10.0) -> None:
    """Poll `predicate()` (a bool, or an awaitable of one) until it holds."""
    deadline = time.monotonic() + timeout
    while not await _value(predicate()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def _value(x):
    return await x if asyncio.iscoroutine(x) else x


def run_app(body_fn):
    return run_app_over(body_fn, FakeEngine(step_delay=0.005, max_model_len=512, num_blocks=256))


async def idle(engine: AsyncEngine) -> bool:
    s = await engine.refresh_stats()  # a fresh snapshot: the engine thread takes none per step
    return s["num_running"] == s["num_waiting"] == s["kv_blocks_used"] == 0


LONG = {"model": MODEL, "max_tokens": 400}


@pytest.mark.parametrize("path, extra", [("/v1/completions", {"prompt": "hi"}),
                                         ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})])
def test_stream_disconnect_aborts(path, extra):
    async def body(app, engine, fake):
        client = Client(app, path, {**LONG, **extra, "stream": True})
        await client.wait_for_chunks(3)
        client.disconnect()
        await asyncio.wait_for(client.task, 5)
        await until(lambda: idle(engine))
        assert client.status == 200 and len(fake.aborted) == 1
        assert not b"".join(client.body_chunks).endswith(b"data: [DONE]\n\n")

    fake = run_app(body)
    assert fake.used == 0 and fake.steps < 200  # stopped long before max_tokens


def test_non_stream_disconnect_aborts():
    async def body(app, engine, fake):
        client = Client(app, "/v1/completions", {**LONG, "prompt": "hi"})
        await until(lambda: fake.steps >= 3)
        client.disconnect()
        await asyncio.wait_for(client.task, 5)
        await until(lambda: idle(engine))
        assert len(fake.aborted) == 1 and client.status == 499

    assert run_app(body).used == 0


@pytest.mark.parametrize("stream", [True, False])
def test_cancelled_handler_aborts(stream):
    """uvicorn cancels request tasks when the graceful-shutdown period runs out."""

    async def body(app, engine, fake):
        client = Client(app, "/v1/completions", {**LONG, "prompt": "hi", "stream": stream})
        await until(lambda: fake.steps >= 3)
        client.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await client.task
        await until(lambda: idle(engine))
        assert len(fake.aborted) == 1

    run_app(body)


def test_finished_requests_are_not_aborted():
    async def body(app, engine, fake):
        for stream in (True, False):
            client = Client(app, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": stream})
            await asyncio.wait_for(client.task, 5)
            assert client.status == 200
        await until(lambda: idle(engine))
        assert fake.aborted == []

    run_app(body)
