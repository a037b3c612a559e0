"""The OpenAPI document of the HTTP API: per-route responses with the status codes and bodies the server
really sends.

Invariants:
- Every route lists each status it can answer with, and only those: 200 with its model (/v1/completions and
  /v1/chat/completions also as `text/event-stream` when `"stream": true`, its schema that of one event,
  as Open API before 3.2 reads it); errors as `ErrorResponse` (400 bad request, 401 missing or wrong key
  (only with an API key), 404 unknown model, 413 body too large, 500 internal error or a request that
  failed alone in the engine, 503 engine stopped); /metrics as Prometheus text in the exact content type
  it sends. (Outside any operation: 404 for an unknown path, 405 for a wrong method, and 413 for a GET
  sent with a body over the limit.)
- No 422: validation errors are 400s (app.py's handler), so FastAPI's 422 and its HTTPValidationError /
  ValidationError schemas are removed from the document.
- With an API key, the /v1 routes declare bearer security (and their 401).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from wisp.server.protocol import ErrorResponse

SSE = "text/event-stream"
PROMETHEUS = CONTENT_TYPE_LATEST  # what ServerMetrics.render sends (prometheus_client's text format)
_FASTAPI_422 = ("HTTPValidationError", "ValidationError")

_ERRORS = {
    400: "Invalid request: not JSON, wrong types, invalid Unicode, unsupported options, or over the context "
         "length (`param` names the field)",
    401: "Missing or incorrect API key (`Authorization: Bearer <key>`)",
    404: "Unknown model",
    413: "Request body over the server's --max-request-bytes (the connection is closed)",
    500: "Internal error (no detail; the connection is closed), or `code: request_failed`: this request failed "
         "alone in the engine",
    503: "The engine is not running (shutting down)",
}


class HealthStatus(BaseModel):
    status: Literal["ok"]


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries: each status code in `codes` as an OpenAI error object."""
    return {code: {"model": ErrorResponse, "description": _ERRORS[code]} for code in codes}


def streamed(model: type[BaseModel], what: str) -> dict[int | str, dict[str, Any]]:
    """The 200 of a generation route: `model` as JSON, or server-sent events with `"stream": true` (the
    schema of one event, as Open API before 3.2 reads it for event streams)."""
    data = (f"a {what} chunk as JSON; `{{\"error\": ...}}` (an OpenAI error object) if the request fails "
            "midway; the last event is `[DONE]`")
    event = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string", "description": data}, "event": {"type": "string"},
                            "id": {"type": "string"}, "retry": {"type": "integer"}}}
    return {200: {"model": model, "description": f"The whole {what} (JSON), or with `\"stream\": true` its chunks "
                                                 "as server-sent events",
                  "content": {SSE: {"schema": event}}}}


def prometheus_text() -> dict[int | str, dict[str, Any]]:
    return {200: {"description": "Prometheus text exposition format",
                  "content": {PROMETHEUS: {"schema": {"type": "string"}}}}}


def install(app: FastAPI, api_key: bool) -> None:
    """Replace `app.openapi` with a generator of the corrected document (made once, then cached)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _drop_422(doc)
            if api_key:
                _add_bearer(doc)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi


def _operations(doc: dict[str, Any]):
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            yield path, method, op


def _drop_422(doc: dict[str, Any]) -> None:
    for _, _, op in _operations(doc):
        op.get("responses", {}).pop("422", None)
    schemas = doc.get("components", {}).get("schemas", {})
    for name in _FASTAPI_422:
        schemas.pop(name, None)


def _add_bearer(doc: dict[str, Any]) -> None:
    doc.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
    for path, _, op in _operations(doc):
        if path.startswith("/v1"):
            op["security"] = [{"bearer": []}]
            op["responses"]["401"] = {
                "description": _ERRORS[401],
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
            }
