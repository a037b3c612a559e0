"""gpt-oss's harmony format: parsing whole replies, and streaming them in any pieces
(wisp/server/tool_calls/harmony.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.server.tool_calls.strategies import ARGUMENTS, FUNCTION_NAMES, TRICKY_CHARS
from tests.server.tool_calls.streaming import assert_stream_agrees, cut_pieces, stream
from wisp.server.tool_calls import HarmonyFormat, ParsedReply

HARMONY = HarmonyFormat()


def call_message(name: str, arguments: str, first: bool = False) -> str:
    return ("" if first else "<|start|>assistant") + \
        f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{arguments}<|call|>"


def calls(reply: ParsedReply) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in reply.tool_calls]


def test_a_final_answer_is_the_content():
    assert HARMONY.parse("<|channel|>final<|message|>It is sunny.<|return|>") == ParsedReply("It is sunny.")
    assert HARMONY.parse("<|channel|>final<|message|>It is sunny.") == ParsedReply("It is sunny.")  # <|return|> cut


def test_analysis_is_reasoning_not_content():
    reply = HARMONY.parse("<|channel|>analysis<|message|>User greets.<|end|>"
                          "<|start|>assistant<|channel|>final<|message|>Hello!<|return|>")
    assert reply == ParsedReply("Hello!", (), "User greets.")


def test_one_call_after_analysis():
    reply = HARMONY.parse("<|channel|>analysis<|message|>Need weather.<|end|>"
                          + call_message("get_weather", '{"city":"Paris"}'))
    assert calls(reply) == [("get_weather", {"city": "Paris"})]
    assert reply.content is None and reply.reasoning == "Need weather."
    assert reply.tool_calls[0].arguments == '{"city":"Paris"}'


@pytest.mark.parametrize("text", [
    ' to=functions.f<|channel|>commentary json<|message|>{"a": 1}<|call|>',  # the recipient in the role's place
    '<|channel|>commentary to=functions.f<|constrain|>json<|message|>{"a": 1}<|call|>',
    '<|channel|>commentary to=functions.f <|constrain|>json<|message|> {"a": 1} ',  # <|call|> cut, whitespace
    '<|channel|>analysis to=functions.f<|message|>{"a": 1}<|end|>',  # a call on the analysis channel
    '<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.f<|channel|>commentary json'
    '<|message|>{"a": 1}<|call|>',
])
def test_a_call_however_its_header_names_the_function(text):
    assert calls(HARMONY.parse(text)) == [("f", {"a": 1})]


def test_two_calls_and_a_preamble_in_order():
    reply = HARMONY.parse("<|channel|>commentary<|message|>Checking both.<|end|>"
                          + call_message("a", '{"x":1}') + call_message("b", "{}"))
    assert calls(reply) == [("a", {"x": 1}), ("b", {})]
    assert reply.content == "Checking both."
    assert reply.tool_calls[0].id != reply.tool_calls[1].id


@pytest.mark.parametrize("body", ['{"city": ', "[1, 2]", "", '{"a": NaN}', "sunny"])
def test_a_call_whose_body_is_not_a_json_object_is_content(body):
    reply = HARMONY.parse("<|channel|>analysis<|message|>x<|end|>" + call_message("f", body))
    assert reply.tool_calls == ()
    assert reply.content == (body.strip() or None)


def test_messages_to_other_recipients_are_not_calls():
    reply = HARMONY.parse("<|channel|>analysis to=browser.search<|message|>{\"q\": 1}<|end|>"
                          "<|start|>assistant<|channel|>commentary to=python<|message|>print(1)<|end|>"
                          "<|start|>assistant<|channel|>commentary to=functions.<|message|>{}<|call|>")
    assert reply.tool_calls == ()
    assert reply.content == "print(1){}"
    assert reply.reasoning == '{"q": 1}'


def test_text_without_markers_is_content_and_a_cut_header_is_dropped():
    assert HARMONY.parse("analysisThinking.assistantfinalHi") == ParsedReply("analysisThinking.assistantfinalHi")
    assert HARMONY.parse("Hi<|start|>assistant<|channel|>final<|message|>there") == ParsedReply("Hithere")
    assert HARMONY.parse("<|channel|>final<|message|>Hi<|end|><|start|>assistant<|chan") == ParsedReply("Hi")
    assert HARMONY.parse("") == ParsedReply(None)


def test_unicode():
    reply = HARMONY.parse("<|channel|>analysis<|message|>Météo à 東京 🌧<|end|>"
                          + call_message("météo", '{"ville": "Zürich", "都市": "\\u6771\\u4eac"}')
                          + "<|start|>assistant<|channel|>final<|message|>Voilà 🌍<|return|>")
    assert calls(reply) == [("météo", {"ville": "Zürich", "都市": "東京"})]
    assert reply.content == "Voilà 🌍" and reply.reasoning == "Météo à 東京 🌧"
    assert "東京" in reply.tool_calls[0].arguments


BODY = st.text(TRICKY_CHARS + "<|>", max_size=12).filter(lambda s: "<|" not in s)


@st.composite
def harmony_replies(draw) -> tuple[str, str | None, list[tuple[str, dict]], str | None]:
    """(reply, content, calls as (name, arguments), reasoning): messages of every kind, headers written every
    way, ended by any marker or by the next message's start."""
    text, content, made, reasoning = "", [], [], []
    for i in range(draw(st.integers(0, 5))):
        start = "" if i == 0 else "<|start|>assistant"
        kind = draw(st.sampled_from(["final", "preamble", "analysis", "call", "call", "bad call"]))
        if kind in ("call", "bad call"):
            name = draw(FUNCTION_NAMES)
            header = draw(st.sampled_from([
                f"{start}<|channel|>commentary to=functions.{name} <|constrain|>json",
                f"{start} to=functions.{name}<|channel|>commentary json",
                f"{start}<|channel|>analysis to=functions.{name}",
            ]))
            if kind == "call":
                arguments = draw(ARGUMENTS)
                body = json.dumps(arguments, ensure_ascii=draw(st.booleans()),
                                  separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
                made.append((name, arguments))
            else:
                body = draw(st.sampled_from(['{"a": ', "[]", "", "nope", '{"a": 1}}']))
                content.append(body)
        else:
            channel = {"final": "final", "preamble": "commentary", "analysis": "analysis"}[kind]
            header, body = f"{start}<|channel|>{channel}", draw(BODY)
            (reasoning if kind == "analysis" else content).append(body)
        text += header + "<|message|>" + body + draw(st.sampled_from(["<|end|>", "<|call|>", "<|return|>", ""]))
    return text, "".join(content).strip() or None, made, "\n".join(reasoning).strip() or None


@given(harmony_replies())
def test_parse_finds_what_was_written(case):
    text, content, made, reasoning = case
    reply = HARMONY.parse(text)
    assert (reply.content, reply.reasoning) == (content, reasoning)
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == made


@given(st.data(), harmony_replies())
def test_streaming_in_any_pieces_agrees_with_parse(data, case):
    text = case[0]
    assert_stream_agrees(HARMONY, text, data.draw(cut_pieces(text)))


MESSY = st.lists(st.sampled_from([
    "<|start|>", "assistant", "<|channel|>", "final", "analysis", "commentary", " to=functions.f", " to=x",
    "<|constrain|>json", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|", "<|mess", "|>", "<", " ", "\n",
    "é東🌧", "hi", '{"a": [1]}', "{",
]), max_size=14).map("".join)


@given(st.data(), MESSY)
def test_streaming_messy_text_in_any_pieces_agrees_with_parse(data, text):
    assert_stream_agrees(HARMONY, text, data.draw(cut_pieces(text)))


def test_streaming_sends_a_final_answer_as_it_comes_and_a_call_when_it_ends():
    text = ("<|channel|>analysis<|message|>secret<|end|>" + call_message("f", '{"a":1}')
            + "<|start|>assistant<|channel|>final<|message|>Hello <|return|>")
    streamer = HARMONY.streamer()
    sent = [(piece, streamer.feed(piece)) for piece in text]
    assert not any(d.content and "secret" in d.content for _, ds in sent for d in ds)
    after_call = [i for i, (_, ds) in enumerate(sent) if any(d.call is not None for d in ds)]
    assert len(after_call) == 1 and text[: after_call[0] + 1].endswith("<|call|>")
    contents = [d.content for _, ds in sent for d in ds if d.content is not None]
    assert contents == ["H", "e", "l", "l", "o"]  # the space is held (trailing), the markers never sent
    assert streamer.finish() == []
    assert stream(HARMONY, [text]).content == "Hello"


def test_grammar_text_forces_one_commentary_call_with_special_tokens():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "now"}}]
    text = HARMONY.grammar(tools, "required", parallel=True)
    lines = text.splitlines()
    assert lines[0] == "start: call_0 | call_1"
    assert lines[1] == ('call_0: <|channel|> "commentary to=functions.get_weather " <|constrain|> "json" <|message|> '
                        "args_0 <|call|>")
    assert lines[2].startswith('args_0: %json {"x-guidance": {"whitespace_flexible": false, "item_separator": ",", '
                               '"key_separator": ":"}, "type": "object"')
    assert HARMONY.grammar(tools, "now", parallel=True).splitlines()[0] == "start: call_0"
