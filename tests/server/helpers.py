"""Helpers the server tests share: an app over a FakeEngine (the fixtures in conftest.py use it too), a
real uvicorn server on a loopback port, and an async test body run against a started engine."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from contextlib import contextmanager

import uvicorn
from fastapi.testclient import TestClient

from tests.server.fake_engine import FakeEngine
from wisp.engine.async_engine import AsyncEngine
from wisp.server.app import build_app

MODEL = "fake"


def make_app(api_key: str | None = None, max_request_bytes: int | None = None, **engine_kw):
    """(app, fake, engine): `build_app` over a fresh FakeEngine (keyword arguments other than the app's
    go to the FakeEngine)."""
    fake = FakeEngine(**engine_kw)
    engine = AsyncEngine(fake)
    app_kw = {} if max_request_bytes is None else {"max_request_bytes": max_request_bytes}
    return build_app(engine, MODEL, api_key=api_key, **app_kw), fake, engine


def make_client(api_key: str | None = None, max_request_bytes: int | None = None,
                **engine_kw) -> tuple[TestClient, FakeEngine, AsyncEngine]:
    app, fake, engine = make_app(api_key, max_request_bytes, **engine_kw)
    return TestClient(app), fake, engine


@contextmanager
def serve_on_loopback(app, start_timeout: float, stop_timeout: float = 10.0, **config):
    """uvicorn serving `app` on a free 127.0.0.1 port in a daemon thread; yields (host, port). `config`: more
    uvicorn.Config arguments."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()
    finally:
        server.should_exit = True
        thread.join(stop_timeout)
        sock.close()


def run_app(body_fn, fake):
    """Run `await body_fn(app, engine, fake)` (at most 30 s) against an app over `fake`, its engine started
    and shut down around it; returns `fake`."""
    engine = AsyncEngine(fake)
    app = build_app(engine, MODEL)
    engine.start()
    try:
        asyncio.run(asyncio.wait_for(body_fn(app, engine, fake), 30))
    finally:
        engine.shutdown()
    return fake
