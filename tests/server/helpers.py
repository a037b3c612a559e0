"""Helpers the server tests share: an app over a FakeEngine (the fixtures in conftest.py use it too)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.server.fake_engine import FakeEngine
from wisp.engine.async_engine import AsyncEngine
from wisp.server.app import build_app

MODEL = "fake"


def make_client(api_key: str | None = None, **engine_kw) -> tuple[TestClient, FakeEngine, AsyncEngine]:
    fake = FakeEngine(**engine_kw)
    engine = AsyncEngine(fake)
    return TestClient(build_app(engine, MODEL, api_key=api_key)), fake, engine
