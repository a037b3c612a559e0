"""The contract's value types (wisp/server/tool_calls/base.py)."""

from __future__ import annotations

import dataclasses
import os
import random
import re

import pytest

from wisp.server.tool_calls import CallDelta, ParsedReply, ReplyDelta, ToolCall, new_call_id, tool_call_format


def test_call_ids_are_call_and_24_hex_digits_from_the_random_source():
    assert re.fullmatch(r"call_[0-9a-f]{24}", new_call_id())
    assert new_call_id(random.Random(7).randbytes) == new_call_id(random.Random(7).randbytes)
    assert new_call_id(lambda n: bytes(range(n))) == "call_000102030405060708090a0b"
    assert new_call_id(os.urandom) != new_call_id(os.urandom)


@pytest.mark.parametrize("name", ["hermes", "harmony"])
def test_a_format_takes_its_ids_from_the_source_it_is_given(name):
    text = ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>' if name == "hermes"
            else "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>")
    ids = [tool_call_format(name, random_bytes=random.Random(3).randbytes).parse(text).tool_calls[0].id
           for _ in range(2)]
    assert ids[0] == ids[1] == new_call_id(random.Random(3).randbytes)


@pytest.mark.parametrize("value, field", [(ToolCall("call_x", "f", "{}"), "arguments"), (ParsedReply(None), "content"),
                                          (CallDelta(0, None, None, ""), "index"), (ReplyDelta.text("a"), "content")])
def test_values_are_frozen(value, field):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, None)


def test_a_reply_delta_carries_exactly_one_of_content_and_call():
    with pytest.raises(ValueError):
        ReplyDelta()
    with pytest.raises(ValueError):
        ReplyDelta(content="a", call=CallDelta(0, "call_x", "f", ""))
    assert ReplyDelta.text("").content == ""


def test_a_whole_call_streams_as_a_head_then_its_arguments():
    head, body = ReplyDelta.deltas_of_call(2, ToolCall("call_x", "f", '{"a":1}'))
    assert head.call == CallDelta(2, "call_x", "f", "")
    assert body.call == CallDelta(2, None, None, '{"a":1}')
