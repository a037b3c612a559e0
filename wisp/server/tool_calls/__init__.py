"""Tool calls per model family: how a model writes OpenAI-style tool calls (`tools`, `tool_choice`,
`parallel_tool_calls`), read back from its reply and forced by a grammar.

The contract is `ToolCallFormat` (`base.py`); the formats are registered by name in `TOOL_CALL_FORMATS`:
- "hermes" (`hermes.py`): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen2.5/3 and most
  open models);
- "harmony" (`harmony.py`): gpt-oss's channels and `to=functions.NAME` messages.

`tool_call_format_for(model_type)` picks a checkpoint's format from its HF `model_type` (unknown types: hermes, what
most chat templates ask for); `tool_call_format(name)` looks one up by name, as a command-line flag would.
"""

from __future__ import annotations

from wisp.server.tool_calls.base import (
    CallDelta, ParsedReply, RandomBytes, ReplyDelta, ToolCall, ToolCallFormat, ToolCallStream, new_call_id,
)
from wisp.server.tool_calls.harmony import HarmonyFormat
from wisp.server.tool_calls.hermes import HermesFormat
from wisp.server.tool_calls.registry import TOOL_CALL_FORMATS, register_tool_call_format

DEFAULT_FORMAT = "hermes"

FORMAT_OF_MODEL_TYPE: dict[str, str] = {
    "qwen2": "hermes",
    "qwen2_moe": "hermes",
    "qwen3": "hermes",
    "qwen3_moe": "hermes",
    "olmoe": "hermes",
    "mixtral": "hermes",
    "deepseek_v2": "hermes",
    "gpt_oss": "harmony",
}
"""HF `model_type` -> tool-call format name; a type not listed gets `DEFAULT_FORMAT`."""


def tool_call_format(name: str, **options) -> ToolCallFormat:
    """The format registered as `name` (options: the `ToolCallFormat` constructor's); ValueError naming the known
    formats if there is none."""
    if name not in TOOL_CALL_FORMATS:
        raise ValueError(f"unknown tool-call format {name!r}; known: {', '.join(sorted(TOOL_CALL_FORMATS))}")
    return TOOL_CALL_FORMATS[name](**options)


def tool_call_format_for(model_type: str, **options) -> ToolCallFormat:
    """The format a checkpoint of HF `model_type` writes its tool calls in (hermes unless listed otherwise)."""
    return tool_call_format(FORMAT_OF_MODEL_TYPE.get(model_type, DEFAULT_FORMAT), **options)


__all__ = [
    "CallDelta", "DEFAULT_FORMAT", "FORMAT_OF_MODEL_TYPE", "HarmonyFormat", "HermesFormat", "ParsedReply",
    "RandomBytes", "ReplyDelta", "TOOL_CALL_FORMATS", "ToolCall", "ToolCallFormat", "ToolCallStream", "new_call_id",
    "register_tool_call_format", "tool_call_format", "tool_call_format_for",
]
