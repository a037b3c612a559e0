"""End to end, what agents send, with the official `openai` client against a live `wisp serve --model demo-random`
(random weights: the trained demo never learnt to end a turn, so a forced tool call would run to max_tokens calling
tools again; a random one ends soon after the grammar allows it): JSON-schema output that validates (hypothesis draws the schemas), forced tool calls (streamed and not) that
call a given tool with valid arguments, a two-turn tool conversation, a small agent loop, logprobs, n, echo and
logit_bias. Where a test draws one seeded answer, its seed is one whose draws end the answer within max_tokens (at
temperature 1 the random model closes an object or a call soon after the grammar allows it, or wanders on: seeds 1
and 2 close; 2, 4 and 7 of json_object's, and 1 and 6 of the streamed call's, did not within their max_tokens with
the device-drawn sampler)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.server.live_server import demo_server

pytestmark = pytest.mark.slow  # a live `wisp serve` subprocess

MODEL = "demo-random"
USER = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "The sum of two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                    "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "wisp-cache"  # conftest's demo cache: written once per session
    with demo_server(cache, tmp_path_factory.mktemp("serve") / "server.log", model=MODEL) as srv:
        yield srv


def check_calls(calls, names=tuple(SCHEMAS)) -> None:
    assert calls, "no tool call"
    for call in calls:
        assert call.type == "function" and call.id
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


# -- structured output ----------------------------------------------------------------------------------
NAMES = st.text("abcdefghij_", min_size=1, max_size=6)
LEAVES = st.one_of(
    st.integers(0, 12).map(lambda n: {"type": "string", "maxLength": n}),
    st.tuples(st.integers(-50, 50), st.integers(0, 100)).map(lambda t: {"type": "integer", "minimum": t[0],
                                                                        "maximum": t[0] + t[1]}),
    st.just({"type": "boolean"}), st.just({"type": "null"}),
    st.lists(st.text("xyz ", min_size=1, max_size=4), min_size=1, max_size=3, unique=True).map(lambda v: {"enum": v}),
)


def objects(children):
    def build(props, required_mask):
        required = [k for k, r in zip(props, required_mask) if r]
        return {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return st.dictionaries(NAMES, children, min_size=1, max_size=3).flatmap(
        lambda props: st.lists(st.booleans(), min_size=len(props), max_size=len(props)).map(
            lambda mask: build(props, mask)))


SCHEMA_STRATEGY = st.recursive(LEAVES, lambda children: st.one_of(
    objects(children), st.tuples(children, st.integers(0, 3)).map(
        lambda t: {"type": "array", "items": t[0], "maxItems": t[1]})), max_leaves=6)


@given(schema=objects(SCHEMA_STRATEGY), seed=st.integers(0, 2**31), temperature=st.sampled_from([0.0, 1.0]))
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_json_schema_output_validates_against_its_schema(server, schema, seed, temperature):
    resp = server.client().chat.completions.create(
        model=MODEL, messages=USER, max_tokens=600, seed=seed, temperature=temperature,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}})
    choice = resp.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_output_is_an_object(server):
    resp = server.client().chat.completions.create(model=MODEL, messages=USER, max_tokens=400, seed=1,
                                                   response_format={"type": "json_object"})
    assert isinstance(json.loads(resp.choices[0].message.content), dict)


def test_choice_and_regex_extensions(server):
    client = server.client()
    resp = client.completions.create(model=MODEL, prompt="Yes or no?", max_tokens=20, seed=1,
                                     extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe so"]}})
    assert resp.choices[0].text in ("yes", "no", "maybe so")
    resp = client.completions.create(model=MODEL, prompt="A date:", max_tokens=20, seed=1,
                                     extra_body={"structured_outputs": {"regex": r"20[0-9]{2}-[01][0-9]"}})
    assert len(resp.choices[0].text) == 7 and resp.choices[0].text[:2] == "20"


# -- tools ----------------------------------------------------------------------------------------------
def test_required_tool_choice_returns_a_valid_call(server):
    resp = server.client().chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="required",
                                                   max_tokens=300, seed=5)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    check_calls(choice.message.tool_calls)


def test_required_tool_choice_streamed(server):
    stream = server.client().chat.completions.create(model=MODEL, messages=USER, tools=TOOLS,
                                                     tool_choice="required", max_tokens=300, seed=2, stream=True)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = call["id"] or delta.id
                call["name"] += delta.function.name or "" if delta.function else ""
                call["arguments"] += delta.function.arguments or "" if delta.function else ""
    assert finish == "tool_calls" and calls
    assert sorted(calls) == list(range(len(calls)))
    for call in calls.values():
        assert call["id"] and call["name"] in SCHEMAS
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_a_named_tool_choice_calls_that_tool(server):
    resp = server.client().chat.completions.create(
        model=MODEL, messages=USER, tools=TOOLS, max_tokens=300, seed=7,
        tool_choice={"type": "function", "function": {"name": "add"}})
    check_calls(resp.choices[0].message.tool_calls, names=("add",))
    assert len(resp.choices[0].message.tool_calls) == 1


def run_tool(name: str, arguments: dict) -> str:
    if name == "add":
        return str(arguments["a"] + arguments["b"])
    return json.dumps({"city": arguments["city"], "temperature": 21, "unit": arguments["unit"]})


def test_two_turn_tool_conversation(server):
    client = server.client()
    first = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=300, seed=8)
    message = first.choices[0].message
    check_calls(message.tool_calls)
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0]
    messages = USER + [message.model_dump(exclude_none=True),
                       {"role": "tool", "tool_call_id": call.id,
                        "content": run_tool(call.function.name, json.loads(call.function.arguments))}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=16, seed=9)
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result were in the prompt


def test_an_agent_loop_runs_to_completion(server):
    """Two tools, called, their results fed back, until the model answers in text (the last turn may not call)."""
    client = server.client()
    messages = [{"role": "system", "content": "You are a helpful agent."}] + USER
    executed = []
    for turn in range(4):
        last = turn == 3
        resp = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=200,
                                              seed=turn, tool_choice="none" if last else "required")
        message = resp.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            executed.append(call.function.name)
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": run_tool(call.function.name, json.loads(call.function.arguments))})
    assert executed and resp.choices[0].message.tool_calls is None
    assert isinstance(resp.choices[0].message.content, str)


# -- logprobs, n, echo, logit_bias ----------------------------------------------------------------------
def test_chat_logprobs_cover_every_token(server):
    resp = server.client().chat.completions.create(model=MODEL, messages=USER, max_tokens=12, temperature=0,
                                                   logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy takes the most likely
    text = b"".join(bytes(e.bytes) for e in content).decode("utf-8", errors="replace")
    assert text.startswith(resp.choices[0].message.content.rstrip("\ufffd"))


def test_n_with_a_seed_gives_reproducible_distinct_samples(server):
    client = server.client()

    def texts():
        resp = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, n=4, seed=11,
                                         temperature=1.0)
        assert [c.index for c in resp.choices] == [0, 1, 2, 3]
        assert resp.usage.completion_tokens == 4 * 12  # nothing stops a random model early but EOS (rare)
        return [c.text for c in resp.choices]

    first = texts()
    assert texts() == first and len(set(first)) == 4


def test_n_streamed_interleaves_every_choice(server):
    stream = server.client().chat.completions.create(model=MODEL, messages=USER, max_tokens=6, n=3, seed=2,
                                                     temperature=1.0, stream=True)
    finished = {c.index for chunk in stream for c in chunk.choices if c.finish_reason}
    assert finished == {0, 1, 2}


def test_echo_with_logprobs(server):
    resp = server.client().completions.create(model=MODEL, prompt="Hello there", max_tokens=4, echo=True,
                                              logprobs=2, temperature=0)
    choice = resp.choices[0]
    assert choice.text.startswith("Hello there")
    lp = choice.logprobs
    assert len(lp.tokens) == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert lp.token_logprobs[0] is None and all(v is not None for v in lp.token_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_logit_bias_forces_a_token(server):
    resp = server.client().completions.create(model=MODEL, prompt="Hi", max_tokens=5, temperature=0,
                                              logprobs=0, logit_bias={"70": 100})
    assert set(resp.choices[0].logprobs.tokens) == {resp.choices[0].logprobs.tokens[0]}
    assert len(resp.choices[0].logprobs.tokens) == 5


def test_penalties_change_a_greedy_reply_that_repeats(server):
    client = server.client()

    def tokens(**kw):
        resp = client.completions.create(model=MODEL, prompt="la la la", max_tokens=24, temperature=0, logprobs=0, **kw)
        return resp.choices[0].logprobs.tokens

    plain = tokens()
    assert len(set(plain)) < len(plain)  # greedy on the random demo repeats itself
    for penalty in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        penalised = tokens(**penalty)
        assert penalised != plain and len(set(penalised)) > len(set(plain))
