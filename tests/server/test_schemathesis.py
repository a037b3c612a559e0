"""schemathesis, through its pytest API, against the real demo engine served by uvicorn on a loopback port
the OS picks (with an API key, so the 401s and bearer security are part of the document it reads from
/openapi.json): 0 server errors, every response conforms to the document (status code, content type,
body schema; for a stream, each event), and bodies the document calls invalid are refused (CHECKS).

Bounded, so CI runs it in about 20 s on a 2-core CPU: a fixed seed (hypothesis derandomize, no example
database), at most MAX_EXAMPLES cases per operation in each of the examples and fuzzing phases (the
coverage phase adds the schema's boundary cases, a few dozen per operation; the stateful phase is off),
a DEADLINE per case and a request timeout. Completions are short: a max_tokens / max_completion_tokens
above MAX_TOKENS is lowered to it, a chat request generated as valid that sets neither gets MAX_TOKENS
(the rest of the context would take seconds on a CPU), and max_model_len is 128. A body generated as
valid names the served model (a random name is a 404 before anything else is looked at).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance, negative_data_rejection, response_schema_conformance, status_code_conformance,
)

MODEL = "demo"
API_KEY = "sk-schemathesis"
MAX_EXAMPLES = 20
DEADLINE = timedelta(seconds=5)
MAX_TOKENS = 4
REQUEST_TIMEOUT_S = 30
# 0 server errors; each response's status, content type and body as documented; and a body the document
# calls invalid is refused with a 4xx (so the document is no stricter than the server: a field it marks
# required really is). Not positive_data_acceptance: some schema-valid bodies are rightly 400s the schema
# cannot express (token ids outside the vocabulary, a prompt over the context, an integer sent as 4.0).
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]


@pytest.fixture(scope="module")
def live_demo(tmp_path_factory):
    """The base URL of uvicorn serving the real demo engine (API_KEY required on /v1) on 127.0.0.1:0."""
    from tests.server.helpers import serve_on_loopback
    from wisp.config import EngineConfig
    from wisp.engine.async_engine import AsyncEngine
    from wisp.engine.engine import LLMEngine
    from wisp.server.app import build_app

    with pytest.MonkeyPatch.context() as mp:  # module scope runs before conftest's per-test WISP_CACHE
        mp.setenv("WISP_CACHE", str(tmp_path_factory.getbasetemp() / "wisp-cache"))
        llm_engine = LLMEngine(EngineConfig(model=MODEL, device="cpu", mode="paged", expert_cap=6, max_model_len=128,
                                            max_concurrency=4))
    engine = AsyncEngine(llm_engine)
    app = build_app(engine, MODEL, api_key=API_KEY)
    with serve_on_loopback(app, start_timeout=60, stop_timeout=30) as (host, port):
        yield f"http://{host}:{port}"


@pytest.fixture(scope="module")
def live_schema(live_demo):
    config = schemathesis.config.SchemathesisConfig.from_dict({
        "seed": 0,
        "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
        "phases": {"stateful": {"enabled": False}},
    })
    return schemathesis.openapi.from_url(live_demo + "/openapi.json", config=config)


def adapt(case) -> None:
    """Lower a larger max_tokens / max_completion_tokens in the body to MAX_TOKENS, and name the served
    model in a body generated to be valid (a random name is a 404 before anything else is looked at)."""
    body = case.body
    if not isinstance(body, dict):
        return
    for field in ("max_tokens", "max_completion_tokens"):
        if type(body.get(field)) is int and body[field] > MAX_TOKENS:
            body[field] = MAX_TOKENS
    if case.meta is not None and case.meta.generation.mode.name == "POSITIVE":
        if isinstance(body.get("model"), str):
            body["model"] = MODEL
        if "messages" in body and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = MAX_TOKENS  # the chat default (the rest of the context) takes seconds on a CPU


schema = schemathesis.pytest.from_fixture("live_schema")


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=DEADLINE,
          suppress_health_check=list(HealthCheck))
def test_schemathesis(case, live_demo):
    adapt(case)
    case.call_and_validate(base_url=live_demo, headers={"Authorization": f"Bearer {API_KEY}"},
                           timeout=REQUEST_TIMEOUT_S, checks=CHECKS)
