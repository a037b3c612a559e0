"""Fixtures for the server tests: an app over a FakeEngine, run through its lifespan."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.server.helpers import make_client


@pytest.fixture
def served():
    client, fake, engine = make_client()
    with client:
        yield client, fake, engine


@pytest.fixture
def client(served) -> TestClient:
    return served[0]
