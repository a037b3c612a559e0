"""The Hermes / Qwen format: parsing whole replies, and streaming them in any pieces
(wisp/server/tool_calls/hermes.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.server.tool_calls.strategies import ARGUMENTS, FUNCTION_NAMES, TRICKY_CHARS
from tests.server.tool_calls.streaming import assert_stream_agrees, cut_pieces, pieces_of, stream
from wisp.server.tool_calls import HermesFormat, ParsedReply

HERMES = HermesFormat()


def block(name: str, arguments, key: str = "arguments", ensure_ascii: bool = False) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, key: arguments}, ensure_ascii=ensure_ascii) + "\n</tool_call>"


def calls(reply: ParsedReply) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in reply.tool_calls]


def test_plain_text_is_all_content():
    assert HERMES.parse("  Hello, world.\n") == ParsedReply("Hello, world.", ())
    assert HERMES.parse("") == ParsedReply(None, ())
    assert HERMES.parse(" \n\t") == ParsedReply(None, ())


def test_one_call():
    reply = HERMES.parse(block("get_weather", {"city": "Paris", "days": 3}))
    assert reply.content is None
    assert calls(reply) == [("get_weather", {"city": "Paris", "days": 3})]
    assert reply.tool_calls[0].arguments == '{"city":"Paris","days":3}'
    assert reply.tool_calls[0].id.startswith("call_")


def test_two_calls_in_order_with_distinct_ids():
    reply = HERMES.parse(block("a", {"x": 1}) + "\n" + block("b", {}))
    assert calls(reply) == [("a", {"x": 1}), ("b", {})]
    assert reply.content is None
    assert reply.tool_calls[0].id != reply.tool_calls[1].id


def test_text_around_calls_is_content():
    reply = HERMES.parse("Let me check.\n" + block("a", {}) + "\nOne moment." + block("b", {}) + "\n")
    assert reply.content == "Let me check.\n\nOne moment."
    assert [c.name for c in reply.tool_calls] == ["a", "b"]


@pytest.mark.parametrize("bad", [
    '<tool_call>\n{"name": "f", "arguments": {"a": }\n</tool_call>',  # JSON that does not parse
    '<tool_call>\n["f", {}]\n</tool_call>',  # not an object
    '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
    '<tool_call>\n{"name": "  ", "arguments": {}}\n</tool_call>',  # a blank name
    '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',  # arguments not an object
    '<tool_call>\n{"name": "f", "arguments": "not json"}\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": {"a": NaN}}\n</tool_call>',
    "<tool_call></tool_call>",
])
def test_a_block_that_is_not_a_call_stays_in_the_content(bad):
    reply = HERMES.parse("Before " + bad + " after")
    assert reply.tool_calls == ()
    assert reply.content == "Before " + bad + " after"


def test_a_bad_block_does_not_hide_the_good_ones():
    bad = '<tool_call>\n{"name": "f", "arguments": {\n</tool_call>'
    reply = HERMES.parse(block("a", {}) + bad + block("b", {"k": [1, 2]}))
    assert calls(reply) == [("a", {}), ("b", {"k": [1, 2]})]
    assert reply.content == bad


def test_unicode_names_arguments_and_content():
    arguments = {"ville": "Zürich", "都市": "東京", "emoji": "🌧️", "escaped": "\u00e9"}
    for ensure_ascii in (False, True):
        reply = HERMES.parse("Voilà 🌍 " + block("météo", arguments, ensure_ascii=ensure_ascii))
        assert reply.content == "Voilà 🌍"
        assert calls(reply) == [("météo", arguments)]
        assert "東京" in reply.tool_calls[0].arguments  # kept, not \\u-escaped


def test_parameters_and_string_arguments_are_read_too():
    reply = HERMES.parse(block("a", {"x": 1}, key="parameters") + block("b", json.dumps({"y": [2]}))
                         + '<tool_call>{"name": "c"}</tool_call>'
                         + '<tool_call>{"name": "d", "arguments": null}</tool_call>')
    assert calls(reply) == [("a", {"x": 1}), ("b", {"y": [2]}), ("c", {}), ("d", {})]


def test_an_unclosed_last_block_is_a_call_if_its_json_is_whole_else_content():
    assert calls(HERMES.parse("Hi " + block("f", {"a": 1})[: -len("\n</tool_call>")])) == [("f", {"a": 1})]
    cut = "Hi " + block("f", {"a": 1})[:-20]
    assert HERMES.parse(cut) == ParsedReply(cut, ())


def test_a_block_ends_at_the_first_closing_tag():
    text = '<tool_call>{"name": "f", "arguments": {"s": "</tool_call>"}}</tool_call>'
    reply = HERMES.parse(text)
    assert reply.tool_calls == ()
    assert reply.content == text


@st.composite
def hermes_replies(draw) -> tuple[str, str | None, list[tuple[str, dict]]]:
    """(reply, its content, its calls as (name, arguments)): text without tags, calls written several ways,
    and bad blocks, in any order."""
    text, content, made = "", [], []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["text", "call", "call", "bad"]))
        if kind == "text":
            part = draw(st.text(TRICKY_CHARS + "tool_call/>", max_size=15))
            content.append(part)
        elif kind == "call":
            name, arguments = draw(FUNCTION_NAMES), draw(ARGUMENTS)
            key = draw(st.sampled_from(["arguments", "parameters"]))
            written = json.dumps(arguments) if draw(st.booleans()) else arguments
            part = block(name, written, key=key, ensure_ascii=draw(st.booleans()))
            made.append((name, arguments))
        else:
            part = "<tool_call>\n" + draw(st.sampled_from(['{"name": "f", "arguments": {', "[]", "", '{"name": 1}']))
            part += "\n</tool_call>"
            content.append(part)
        text += part
    return text, "".join(content).strip() or None, made


@given(hermes_replies())
def test_parse_finds_what_was_written(case):
    text, content, made = case
    reply = HERMES.parse(text)
    assert reply.content == content
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == made


@given(st.data(), hermes_replies())
def test_streaming_in_any_pieces_agrees_with_parse(data, case):
    text = case[0]
    assert_stream_agrees(HERMES, text, data.draw(cut_pieces(text)))


MESSY = st.lists(st.sampled_from([
    "<tool_call>", "</tool_call>", "<tool_", "</tool", "<", "\n", " ", "é東🌧", "text", '{"name": "f"}',
    '{"name": "g", "arguments": {"a": [1, "x"]}}', '{"name": "h", "parameters": "{\\"b\\": 2}"}', "{", "}",
]), max_size=12).map("".join)


@given(st.data(), MESSY)
def test_streaming_messy_text_in_any_pieces_agrees_with_parse(data, text):
    assert_stream_agrees(HERMES, text, data.draw(cut_pieces(text)))


def test_streaming_one_character_at_a_time_holds_back_only_a_possible_tag():
    text = "Sure <b>: " + block("f", {"a": "é"}) + " done <tool"
    deltas = stream(HERMES, list(text)).deltas
    contents = [d.content for d in deltas if d.content is not None]
    assert "".join(contents) == "Sure <b>:  done <tool"
    assert contents[:3] == ["S", "u", "r"]
    assert [d.call.name for d in deltas if d.call is not None and d.call.id] == ["f"]


def test_a_stream_split_inside_a_multibyte_character_gets_empty_pieces():
    text = "é" + block("f", {"c": "東"})
    pieces = pieces_of(text, [1, 5, len(text.encode()) - 2])
    assert "" in pieces
    assert_stream_agrees(HERMES, text, pieces)


def test_grammar_text_forces_blocks_with_qwens_layout():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "now"}}]
    one = HERMES.grammar(tools, "now", parallel=False)
    assert one.splitlines()[:2] == ["start: tool_call", "tool_call: call_0"]
    assert '"<tool_call>\\n{\\"name\\": \\"now\\", \\"arguments\\": " args_0 "}\\n</tool_call>"' in one
    assert "get_weather" not in one
    many = HERMES.grammar(tools, "required", parallel=True)
    assert many.splitlines()[:2] == ['start: tool_call ("\\n" tool_call)*', "tool_call: call_0 | call_1"]
    with pytest.raises(ValueError, match="not in tools"):
        HERMES.grammar(tools, "nope", parallel=False)
    with pytest.raises(ValueError, match="at least one"):
        HERMES.grammar([], "required", parallel=False)
