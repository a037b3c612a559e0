"""The Hermes / Qwen tool-call format: each call a `<tool_call>` block holding one JSON object, e.g.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Qwen2.5, Qwen3 and Qwen3-MoE chat templates list the tools and ask for this; several calls are blocks one after
another (separated by "\\n"). The object's "arguments" is an object (OpenAI's `arguments` is its JSON text); some
models write "parameters" instead, or the arguments' JSON text as a string, and both are read too.

Reading rules (`parse`, and the stream, which agrees with it):
- A block runs from `<tool_call>` to the first `</tool_call>` after it, or to the end of the reply when it is never
  closed (a reply cut short, or a model that stops right after the JSON).
- A block is a call when its body is a JSON object with a non-blank string "name" and an object (or absent/null:
  `{}`) "arguments"/"parameters"; any other block stays in the content, tags and all.
- Content is everything outside call blocks, trimmed as `wisp.server.tool_calls.content` says.

The stream sends content as it comes, holding back a tail that could be the start of `<tool_call>`; a call is sent
(its head, then its whole arguments) once its block is closed, or at `finish` for an unclosed one.
"""

from __future__ import annotations

import json
import re

from wisp.server.tool_calls.arguments import arguments_text, is_encodable, load_json, load_object
from wisp.server.tool_calls.base import ParsedReply, ReplyDelta, ToolCallFormat, ToolCallStream
from wisp.server.tool_calls.content import StrippedContent, held_tail, reply_content
from wisp.server.tool_calls.grammar import SPACED, forced_functions, json_rule, lark_literal
from wisp.server.tool_calls.registry import register_tool_call_format

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.S)


def read_call(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a block's body, or None if the body is not a call (see the reading rules)."""
    value = load_json(body)
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name.strip() or not is_encodable(name):
        return None
    raw = value["arguments"] if "arguments" in value else value.get("parameters")
    arguments = load_object({} if raw is None else raw)
    text = arguments_text(arguments) if arguments is not None else None
    return None if text is None else (name, text)


@register_tool_call_format("hermes")
class HermesFormat(ToolCallFormat):
    """`<tool_call>` JSON blocks (Hermes, Qwen2.5/Qwen3 and the families that follow them)."""

    def parse(self, text: str) -> ParsedReply:
        parts, calls, pos = [], [], 0
        for block in _BLOCK.finditer(text):
            parts.append(text[pos:block.start()])
            call = read_call(block.group(1))
            if call is None:
                parts.append(block.group(0))
            else:
                calls.append(self.new_call(*call))
            pos = block.end()
        parts.append(text[pos:])
        return ParsedReply(reply_content(parts), tuple(calls))

    def streamer(self) -> "HermesStream":
        return HermesStream(self)

    def grammar(self, tools: list[dict], choice: str, parallel: bool) -> str:
        """`<tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>`, once or (`parallel`) one or more times
        separated by "\\n"; ARGS follows the tool's parameters with Python's default separators (", ", ": ")."""
        functions = forced_functions(tools, choice, SPACED)
        lines = ["start: tool_call" + (' ("\\n" tool_call)*' if parallel else ""),
                 "tool_call: " + " | ".join(f"call_{i}" for i in range(len(functions)))]
        for i, function in enumerate(functions):
            head = OPEN + '\n{"name": ' + json.dumps(function.name, ensure_ascii=False) + ', "arguments": '
            lines.append(f"call_{i}: {lark_literal(head)} args_{i} {lark_literal('}' + chr(10) + CLOSE)}")
            lines.append(f"args_{i}: {json_rule(function.schema)}")
        return "\n".join(lines) + "\n"


class HermesStream(ToolCallStream):
    """One reply in the Hermes format, streamed (see the module docstring)."""

    def __init__(self, fmt: HermesFormat):
        self._format = fmt
        self._pending = ""  # text not yet sent: a held tail of content, or a call block so far (from its OPEN)
        self._in_block = False
        self._scanned = len(OPEN)  # in a block: where the search for CLOSE resumes
        self._content = StrippedContent()
        self._calls = 0

    def feed(self, delta_text: str) -> list[ReplyDelta]:
        self._pending += delta_text
        out: list[ReplyDelta] = []
        while True:
            if not self._in_block:
                start = self._pending.find(OPEN)
                if start == -1:
                    keep = len(self._pending) - held_tail(self._pending, (OPEN,))
                    self._send_text(out, self._pending[:keep])
                    self._pending = self._pending[keep:]
                    return out
                self._send_text(out, self._pending[:start])
                self._pending, self._in_block, self._scanned = self._pending[start:], True, len(OPEN)
            close = self._pending.find(CLOSE, self._scanned)
            if close == -1:
                self._scanned = max(len(OPEN), len(self._pending) - len(CLOSE) + 1)
                return out
            end = close + len(CLOSE)
            self._send_block(out, self._pending[len(OPEN):close], self._pending[:end])
            self._pending, self._in_block = self._pending[end:], False

    def finish(self) -> list[ReplyDelta]:
        out: list[ReplyDelta] = []
        if self._in_block:
            self._send_block(out, self._pending[len(OPEN):], self._pending)
        else:
            self._send_text(out, self._pending)
        self._pending, self._in_block = "", False
        self._content.finish()
        return out

    def _send_text(self, out: list[ReplyDelta], text: str) -> None:
        sent = self._content.push(text)
        if sent:
            out.append(ReplyDelta.text(sent))

    def _send_block(self, out: list[ReplyDelta], body: str, block: str) -> None:
        call = read_call(body)
        if call is None:
            self._send_text(out, block)
            return
        out.extend(ReplyDelta.deltas_of_call(self._calls, self._format.new_call(*call)))
        self._calls += 1
