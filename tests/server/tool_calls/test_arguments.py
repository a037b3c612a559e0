"""Reading the model's JSON and writing OpenAI's `arguments` (wisp/server/tool_calls/arguments.py)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.server.tool_calls.arguments import JsonNumber, arguments_text, load_json, load_object

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@pytest.mark.parametrize("text", [
    "NaN", '{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', "{", '{"a": 1} x', "", "'a'", "{'a': 1}",
    "[" * 100_000 + "]" * 100_000, "01", "1.", ".5", "+1", "0x10",
])
def test_load_json_reads_nothing_from_what_is_not_strict_json(text):
    assert load_json(text) is None


def test_load_object_takes_an_object_or_its_json_text():
    assert load_object({"a": 1}) == {"a": 1}
    assert load_object('{"a": 1.50}') == {"a": JsonNumber("1.50")}
    assert load_object("[1]") is None
    assert load_object(3) is None
    assert load_object("not json") is None


@settings(max_examples=50)
@given(st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=4))
def test_arguments_text_is_compact_json_of_the_same_object(arguments):
    text = arguments_text(arguments)
    assert json.loads(text) == arguments
    assert text == json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    text.encode("utf-8")


@settings(max_examples=50)
@given(st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=4), st.booleans())
def test_json_read_then_written_is_the_same_value_compact(arguments, spaced):
    text = json.dumps(arguments, separators=(", ", ": ") if spaced else (",", ":"))
    written = arguments_text(load_json(text))
    assert json.loads(written) == arguments
    outside_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', written)
    assert not re.search(r"\s", outside_strings)


def test_numbers_keep_their_value_however_large_or_precise():
    text = '{"a":1e400,"b":1.50,"c":-0.0,"d":%s,"e":1E-7,"f":[2e-99999999999999999999]}' % ("9" * 5000)
    assert arguments_text(load_json(text)) == text
    assert arguments_text(load_json(text.replace(",", ", ").replace(":", ": "))) == text
    assert arguments_text({"f": float("inf")}) is None
    assert arguments_text({1: "non-string key"}) is None


def test_arguments_text_keeps_non_ascii_and_escapes_a_lone_surrogate():
    assert arguments_text({"city": "Zürich 東京 🌧"}) == '{"city":"Zürich 東京 🌧"}'
    lone = arguments_text({"s": "\ud800x"})
    lone.encode("utf-8")
    assert json.loads(lone) == {"s": "\ud800x"}
