"""The OpenAPI document says what the server does (tests/server/test_schemathesis.py holds a live server to it).

Each route lists the status codes it can send and no other (no 422: validation errors are 400s), errors
as `ErrorResponse`, 200s with their models, streaming as text/event-stream, /metrics as Prometheus text
in the content type it sends; request fields with defaults are not required (max_tokens among them), and
fields wisp only takes at one value say so.
"""

from __future__ import annotations

import pytest

from tests.server.helpers import make_app

API_KEY = "sk-openapi"


# -- the document -------------------------------------------------------------------------------------
def document(api_key: str | None = None) -> dict:
    app, _, _ = make_app(api_key=api_key)
    return app.openapi()


def responses(doc: dict, method: str, path: str) -> dict:
    return doc["paths"][path][method]["responses"]


def media_types(doc: dict, method: str, path: str, status: str) -> list[str]:
    return list(responses(doc, method, path)[status].get("content", {}))


def ref(doc: dict, method: str, path: str, status: str, media_type: str = "application/json") -> str:
    return responses(doc, method, path)[status]["content"][media_type]["schema"]["$ref"].rsplit("/", 1)[1]


GENERATION = {"/v1/completions": "Completion", "/v1/chat/completions": "ChatCompletion"}
STATUSES = {
    ("get", "/health"): {"200", "500", "503"},
    ("get", "/metrics"): {"200", "500"},
    ("get", "/v1/models"): {"200", "500"},
    **{("post", path): {"200", "400", "404", "413", "500", "503"} for path in GENERATION},
}


@pytest.mark.parametrize("api_key", [None, API_KEY])
def test_status_codes_per_route(api_key):
    doc = document(api_key)
    found = {(method, path): set(op["responses"]) for path, ops in doc["paths"].items() for method, op in ops.items()}
    with_key = {k: v | ({"401"} if api_key and k[1].startswith("/v1") else set()) for k, v in STATUSES.items()}
    assert found == with_key
    assert not any("422" in op["responses"] for ops in doc["paths"].values() for op in ops.values())
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    secured = {(m, p) for p, ops in doc["paths"].items() for m, op in ops.items() if "security" in op}
    assert secured == ({k for k in STATUSES if k[1].startswith("/v1")} if api_key else set())


@pytest.mark.parametrize("api_key", [None, API_KEY])
def test_error_bodies_are_error_responses(api_key):
    doc = document(api_key)
    for (method, path) in STATUSES:
        for status in responses(doc, method, path):
            if status != "200":
                assert media_types(doc, method, path, status) == ["application/json"]
                assert ref(doc, method, path, status) == "ErrorResponse", (method, path, status)
    assert doc["components"]["schemas"]["ErrorInfo"]["required"] == ["message", "type"]


def test_success_bodies_and_content_types():
    from prometheus_client import CONTENT_TYPE_LATEST

    doc = document()
    for path, model in GENERATION.items():
        assert media_types(doc, "post", path, "200") == ["application/json", "text/event-stream"]
        assert ref(doc, "post", path, "200") == model
    assert ref(doc, "get", "/v1/models", "200") == "ModelList"
    assert ref(doc, "get", "/health", "200") == "HealthStatus"
    assert media_types(doc, "get", "/metrics", "200") == [CONTENT_TYPE_LATEST]
    assert CONTENT_TYPE_LATEST.startswith("text/plain; version=")


def test_streams_document_their_events():
    doc = document()
    for path in GENERATION:
        event = responses(doc, "post", path)["200"]["content"]["text/event-stream"]["schema"]
        assert event["type"] == "object" and event["required"] == ["data"]  # one event (Open API < 3.2 reading)


def test_request_schemas_require_only_what_the_server_requires():
    schemas = document()["components"]["schemas"]
    completion, chat = schemas["CompletionRequest"], schemas["ChatCompletionRequest"]
    assert completion["required"] == ["model", "prompt"]
    assert chat["required"] == ["model", "messages"]
    positive = {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]}
    for request, length_fields in ((completion, ("max_tokens",)), (chat, ("max_tokens", "max_completion_tokens"))):
        for field in length_fields:
            assert {k: v for k, v in request["properties"][field].items() if k != "title"} == positive
        n = request["properties"]["n"]
        assert n["default"] == 1 and n["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 128}
    prompt = completion["properties"]["prompt"]["anyOf"]
    assert prompt[0] == {"type": "string", "minLength": 1}  # an empty prompt is a 400
    assert all(alt["minItems"] == 1 for alt in prompt[1:]) and [alt.get("maxItems") for alt in prompt[1:]] == [None, 1, 1]
    assert chat["properties"]["messages"]["minItems"] == 1


def test_served_document_matches(client):
    resp = client.get("/openapi.json")
    assert resp.status_code == 200
    assert resp.json() == client.app.openapi()
