"""What a request may carry beyond the basics: fields wisp cannot honour are a 400 naming them, never ignored;
message roles are checked; integer fields take whole floats (JSON Schema's `integer` admits 16.0) and the
seed's range is the one the OpenAPI document states; an unparsable body's 400 says what was wrong with it."""

from __future__ import annotations

import pytest

from tests.server.helpers import MODEL, make_client
from tests.server.test_app import assert_error
from wisp.server.protocol import _SEED_MAX, ROLES

USER = [{"role": "user", "content": "Hi"}]
UNHONOURED = [("functions", [{"name": "f", "parameters": {}}]),
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


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("fields, param, needle", [
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "not in tools"),
    ({"tools": [TOOL, TOOL]}, "tools", "same function name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "function name"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs a json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "not one of"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "response_format",
     "both constrain"),
    ({"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "both constrain"),
])
def test_inconsistent_agent_fields_are_400_naming_the_field(served, fields, param, needle):
    client, fake, _ = served
    resp = client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, **fields})
    err = assert_error(resp, 400, needle)
    assert err["param"] == param and fake.steps == 0


def test_agent_fields_are_accepted():
    client, _, _ = make_client(max_model_len=1024, num_blocks=1024)  # the tools make a long prompt
    with client:
        resp = client.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 3, "tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": True,
            "messages": USER + [{"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}],
            "presence_penalty": 0.5, "frequency_penalty": -0.5, "logit_bias": {"65": 3}, "logprobs": True,
            "top_logprobs": 2, "n": 2, "seed": 4})
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["choices"]) == 2


def test_a_constraint_without_a_grammar_engine_is_400(served):
    client, fake, _ = served  # the fake engine has no tokenizer.json to compile grammars over
    resp = client.post("/v1/chat/completions", json={"model": MODEL, "messages": USER,
                                                     "response_format": {"type": "json_object"}})
    err = assert_error(resp, 400, "tokenizer.json")
    assert err["param"] == "response_format" and fake.steps == 0


@pytest.mark.parametrize("route, body", [("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": USER})])
def test_sampling_a_request_leaves_out_comes_from_the_models_generation_config(route, body):
    """As vLLM's server does: temperature, top_p and top_k a request does not name take the model's
    generation_config values; those it names (0 included) are its own; a model with none samples as OpenAI's."""
    seen = []

    def recorded(fake):
        add = fake.add_request
        fake.add_request = lambda rid, ids, params, constraint=None: (seen.append(params), add(rid, ids, params, constraint))
        return fake

    client, fake, _ = make_client(sampling_defaults=(("temperature", 0.8), ("top_p", 0.95), ("top_k", 20.0)))
    recorded(fake)
    with client:
        assert client.post(route, json={"model": MODEL, "max_tokens": 2, **body}).status_code == 200
        named = {"temperature": 0, "top_p": 0.5, "top_k": 0}
        assert client.post(route, json={"model": MODEL, "max_tokens": 2, **body, **named}).status_code == 200
    plain, fake, _ = make_client()
    recorded(fake)
    with plain:
        assert plain.post(route, json={"model": MODEL, "max_tokens": 2, **body}).status_code == 200
    assert [(p.temperature, p.top_p, p.top_k) for p in seen] == [(0.8, 0.95, 20), (0.0, 0.5, 0), (1.0, 1.0, 0)]
