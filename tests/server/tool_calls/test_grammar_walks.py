"""The forced-tool-call grammars, compiled by llguidance over a byte vocabulary and walked at random: every reply a
random model could write under them parses back into calls the request allows, with arguments valid under the
tool's parameters schema (tool_choice "required" or named, parallel_tool_calls on or off)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.tool_calls.grammar_walk import accepts, compile_error, tokens_of, walk
from tests.server.tool_calls.streaming import assert_stream_agrees, cut_pieces
from wisp.server.tool_calls import tool_call_format
from wisp.server.tool_calls.grammar import NO_PARAMETERS


def tool(name: str, parameters: dict | None = None, description: str = "") -> dict:
    function = {"name": name, "description": description}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


# bounded strings and arrays, so a random walk ends; every JSON type; a description that could confuse a grammar
TOOLS = [
    tool("get_weather", {
        "type": "object", "additionalProperties": False, "required": ["city"],
        "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1,
                                                                            "maximum": 14},
                       "units": {"enum": ["c", "f"]}},
    }, description='The weather } %json { "x" <tool_call>'),
    tool("search", {
        "type": "object", "additionalProperties": False, "required": ["query", "filters"],
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 10},
            "filters": {"type": "array", "maxItems": 3, "items": {
                "type": "object", "additionalProperties": False, "required": ["key"],
                "properties": {"key": {"type": "string", "maxLength": 4},
                               "value": {"anyOf": [{"type": "number"}, {"type": "string", "maxLength": 3},
                                                   {"type": "null"}]}}}},
            "exact": {"type": "boolean"},
        },
    }),
    tool("route", {
        "$defs": {"point": {"type": "object", "additionalProperties": False, "required": ["lat", "lon"],
                            "properties": {"lat": {"type": "integer"}, "lon": {"type": "integer"}}}},
        "type": "object", "additionalProperties": False, "required": ["start"],
        "properties": {"start": {"$ref": "#/$defs/point"}, "stops": {"type": "array", "maxItems": 2,
                                                                      "items": {"$ref": "#/$defs/point"}}},
    }),
    tool("now"),  # no parameters: only {}
    tool("ping", {}),  # empty parameters: only {}
]
PARAMETERS = {t["function"]["name"]: t["function"].get("parameters") or NO_PARAMETERS for t in TOOLS}


@st.composite
def forced_requests(draw) -> tuple[list[dict], str, bool]:
    """(tools, tool_choice: "required" or a name among them, parallel_tool_calls) as the server passes them."""
    tools = draw(st.lists(st.sampled_from(TOOLS), min_size=1, max_size=len(TOOLS), unique_by=lambda t: id(t)))
    choice = draw(st.sampled_from(["required"] + [t["function"]["name"] for t in tools]))
    return tools, choice, draw(st.booleans()) and choice == "required"


@pytest.mark.parametrize("name", ["hermes", "harmony"])
def test_every_grammar_compiles(name):
    fmt = tool_call_format(name)
    for one in TOOLS:
        for parallel in (False, True):
            assert compile_error(fmt.grammar([one], one["function"]["name"], parallel)) == ""
    assert compile_error(fmt.grammar(TOOLS, "required", True)) == ""


@pytest.mark.parametrize("name", ["hermes", "harmony"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=forced_requests(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_a_random_walk_writes_only_allowed_calls(name, request, seed, data):
    tools, choice, parallel = request
    fmt = tool_call_format(name)
    text = walk(fmt.grammar(tools, choice, parallel), random.Random(seed))
    assert text is not None, "the walk did not end"
    reply = fmt.parse(text)
    assert reply.content is None, text
    allowed = {t["function"]["name"] for t in tools} if choice == "required" else {choice}
    assert len(reply.tool_calls) >= 1
    if not parallel or name == "harmony":
        assert len(reply.tool_calls) == 1, text
    for call in reply.tool_calls:
        assert call.name in allowed
        jsonschema.validate(json.loads(call.arguments), PARAMETERS[call.name])
    assert_stream_agrees(fmt, text, data.draw(cut_pieces(text)))


def test_walks_of_a_parallel_hermes_grammar_reach_several_calls():
    grammar = tool_call_format("hermes").grammar(TOOLS, "required", True)
    counts = {len(tool_call_format("hermes").parse(walk(grammar, random.Random(seed))).tool_calls)
              for seed in range(12)}
    assert max(counts) > 1


HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
HARMONY_CALL = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris","days":3}'
                "<|call|>")


def test_the_hermes_grammar_takes_qwens_rendering_and_nothing_looser():
    hermes = tool_call_format("hermes")
    assert accepts(hermes.grammar(TOOLS, "required", False), HERMES_CALL)
    assert accepts(hermes.grammar(TOOLS, "required", True), HERMES_CALL + "\n" + HERMES_CALL)
    assert not accepts(hermes.grammar(TOOLS, "required", False), HERMES_CALL + "\n" + HERMES_CALL)
    assert not accepts(hermes.grammar(TOOLS, "now", False), HERMES_CALL)  # not the named function
    assert not accepts(hermes.grammar(TOOLS, "required", False), HERMES_CALL.replace('"city": ', '"city":'))
    assert not accepts(hermes.grammar(TOOLS, "required", False), HERMES_CALL.replace("3}", '"3"}'))  # the schema
    assert accepts(hermes.grammar(TOOLS, "now", False), '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>')


def test_the_harmony_grammar_takes_gpt_oss_rendering_and_nothing_looser():
    harmony = tool_call_format("harmony")
    assert accepts(harmony.grammar(TOOLS, "required", True), HARMONY_CALL)
    assert not accepts(harmony.grammar(TOOLS, "required", True), HARMONY_CALL + "<|start|>assistant" + HARMONY_CALL)
    assert not accepts(harmony.grammar(TOOLS, "required", False), HARMONY_CALL.replace('"city":', '"city": '))
    assert not accepts(harmony.grammar(TOOLS, "route", False), HARMONY_CALL)
    spelled = list(b"<|channel|>") + tokens_of(HARMONY_CALL[len("<|channel|>"):])  # a marker as text, not a token
    assert not accepts(harmony.grammar(TOOLS, "required", False), spelled)
