"""What a request may carry beyond the basics: fields wisp cannot honour are a 400 naming them, never ignored;
message roles are checked; integer fields take whole floats (JSON Schema's `integer` admits 16.0) and the
seed's range is the one the OpenAPI document states; an unparsable body's 400 says what was wrong with it."""

from __future__ import annotations

import pytest

from tests.server.helpers import MODEL
from tests.server.test_app import assert_error
from wisp.server.protocol import _SEED_MAX, ROLES

USER = [{"role": "user", "content": "Hi"}]
UNHONOURED = [("tool_choice", "auto"), ("tool_choice", "required"),
              ("tool_choice", {"type": "function", "function": {"name": "f"}}), ("parallel_tool_calls", True),
              ("parallel_tool_calls", False), ("functions", [{"name": "f", "parameters": {}}]),
              ("function_call", "auto"), ("reasoning_effort", "low"), ("audio", {"voice": "alloy", "format": "wav"}),
              ("web_search_options", {}), ("modalities", ["text", "audio"])]


@pytest.mark.parametrize("field, value", UNHONOURED)
def test_a_field_wisp_cannot_honour_is_400_naming_it(served, field, value):
    client, fake, _ = served
    resp = client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, field: value})
    err = assert_error(resp, 400, field, "not supported")
    assert err["param"] == field and fake.steps == 0


def test_the_neutral_values_ask_for_nothing_and_are_accepted(client):
    resp = client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "tool_choice": "none",
                                                     "modalities": ["text"], "max_tokens": 2})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("role", ["banana", "", "User", " user"])
def test_an_unknown_role_is_400(served, role):
    client, fake, _ = served
    resp = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": role, "content": "x"}]})
    err = assert_error(resp, 400, "role", ", ".join(ROLES))
    assert err["param"] == "messages" and fake.steps == 0


@pytest.mark.parametrize("role", ROLES)
def test_every_known_role_is_accepted(client, role):
    resp = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": role, "content": "x"}],
                                                     "max_tokens": 2})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("route, body", [
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 3.0, "seed": 77304952.0, "top_k": 2.0}),
    ("/v1/completions", {"prompt": [72.0, 101.0], "max_tokens": 3}),
    ("/v1/chat/completions", {"messages": USER, "max_completion_tokens": 3.0, "n": 1.0}),
])
def test_whole_floats_count_as_integers(client, route, body):
    resp = client.post(route, json={"model": MODEL, **body})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] <= 3


@pytest.mark.parametrize("field, value", [("max_tokens", 2.5), ("seed", 1e300 + 0.5), ("top_k", float("inf")),
                                          ("max_tokens", True), ("max_tokens", "3")])
def test_other_numbers_are_not_integers(client, field, value):
    body = {"model": MODEL, "prompt": "Hello", field: value}
    if value == float("inf"):
        resp = client.post("/v1/completions", content=f'{{"model": "{MODEL}", "prompt": "Hello", "{field}": 1e999}}',
                           headers={"content-type": "application/json"})
    else:
        resp = client.post("/v1/completions", json=body)
    assert assert_error(resp, 400)["param"] == field


def test_the_seed_range_is_the_documented_one(client):
    top = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 2, "seed": _SEED_MAX})
    assert top.status_code == 200, top.text
    over = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "seed": 9223372036854775001})
    assert assert_error(over, 400, "seed", str(_SEED_MAX))["param"] == "seed"
    seed = client.get("/openapi.json").json()["components"]["schemas"]["CompletionRequest"]["properties"]["seed"]
    assert seed["anyOf"][0]["maximum"] == _SEED_MAX


def test_json_nested_too_deeply_says_so(client):
    body = '{"model": "fake", "prompt": ' + "[" * 5000 + "]" * 5000 + "}"
    assert_error(client.post("/v1/completions", content=body, headers={"content-type": "application/json"}), 400,
                 "too deeply")
