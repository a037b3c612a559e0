"""The registry of tool-call formats and the model-type mapping (wisp/server/tool_calls/__init__.py, registry.py)."""

from __future__ import annotations

import pytest

from wisp.server.tool_calls import (
    TOOL_CALL_FORMATS, HarmonyFormat, HermesFormat, ToolCallFormat, register_tool_call_format, tool_call_format,
    tool_call_format_for,
)


def test_the_known_formats_are_registered_under_their_names():
    assert TOOL_CALL_FORMATS == {"hermes": HermesFormat, "harmony": HarmonyFormat}
    assert HermesFormat.name == "hermes" and HarmonyFormat.name == "harmony"


@pytest.mark.parametrize("model_type", ["qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmoe", "mixtral", "deepseek_v2",
                                        "", "some_future_model"])
def test_most_model_types_write_hermes_calls(model_type):
    assert isinstance(tool_call_format_for(model_type), HermesFormat)


def test_gpt_oss_writes_harmony():
    assert isinstance(tool_call_format_for("gpt_oss"), HarmonyFormat)


def test_an_unknown_format_name_is_a_value_error_listing_the_known_ones():
    with pytest.raises(ValueError, match="unknown tool-call format 'llama3'; known: harmony, hermes"):
        tool_call_format("llama3")


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="already registered"):
        @register_tool_call_format("hermes")
        class Again(HermesFormat):
            pass
    assert TOOL_CALL_FORMATS["hermes"] is HermesFormat


def test_formats_are_tool_call_formats():
    for cls in TOOL_CALL_FORMATS.values():
        assert issubclass(cls, ToolCallFormat)
        assert isinstance(cls().streamer().feed(""), list)
