"""Helpers the server tests share: an app over a FakeEngine (the fixtures in conftest.py use it too)."""

from __future__ import annotations

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
